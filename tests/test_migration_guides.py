"""The examples of docs/migrating-from-celery-once.md and -celery-singleton.md, as written.

Each guide's "After" example is taken from the page: its task definitions go in
a module a real Celery worker imports, and its calls run here while no worker
consumes the queue yet (so the first task is still queued: the duplicate must
be refused). Then a real worker (solo pool) runs the queued tasks, their locks
go away, and the same call queues a new task.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from django_redislock import locks

pytestmark = [pytest.mark.celery, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
GUIDES = ("migrating-from-celery-once", "migrating-from-celery-singleton")
_BASE = settings.REDIS_URL.rsplit("/", 1)[0]
#: Broker and results of the guides' app: databases no other test uses.
BROKER, RESULTS = f"{_BASE}/6", f"{_BASE}/7"
WAIT = 30


def _after_example(guide: str) -> tuple[str, str]:
    """(task definitions, calls) of the guide's "After:" example."""
    text = (ROOT / "docs" / f"{guide}.md").read_text()
    found = re.findall(r"After:\n\n```python\n(.*?)```", text, re.S)
    assert len(found) == 1, f"docs/{guide}.md lost its After example"
    definitions, sep, calls = found[0].partition("\nfirst = ")
    assert sep, f"docs/{guide}.md: the example's calls no longer start with `first = `"
    return definitions, "first = " + calls


@pytest.fixture
def guide_project(tmp_path: Path) -> Iterator[Path]:
    """A project whose ``guide_tasks`` module holds both guides' task definitions."""
    (tmp_path / "guide_app.py").write_text(
        textwrap.dedent(
            f"""
            import os
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
            import django
            django.setup()
            from celery import Celery
            app = Celery("guides", include=["guide_tasks"])
            app.conf.update(broker_url={BROKER!r}, result_backend={RESULTS!r})
            """
        )
    )
    definitions = [_after_example(guide)[0] for guide in GUIDES]
    (tmp_path / "guide_tasks.py").write_text(
        "from guide_app import app\n\n" + "\n\n".join(definitions)
    )
    for url in (BROKER, RESULTS):
        redis.Redis.from_url(url).flushdb()
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for module in ("guide_app", "guide_tasks"):
            sys.modules.pop(module, None)
        for url in (BROKER, RESULTS):
            redis.Redis.from_url(url).flushdb()


def _run_calls(guide: str) -> dict[str, Any]:
    """Run the guide's calls (with its task module's names), return their namespace."""
    import guide_tasks

    namespace = dict(vars(guide_tasks))
    exec(_after_example(guide)[1], namespace)
    return namespace


def _worker(project: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(project), str(ROOT)])}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "guide_app",
            "worker",
            "--pool=solo",
            "-l",
            "warning",
        ],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_free(name: str) -> None:
    deadline = time.monotonic() + WAIT
    while locks.get(name) is not None:
        assert time.monotonic() < deadline, f"{name} still held after {WAIT} s"
        time.sleep(0.05)


def test_the_guides_examples_dedupe_then_run_on_a_real_worker(guide_project: Path) -> None:
    once = _run_calls("migrating-from-celery-once")
    # The duplicate raised DuplicateTaskError naming the queued task.
    assert once["holder"] == once["first"].id
    held = locks.get("sync_account:42")
    assert held is not None and held.task_id == once["first"].id

    singleton = _run_calls("migrating-from-celery-singleton")
    assert singleton["again"].id == singleton["first"].id
    held = locks.get("refresh_profile:bob")
    assert held is not None and held.task_id == singleton["first"].id

    worker = _worker(guide_project)
    try:
        for result in (once["first"], singleton["first"]):
            assert result.get(timeout=WAIT) is None  # the bodies are `...`
        _wait_free("sync_account:42")
        _wait_free("refresh_profile:bob")
        # Done: the same call queues (and runs) a new task.
        import guide_tasks

        later = guide_tasks.refresh_profile.delay("bob")
        assert later.id != singleton["first"].id
        assert later.get(timeout=WAIT) is None
    finally:
        worker.kill()  # a solo worker: no pool children; its tasks are done or moot
        worker.wait(10)
