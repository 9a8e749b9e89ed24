"""The engine under real faults: lost replies, a Redis down or full, stale nonces, renewals.

A real redis-server behind tests.tcp_proxy.TcpProxy, which loses replies or
refuses traffic on demand (a real server cannot be told to lose one reply), or a
port nothing listens on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redislock import LockBackendError, LockLost, LockManager, LockNotOwned
from django_redislock.engine.watchdog import watchdog
from tests.redis_server import RedisServer, free_port
from tests.tcp_proxy import TcpProxy


@pytest.fixture
def via_proxy(proxy: TcpProxy) -> LockManager:
    return LockManager(client=_client(proxy.port, 0, socket_timeout=1))


@pytest.fixture
def direct() -> LockManager:
    return LockManager("default")


def _wait_for(condition, what: str, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _client(port: int, retries: int, socket_timeout: float = 2) -> redis.Redis:
    """A client on *port* with *retries* of redis-py's own and no backoff."""
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_timeout=socket_timeout,
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


def test_an_acquire_granted_while_both_replies_were_lost_does_not_keep_the_lock(
    proxy: TcpProxy, via_proxy: LockManager, direct: LockManager, name: str
) -> None:
    lock = via_proxy.lock(name)
    lock.acquire()  # warm up: connection and scripts
    lock.release()
    proxy.drop_next_replies(2)
    with pytest.raises(LockBackendError):
        lock.acquire(blocking=False)
    assert direct.get(name).owner == lock.owner, "Redis granted it; the client does not know"
    with via_proxy.lock(name):  # the same thread, through another Lock object
        assert direct.get(name).hold_count == 1, "the unknown hold must not count"
    assert direct.get(name) is None, "after the with block the lock must be free"


def test_a_release_that_failed_does_not_keep_the_lock_after_the_next_with_block(
    proxy: TcpProxy, via_proxy: LockManager, direct: LockManager, name: str
) -> None:
    lock = via_proxy.lock(name, auto_renew=False)
    lock.acquire()
    proxy.set_down(True)
    with pytest.raises(LockBackendError):
        lock.release()
    proxy.set_down(False)
    assert direct.get(name).hold_count == 1, "the release never reached Redis"
    for _ in range(3):
        with via_proxy.lock(name):
            pass
    assert direct.get(name) is None, "the thread must not keep the lock by using it"


def test_a_hand_off_to_a_waiter_whose_acquire_raised_is_not_monopolised(
    proxy: TcpProxy, via_proxy: LockManager, direct: LockManager, name: str
) -> None:
    holder = direct.lock(name, owner="holder")
    assert holder.acquire()
    queue_key = direct.backend().keyspace.keys(name).queue

    def cut_then_release() -> None:
        _wait_for(lambda: direct.client.llen(queue_key) == 1, "the waiter never queued")
        proxy.set_down(True)
        holder.release()  # handed to the waiter in Redis; the waiter cannot hear it

    cutter = threading.Thread(target=cut_then_release)
    cutter.start()
    with pytest.raises(LockBackendError):
        via_proxy.lock(name).acquire(timeout=10)
    cutter.join(5)
    waiter_owner = via_proxy.lock(name).owner
    handoffs = [e for e in direct.history(name) if e.event == "handoff"]
    info = direct.get(name)
    if handoffs:
        assert [e.waiter for e in handoffs] == [waiter_owner], "handed to another"
        # The hand-off's short claim lease (2 s) may already have run out on a loaded
        # machine: the lock is then free; else the waiter that never heard of it holds it.
        assert info is None or info.owner == waiter_owner
    else:
        # Cutting the proxy closed the waiter's subscription too: when Redis saw that
        # before the release ran, the release's PUBLISH reached nobody and it passed the
        # waiter over (a confirmed subscription that is gone: scripts.WAKE_SURE), freeing
        # the lock. (CI's middle cell met this order.)
        assert info is None, "nobody handed it, yet it is held"
    proxy.set_down(False)
    with via_proxy.lock(name, timeout=5):
        pass
    assert direct.get(name) is None, "after the with block the lock must be free"


