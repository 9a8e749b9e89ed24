"""Holds of semaphores and read-write locks whose release failed (Redis down), on a real
redis-server that is SIGKILLed and started again with its append-only file.

The failed release counts as done, as for a mutex (tests/test_engine_faults.py): the
same thread's next use adopts the orphaned hold and frees it, instead of treating it
as held (a write refused as an upgrade, a lock left held after the next block).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from django_redislock import LockBackendError, LockManager
from tests.restartable import RestartableRedis

pytestmark = pytest.mark.slow


@pytest.fixture
def server() -> Iterator[RestartableRedis]:
    """A redis-server whose every write is in its append-only file before it
    answers, SIGKILLed and started again by the tests."""
    server = RestartableRedis(persistent=True)
    yield server
    server.close()


@pytest.fixture
def manager(server: RestartableRedis) -> LockManager:
    return LockManager(client=redis.Redis.from_url(server.url))


def _release_fails_while_down(server: RestartableRedis, lock: object) -> None:
    """Leave a ``with`` block of *lock* while its server is down: the release fails;
    the server then comes back with the hold still in its append-only file."""
    with pytest.raises(LockBackendError):
        with lock:  # type: ignore[attr-defined]
            server.kill()
    server.start()


def test_a_write_after_a_read_whose_release_failed_is_no_upgrade(
    server: RestartableRedis, manager: LockManager, name: str
) -> None:
    rw = manager.rw_lock(name, ttl=30)
    _release_fails_while_down(server, rw.read())
    info = manager.get(name)
    assert info is not None and len(info.readers) == 1, "the read came back with Redis"
    with rw.write():  # the read block has ended: this is no upgrade
        info = manager.get(name)
        assert info is not None and info.writer is not None and not info.readers
    assert manager.get(name) is None, "after the block nothing may be held"


def test_a_read_after_a_write_whose_release_failed_leaves_nothing_held(
    server: RestartableRedis, manager: LockManager, name: str
) -> None:
    rw = manager.rw_lock(name, ttl=30)
    _release_fails_while_down(server, rw.write())
    with rw.read():
        pass
    assert manager.get(name) is None, "the orphaned write must not outlive the next block"


def test_a_permit_whose_release_failed_is_adopted_and_freed(
    server: RestartableRedis, manager: LockManager, name: str
) -> None:
    permits = manager.semaphore(name, 2, ttl=30)
    _release_fails_while_down(server, permits)
    with manager.semaphore(name, 2, ttl=30):  # another Lock object, the same thread
        info = manager.get(name)
        assert info is not None and len(info.holders) == 1
    assert manager.get(name) is None, "after the block no permit may be held"
