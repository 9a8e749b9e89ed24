"""wait_replicas on real replicated Redis: a primary and a replica (through a proxy
that can slow the replication stream), a SIGSTOPped replica, failovers by SIGKILL
with a manual promotion and with three real sentinels."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
import redis.sentinel
from django.test import override_settings

from django_redislock import Lock, LockManager
from django_redislock.checks import check_server, check_settings
from django_redislock.exceptions import LockBackendError, LockNotReplicated
from example_project.embedded_redis import EmbeddedRedis
from tests.replication import FAST_SYNC, SERVICE, ReplicatedPair, SentinelSetup, wait_until


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    setup = ReplicatedPair()
    try:
        yield setup
    finally:
        setup.stop()


@pytest.fixture(autouse=True)
def _short_wait() -> Iterator[None]:
    with override_settings(REDISLOCK_WAIT_TIMEOUT=0.2):
        yield


def _manager(port: int) -> LockManager:
    return LockManager(client=redis.Redis(port=port, socket_timeout=5))


def _confirmed(acquire: Callable[..., bool]) -> bool:
    """One non-blocking try; an unconfirmed grant (the replica still catching up) is a no."""
    try:
        return acquire(blocking=False)
    except LockNotReplicated:
        return False


async def _aconfirmed(lock: Lock) -> bool:
    """:func:`_confirmed` for asyncio."""
    try:
        return await lock.aacquire(blocking=False)
    except LockNotReplicated:
        return False


class _Stopped:
    """SIGSTOP a server for the duration of a with block (SIGCONT however it ends)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> _Stopped:
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def __exit__(self, *exc: object) -> None:
        self.resume()


def test_a_confirmed_grant_is_on_the_replica_when_acquire_returns(
    pair: ReplicatedPair, name: str
) -> None:
    pair.proxy.reply_delay = 0.05  # a lagging replica: 50 ms behind
    manager = _manager(pair.primary.port)
    confirmed = manager.lock(name, wait_replicas=1, auto_renew=False)
    # Blocking: on a loaded machine one WAIT (0.5 s) may pass before the lagging replica
    # answers; the grant is then given back and asked for again.
    assert confirmed.acquire(timeout=10)
    key = confirmed.key
    assert pair.replica_client.hget(key, "owner") == confirmed.owner.encode()
    confirmed.release()
    # The same without waiting: the replica has not seen the grant yet.
    unconfirmed = manager.lock(name + ":plain", wait_replicas=0, auto_renew=False)
    assert unconfirmed.acquire(blocking=False)
    assert pair.replica_client.exists(unconfirmed.key) == 0
    unconfirmed.release()


def test_an_unconfirmed_grant_is_given_back_and_reported(pair: ReplicatedPair, name: str) -> None:
    manager = _manager(pair.primary.port)
    lock = manager.lock(name, wait_replicas=1, auto_renew=False)
    with _Stopped(pair.replica.process.pid):
        started = time.monotonic()
        with pytest.raises(LockNotReplicated, match="0 of the 1 replicas") as caught:
            lock.acquire(blocking=False)
        assert time.monotonic() - started < 2.0
        assert (caught.value.acks, caught.value.required) == (0, 1)
        assert pair.primary_client.exists(lock.key) == 0, "the unconfirmed grant was kept"
        assert not lock.owned()
        with pytest.raises(LockNotReplicated):
            with manager.lock(name, wait_replicas=1, blocking=False):
                pass
    wait_until(lambda: _confirmed(lock.acquire), 5, "a confirmed grant after SIGCONT")
    assert lock.release() == 0


def test_a_blocking_acquire_retries_until_the_replica_confirms(
    pair: ReplicatedPair, name: str
) -> None:
    manager = _manager(pair.primary.port)
    lock = manager.lock(name, wait_replicas=1, auto_renew=False)
    with _Stopped(pair.replica.process.pid) as stopped:
        resumed_at: list[float] = []

        def resume() -> None:
            resumed_at.append(time.monotonic())
            stopped.resume()

        timer = threading.Timer(0.5, resume)
        timer.start()
        try:
            assert lock.acquire(timeout=10)
        finally:
            timer.cancel()
        assert resumed_at and time.monotonic() >= resumed_at[0]
    assert pair.replica_client.hget(lock.key, "owner") == lock.owner.encode()
    lock.release()


def test_a_blocking_acquire_that_runs_out_of_time_raises(pair: ReplicatedPair, name: str) -> None:
    manager = _manager(pair.primary.port)
    lock = manager.lock(name, wait_replicas=1, auto_renew=False)
    with _Stopped(pair.replica.process.pid):
        with pytest.raises(LockNotReplicated):
            lock.acquire(timeout=0.8)
        assert pair.primary_client.exists(lock.key) == 0
        assert pair.primary_client.llen(manager.backend().keyspace.keys(name).queue) == 0