def test_a_stale_release_nonce_does_not_hide_a_loss(
    proxy: TcpProxy, via_proxy: LockManager, direct: LockManager, name: str
) -> None:
    lock = via_proxy.lock(name, auto_renew=False)
    lock.acquire()
    proxy.drop_next_replies(2)  # the release runs, both replies are lost
    with pytest.raises(LockBackendError):
        lock.release()
    assert direct.get(name) is None
    assert lock.acquire(), "a new hold"
    assert direct.force_release(name)
    other = direct.lock(name, owner="someone else")
    assert other.acquire()
    with pytest.raises(LockNotOwned):
        lock.release()
    assert direct.get(name).owner == "someone else"


def test_renewal_never_gives_a_lock_without_expiry_an_expiry(
    direct: LockManager, name: str, redis_client: redis.Redis
) -> None:
    outer = direct.lock(name, ttl=None, no_expiry=True)
    inner = direct.lock(name, ttl=0.3)  # same thread: a leased re-entry, renewed every 0.1 s
    assert outer.acquire()
    assert inner.acquire()
    key = direct.backend().keyspace.keys(name).lock
    time.sleep(0.5)  # several renewal rounds of the inner hold
    assert redis_client.pttl(key) == -1, "the outer hold has no expiry"
    inner.release()
    time.sleep(0.5)  # longer than the inner lease
    assert direct.get(name) is not None and redis_client.pttl(key) == -1
    outer.release()


def _partitionable(proxy: TcpProxy) -> LockManager:
    """A manager whose client hangs (3 s socket timeout) when the proxy blackholes it."""
    return LockManager(client=_client(proxy.port, 0, socket_timeout=3))


@pytest.mark.slow
def test_a_partitioned_holder_learns_of_its_loss_before_the_lease_runs_out(
    proxy: TcpProxy, direct: LockManager, name: str, redis_client: redis.Redis
) -> None:
    manager = _partitionable(proxy)
    lock = manager.lock(name, ttl=1)
    key = direct.backend().keyspace.keys(name).lock
    with pytest.raises(LockLost) as caught:
        with lock:
            proxy.blackhole(True)
            deadline = time.monotonic() + 5
            lost_at = expired_at = None
            while lost_at is None or expired_at is None:
                assert time.monotonic() < deadline, (lost_at, expired_at)
                now = time.monotonic()
                if lost_at is None and lock.lost:
                    lost_at = now
                if expired_at is None and not redis_client.exists(key):
                    expired_at = now
                time.sleep(0.005)
            assert lost_at < expired_at, "the holder must know before the lease runs out"
    assert isinstance(caught.value.__cause__, LockBackendError), "Redis was unreachable"
    proxy.blackhole(False)


@pytest.mark.slow
def test_a_stalled_redis_does_not_stop_the_renewals_of_another(
    proxy: TcpProxy, direct: LockManager, name: str, redis_client: redis.Redis
) -> None:
    # Two backends: one on the plain connection, one whose connection is partitioned.
    stalled = _partitionable(proxy)
    healthy = direct.lock(name, ttl=1)
    cut_off = stalled.lock(f"{name}:other", ttl=1)
    assert cut_off.acquire()
    assert healthy.acquire()
    proxy.blackhole(True)
    key = direct.backend().keyspace.keys(name).lock
    until = time.monotonic() + 3  # three leases
    while time.monotonic() < until:
        assert redis_client.exists(key), "the healthy server's lock expired: renewals stalled"
        time.sleep(0.01)
    assert not healthy.lost
    healthy.release()
    proxy.blackhole(False)


