"""Enqueue-time dedupe of ``django.tasks`` with a real worker: django-tasks-db's
``db_worker`` in its own process, over a SQLite file, against the real test Redis.

The enqueues run in a child process too (the worker's settings: the database backend);
each prints the result id it got. Skipped without Django 6 and django-tasks-db.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("django.tasks", reason="django.tasks came in Django 6.0")
pytest.importorskip("django_tasks_db", reason="needs django-tasks-db (Django 6 cells)")

from django_redislock import locks  # noqa: E402
from tests.dtasks_jobs import probe  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
ENQUEUE = """
import sys
import django
django.setup()
from tests.dtasks_jobs import report
from django_tasks_db.models import DBTaskResult
for account in sys.argv[2:]:
    print(report.enqueue(int(account), sys.argv[1]).id)
print(DBTaskResult.objects.count())
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The worker's settings and a fresh database, migrated."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings_dtasks",
        "REDISLOCK_TEST_DTASKS_DB": str(tmp_path / "tasks.sqlite3"),
    }
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
    )
    return env


@pytest.fixture
def worker(env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """One ``db_worker`` polling every 0.1 s."""
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "db_worker", "--interval", "0.1"],
        cwd=ROOT,
        env=env,
    )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _enqueue(env: dict[str, str], tag: str, *accounts: int) -> tuple[list[str], int]:
    """Enqueue a report per account in a child process: the result ids, and how many
    tasks the database holds afterwards."""
    out = subprocess.run(
        [sys.executable, "-c", ENQUEUE, tag, *map(str, accounts)],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    ).stdout.split()
    return out[:-1], int(out[-1])


def _event(tag: str, timeout: float = 30) -> list[str]:
    got = probe.blpop([f"events:{tag}"], timeout=timeout)
    assert got is not None, f"no event on events:{tag} within {timeout} s"
    return got[1].decode().split()


def test_a_duplicate_enqueue_is_not_stored_and_the_run_takes_the_hold_over(
    env: dict[str, str], worker: subprocess.Popen[bytes], name: str
) -> None:
    # Three enqueues of account 1 (two while the first waits or runs) and one of 2.
    ids, stored = _enqueue(env, name, 1, 1, 2)
    assert ids[0] == ids[1] != ids[2] and stored == 2, (ids, stored)
    # The worker runs one task at a time; each run holds its key's lock as the
    # enqueue-time hold taken over: one owner (<hold token>:<nonce>), two holds.
    for _ in range(2):
        start = _event(name)
        assert start[0] == "start" and start[2].startswith("djtask:"), start
        assert start[2].count(":") == 2 and start[3] == "2", start
        if len(ids) == 3:  # while the first run runs: still deduplicated onto it
            more, stored = _enqueue(env, name, 1)
            ids += more
            # (account 1 is queued or running, whichever run this is)
            assert more[0] == ids[0] and stored == 2, (more, stored)
        probe.rpush(f"gate:{name}", "go")
        assert _event(name) == ["end"]
    for account in (1, 2):
        assert locks.get(f"dtasks-report:{account}") is None
    # Once it ran, the same key is queued again: a third run.
    again, stored = _enqueue(env, name, 1)
    assert again[0] not in ids and stored == 3
    assert _event(name)[0] == "start"
    probe.rpush(f"gate:{name}", "go")
    assert _event(name) == ["end"]
