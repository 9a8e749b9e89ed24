"""benchmarks/plot.py: every chart of docs/benchmarks.md from the committed results; and
docs/images/make_shaping_timelines.py, the timeline pictures of docs/shaping.md.

matplotlib is in the ``docs`` extra (``scripts/docs build`` installs it); without it
these tests are skipped.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def plot() -> ModuleType:
    return _script("bench_plot", ROOT / "benchmarks" / "plot.py")


@pytest.fixture(scope="module")
def timelines() -> ModuleType:
    return _script("shaping_timelines", ROOT / "docs" / "images" / "make_shaping_timelines.py")


def test_every_chart_names_its_result_file_and_unit(plot: ModuleType, tmp_path: Path) -> None:
    assert plot.main(["--out", str(tmp_path)]) == 0
    sources = {
        "uncontended.svg": (plot.LOCKS_FINAL, "µs"),
        "contended.svg": (plot.LOCKS_FINAL, "critical sections per second"),
        "contended-fair-false.svg": (plot.LOCKS_FAIRNESS, "critical sections per second"),
        "wake.svg": (plot.LOCKS_FINAL, "(ms, log scale"),
        "celery-overhead.svg": (plot.CELERY, "µs"),
        "semaphore.svg": (plot.PRIMITIVES, "permits granted per second"),
        "rwlock.svg": (plot.PRIMITIVES, "grants per second"),
        "hotpath-sync.svg": (plot.HOTPATH_SYNC, "after ÷ before"),
        "hotpath-async.svg": (plot.HOTPATH_ASYNC, "after ÷ before"),
        "handoff-sync.svg": (plot.HANDOFF_SYNC, "after ÷ before"),
        "handoff-async.svg": (plot.HANDOFF_ASYNC, "after ÷ before"),
        "step4-sync.svg": (plot.STEP4_SYNC, "after ÷ before"),
        "gap-to-floor.svg": (plot.STEP4_SYNC, "over the floor"),
        "lock-many.svg": (plot.LOCK_MANY_AFTER, "round trips"),
        "step7-sync.svg": (plot.STEP7_SYNC, "after ÷ before"),
        "step7-async.svg": (plot.STEP7_ASYNC, "after ÷ before"),
        "step8-sync.svg": (plot.STEP8_SYNC, "after ÷ before"),
        "gap-to-floor-step8.svg": (plot.STEP8_SYNC, "over the floor"),
        "step9-sync.svg": (plot.STEP9_SYNC, "after ÷ before"),
        "step9-async.svg": (plot.STEP9_ASYNC, "after ÷ before"),
        "gap-to-floor-step9.svg": (plot.STEP9_SYNC, "over the floor"),
        "step11-async.svg": (plot.STEP11_ASYNC, "after ÷ before"),
    }
    assert set(plot.CHARTS) == set(sources)
    for filename, (result, unit) in sources.items():
        svg = (tmp_path / filename).read_text(encoding="utf-8")
        assert svg.lstrip().startswith("<?xml"), filename
        assert f"benchmarks/results/{result}" in svg, filename
        assert unit in svg, filename


def test_committed_charts_are_deterministic(plot: ModuleType, tmp_path: Path) -> None:
    # Same JSON, same bytes: re-running the script leaves no diff behind.
    first, second = tmp_path / "a", tmp_path / "b"
    assert plot.main(["--out", str(first)]) == 0
    assert plot.main(["--out", str(second)]) == 0
    for filename in plot.CHARTS:
        assert (first / filename).read_bytes() == (second / filename).read_bytes(), filename


def test_a_result_without_the_section_is_named(
    plot: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / plot.LOCKS_FINAL).write_text(json.dumps({"machine": {}, "wake": {}}))
    monkeypatch.setattr(plot, "RESULTS", results)
    assert plot.main(["--out", str(tmp_path / "out")]) == 1
    message = capsys.readouterr().out
    assert plot.LOCKS_FINAL in message
    assert "uncontended.rows" in message


def test_a_missing_result_file_is_named(
    plot: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plot, "RESULTS", tmp_path)
    with pytest.raises(plot.ResultError, match="does not exist; update the constant"):
        plot.load("locks-1999-01-01.json")


def test_each_mode_has_a_deterministic_timeline_the_docs_show(
    timelines: ModuleType, tmp_path: Path
) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    assert timelines.main(["--out", str(first)]) == 0
    assert timelines.main(["--out", str(second)]) == 0
    page = (ROOT / "docs" / "shaping.md").read_text(encoding="utf-8")
    titles = {
        "shaping-rate.svg": "at most 3 starts in any 10 s",
        "shaping-cooldown.svg": "cooldown=5",
        "shaping-coalesce.svg": "coalesce=True",
        "shaping-debounce.svg": "debounce=2",
    }
    assert set(timelines.PICTURES) == set(titles)
    for filename, title in titles.items():
        svg = (first / filename).read_text(encoding="utf-8")
        assert svg.lstrip().startswith("<?xml"), filename
        assert title in svg, filename
        assert (first / filename).read_bytes() == (second / filename).read_bytes(), filename
        assert (ROOT / "docs" / "images" / filename).is_file(), filename
        assert f"](images/{filename})" in page, filename


def test_the_rate_timeline_replays_a_sliding_window(timelines: ModuleType) -> None:
    # 3 per 10 s, deferred: d and e wait until a, then b, leave the window.
    replay = timelines.rate_starts([6.0, 7.0, 8.5, 10.0, 12.0, 19.5], 3, 10.0)
    assert [start for _, start, _ in replay] == [6.0, 7.0, 8.5, 16.0, 17.0, 19.5]
    assert [deferred for _, _, deferred in replay] == [False, False, False, True, True, False]