@pytest.mark.slow
def test_a_lock_handed_to_a_dead_waiter_costs_the_claim_window_not_its_lease(
    direct: LockManager, name: str, redis_client: redis.Redis
) -> None:
    holder = direct.lock(name, owner="holder")
    assert holder.acquire()
    queue_key = direct.backend().keyspace.keys(name).queue
    doomed = subprocess.Popen(
        [sys.executable, "-m", "tests.proc", "wait_for", name, "30"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: redis_client.llen(queue_key) == 1, "the doomed waiter never queued", 20)
        doomed.kill()  # its queue entry stays valid for a few seconds
        doomed.wait(5)
        survivor = direct.lock(name, ttl=30)
        outcome: list[float] = []

        def wait() -> None:
            started = time.monotonic()
            if survivor.acquire(timeout=15):
                outcome.append(time.monotonic() - started)
                survivor.release()

        waiter = threading.Thread(target=wait)
        waiter.start()
        _wait_for(lambda: redis_client.llen(queue_key) == 2, "the survivor never queued")
        released_at = time.monotonic()
        holder.release()  # handed to the dead waiter, first in line
        waiter.join(20)
        assert outcome, "the live waiter never got the lock"
        waited = time.monotonic() - released_at
        assert waited < 5, f"the dead waiter's hand-off cost {waited:.1f} s (its lease is 30 s)"
    finally:
        doomed.kill()
        doomed.wait(5)


def test_releasing_cancelling_and_force_releasing_work_when_redis_is_full(name: str) -> None:
    server = RedisServer("--maxmemory-policy", "noeviction")
    try:
        manager = LockManager(url=f"{server.url}?socket_timeout=5")
        raw = redis.Redis.from_url(server.url)
        held = manager.lock(name, auto_renew=False)
        assert held.acquire() and held.acquire()  # two holds: a partial release comes first
        forced = manager.lock(f"{name}:forced", owner="stuck")
        assert forced.acquire()
        blocker = manager.lock(f"{name}:busy", owner="blocker")
        assert blocker.acquire()
        waiter = manager.lock(f"{name}:busy")
        assert waiter.acquire(timeout=0.05) is False  # subscribes the wake-up hub beforehand
        waited: list[bool] = []
        queued_waiter = threading.Thread(target=lambda: waited.append(waiter.acquire(timeout=0.5)))
        queued_waiter.start()
        queue_key = manager.backend().keyspace.keys(f"{name}:busy").queue
        _wait_for(lambda: raw.llen(queue_key) == 1, "the waiter never queued")
        raw.config_set("maxmemory", 1)  # far below what is used: Redis is full
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            raw.set("junk", "x")
        with pytest.raises(LockBackendError, match="out of memory"):
            manager.lock(f"{name}:new").acquire(blocking=False)
        assert held.release() == 1
        assert held.release() == 0
        assert manager.get(name) is None
        assert manager.force_release(f"{name}:forced")
        queued_waiter.join(5)
        assert waited == [False], "the wait timed out and was cancelled at maxmemory"
        assert raw.llen(queue_key) == 0
        blocker.release()
    finally:
        server.stop()


def test_a_child_forked_while_a_thread_held_the_pool_lock_does_not_hang(
    direct: LockManager, name: str
) -> None:
    """The fork hazard made deterministic: instead of forking hundreds of times under
    load until a fork lands while the watchdog or a waiter is inside the connection
    pool, a parent thread holds the real pool's lock across a real fork(). The
    parent has a subscribed wake-up hub too: dropping it in the child must not hang.
    Every after-fork hook must run (none may stop the rest by raising): the child's
    watchdog forgets the parent's held lock."""
    assert direct.lock(name).acquire(blocking=False)  # the pool exists and is ours
    direct.lock(name).release()
    kept = direct.lock(f"{name}:kept")
    assert kept.acquire(blocking=False) and watchdog.watched() >= 1
    blocker = direct.lock(f"{name}:busy", owner="someone else")
    assert blocker.acquire()
    assert direct.lock(f"{name}:busy").acquire(timeout=0.05) is False  # subscribes the hub
    blocker.release()
    pool = direct.client.connection_pool
    holding, done = threading.Event(), threading.Event()

    def hold_pool_lock() -> None:
        with pool._lock:
            holding.set()
            done.wait(10)

    holder = threading.Thread(target=hold_pool_lock)
    holder.start()
    assert holding.wait(5)
    try:
        pid = os.fork()
        if pid == 0:  # the child: one lock round trip, then report by exit status
            status = 1
            try:
                if watchdog.watched() != 0:
                    status = 2  # the hooks stopped before the watchdog's reset
                else:
                    with direct.lock(f"{name}:child", timeout=5):
                        status = 0
            finally:
                os._exit(status)
        deadline = time.monotonic() + 15
        while True:
            finished, status = os.waitpid(pid, os.WNOHANG)
            if finished:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung on its first Redis command")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0, "2: the child still watched a lock"
    finally:
        done.set()
        holder.join(5)
        kept.release()
