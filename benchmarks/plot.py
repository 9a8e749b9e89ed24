"""Charts for docs/benchmarks.md from the JSON results in benchmarks/results/.

Usage (from the repository root; matplotlib is in the ``docs`` dependency group)::

    .venv/bin/python benchmarks/plot.py              # every chart
    .venv/bin/python benchmarks/plot.py --out DIR    # somewhere else
    scripts/docs plots                               # the same, installing the group first

Each chart is an SVG in docs/images/benchmarks/ built from ONE result file, named
in the chart's footer with the machine and commit it ran on: figures from
different runs of this shared 2-core VM are not comparable, so no chart mixes
runs. The output is deterministic (no dates, fixed SVG ids): re-running on the
same JSON changes no file.

To chart a newer run, point the constant of its chart at the new file below.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display needed

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "docs" / "images" / "benchmarks"

#: The run each chart shows (see docs/benchmarks.md for each run's method).
LOCKS_FINAL = "locks-2026-11-22-final.json"  # uncontended, wake, contended (fair only)
LOCKS_FAIRNESS = "locks-2026-11-23-issue9.json"  # contended with fair=False
PRIMITIVES = "primitives-2026-11-23-issue9.json"  # semaphore, read-write lock
CELERY = "celery-2026-11-23-issue12.json"  # per-task overhead with floor and lock_only
HOTPATH_SYNC = "locks-hotpath-step2-2026-11-27.json"  # bench_locks --baseline (issue 23)
HOTPATH_ASYNC = "async-hotpath-step2-2026-11-27.json"  # bench_async --baseline (issue 23)
# The third step's first runs (docs/benchmarks.md lists every run's ratios).
HANDOFF_SYNC = "locks-hotpath-step3-2026-11-27.json"
HANDOFF_ASYNC = "async-hotpath-step3-2026-11-27.json"
# The fourth step (fewer calls; where the uncontended gap is: the server's CPU column is
# the server process's from this run on).
STEP4_SYNC = "locks-hotpath-step4-2026-11-27.json"
# bench_lock_many.py, this tree and a worktree of the commit before (issue 23, fifth step)
LOCK_MANY_AFTER = "lock-many-after-2026-11-27-1.json"
LOCK_MANY_BEFORE = "lock-many-before-2026-11-27-1.json"
# The seventh step (a lock's scripts past redis-py's execute_command), sync and asyncio.
STEP7_SYNC = "direct-send-locks-2026-11-28.json"
STEP7_ASYNC = "direct-send-async-2026-11-28-2.json"
# The eighth step (the direct path packs its own commands), sync; and where the
# uncontended gap to the floor stands after it.
STEP8_SYNC = "wire-locks-2026-11-28-1.json"
# The ninth step (one connection per pool kept between exchanges), sync and asyncio
# (pinned); and where the uncontended gap to the floor stands after it.
STEP9_SYNC = "kept-locks-2026-11-28-1.json"
STEP9_ASYNC = "kept-async-pinned-2026-11-28-1.json"
# The eleventh step (an asyncio hand-off within one loop comes back in the release's
# reply): the asyncio hand-off, one process and two.
STEP11_ASYNC = "local-handoff-async-2026-11-28-2.json"

OURS_COLOR = "#c0392b"
PEER_COLOR = "#7f8c8d"
FLOOR_COLOR = "#2c3e50"
#: One colour per library in every line chart; others take the spare ones.
LIB_COLORS = {
    "ours": "#c0392b",
    "ours_unfair": "#e67e22",
    "prl": "#2980b9",
    "redispy": "#27ae60",
    "redispy_1ms": "#8e44ad",
    "pottery": "#7f8c8d",
}
SPARE_COLORS = ["#16a085", "#d35400", "#2c3e50", "#f1c40f"]


class ResultError(Exception):
    """A result file lacks what a chart needs (renamed key, other benchmark)."""


def load(name: str) -> dict[str, Any]:
    """The parsed result file *name* of benchmarks/results/."""
    path = RESULTS / name
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultError(f"{path} does not exist; update the constant in plot.py") from None
    return data


def section(data: dict[str, Any], name: str, *keys: str) -> Any:
    """``data[keys[0]][keys[1]]...``, or a ResultError naming the file and the path."""
    value: Any = data
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            raise ResultError(f"{name}: no {'.'.join(keys)} (stopped at {key!r})")
        value = value[key]
    return value


def is_ours(lib: str, label: str) -> bool:
    """Whether a result row is django-redislock's (the benchmarks call it "ours")."""
    return lib.startswith("ours") or label.startswith("ours")


