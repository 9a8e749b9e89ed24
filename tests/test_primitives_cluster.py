"""W10: semaphores and read-write locks on a real Redis Cluster (3 primaries + 3
replicas, tests/redis_cluster.py).

Every key of one name (lock hash, fence, queue, waiter entries, holders' leases)
is in the name's slot, and every script of these primitives runs there: acquire,
re-entry, refusal, a timed-out wait, renewal, extension, release with hand-off,
the operator's per-holder actions, listing. A script that touched a key of
another slot would fail with CROSSSLOT (or "non local key"), which the lock
raises as an error; a key created outside the slot would show in the scan.
Names are spread over the three primaries; grants are also asked with a
replica's acknowledgement (``wait_replicas=1``).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from django_redislock import LockManager, LockMismatch, LockUpgradeError
from tests.redis_cluster import Cluster, shared_cluster
from tests.test_cluster import names_on_each_primary
from tests.test_primitives_procs import WOKEN_BY_MESSAGE, Child

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def manager() -> LockManager:
    return LockManager(client=shared_cluster().client())


@pytest.fixture
def cluster() -> Cluster:
    return shared_cluster()


@pytest.fixture
def prefix() -> str:
    return f"clp{uuid.uuid4().hex[:8]}:"


def keys_of(cluster: Cluster, name: str, slot_key: str | None = None) -> dict[str, int]:
    """Every key on any primary whose name contains ``{name}`` (and *slot_key*, the
    hash of *name*'s slot, shared with other names, if it exists), with its slot."""
    found: dict[str, int] = {}
    for server in cluster.primaries:
        node = cluster.node(server)
        for key in node.scan_iter(match=f"*{{{name}}}*", count=1000):
            found[key.decode()] = key_slot(key)
    if slot_key is not None:
        slot = key_slot(slot_key.encode())
        if cluster.node(cluster.server_for_slot(slot)).exists(slot_key):
            found[slot_key] = slot
    return found


def queued(manager: LockManager, name: str) -> int:
    backend = manager.backend()
    return int(backend.client.llen(backend.keyspace.keys(name).queue))


def wait_queued(manager: LockManager, name: str, n: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while queued(manager, name) < n:
        assert time.monotonic() < deadline, f"{n} waiters never queued for {name}"
        time.sleep(0.01)


def in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    """Run *fn* in a thread; its result (and when it returned) land in the list."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append((fn(), time.monotonic())))
    thread.start()
    return thread, out


def assert_one_slot(cluster: Cluster, manager: LockManager, name: str, parts: set[str]) -> None:
    """All of *name*'s keys are in its slot, and the expected ones exist."""
    keys = manager.backend().keyspace.keys(name)
    found = keys_of(cluster, name, keys.slot)
    expected = {getattr(keys, part) for part in parts}
    assert expected <= set(found), sorted(found)
    assert set(found.values()) == {key_slot(keys.lock.encode())}, found


@pytest.mark.parametrize("replicas", [0, 1], ids=["no-wait", "wait-replica"])
def test_a_semaphore_on_every_primary(
    cluster: Cluster, manager: LockManager, prefix: str, replicas: int
) -> None:
    """Limit 2: two permits, a third owner queued (all five keys then exist, in one
    slot), a timed-out fourth owner leaves the queue, a release hands the permit to
    the queued owner by its message, a limit mismatch and a use as a read-write
    lock are refused, and nothing is left once every permit is back."""
    for name in names_on_each_primary(manager, prefix):
        opts: dict[str, Any] = {"ttl": 10, "auto_renew": False, "wait_replicas": replicas}
        a, b, c, d = (manager.semaphore(name, 2, owner=o, **opts) for o in "abcd")
        assert a.acquire(blocking=False) and b.acquire(blocking=False)
        assert a.acquire(blocking=False)  # re-entry
        thread, got = in_thread(lambda c=c: c.acquire(timeout=10))
        wait_queued(manager, name, 1)
        started = time.monotonic()
        assert not d.acquire(timeout=0.2)
        assert time.monotonic() - started < 2
        assert_one_slot(cluster, manager, name, {"lock", "slot", "queue", "waiters", "holders"})
        info = manager.get(name)
        assert info is not None and info.primitive == "semaphore" and info.limit == 2
        assert sorted(h.owner for h in info.holders) == ["a", "b"]
        with pytest.raises(LockMismatch):
            manager.semaphore(name, 3, owner="e").acquire(blocking=False)
        with pytest.raises(LockMismatch):
            manager.rw_lock(name).read(owner="e").acquire(blocking=False)
        assert a.release() == 1 and a.release() == 0
        released = time.monotonic()
        thread.join(10)
        assert got and got[0][0] is True and got[0][1] - released < WOKEN_BY_MESSAGE
        assert sorted(h.owner for h in manager.get(name).holders) == ["b", "c"]  # type: ignore[union-attr]
        assert b.release() == 0 and c.release() == 0
        assert manager.get(name) is None
        assert_one_slot(cluster, manager, name, set())


@pytest.mark.parametrize("replicas", [0, 1], ids=["no-wait", "wait-replica"])
def test_a_read_write_lock_on_every_primary(
    cluster: Cluster, manager: LockManager, prefix: str, replicas: int
) -> None:
    """Two readers hold; a writer queues behind them, then a third reader behind the
    writer (phase-fair); the last read's release hands the write over, and the
    write's release admits the queued reader. A downgrade (read while writing)
    works; an upgrade is refused; every token is larger than the one before."""
    for name in names_on_each_primary(manager, prefix):
        opts: dict[str, Any] = {"ttl": 10, "auto_renew": False, "wait_replicas": replicas}
        rw = manager.rw_lock(name, **opts)
        r1, r2, r3 = (rw.read(owner=f"r{i}") for i in (1, 2, 3))
        w = rw.write(owner="w")
        assert r1.acquire(blocking=False) and r2.acquire(blocking=False)
        first = max(r1.fencing_token or 0, r2.fencing_token or 0)
        with pytest.raises(LockMismatch):  # a read-write lock's name is not a semaphore's
            manager.semaphore(name, 1, owner="x").acquire(blocking=False)
        with pytest.raises(LockUpgradeError):
            rw.write(owner="r1").acquire(blocking=False)
        writer_thread, writer_got = in_thread(lambda w=w: w.acquire(timeout=10))
        wait_queued(manager, name, 1)
        reader_thread, reader_got = in_thread(lambda r3=r3: r3.acquire(timeout=10))
        wait_queued(manager, name, 2)
        assert_one_slot(cluster, manager, name, {"lock", "slot", "queue", "waiters", "holders"})
        assert r1.release() == 0
        assert not writer_got
        assert r2.release() == 0
        released = time.monotonic()
        writer_thread.join(10)
        assert writer_got and writer_got[0][1] - released < WOKEN_BY_MESSAGE
        assert (w.fencing_token or 0) > first
        assert not reader_got, "a reader got in beside the writer"
        assert rw.read(owner="w").acquire(blocking=False)  # downgrade
        assert w.release() == 0
        released = time.monotonic()
        reader_thread.join(10)
        assert reader_got and reader_got[0][1] - released < WOKEN_BY_MESSAGE
        assert (r3.fencing_token or 0) > (w.fencing_token or 0)
        info = manager.get(name)
        assert info is not None and sorted((h.mode, h.owner) for h in info.holders) == [
            ("read", "r3"),
            ("read", "w"),
        ]
        assert rw.read(owner="w").release() == 0 and r3.release() == 0
        assert manager.get(name) is None


def test_renewal_extension_and_operator_actions_on_the_cluster(
    cluster: Cluster, manager: LockManager, prefix: str
) -> None:
    """The renewal (a 1.5 s lease kept for 2 s by the watchdog), ``extend``, the
    operator's per-holder ``force_extend`` and ``force_release`` (whose freed
    permit goes to the queued owner), and ``active()`` listing every holder, on
    names on every primary."""
    names = names_on_each_primary(manager, prefix)
    held: dict[str, tuple[Any, Any, Any]] = {}
    for name in names:
        # Leases long enough for the watchdog to keep up on a loaded 2-core machine.
        renewed = manager.semaphore(name, 2, owner="renewed", ttl=1.5)
        other = manager.semaphore(name, 2, owner="other", ttl=10, auto_renew=False)
        reader = manager.rw_lock(f"{name}:rw", ttl=1.5).read(owner="reader")
        assert renewed.acquire(blocking=False) and other.acquire(blocking=False)
        assert reader.acquire(blocking=False)
        held[name] = renewed, other, reader
    time.sleep(2.0)
    listed = {i.name: i for i in manager.active(prefix)}
    for name, (renewed, other, reader) in held.items():
        assert renewed.owned() and not renewed.lost
        assert reader.owned() and not reader.lost
        assert {name, f"{name}:rw"} <= set(listed)
        assert sorted(h.owner for h in listed[name].holders) == ["other", "renewed"]
        assert other.extend(5)
        assert manager.force_extend(name, 20, owner="other")
        ttl = {h.owner: h.ttl for h in manager.get(name).holders}  # type: ignore[union-attr]
        assert ttl["other"] > 20  # type: ignore[operator]
        assert ttl["renewed"] < 5  # type: ignore[operator]
        waiter = manager.semaphore(name, 2, owner="waiter", ttl=10, auto_renew=False)
        thread, got = in_thread(lambda waiter=waiter: waiter.acquire(timeout=10))
        wait_queued(manager, name, 1)
        assert manager.force_release(name, owner="other")
        thread.join(10)
        assert got and got[0][0] is True
        info = manager.get(name)
        assert info is not None and sorted(h.owner for h in info.holders) == ["renewed", "waiter"]
        assert not other.owned()
        assert_one_slot(cluster, manager, name, {"lock", "holders"})
        assert_one_slot(cluster, manager, f"{name}:rw", {"lock", "holders"})
        renewed.release()
        waiter.release()
        reader.release()
        assert manager.get(name) is None and manager.get(f"{name}:rw") is None


def test_asyncio_write_release_admits_the_waiting_readers_on_the_cluster(
    manager: LockManager, prefix: str
) -> None:
    """asyncio on the cluster: three reader tasks wait behind a held write; the
    write's ``arelease()`` grants all three inside the release (Redis lists them
    the moment it returns), and each task's ``aacquire`` returns by the message,
    with a token larger than the writer's."""
    name = names_on_each_primary(manager, prefix)[2]

    async def scenario() -> None:
        rw = manager.rw_lock(name, ttl=10, auto_renew=False)
        writer = rw.write(owner="w")
        assert await writer.aacquire(blocking=False)
        readers = [rw.read(owner=f"r{i}") for i in range(3)]
        waits = [asyncio.create_task(r.aacquire(timeout=10)) for r in readers]
        deadline = time.monotonic() + 10
        while queued(manager, name) < 3:
            assert time.monotonic() < deadline, "the readers never queued"
            await asyncio.sleep(0.01)
        token = writer.fencing_token
        released = time.monotonic()
        assert await writer.arelease() == 0
        info = await manager.aget(name)
        assert info is not None and sorted(h.owner for h in info.readers) == ["r0", "r1", "r2"]
        assert await asyncio.wait_for(asyncio.gather(*waits), 10) == [True] * 3
        assert time.monotonic() - released < WOKEN_BY_MESSAGE
        assert token is not None and all((r.fencing_token or 0) > token for r in readers)
        for reader in readers:
            assert await reader.arelease() == 0
        assert await manager.aget(name) is None

    asyncio.run(scenario())


@pytest.fixture
def cluster_child(cluster: Cluster) -> Iterator[Child]:
    child = Child(settings="tests.settings_cluster", REDISLOCK_TEST_CLUSTER_URL=cluster.url)
    try:
        child.expect("ready")
        yield child
    finally:
        child.kill()


def test_a_read_in_another_process_hands_over_to_a_writer(
    manager: LockManager, prefix: str, cluster_child: Child
) -> None:
    """A child process (locks on the cluster through ``REDISLOCK_URL``) holds a read;
    the writer here queues, and gets the lock by the child's release message. A
    permit of a SIGKILLed child is then freed by its 1 s lease."""
    name = names_on_each_primary(manager, prefix)[1]
    cluster_child.send(op="hold", id="r", prim="read", name=name, ttl=10)
    cluster_child.expect("acquired", "r")
    writer = manager.rw_lock(name, ttl=10, auto_renew=False).write(owner="writer")
    thread, got = in_thread(lambda: writer.acquire(timeout=10))
    wait_queued(manager, name, 1)
    cluster_child.send(op="release", id="r")
    released = cluster_child.expect("released", "r")["t"]
    thread.join(10)
    assert got and got[0][0] is True and got[0][1] - released < WOKEN_BY_MESSAGE
    writer.release()

    sem_name = f"{name}:sem"
    cluster_child.send(op="hold", id="s", prim="sem", name=sem_name, limit=1, ttl=1.0)
    cluster_child.expect("acquired", "s")
    cluster_child.kill()
    killed = time.monotonic()
    other = manager.semaphore(sem_name, 1, owner="other", ttl=10, auto_renew=False)
    assert other.acquire(timeout=10)
    assert time.monotonic() - killed <= 1.0 + 1.5
    other.release()