def test_a_hand_off_counts_only_once_the_replica_confirms_it(
    pair: ReplicatedPair, name: str
) -> None:
    manager = _manager(pair.primary.port)
    holder = manager.lock(name, wait_replicas=1, auto_renew=False)
    assert holder.acquire()
    got: list[tuple[float, bool, bytes | None]] = []
    ready = threading.Event()

    def wait_for_it() -> None:
        waiter = manager.lock(name, wait_replicas=1, auto_renew=False)
        ready.set()
        acquired = waiter.acquire(timeout=15)
        # Checked on the replica right away: a confirmed grant is there.
        got.append((time.monotonic(), acquired, pair.replica_client.hget(waiter.key, "owner")))
        if acquired:
            got.append((0.0, True, waiter.owner.encode()))
            waiter.release()

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    ready.wait(5)
    queue = manager.backend().keyspace.keys(name).queue
    wait_until(lambda: pair.primary_client.llen(queue) == 1, 5, "the waiter to queue")
    with _Stopped(pair.replica.process.pid) as stopped:
        holder.release()  # hands the lock to the waiter, which cannot get it confirmed
        time.sleep(0.6)  # the waiter keeps trying meanwhile: it must not return
        assert not got, "the waiter returned while the replica could not confirm"
        resumed = time.monotonic()
        stopped.resume()
    thread.join(20)
    assert not thread.is_alive()
    when, acquired, replica_owner = got[0]
    assert acquired and when >= resumed
    assert replica_owner == got[1][2]


def test_an_unconfirmed_extension_raises_and_the_lock_stays_held(
    pair: ReplicatedPair, name: str
) -> None:
    lock = _manager(pair.primary.port).lock(name, ttl=30, wait_replicas=1, auto_renew=False)
    assert lock.acquire()
    with _Stopped(pair.replica.process.pid):
        with pytest.raises(LockNotReplicated, match="extension"):
            lock.extend(10)
    assert lock.owned()
    assert lock.extend(10)
    lock.release()


def test_renewals_that_replicas_do_not_confirm_lose_the_lock(
    pair: ReplicatedPair, name: str
) -> None:
    manager = _manager(pair.primary.port)
    confirmed = manager.lock(name, ttl=1.5, wait_replicas=1, raise_on_lost=False)
    plain = manager.lock(name + ":plain", ttl=1.5, wait_replicas=0, raise_on_lost=False)
    assert confirmed.acquire() and plain.acquire()
    with _Stopped(pair.replica.process.pid):
        wait_until(lambda: confirmed.lost, 4, "the unconfirmed renewals to lose the lock")
        assert not plain.lost  # renewed on the primary, which is all it asks for
        assert plain.owned()
    plain.release()


def test_async_acquire_waits_for_the_replica(pair: ReplicatedPair, name: str) -> None:
    async def scenario() -> None:
        manager = _manager(pair.primary.port)
        lock = manager.lock(name, wait_replicas=1, auto_renew=False)
        with _Stopped(pair.replica.process.pid):
            with pytest.raises(LockNotReplicated):
                await lock.aacquire(blocking=False)
            assert pair.primary_client.exists(lock.key) == 0
        # The resumed replica may take a few tries to catch up on a loaded machine.
        for _ in range(100):
            if await _aconfirmed(lock):
                break
            await asyncio.sleep(0.05)
        assert pair.replica_client.hget(lock.key, "owner") == lock.owner.encode()
        assert await lock.arelease() == 0

    asyncio.run(scenario())