def display(label: str) -> str:
    """A row label as readers know the library ("ours" is django-redislock)."""
    if label.startswith("ours"):
        return "django-redislock" + label[len("ours") :]
    return label


def footer(fig: Figure, name: str, data: dict[str, Any], note: str = "") -> None:
    """Name the source file and the machine under the chart."""
    machine = data.get("machine", {})
    facts = [f"benchmarks/results/{name}"]
    if machine.get("git_commit"):
        dirty = " + uncommitted changes" if machine.get("engine_uncommitted_changes") else ""
        facts.append(f"commit {machine['git_commit']}{dirty}")
    if machine.get("python"):
        facts.append(f"Python {machine['python']}")
    if machine.get("redis_server"):
        facts.append(f"redis-server {machine['redis_server']}")
    if machine.get("cpus"):
        facts.append(f"{machine['cpus']} vCPUs (shared VM: compare within a chart only)")
    text = "Source: " + ", ".join(facts[:1]) + "\n" + ", ".join(facts[1:])
    if note:
        text = note + "\n" + text
    # Below the figure: savefig(bbox_inches="tight") grows the image to include it.
    fig.text(0.01, 0.0, text, fontsize=7.5, color="#555555", ha="left", va="top")


def bar_colors(rows: Sequence[tuple[str, str]]) -> list[str]:
    """Red for our rows, dark for the floor, grey for the peers."""
    colors = []
    for lib, label in rows:
        if is_ours(lib, label):
            colors.append(OURS_COLOR)
        elif lib == "floor" or lib == "plain":
            colors.append(FLOOR_COLOR)
        else:
            colors.append(PEER_COLOR)
    return colors


def label_bar(ax: Axes, x: float, y: float, text: str) -> None:
    """Write *text* just past the end of a horizontal bar (left of it when negative)."""
    ax.annotate(
        text,
        (x, y),
        xytext=(3 if x >= 0 else -3, 0),
        textcoords="offset points",
        ha="left" if x >= 0 else "right",
        va="center",
        fontsize=7.5,
    )


def style_rows(ax: Axes, ys: Sequence[float], labels: Sequence[str]) -> None:
    """One labelled row per y, first row on top, light vertical grid."""
    ax.set_yticks(ys, labels, fontsize=8.5)
    ax.invert_yaxis()
    ax.grid(axis="x", color="#dddddd", zorder=0)
    ax.spines[["top", "right"]].set_visible(False)


def hbars(
    ax: Axes,
    labels: Sequence[str],
    values: Sequence[float],
    colors: Sequence[str],
    fmt: str,
    marks: Sequence[float] | None = None,
    mark_label: str = "",
) -> None:
    """Horizontal bars, each with its value; optional tick marks (a p90 or p99)."""
    ys = list(range(len(labels)))
    ax.barh(ys, values, color=colors, height=0.62, zorder=2)
    for i, (y, value) in enumerate(zip(ys, values, strict=True)):
        if marks is None:
            label_bar(ax, value, y, fmt.format(value))
        else:
            text = f"{fmt.format(value)} ({mark_label} {fmt.format(marks[i])})"
            label_bar(ax, max(value, marks[i]), y, text)
    if marks is not None:
        ax.scatter(marks, ys, marker="|", s=160, color="black", zorder=3, label=mark_label)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    style_rows(ax, ys, labels)


