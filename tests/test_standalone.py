"""django-redislock without Django settings: a script, and a Celery app with a real worker.

Everything here runs in child processes whose environment has no
``DJANGO_SETTINGS_MODULE`` (the test process itself has Django configured), on
the suite's real redis-server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
BASE = settings.REDIS_URL.rsplit("/", 1)[0]
DBS = {"STANDALONE_BROKER": 11, "STANDALONE_BACKEND": 12, "STANDALONE_LOCKS": 13}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update({name: f"{BASE}/{db}" for name, db in DBS.items()})
    env["PYTHONPATH"] = str(ROOT)
    return env


def _python(code: str, timeout: float = 60) -> dict[str, object]:
    """Run *code* in a fresh interpreter without Django settings; return its last JSON line."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture
def clean_dbs() -> Iterator[None]:
    for db in DBS.values():
        redis.Redis.from_url(f"{BASE}/{db}").flushdb()
    yield
    for db in DBS.values():
        redis.Redis.from_url(f"{BASE}/{db}").flushdb()


def test_a_script_locks_with_a_plain_client_or_a_configured_url(clean_dbs: None) -> None:
    out = _python(
        """
        import json, os, redis
        from django.conf import settings
        from django_redislock import LockManager, locks, single_instance
        from django_redislock.standalone import configure
        assert not settings.configured
        url = os.environ["STANDALONE_LOCKS"]
        out = {}
        manager = LockManager(client=redis.Redis.from_url(url))
        with manager.lock("plain", ttl=5) as held:
            out["plain_key"] = manager.get("plain").key
        try:
            locks.lock("nowhere").acquire()
        except Exception as exc:
            out["unconfigured"] = f"{type(exc).__name__}: {exc}"
        configure(REDISLOCK_URL=url, REDISLOCK_KEY_PREFIX="script", REDISLOCK_DEFAULT_TTL=7)
        with locks.lock("report") as held:
            info = locks.get("report")
            out["report"] = [info.key, info.lease]

        @single_instance("job:{n}")
        def job(n):
            return locks.get(f"job:{n}").hold_count

        out["job"] = job(1)
        try:
            configure(REDISLOCK_DEFUALT_TTL=3)
        except ValueError as exc:
            out["typo"] = str(exc)
        print(json.dumps(out))
        """
    )
    assert out["plain_key"] == "redislock:{plain}"
    assert str(out["unconfigured"]).startswith(
        "ImproperlyConfigured: django-redislock has no Redis"
    )
    assert "REDISLOCK_URL" in str(out["unconfigured"])
    assert out["report"] == ["script:{report}", 7.0]
    assert out["job"] == 1
    assert out["typo"] == (
        "REDISLOCK_DEFUALT_TTL is not a django-redislock setting; "
        "did you mean REDISLOCK_DEFAULT_TTL?"
    )
    held = [k for k in redis.Redis.from_url(f"{BASE}/13").keys("*") if b":slot:" not in k]
    assert held == []  # every lock released (fencing counters outlive their locks)


@pytest.mark.celery
def test_a_celery_app_without_django_dedupes_and_guards_on_a_real_worker(clean_dbs: None) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.standalone_app", "worker",
         "--pool=threads", "--concurrency=2", "-l", "info",
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out = _python(
            """
            import json, time, redis, os
            from django.conf import settings
            from django_redislock import locks
            from django_redislock.celery import is_skipped
            from tests.standalone_app import guarded, unique
            assert not settings.configured
            out = {}
            first = unique.delay(1, 1.0)
            out["held_while_queued"] = locks.get("unique:1") is not None
            out["lock_key"] = locks.get("unique:1").key
            again = unique.delay(1, 1.0)
            out["deduped"] = again.id == first.id
            out["unique_result"] = first.get(timeout=60)
            a, b = guarded.delay(5, 1.5), guarded.delay(5, 1.5)
            results = [a.get(timeout=30), b.get(timeout=30)]
            out["skipped"] = sorted(is_skipped(r) for r in results)
            out["ran"] = [r for r in results if not is_skipped(r)]
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and (locks.get("unique:1") or locks.get("run:5")):
                time.sleep(0.05)
            out["left"] = [n for n in ("unique:1", "run:5") if locks.get(n) is not None]
            print(json.dumps(out))
            """,
            timeout=120,
        )
    finally:
        worker.terminate()
        try:
            _, err = worker.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            _, err = worker.communicate()
    assert out["held_while_queued"] is True, err[-3000:]
    assert out["lock_key"] == "standalone:{unique:1}"  # the prefix from the app's conf
    assert out["deduped"] is True
    assert out["unique_result"] == 1
    assert out["skipped"] == [False, True]  # one ran, the duplicate was skipped
    assert out["ran"] == [5]
    assert out["left"] == []