def test_wait_replicas_is_validated() -> None:
    manager = LockManager()
    with pytest.raises(TypeError, match="wait_replicas must be an int"):
        manager.lock("x", wait_replicas="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="between 0"):
        manager.lock("x", wait_replicas=-1)
    with override_settings(REDISLOCK_WAIT_REPLICAS=True):
        with pytest.raises(TypeError, match="REDISLOCK_WAIT_REPLICAS"):
            manager.lock("x")
    with override_settings(REDISLOCK_WAIT_REPLICAS=2):
        assert manager.lock("x").wait_replicas == 2


def _failover_round(wait_replicas: int, name: str) -> tuple[bool, int, int]:
    """One grant, a SIGKILL of the primary right after it and a promotion of the
    replica: (did a second client get the lock, first token, next token)."""
    pair = ReplicatedPair()
    try:
        pair.proxy.reply_delay = 0.03  # the replica lags 30 ms behind, as under load
        first = _manager(pair.primary.port).lock(
            name, ttl=60, wait_replicas=wait_replicas, auto_renew=False
        )
        wait_until(lambda: _confirmed(first.acquire), 5, "a confirmed first grant")
        token = first.fencing_token
        assert token is not None
        pair.kill_primary()
        pair.promote_replica()
        promoted = _manager(pair.replica.port)
        second = promoted.lock(name, ttl=60, auto_renew=False, owner="second client")
        double = second.acquire(blocking=False)
        if not double:
            promoted.force_release(name)
            assert second.acquire(blocking=False)
        next_token = second.fencing_token
        assert next_token is not None
        return double, token, next_token
    finally:
        pair.stop()


@pytest.mark.slow
@pytest.mark.parametrize("wait_replicas", [1, 0])
def test_failover_right_after_grants(wait_replicas: int, name: str) -> None:
    """With wait_replicas=1 a failover never gives the lock to a second client; without
    it, a replica that lags behind loses fresh grants (the failure the option prevents).
    Either way the next fencing token is larger."""
    rounds = [_failover_round(wait_replicas, f"{name}:{i}") for i in range(6)]
    doubles = sum(double for double, _, _ in rounds)
    assert all(after > before for _, before, after in rounds), rounds
    if wait_replicas:
        assert doubles == 0
    else:
        assert doubles >= 1  # the hazard is real here, so the test above can fail


@pytest.fixture
def sentinels() -> Iterator[SentinelSetup]:
    setup = SentinelSetup()
    try:
        yield setup
    finally:
        setup.stop()


@pytest.mark.slow
def test_a_held_lock_survives_a_sentinel_failover(sentinels: SentinelSetup, name: str) -> None:
    sentinel = redis.sentinel.Sentinel(sentinels.sentinels, socket_timeout=0.5)
    manager = LockManager(client=sentinel.master_for(SERVICE, socket_timeout=0.5))
    # The lease must outlast the failover and the rejoin: with no replica, renewals fail.
    holder = manager.lock(name, ttl=20, wait_replicas=1, raise_on_lost=False)
    assert holder.acquire(blocking=False)
    token = holder.fencing_token
    assert token is not None
    old_port = sentinels.master_port()
    old = sentinels.server_on(old_port)
    old.process.send_signal(signal.SIGKILL)
    old.process.wait(5)
    wait_until(lambda: sentinels.master_port() != old_port, 30, "the sentinels to fail over")

    other = manager.lock(name, ttl=12, auto_renew=False, owner="other client")

    def refused_by_new_primary() -> bool:
        try:
            return not other.acquire(blocking=False)
        except LockBackendError:
            return False  # the client has not found the new primary yet

    wait_until(refused_by_new_primary, 15, "the new primary to answer")
    assert not holder.lost
    assert holder.owned()
    # The old primary comes back as a replica of the new one (started so, as an operator's
    # restart would do it: sentinels alone convert a returning primary only after 10-20 s
    # of INFO polling, which races the lease), and confirmed extensions work again.
    restarted = EmbeddedRedis(
        port=old_port,
        extra_args=(*FAST_SYNC, "--replicaof", "127.0.0.1", str(sentinels.master_port())),
    )
    try:
        restarted.wait_ready()
        back = redis.Redis(port=old_port, socket_timeout=1)
        wait_until(lambda: back.hget(holder.key, "owner") is not None, 30, "the rejoined replica")

        def confirmed_extension() -> bool:
            try:
                return holder.extend(5)
            except LockNotReplicated:  # its first acknowledgement may come after the WAIT
                return False

        wait_until(confirmed_extension, 10, "an extension the rejoined replica confirms")
        assert holder.release() == 0
        assert other.acquire(blocking=False)
        assert other.fencing_token is not None and other.fencing_token > token
        other.release()
    finally:
        restarted.stop()


def test_checks_compare_wait_replicas_with_the_connected_replicas(
    pair: ReplicatedPair,
) -> None:
    with override_settings(REDISLOCK_URL=pair.primary.url):
        assert [m.id for m in check_server(databases=["default"])] == ["django_redislock.W004"]
        with override_settings(REDISLOCK_WAIT_REPLICAS=1):
            assert check_server(databases=["default"]) == []
        with override_settings(REDISLOCK_WAIT_REPLICAS=2):
            messages = check_server(databases=["default"])
            assert [m.id for m in messages] == ["django_redislock.E003"]
            assert "has 1 replica(s) connected" in messages[0].msg
    with override_settings(REDISLOCK_WAIT_REPLICAS=1):  # the test Redis has none
        assert [m.id for m in check_server(databases=["default"])] == ["django_redislock.E003"]
    with override_settings(REDISLOCK_WAIT_REPLICAS="one", REDISLOCK_WAIT_TIMEOUT=0):
        assert [m.id for m in check_settings()] == ["django_redislock.E002"] * 2