def paired_hbars(
    ax: Axes,
    labels: Sequence[str],
    series: Sequence[tuple[Sequence[float], str, str]],
    fmt: Callable[[float], str],
) -> None:
    """Two bars per row: *series* is two (values, legend, colour)."""
    ys = list(range(len(labels)))
    height = 0.38
    for (values, legend, color), shift in zip(series, (-height / 2, height / 2), strict=True):
        ax.barh([y + shift for y in ys], values, height=height, color=color, label=legend, zorder=2)
        for y, value in zip(ys, values, strict=True):
            label_bar(ax, value, y + shift, fmt(value))
    style_rows(ax, ys, labels)
    ax.legend(fontsize=8, frameon=False, loc="lower right")


#: Latency charts of bench_locks.py results: section -> (unit, title, x label, note,
#: log scale). Title and note are formatted with the section (``{rounds}``, ...).
LATENCIES = {
    "uncontended": (
        "us",
        "Uncontended acquire + release per library",
        "create + acquire + release, one process: p50 latency (µs, lower is better)",
        "{rounds} interleaved rounds of every library; bar = p50.",
        False,
    ),
    "wake": (
        "ms",
        "Wake latency after a hold of {hold_s:g} s",
        "release call → waiter's acquire returns: p50 (ms, log scale, lower is better)",
        "{trials} trials per library; the waiter is another process.",
        True,
    ),
}


def latency(key: str, name: str = LOCKS_FINAL) -> Figure:
    """Bars of the p50 (ticks at the p90) of every row of ``data[key]["rows"]``."""
    unit, title, xlabel, note, log = LATENCIES[key]
    data = load(name)
    rows = section(data, name, key, "rows")
    libs = list(rows)
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.38 * len(libs)))
    hbars(
        ax,
        [display(rows[lib]["label"]) for lib in libs],
        [rows[lib][f"p50_{unit}"] for lib in libs],
        bar_colors([(lib, rows[lib]["label"]) for lib in libs]),
        "{:.0f}" if unit == "us" else "{:.2f}",
        marks=[rows[lib][f"p90_{unit}"] for lib in libs],
        mark_label="p90",
    )
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(title.format(**data[key]), fontsize=11, loc="left")
    footer(fig, name, data, note.format(**data[key]))
    fig.tight_layout()
    return fig


def _time_per_op(row: dict[str, Any], field: str) -> float:
    """A row's *field* as time per operation: critical sections per second inverted."""
    return 1.0 / row[field] if field == "cs_per_s" else float(row[field])


#: What a before/after chart shows of each experiment (section, row suffix -> row
#: label): (field, what), all as time per operation, so lower is better everywhere.
BEFORE_AFTER = {
    "uncontended": [("p50_us", "uncontended p50"), ("client_cpu_p50_us", "uncontended client CPU")],
    "contended": [("handoff_p50_ms", "hand-off p50"), ("cs_per_s", "time per critical section")],
    "handoff": [("handoff_p50_ms", "hand-off p50"), ("cs_per_s", "time per critical section")],
    "wake": [("p50_ms", "wake p50")],
}


def _tree(info: dict[str, Any]) -> str:
    """A ``--baseline`` run's tree as its commit, marked when it had uncommitted changes."""
    dirty = " + uncommitted changes" if info.get("uncommitted_package_changes") else ""
    return f"{info.get('commit', '?')}{dirty}"


