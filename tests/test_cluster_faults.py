"""Cluster faults on real servers: a slot migrating under a held lock (C3), replica
acknowledgements with a stopped replica and a primary killed under a renewed lock (C4).

No mocks: the migration is done with ``CLUSTER SETSLOT`` and ``MIGRATE``, the replica
is SIGSTOPped, the primary SIGKILLed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio

from django_redislock import LockManager, signals
from django_redislock.engine.backends.cluster import AsyncClusterBackend, ClusterBackend
from django_redislock.engine.calls import Call, NotReplicated
from django_redislock.engine.lua.mutex import renew_script
from django_redislock.exceptions import LockBackendError
from tests.redis_cluster import Cluster, RedisServer, shared_cluster
from tests.replication import wait_until


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    return shared_cluster()


@pytest.fixture(scope="module")
def manager(cluster: Cluster) -> LockManager:
    return LockManager(client=cluster.client())


def _slot_of(manager: LockManager, name: str) -> int:
    backend = manager.backend()
    return int(backend.client.keyslot(backend.keyspace.keys(name).lock))


def _renew(lock: Any, ttl_ms: int = 30_000, replicas: int = 0) -> Call:
    """The renewal call the watchdog builds for *lock*'s hold."""
    key = lock._source.backend().keyspace.keys(lock.name).lock
    return Call(renew_script, (key,), (lock.owner, ttl_ms), "renew the lock", lock.name, replicas)


# --- C3: resharding ------------------------------------------------------------------


def test_calls_retry_through_a_slot_migration_and_never_grant_twice(
    cluster: Cluster, manager: LockManager
) -> None:
    name = f"reshard:{uuid.uuid4().hex[:8]}"
    holder = manager.lock(name, auto_renew=False)
    assert holder.acquire(blocking=False)
    token = holder.fencing_token
    slot, target, finish_now = _migrate_the_lock_hash_only(cluster, manager, name)
    assert manager.backend().run_many([_renew(holder)]) == [1]

    def finish() -> None:
        time.sleep(0.5)  # the calls below retry meanwhile
        finish_now()

    finisher = threading.Thread(target=finish)
    finisher.start()
    other = manager.lock(name, owner="other", auto_renew=False)
    outcome: dict[str, bool] = {}
    contender = threading.Thread(
        target=lambda: outcome.setdefault("other", other.acquire(blocking=False))
    )
    contender.start()
    started = time.monotonic()
    assert holder.release() == 0  # retried through TRYAGAIN until the slot settled
    waited = time.monotonic() - started
    finisher.join(10)
    contender.join(10)
    assert waited > 0.2, "the release was not held up by the migration"
    info = manager.get(name)
    if outcome["other"]:  # it came after the release: the one holder is "other"
        assert info is not None and info.owner == "other"
        assert other.fencing_token is not None and token is not None
        assert other.fencing_token > token
        other.release()
    else:
        assert info is None
    assert cluster.server_for_slot(slot) is target
    assert manager.backend().run_many([_renew(holder)]) == [0]  # MOVED followed, not owned


def _migrate_the_lock_hash_only(
    cluster: Cluster, manager: LockManager, name: str
) -> tuple[int, RedisServer, Any]:
    """Start moving *name*'s slot to another primary and move only its lock hash:
    the 4-key scripts then get TRYAGAIN (the fence hash is still on the source), the
    1-key renewal is sent on with ASK. Returns (slot, target, a function finishing
    the migration)."""
    slot = _slot_of(manager, name)
    source = cluster.server_for_slot(slot)
    target = next(s for s in cluster.primaries if s is not source and s.process.poll() is None)
    keys = manager.backend().keyspace.keys(name)
    src, dst = cluster.node(source), cluster.node(target)
    src_id, dst_id = src.execute_command("CLUSTER MYID"), dst.execute_command("CLUSTER MYID")
    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", keys.lock)

    def finish() -> None:
        rest = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 100)
        if rest:
            src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *rest)
        for server in [target, source, *cluster.primaries]:
            if server.process.poll() is None:
                cluster.node(server).execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)

    return slot, target, finish


def test_an_acquire_stops_retrying_a_migrating_slot_at_its_timeout(
    cluster: Cluster, manager: LockManager
) -> None:
    name = f"reshard:{uuid.uuid4().hex[:8]}"
    holder = manager.lock(name, auto_renew=False)
    assert holder.acquire(blocking=False)
    _slot, _target, finish = _migrate_the_lock_hash_only(cluster, manager, name)
    try:
        other = manager.lock(name, owner="other", auto_renew=False)
        started = time.monotonic()
        with pytest.raises(LockBackendError, match="TRYAGAIN|TTL exhausted"):
            other.acquire(timeout=0.3)
        # The caller's timeout, not the backend's 5 s window, bounded the retries.
        assert time.monotonic() - started < 2.0
    finally:
        finish()
    assert holder.release() == 0


# --- C4: replica acknowledgements ----------------------------------------------------


def _paused(server: RedisServer) -> Any:
    class Paused:
        def __enter__(self) -> None:
            os.kill(server.process.pid, signal.SIGSTOP)

        def __exit__(self, *exc: object) -> None:
            os.kill(server.process.pid, signal.SIGCONT)

    return Paused()


