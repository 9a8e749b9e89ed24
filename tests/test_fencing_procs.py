"""A holder stopped past its lease, then continued, is refused by every store.

A child process (tests/fencing_proc.py) holds a lock and is frozen with SIGSTOP (its
watchdog too, so its lease runs out); this process takes the lock over and writes; the
child is continued and writes through each guarded path, sync and async: Redis
(check, SET, HSET, INCRBY, DEL, a generic command) and the databases (SQLite, and a
real PostgreSQL). Every guarded write is refused and the new holder's writes stay,
while the child's one plain write (the control) lands: the child really did write late.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db import connections

from django_redislock import locks
from tests.fencing_models import Invoice
from tests.postgres_server import PostgresServer
from tests.test_fencing_db import add_database
from tests.test_multiprocess import _expect_line

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

GUARDED = ["check", "set", "hset", "incrby", "delete", "execute"]
AGUARDED = ["acheck", "aset", "ahset", "aincrby", "adelete", "aexecute"]


@pytest.fixture
def databases(
    postgres: PostgresServer, tmp_path: Path, django_db_blocker: Any
) -> Iterator[dict[str, dict[str, Any]]]:
    """Two databases with an Invoice table and row 1: a SQLite file and PostgreSQL."""
    entries: dict[str, dict[str, Any]] = {
        "zsqlite": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "z.db")},
        "zpostgresql": postgres.settings(),
    }
    with django_db_blocker.unblock():
        for alias, entry in entries.items():
            add_database(alias, entry)
            with connections[alias].schema_editor() as editor:
                editor.create_model(Invoice)
            Invoice.objects.using(alias).create(pk=1, note="initial")
        try:
            yield entries
        finally:
            for alias in entries:
                with connections[alias].schema_editor() as editor:
                    editor.delete_model(Invoice)
                connections[alias].close()
                del connections[alias]
                del connections.settings[alias]


def _spawn(name: str, prefix: str, databases: dict[str, Any]) -> subprocess.Popen[str]:
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONPATH=str(ROOT),
        FENCING_DATABASES=json.dumps(
            {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}, **databases}
        ),
    )
    return subprocess.Popen(
        [sys.executable, "-m", "tests.fencing_proc", name, "1.0", prefix, "1"],
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_a_holder_continued_after_its_lease_is_refused_by_every_guarded_store(
    name: str, redis_client: redis.Redis, databases: dict[str, Any], django_db_blocker: Any
) -> None:
    k = f"{name}:k"
    child = _spawn(name, k, databases)
    try:
        old = int(_expect_line(child, "acquired", 60)[1])
        os.kill(child.pid, signal.SIGSTOP)  # the holder and its watchdog freeze
        successor = locks.lock(name, owner="successor", ttl=30)
        assert successor.acquire(timeout=15), "the stopped holder's lease never ran out"
        new = successor.fencing_token
        assert new is not None and new > old
        g = successor.guarded()
        g.set(f"{k}:s", "successor")
        g.hset(f"{k}:h", {"by": "successor"})
        g.incrby(f"{k}:n", 100)
        g.set(f"{k}:d", "successor")
        g.execute("LPUSH", f"{k}:l", "successor")
        with django_db_blocker.unblock():
            for alias in databases:
                rows = Invoice.objects.using(alias).filter(pk=1)
                assert rows.fenced_update(token=new, note="successor") == 1

        os.kill(child.pid, signal.SIGCONT)
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        outcomes: dict[str, str] = {}
        while True:
            line = _expect_line(child, "", 60)
            if line == ["done"]:
                break
            if line and line[0] in ("refused", "wrote", "error"):
                outcomes[line[1]] = " ".join([line[0], *line[2:]])
        paths = GUARDED + AGUARDED + [f"{p}:{a}" for p in ("db", "adb") for a in databases]
        assert {p: outcomes.get(p) for p in paths} == {p: "refused" for p in paths}
        assert outcomes["plain"] == "wrote"  # the control: the child did write, late
        successor.release()
    finally:
        child.kill()
        child.wait(10)

    assert redis_client.get(f"{k}:s") == b"successor"
    assert redis_client.hgetall(f"{k}:h") == {b"by": b"successor"}
    assert redis_client.get(f"{k}:n") == b"100"
    assert redis_client.get(f"{k}:d") == b"successor"
    assert redis_client.lrange(f"{k}:l", 0, -1) == [b"successor"]
    assert redis_client.get(f"{k}:plain") == b"zombie"
    with django_db_blocker.unblock():
        for alias in databases:
            row = Invoice.objects.using(alias).get(pk=1)
            assert (row.note, row.fence) == ("successor", new), alias