def before_after(name: str, title: str) -> Figure:
    """``ours@current`` ÷ ``ours@baseline`` of a ``--baseline`` run, measure by measure."""
    data = load(name)
    labels: list[str] = []
    ratios: list[float] = []
    for key, measures in BEFORE_AFTER.items():
        if key not in data:
            continue
        rows = section(data, name, key, "rows")
        for row_key, current in rows.items():
            if not row_key.startswith("ours@current"):
                continue
            suffix = row_key.removeprefix("ours@current")
            baseline = section(data, name, key, "rows", f"ours@baseline{suffix}")
            where = suffix.strip("@:").replace(":", " ").replace("N", "N=")
            if where and where.isdigit():
                where = f"N={where}"
            for field, what in measures:
                labels.append(f"{what} {where}".strip())
                ratios.append(_time_per_op(current, field) / _time_per_op(baseline, field))
    if not ratios:
        raise ResultError(f"{name}: no ours@current / ours@baseline rows (not a --baseline run)")
    fig, ax = plt.subplots(figsize=(8, 1.4 + 0.3 * len(labels)))
    colors = [OURS_COLOR if r < 1 else PEER_COLOR for r in ratios]
    hbars(ax, labels, ratios, colors, "{:.2f}")
    ax.axvline(1.0, color="black", linewidth=0.8, zorder=3)
    ax.set_xlabel("after ÷ before, time per operation (below 1: faster)")
    ax.set_title(title, fontsize=11, loc="left")
    commits = data.get("baseline", {})
    note = (
        f"before: {_tree(commits.get('baseline', {}))}, after: "
        f"{_tree(commits.get('current', {}))}, each in a spawned process of its "
        "own, interleaved in one run; critical sections per second shown inverted."
    )
    footer(fig, name, data, note)
    fig.tight_layout()
    return fig


def gap_to_floor(name: str) -> Figure:
    """Each library's uncontended operation over the floor's: its client CPU and the
    server's CPU (the Redis process's, per operation) stacked, the p50 as a tick."""
    data = load(name)
    rows = section(data, name, "uncontended", "rows")
    if "floor" not in rows:
        raise ResultError(f"{name}: no floor row in the uncontended experiment")
    floor = rows["floor"]
    keys = [k for k in rows if k != "floor" and "@" not in k]
    labels = [display(rows[k]["label"]) for k in keys]
    client = [rows[k]["client_cpu_p50_us"] - floor["client_cpu_p50_us"] for k in keys]
    server = [rows[k]["redis_cpu_us_per_op"] - floor["redis_cpu_us_per_op"] for k in keys]
    wall = [rows[k]["p50_us"] - floor["p50_us"] for k in keys]
    ys = list(range(len(keys)))
    fig, ax = plt.subplots(figsize=(8, 1.8 + 0.42 * len(keys)))
    ax.barh(ys, client, height=0.62, color="#e67e22", label="client CPU", zorder=2)
    starts = [max(0.0, c) for c in client]
    ax.barh(ys, server, left=starts, height=0.62, color="#2980b9", label="server CPU", zorder=2)
    ax.scatter(wall, ys, marker="|", s=160, color="black", zorder=3, label="p50")
    for y, c, sv, w in zip(ys, client, server, wall, strict=True):
        text = f"client {c:+.0f}, server {sv:+.0f}, p50 {w:+.0f} µs"
        label_bar(ax, max(starts[y] + max(sv, 0.0), w), y, text)
    ax.axvline(0.0, color="black", linewidth=0.8, zorder=3)
    style_rows(ax, ys, labels)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_xlabel("µs per create + acquire + release over the floor's (lower is better)")
    ax.set_title("Uncontended: where each library's time over the floor goes", loc="left")
    note = (
        f"floor: SET NX PX + compare-and-delete, p50 {floor['p50_us']:.0f} µs; in-process rows "
        "of one run; server CPU = the Redis process's CPU per operation (INFO cpu)."
    )
    footer(fig, name, data, note)
    fig.tight_layout()
    return fig