def test_wait_on_the_key_node_counts_its_own_replica(
    cluster: Cluster, manager: LockManager
) -> None:
    name = f"wait:{uuid.uuid4().hex[:8]}"
    holder = manager.lock(name, auto_renew=False)
    assert holder.acquire(blocking=False)
    base = manager.backend()
    backend = ClusterBackend(base.client, base.keyspace, base.retention_ms, wait_timeout_ms=200)
    call = _renew(holder, replicas=1)
    assert backend.run(call) == 1 and backend.run_many([call]) == [1]
    replica = cluster.replica_of(cluster.server_for_slot(_slot_of(manager, name)))
    with _paused(replica):
        started = time.monotonic()
        with pytest.raises(NotReplicated) as caught:
            backend.run(call)
        assert time.monotonic() - started < 0.2 + 1.0
        assert caught.value.reply == 1 and caught.value.acks == 0 and caught.value.required == 1
        [result] = backend.run_many([call])
        assert isinstance(result, NotReplicated) and result.reply == 1

        async def arun() -> None:
            client = redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster.primaries[0].port)
            abackend = AsyncClusterBackend(
                client, base.keyspace, base.retention_ms, wait_timeout_ms=200
            )
            try:
                with pytest.raises(NotReplicated):
                    await abackend.run(call)
            finally:
                await abackend.aclose()

        asyncio.run(arun())
    wait_until(lambda: backend.run(call) == 1, 10, "the replica to acknowledge again")
    holder.release()


@pytest.mark.slow
def test_a_killed_primary_under_a_renewed_lock_never_makes_two_holders() -> None:
    own = Cluster()  # this test kills a primary: not the shared cluster
    try:
        manager = LockManager(client=own.client(socket_timeout=2, socket_connect_timeout=1))
        name = f"failover:{uuid.uuid4().hex[:8]}"
        lost = threading.Event()
        signals.lock_lost.connect(lambda **kw: lost.set(), weak=False, dispatch_uid=name)
        holder = manager.lock(name, ttl=6)
        assert holder.acquire()
        slot = _slot_of(manager, name)
        primary = own.server_for_slot(slot)
        replica = redis.Redis(
            port=own.replica_of(primary).port, socket_timeout=2, single_connection_client=True
        )
        replica.execute_command("READONLY")  # a cluster replica answers reads only so
        key = manager.backend().keyspace.keys(name).lock
        wait_until(lambda: replica.exists(key), 5, "the grant to reach the replica")
        primary.process.send_signal(signal.SIGKILL)
        primary.process.wait(5)
        killed = time.monotonic()
        wait_until(lambda: own.server_for_slot(slot) is not primary, 15, "the failover")
        promoted_after = time.monotonic() - killed
        # Renewals fail meanwhile; then they go to the promoted replica, or the hold is lost.
        wait_until(
            lambda: lost.is_set() or _renewed_since(manager, name, killed), 10, "renewal or loss"
        )
        other = manager.lock(name, owner="other", auto_renew=False)
        got = other.acquire(blocking=False)
        assert not (got and not holder.lost), "two holders after the failover"
        print(f"promoted after {promoted_after:.2f} s; lost={holder.lost} other={got}")
        if not holder.lost:
            holder.release()
    finally:
        own.stop()


def _renewed_since(manager: LockManager, name: str, moment: float) -> bool:
    """Whether the lock's lease was renewed after *moment* (its ttl is back near 6 s)."""
    try:
        info = manager.get(name)
    except Exception:  # noqa: BLE001 - the cluster may still be failing over
        return False
    return (
        info is not None
        and info.ttl is not None
        and info.ttl > 6 - (time.monotonic() - moment) + 0.5
    )


@pytest.mark.slow
def test_a_confirmed_grant_survives_a_primary_killed_right_after_it() -> None:
    """wait_replicas=1 on a cluster: the primary is SIGKILLed the moment acquire()
    returns, with no wait for replication; the promoted replica still has the lock,
    so another client is refused, and the next token is larger."""
    own = Cluster()  # this test kills a primary: not the shared cluster
    try:
        manager = LockManager(client=own.client(socket_timeout=2, socket_connect_timeout=1))
        name = f"failover-wait:{uuid.uuid4().hex[:8]}"
        holder = manager.lock(name, ttl=30, wait_replicas=1, auto_renew=False)
        assert holder.acquire(blocking=False)
        token = holder.fencing_token
        slot = _slot_of(manager, name)
        primary = own.server_for_slot(slot)
        primary.process.send_signal(signal.SIGKILL)
        primary.process.wait(5)
        wait_until(lambda: own.server_for_slot(slot) is not primary, 15, "the failover")
        other = manager.lock(name, owner="other", auto_renew=False)

        def refused() -> bool:
            try:
                return not other.acquire(blocking=False)
            except LockBackendError:
                return False  # the slot is still moving to the promoted replica

        wait_until(refused, 10, "the promoted replica to refuse the other client")
        assert manager.force_release(name)
        assert other.acquire(blocking=False)
        assert other.fencing_token is not None and token is not None
        assert other.fencing_token > token
    finally:
        own.stop()
