"""Network faults between client and Redis, injected with a loopback TCP proxy.

A real redis-server cannot "lose a reply" on demand, so these tests place
tests.tcp_proxy.TcpProxy between the client and the real server.
"""

from __future__ import annotations

import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redislock import LockBackendError, LockManager
from tests.redis_server import free_port
from tests.tcp_proxy import TcpProxy


def _client(port: int, retries: int) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_timeout=2,
        socket_connect_timeout=1,
        retry=Retry(NoBackoff(), retries),
    )


@pytest.mark.parametrize("retries", [0, 3], ids=["our-retry", "redis-py-retries"])
def test_lost_acquire_reply_is_resolved_not_reported_busy(
    proxy: TcpProxy, name: str, redis_client, retries: int
) -> None:
    manager = LockManager(client=_client(proxy.port, retries))
    lock = manager.lock(name)
    lock.locked()  # warm up: scripts and connection
    proxy.drop_next_replies(1)
    assert lock.acquire(blocking=False)
    assert proxy.dropped == 1
    info = manager.get(name)
    assert info.owner == lock.owner
    assert info.hold_count == 1, "a retried acquire must not count twice"
    lock.release()
    assert redis_client.exists(info.key) == 0


def test_lost_release_reply_does_not_release_twice(
    proxy: TcpProxy, name: str, redis_client
) -> None:
    manager = LockManager(client=_client(proxy.port, 0))
    lock = manager.lock(name)
    lock.acquire()
    lock.acquire()
    proxy.drop_next_replies(1)
    lock.release()  # the reply is lost; the retry must not decrement again
    assert manager.get(name).hold_count == 1
    proxy.drop_next_replies(1)
    lock.release()
    assert manager.get(name) is None


def test_failed_release_keeps_the_hold_so_it_can_be_retried(
    proxy: TcpProxy, name: str, redis_client
) -> None:
    manager = LockManager(client=_client(proxy.port, 0))
    lock = manager.lock(name, auto_renew=False)
    lock.acquire()
    proxy.set_down(True)
    with pytest.raises(LockBackendError):
        lock.release()
    assert lock.fencing_token is not None
    proxy.set_down(False)
    assert lock.owned()
    lock.release()
    assert redis_client.exists(manager.backend().keyspace.keys(name).lock) == 0


def test_redis_down_raises_backend_error_promptly(name: str) -> None:
    manager = LockManager(url=f"redis://127.0.0.1:{free_port()}/0")
    started = time.monotonic()
    for call in (
        lambda: manager.lock(name).acquire(blocking=False),
        lambda: manager.lock(name).acquire(timeout=5),
        lambda: manager.lock(name).locked(),
        lambda: manager.get(name),
        lambda: list(manager.active()),
        lambda: manager.force_release(name),
    ):
        with pytest.raises(LockBackendError) as caught:
            call()
        assert isinstance(caught.value.__cause__, redis.RedisError)
    assert time.monotonic() - started < 10


def test_a_backend_error_of_a_lock_call_names_the_lock(name: str) -> None:
    manager = LockManager(client=_client(free_port(), retries=0))
    lock = manager.lock(name)
    for call in (
        lambda: lock.acquire(blocking=False),
        lambda: lock.acquire(timeout=1),
        lock.locked,
        lock.info,
        lambda: lock.extend(5),
        lambda: manager.get(name),
        lambda: manager.history(name),
        lambda: manager.force_release(name),
        lambda: manager.force_extend(name, 5),
        lambda: manager.semaphore(name, 2).acquire(blocking=False),
    ):
        with pytest.raises(LockBackendError) as caught:
            call()
        assert caught.value.name == caught.value.lock_name == name
        assert str(caught.value).startswith(f"lock {name!r}: Redis error while trying to ")


def test_wrong_type_key_is_a_backend_error(manager: LockManager, name: str, redis_client) -> None:
    redis_client.set(manager.backend().keyspace.keys(name).lock, "not a hash")
    with pytest.raises(LockBackendError, match="WRONGTYPE"):
        manager.lock(name).acquire(blocking=False)


def test_with_block_whose_release_fails_stops_renewing(
    proxy: TcpProxy, name: str, redis_client
) -> None:
    from django_redislock.engine.watchdog import watchdog

    manager = LockManager(client=_client(proxy.port, 0))
    # A lease long enough that a slow machine does not declare the hold lost (a
    # LockLost) before the block ends.
    lock = manager.lock(name, ttl=1.5)
    with pytest.raises(LockBackendError):
        with lock:
            assert watchdog.watched() == 1
            proxy.set_down(True)
    assert watchdog.watched() == 0, "a lock whose block has ended must not be kept alive"
    assert lock.fencing_token is not None, "the hold is kept so release() can be retried"
    proxy.set_down(False)
    deadline = time.monotonic() + 5
    key = manager.backend().keyspace.keys(name).lock
    while redis_client.exists(key):
        assert time.monotonic() < deadline, "the lease should run out without renewal"
        time.sleep(0.02)