def contended(name: str) -> Figure:
    """Critical sections per second and fairness (fewest/most) against N processes."""
    data = load(name)
    rows = section(data, name, "contended", "rows")
    libs: dict[str, str] = {}
    for row in rows.values():
        libs.setdefault(row["lib"], row["label"])
    ns = sorted({row["n"] for row in rows.values()})
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.4))
    for i, (lib, label) in enumerate(libs.items()):
        mine = [rows[f"{lib}@{n}"] for n in ns if f"{lib}@{n}" in rows]
        xs = [row["n"] for row in mine]
        style: dict[str, Any] = {
            "color": LIB_COLORS.get(lib, SPARE_COLORS[i % len(SPARE_COLORS)]),
            "marker": "o",
            "linewidth": 2.6 if is_ours(lib, label) else 1.4,
            "label": display(label),
        }
        left.plot(xs, [row["cs_per_s"] for row in mine], **style)
        right.plot(xs, [row["fewest_most_ratio"] for row in mine], **style)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
        ax.set_xlabel("N processes contending for one name")
        ax.grid(color="#dddddd")
        ax.spines[["top", "right"]].set_visible(False)
    left.set_ylabel("critical sections per second (higher is better)")
    left.set_ylim(bottom=0)
    left.set_title("Throughput", fontsize=11, loc="left")
    right.set_ylabel("fewest / most sections of one process (1 = fair)")
    right.set_ylim(0, 1.05)
    right.set_title("Fairness", fontsize=11, loc="left")
    right.legend(fontsize=7.5, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    duration = section(data, name, "contended", "duration_s")
    reps = section(data, name, "contended", "reps")
    footer(
        fig,
        name,
        data,
        f"Critical section: GET, sleep 1 ms, SET; {duration:g} s per library per N, "
        f"median of {reps} interleaved reps.",
    )
    fig.suptitle("Contended mutex: one name, N processes", fontsize=12, x=0.01, ha="left")
    fig.tight_layout()
    return fig


CELERY_VARIANTS = {
    "floor": "floor: bare SET NX + DEL in the body",
    "lock_only": "with locks.lock(...) in the body",
    "decorated": "@single_instance",
    "based": "SingleInstanceTask",
    "based_unique": "SingleInstanceTask(unique_on_enqueue=True)",
    "once_task": "celery-once QueueOnce",
    "singleton_task": "celery-singleton Singleton",
}


def celery(name: str = CELERY) -> Figure:
    """Per-task cost each variant adds to a plain task: worker runtime and enqueue, µs."""
    data = load(name)
    variants = section(data, name, "variants")
    keys = [key for key in CELERY_VARIANTS if key in variants]
    if not keys:
        raise ResultError(f"{name}: none of the variants {sorted(CELERY_VARIANTS)}")
    fig, ax = plt.subplots(figsize=(8.5, 4.4))
    paired_hbars(
        ax,
        [CELERY_VARIANTS[key] for key in keys],
        [
            ([variants[key]["added_runtime_us"] for key in keys], "+ worker runtime", OURS_COLOR),
            ([variants[key]["added_enqueue_us"] for key in keys], "+ enqueue", "#2980b9"),
        ],
        lambda value: f"{value:.0f}",
    )
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("median added per task against a plain task (µs, lower is better)")
    ax.set_title("Celery: what each single-instance variant adds per task", fontsize=11, loc="left")
    plain = variants.get("plain", {})
    footer(
        fig,
        name,
        data,
        f"Real worker (solo pool), {data.get('tasks_per_variant', '?')} trivial tasks per "
        f"variant; plain task: runtime {plain.get('runtime_us', 0):.0f} µs, "
        f"enqueue {plain.get('enqueue_us', 0):.0f} µs. The peers release outside the runtime.",
    )
    fig.tight_layout()
    return fig


def primitive_rows(name: str, key: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The result file and its ``key`` rows (bench_primitives.py), ours first."""
    data = load(name)
    rows = list(section(data, name, key).values())
    rows.sort(key=lambda row: not is_ours(row["lib"], row["label"]))
    return data, rows


def finish_primitive(
    fig: Figure, name: str, data: dict[str, Any], row: dict[str, Any], body: str
) -> Figure:
    """Footer (critical section *body*, duration, reps) and layout of a primitives chart."""
    note = f"{body}; {row['duration_s']:g} s per library, median of {row['reps']} reps."
    footer(fig, name, data, note)
    fig.tight_layout()
    return fig


def semaphore(name: str = PRIMITIVES) -> Figure:
    """Semaphore (limit 3, 8 processes): permits per second and wait percentiles."""
    data, rows = primitive_rows(name, "semaphore")
    labels = [display(row["label"]) for row in rows]
    colors = bar_colors([(row["lib"], row["label"]) for row in rows])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    hbars(left, labels, [row["per_s"] for row in rows], colors, "{:,.0f}")
    left.set_xlabel("permits granted per second (higher is better)")
    left.set_title("Throughput", fontsize=11, loc="left")
    hbars(
        right,
        labels,
        [row["wait_p50_ms"] for row in rows],
        colors,
        "{:.2f}",
        marks=[row["wait_p99_ms"] for row in rows],
        mark_label="p99",
    )
    right.tick_params(labelleft=False)
    right.set_xscale("log")
    right.set_xlabel("wait for a permit: p50 (ms, log scale, lower is better)")
    right.set_title("Waiting", fontsize=11, loc="left")
    first = rows[0]
    fig.suptitle(
        f"Semaphore, limit {first['limit']}, {first['processes']} processes",
        fontsize=12,
        x=0.01,
        ha="left",
    )
    return finish_primitive(fig, name, data, first, "Critical section INCR + 1 ms")


def rwlock(name: str = PRIMITIVES) -> Figure:
    """Read-write lock (6 readers, 2 writers): reads and writes per second per library."""
    data, rows = primitive_rows(name, "rwlock")
    fig, ax = plt.subplots(figsize=(8.5, 3.4))
    paired_hbars(
        ax,
        [display(row["label"]) for row in rows],
        [
            ([row["read_per_s"] for row in rows], "reads/s", "#2980b9"),
            ([row["write_per_s"] for row in rows], "writes/s", OURS_COLOR),
        ],
        lambda value: f"{value:,.1f}" if value < 10 else f"{value:,.0f}",
    )
    ax.set_xscale("log")
    ax.set_xlabel("grants per second (log scale): both sides served = both bars long")
    first = rows[0]
    ax.set_title(
        f"Read-write lock, {first['processes']} processes (6 readers, 2 writers)",
        fontsize=11,
        loc="left",
    )
    return finish_primitive(
        fig, name, data, first, "Read = GET + 1 ms + GET, write = GET + 1 ms + SET"
    )


#: bench_lock_many.py's rows, as the chart names them.
LOCK_MANY_ROWS = {
    "floor": "floor: two pipelines",
    "ours": "ours: lock_many",
    "ours@before": "ours: lock_many before",
    "ours_one_by_one": "ours: one Lock at a time",
    "redispy": "redis-py Lock, one at a time",
    "prl": "python-redis-lock, one at a time",
}


def lock_many(after: str = LOCK_MANY_AFTER, before: str = LOCK_MANY_BEFORE) -> Figure:
    """One ``with`` block over k free locks, per library, for each k; our ``lock_many``
    of the run *before* (a worktree of the previous commit) beside it."""
    data, old = load(after), load(before)
    sizes = section(data, after, "sizes")
    fig, axes = plt.subplots(len(sizes), 1, figsize=(8, 1.0 + 2.2 * len(sizes)), sharex=True)
    for ax, (size, rows) in zip(axes, sizes.items(), strict=True):
        rows = {**rows, "ours@before": section(old, before, "sizes", size, "ours")}
        keys = [k for k in LOCK_MANY_ROWS if k in rows]
        labels = [display(LOCK_MANY_ROWS[k]) for k in keys]
        values = [rows[k]["p50_us"] for k in keys]
        colors = bar_colors([(k, LOCK_MANY_ROWS[k]) for k in keys])
        ys = list(range(len(keys)))
        ax.barh(ys, values, color=colors, height=0.62, zorder=2)
        for y, key, value in zip(ys, keys, values, strict=True):
            trips = rows[key]["round_trips"]
            label_bar(ax, value, y, f"{value:.0f} µs, {trips} round trips")
        style_rows(ax, ys, labels)
        ax.set_title(f"{size} locks", loc="left", fontsize=9.5)
    axes[-1].set_xlabel("p50 of one with-block over free locks (µs, lower is better)")
    fig.suptitle("Several locks at once: lock_many in two round trips", x=0.01, ha="left")
    commit = old.get("machine", {}).get("git_commit", "?")
    note = (
        f"'before': the same script run in a worktree of commit {commit} "
        f"(benchmarks/results/{before})."
    )
    footer(fig, after, data, note)
    fig.tight_layout()
    return fig


#: Output file name -> chart builder.
CHARTS: dict[str, Callable[[], Figure]] = {
    "uncontended.svg": lambda: latency("uncontended"),
    "contended.svg": lambda: contended(LOCKS_FINAL),
    "contended-fair-false.svg": lambda: contended(LOCKS_FAIRNESS),
    "wake.svg": lambda: latency("wake"),
    "celery-overhead.svg": celery,
    "semaphore.svg": semaphore,
    "rwlock.svg": rwlock,
    "hotpath-sync.svg": lambda: before_after(HOTPATH_SYNC, "Hot path, second step: sync"),
    "hotpath-async.svg": lambda: before_after(HOTPATH_ASYNC, "Hot path, second step: asyncio"),
    "handoff-sync.svg": lambda: before_after(HANDOFF_SYNC, "Hand-off release, third step: sync"),
    "handoff-async.svg": lambda: before_after(
        HANDOFF_ASYNC, "Hand-off release, third step: asyncio"
    ),
    "step4-sync.svg": lambda: before_after(STEP4_SYNC, "Fewer calls, fourth step: sync"),
    "gap-to-floor.svg": lambda: gap_to_floor(STEP4_SYNC),
    "lock-many.svg": lock_many,
    "step7-sync.svg": lambda: before_after(STEP7_SYNC, "Past execute_command, seventh step: sync"),
    "step7-async.svg": lambda: before_after(
        STEP7_ASYNC, "Past execute_command, seventh step: asyncio"
    ),
    "step8-sync.svg": lambda: before_after(STEP8_SYNC, "Our own packing, eighth step: sync"),
    "gap-to-floor-step8.svg": lambda: gap_to_floor(STEP8_SYNC),
    "step9-sync.svg": lambda: before_after(STEP9_SYNC, "A kept connection, ninth step: sync"),
    "step9-async.svg": lambda: before_after(
        STEP9_ASYNC, "A kept connection, ninth step: asyncio (pinned)"
    ),
    "gap-to-floor-step9.svg": lambda: gap_to_floor(STEP9_SYNC),
    "step11-async.svg": lambda: before_after(
        STEP11_ASYNC, "A hand-off within one loop in the release's reply, eleventh step: asyncio"
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Write every chart; return a process exit status."""
    return write_svgs(CHARTS, OUT, __doc__, argv)


def write_svgs(
    charts: dict[str, Callable[[], Figure]],
    default: Path,
    doc: str | None,
    argv: Sequence[str] | None = None,
) -> int:
    """The command line of a script that draws each of *charts* into ``<--out or
    default>/<its file name>`` as a deterministic SVG (this one, and
    docs/images/make_shaping_timelines.py); return a process exit status."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=default, help=f"directory (default {default})")
    out: Path = parser.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    plt.rcParams.update(
        {
            "svg.fonttype": "none",  # text stays text: small files, searchable
            "svg.hashsalt": "django-redislock",  # stable ids: same JSON, same file
            # Measured with DejaVu Sans; a viewer without it falls back to a sans-serif.
            "font.family": "sans-serif",
            "font.sans-serif": ["DejaVu Sans", "Verdana", "Arial", "Helvetica"],
        }
    )
    for filename, build in charts.items():
        try:
            fig = build()
        except ResultError as exc:
            print(f"plot.py: {filename}: {exc}")
            return 1
        fig.savefig(out / filename, metadata={"Date": None}, bbox_inches="tight")
        plt.close(fig)
        print(f"wrote {out / filename}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
