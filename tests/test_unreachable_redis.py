"""The first lock call to a Redis that cannot be reached, with the default settings.

``REDISLOCK_CLUSTER`` is None by default: the client is chosen by asking the server
whether it is a cluster node. When the server is down, that question must not
become the error (issue 41, defect 7): the first call fails as every later call
does, with the ``LockBackendError`` naming its lock and the server, and the
question is asked again once the server answers. A real redis-server is started
and stopped (its port is then free), and the runner is a real process.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator

import pytest
from django.test import override_settings

from django_redislock import LockBackendError, LockManager, locks
from django_redislock.runner.runner import EXIT_UNAVAILABLE
from example_project.embedded_redis import EmbeddedRedis
from tests.redis_server import RedisServer
from tests.runners import PY, ROOT, clean_env


@pytest.fixture
def gone() -> Iterator[int]:
    """The port of a redis-server that was started, then stopped (nothing listens there)."""
    server = RedisServer()
    port = server.port
    server.stop()
    yield port


def _says_what_failed(message: str, lock: str, port: int) -> None:
    assert f"lock {lock!r}" in message, message
    assert f"127.0.0.1:{port}" in message, message
    assert "REDISLOCK_CLUSTER" not in message and "cluster" not in message, message


def test_the_first_call_names_the_lock_and_the_server(gone: int) -> None:
    manager = LockManager(url=f"redis://127.0.0.1:{gone}/0")
    for attempt in range(2):  # the first call, then a later one: the same error
        with pytest.raises(LockBackendError) as raised:
            manager.lock("report:7").acquire(blocking=False)
        _says_what_failed(str(raised.value), "report:7", gone)
        assert raised.value.name == "report:7", attempt


def test_the_default_manager_with_the_default_settings(gone: int) -> None:
    with override_settings(REDISLOCK_URL=f"redis://127.0.0.1:{gone}/0"):
        with pytest.raises(LockBackendError) as raised:
            with locks.lock("nightly-report"):
                pass
        _says_what_failed(str(raised.value), "nightly-report", gone)
        with pytest.raises(LockBackendError) as looked:
            locks.get("nightly-report")
        _says_what_failed(str(looked.value), "nightly-report", gone)


def test_the_first_async_call_names_the_lock_and_the_server(gone: int) -> None:
    manager = LockManager(url=f"redis://127.0.0.1:{gone}/0")

    async def first_call() -> None:
        await manager.lock("report:8").aacquire(blocking=False)

    with pytest.raises(LockBackendError) as raised:
        asyncio.run(first_call())
    _says_what_failed(str(raised.value), "report:8", gone)


def test_the_server_is_asked_again_once_it_answers(gone: int) -> None:
    manager = LockManager(url=f"redis://127.0.0.1:{gone}/0")
    with pytest.raises(LockBackendError):
        manager.lock("report:9").acquire(blocking=False)
    server = EmbeddedRedis(port=gone)
    try:
        server.wait_ready()
        lock = manager.lock("report:9", ttl=5)
        assert lock.acquire(blocking=False)
        lock.release()
    finally:
        server.stop()


def test_the_runner_names_the_lock_and_the_server(gone: int) -> None:
    result = subprocess.run(
        [PY, "-m", "django_redislock", "run", "nightly", "--url",
         f"redis://127.0.0.1:{gone}/0", "--", PY, "-c", "pass"],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == EXIT_UNAVAILABLE, result.stderr
    assert "cannot reach Redis, not starting the command" in result.stderr
    _says_what_failed(result.stderr, "nightly", gone)
