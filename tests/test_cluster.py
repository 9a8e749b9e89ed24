"""Locks on a real Redis Cluster (3 primaries + 3 replicas on loopback), sync and async.

C1: the lock API with names on every primary, hand-offs between threads, tasks and
processes, renewal, listing and operator actions; C2: a waiter whose wake-up hub
listens on another node than the lock's is woken by the hand-off message; C6:
3,000 locks paged through with small pages; the admin list page and the
management command on a cluster found through ``REDISLOCK_URL``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client, override_settings

from django_redislock import Lock, LockManager, locks
from django_redislock.engine.backends.cluster import AsyncClusterBackend, ClusterBackend
from tests.redis_cluster import Cluster, shared_cluster
from tests.replication import wait_until
from tests.test_multiprocess import _expect_line

ROOT = Path(__file__).resolve().parent.parent
#: The hub's fallback poll is 0.75-1 s: a wake-up well under it came from the message.
WOKEN_BY_MESSAGE = 0.5


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    return shared_cluster()


@pytest.fixture(scope="module")
def manager(cluster: Cluster) -> LockManager:
    return LockManager(client=cluster.client())


@pytest.fixture
def prefix() -> str:
    return f"cl{uuid.uuid4().hex[:8]}:"


def primary_of(manager: LockManager, name: str) -> str:
    """The node (``host:port``) serving the lock *name*'s slot."""
    backend = manager.backend()
    return str(backend.client.get_node_from_key(backend.keyspace.keys(name).lock).name)


def names_on_each_primary(manager: LockManager, prefix: str, per_node: int = 1) -> list[str]:
    """Lock names under *prefix*, *per_node* on each of the primaries."""
    wanted = {node.name: per_node for node in manager.backend().client.get_primaries()}
    names: list[str] = []
    for i in range(10_000):
        name = f"{prefix}{i}"
        node = primary_of(manager, name)
        if wanted.get(node, 0) > 0:
            wanted[node] -= 1
            names.append(name)
        if not any(wanted.values()):
            return names
    raise AssertionError("could not spread names over the primaries")


def queued(manager: LockManager, name: str) -> bool:
    """Whether someone waits in *name*'s queue."""
    backend = manager.backend()
    return bool(backend.client.exists(backend.keyspace.keys(name).queue))


# --- C1: the API on every primary ----------------------------------------------------


def test_the_manager_runs_on_the_cluster_backend(manager: LockManager) -> None:
    assert isinstance(manager.backend(), ClusterBackend)
    assert manager.backend().features.cursor == "composite"
    assert manager.client is manager.backend().client


def test_acquire_reenter_inspect_release_on_every_primary(
    manager: LockManager, prefix: str
) -> None:
    names = names_on_each_primary(manager, prefix)
    assert len({primary_of(manager, n) for n in names}) == 3
    for name in names:
        lock = manager.lock(name, purpose="cluster", auto_renew=False)
        assert lock.acquire(blocking=False)
        token = lock.fencing_token
        assert lock.acquire(blocking=False) and lock.fencing_token == token  # re-entry
        info = manager.get(name)
        assert info is not None and info.owner == lock.owner and info.purpose == "cluster"
        other = manager.lock(name, owner="someone-else")
        started = time.monotonic()
        assert not other.acquire(timeout=0.2)
        assert 0.2 <= time.monotonic() - started < 2
        assert lock.release() == 1 and lock.release() == 0
        assert manager.get(name) is None
        with manager.lock(name) as again:
            assert again.fencing_token is not None and again.fencing_token > token


def test_a_run_s_completion_record_is_kept_with_its_lock_on_every_primary(
    manager: LockManager, prefix: str
) -> None:
    """The Celery acks_late record (``Lock._with_completion``): a fifth key in the lock's
    slot, read by the acquire and written by the release on the slot's node."""
    from django_redislock.engine.calls import RunCompleted

    for name in names_on_each_primary(manager, prefix):
        run = manager.lock(name, owner="t-1:a", ttl=10, auto_renew=False)
        run._with_completion("t-1", 60)
        assert run.acquire(blocking=False)
        assert run._release_completed() == 0
        record = manager.backend().keyspace.keys(name).completion("t-1")
        assert manager.backend().client.pttl(record) > 0
        copy = manager.lock(name, owner="t-1:b", ttl=10, auto_renew=False)
        copy._with_completion("t-1", 60)
        with pytest.raises(RunCompleted):
            copy.acquire(blocking=False)
        assert manager.get(name) is None


def test_hand_off_between_threads_on_every_primary(manager: LockManager, prefix: str) -> None:
    for name in names_on_each_primary(manager, prefix):
        holder = manager.lock(name)
        holder.acquire()
        got: list[int | None] = []

        def wait(name: str = name, got: list[int | None] = got) -> None:
            waiter = manager.lock(name)
            if waiter.acquire(timeout=10):
                got.append(waiter.fencing_token)
                waiter.release()

        thread = threading.Thread(target=wait)
        thread.start()
        wait_until(lambda name=name: queued(manager, name), 5, "the waiter to queue")
        token = holder.fencing_token
        holder.release()
        thread.join(15)
        assert got and got[0] is not None and token is not None and got[0] > token


def test_no_lost_update_between_threads(manager: LockManager, prefix: str) -> None:
    name, counter = f"{prefix}counter", {"value": 0, "inside": 0, "overlaps": 0}

    def work() -> None:
        for _ in range(30):
            with manager.lock(name, timeout=30):
                counter["inside"] += 1
                if counter["inside"] != 1:
                    counter["overlaps"] += 1
                value = counter["value"]
                time.sleep(0)
                counter["value"] = value + 1
                counter["inside"] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert counter["value"] == 120 and counter["overlaps"] == 0


@pytest.mark.slow
def test_the_watchdog_keeps_short_leases_alive_on_every_primary(
    manager: LockManager, prefix: str
) -> None:
    held = [manager.lock(name, ttl=1) for name in names_on_each_primary(manager, prefix)]
    for lock in held:
        assert lock.acquire()
    time.sleep(2.5)  # the point: 2.5 leases pass
    for lock in held:
        info = manager.get(lock.name)
        assert info is not None and info.owner == lock.owner and not lock.lost
        lock.release()


def test_listing_paging_and_force_release(manager: LockManager, prefix: str) -> None:
    names = names_on_each_primary(manager, prefix, per_node=2)
    held = [manager.lock(name, auto_renew=False) for name in names]
    for lock in held:
        assert lock.acquire(blocking=False)
    assert {info.name for info in manager.active(prefix)} == set(names)
    listed, cursor, pages = [], "0", 0
    while True:
        cursor, infos = manager.scan_page(cursor, count=1, pattern=_pattern(manager, prefix))
        listed += [info.name for info in infos]
        pages += 1
        assert pages < 1000
        if cursor == "0":
            break
    assert sorted(listed) == sorted(names)
    assert {info.name for info in manager.get_many(names)} == set(names)
    victim = names[0]
    assert manager.force_release(victim)
    assert manager.get(victim) is None and not held[0].owned()
    for lock in held[1:]:
        lock.release()


def _pattern(manager: LockManager, prefix: str) -> str:
    return manager.backend().keyspace.match_pattern(prefix)


def test_async_lock_hand_off_listing_and_force_release(
    cluster: Cluster, manager: LockManager, prefix: str
) -> None:
    names = names_on_each_primary(manager, prefix)

    async def main() -> None:
        assert isinstance(manager.source.abackend(), AsyncClusterBackend)
        for name in names:
            async with manager.lock(name) as lock:
                assert lock.owned() and (await manager.aget(name)) is not None
                holder_token = lock.fencing_token
                waiter = manager.lock(name)
                task = asyncio.ensure_future(_acquire_in_task(waiter))  # another owner
                await _until_queued(manager, name)
            token, _woken = await task
            assert token > holder_token  # type: ignore[operator]
            assert [i.name async for i in manager.aactive(name)] == [name]
            pattern = _pattern(manager, name)
            cursor, page = await manager.ascan_page("0", count=1000, pattern=pattern)
            assert cursor != "0" or [i.name for i in page] == [name]
            assert await manager.aforce_release(name)
            assert await manager.aget(name) is None

    asyncio.run(main())


async def _acquire_in_task(lock: Lock, release: bool = False) -> tuple[int, float]:
    """Acquire *lock* as the current task: (fencing token, when acquired); release after."""
    assert await lock.aacquire(timeout=10)
    woken, token = time.monotonic(), lock.fencing_token
    if release:
        await lock.arelease()
    assert token is not None
    return token, woken


async def _until_queued(manager: LockManager, name: str) -> None:
    for _ in range(500):
        if queued(manager, name):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the waiter did not queue within 5 s")


def test_an_async_client_alone_gets_a_blocking_twin(cluster: Cluster, prefix: str) -> None:
    async_client = redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster.primaries[1].port)
    twin_manager = LockManager(async_client=async_client)
    with twin_manager.lock(f"{prefix}twin") as lock:
        assert isinstance(twin_manager.backend(), ClusterBackend) and lock.owned()

    async def main() -> None:
        async with twin_manager.lock(f"{prefix}twin") as lock:
            assert lock.owned()
        await async_client.aclose()

    asyncio.run(main())


def _spawn(module: str, cluster: Cluster, *args: str) -> subprocess.Popen[str]:
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="tests.settings_cluster",
        REDISLOCK_TEST_CLUSTER_URL=cluster.url,
        PYTHONPATH=str(ROOT),
    )
    return subprocess.Popen(
        [sys.executable, "-m", module, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_processes_lose_no_update_and_hand_off(cluster: Cluster, manager: LockManager) -> None:
    name = f"clproc:{uuid.uuid4().hex[:8]}"
    counter, inside = f"{name}:counter", f"{name}:inside"
    plain = redis.Redis.from_url(settings.REDIS_URL)
    procs = [_spawn("tests.proc", cluster, "count", name, "60", counter, inside) for _ in range(3)]
    procs.append(_spawn("tests.aproc", cluster, "count", name, "3", "20", counter, inside))
    try:
        overlaps = [int(_expect_line(p, "done", timeout=120)[1]) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    assert overlaps == [0] * 4
    assert int(plain.get(counter) or 0) == 3 * 60 + 3 * 20

    holder = manager.lock(name, ttl=30)
    holder.acquire()
    waiter = _spawn("tests.proc", cluster, "wait_for", name, "30")
    try:
        _expect_line(waiter, "waiting")
        wait_until(lambda: queued(manager, name), 15, "the child to queue")
        holder_token = holder.fencing_token
        holder.release()
        token = int(_expect_line(waiter, "acquired", timeout=15)[1])
        assert holder_token is not None and token > holder_token
        info = manager.get(name)
        assert info is not None and info.owner != holder.owner
    finally:
        waiter.kill()
        waiter.wait(10)
    manager.force_release(name)


# --- C2: a wake-up crosses nodes -----------------------------------------------------


def _name_off_node(manager: LockManager, node: str, prefix: str) -> str:
    for i in range(1000):
        if primary_of(manager, f"{prefix}{i}") != node:
            return f"{prefix}{i}"
    raise AssertionError("every name on one node?")


def test_a_waiter_listening_on_another_node_is_woken_by_the_message(
    manager: LockManager, prefix: str
) -> None:
    backend = manager.backend()
    backend.hub().wait_ready()
    hub_node = backend.hub_node
    assert hub_node is not None
    name = _name_off_node(manager, hub_node, prefix)
    assert primary_of(manager, name) != hub_node
    holder = manager.lock(name)
    holder.acquire()
    woken: list[float] = []

    def wait() -> None:
        waiter = manager.lock(name)
        if waiter.acquire(timeout=10):
            woken.append(time.monotonic())
            waiter.release()

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: queued(manager, name), 5, "the waiter to queue")
    released = time.monotonic()
    holder.release()
    thread.join(15)
    assert woken and woken[0] - released < WOKEN_BY_MESSAGE
    assert backend.hub_node == hub_node  # no re-subscription happened meanwhile


def test_a_waiter_listens_on_its_locks_node_and_is_woken_by_the_message_alone(
    manager: LockManager, cluster: Cluster, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter's wake-up channel has its subscriber on the lock's own node (where the
    release's PUBLISH runs: no cluster-bus hop, see docs/architecture.md, Cluster), and
    the hand-off wakes it through that message: the waiter asks Redis once (it queues),
    then never again (no fallback poll), and gets the lock."""
    backend = manager.backend()
    backend.hub().wait_ready()
    default_node = backend.hub_node
    assert default_node is not None
    name = _name_off_node(manager, default_node, prefix)
    keys = backend.keyspace.keys(name)
    node = primary_of(manager, name)
    backend.hub(keys.lock).wait_ready()  # so that the wait queues on a confirmed subscription
    asks: dict[int, int] = {}
    run = backend.run

    def counted(call: Any) -> Any:
        thread = threading.get_ident()
        asks[thread] = asks.get(thread, 0) + 1
        return run(call)

    monkeypatch.setattr(backend, "run", counted)
    holder = manager.lock(name)
    holder.acquire()
    woken: list[int] = []

    def wait() -> None:
        waiter = manager.lock(name)
        if waiter.acquire(timeout=10):
            woken.append(asks.get(threading.get_ident(), 0))
            waiter.release()

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: queued(manager, name), 5, "the waiter to queue")
    (entry,) = [  # (without '~cur', the holder on record: not a waiter)
        e for w, e in backend.client.hgetall(keys.waiters).items() if w != b"~cur"
    ]
    assert _listened_on(node, entry), "nobody listens on the lock's node"
    holder.release()
    thread.join(15)
    assert woken == [1]  # the queueing acquire only: woken by the message, not a poll


def test_an_async_waiter_on_another_node_is_woken_by_the_message(
    manager: LockManager, prefix: str
) -> None:
    async def main() -> float:
        backend = manager.source.abackend()
        assert isinstance(backend, AsyncClusterBackend)
        await backend.hub().wait_ready()
        hub_node = backend._picker.node_name
        assert hub_node is not None
        name = _name_off_node(manager, hub_node, prefix)
        holder = manager.lock(name)
        await holder.aacquire()
        task = asyncio.ensure_future(_acquire_in_task(manager.lock(name), release=True))
        await _until_queued(manager, name)
        released = time.monotonic()
        await holder.arelease()
        _token, woken = await task
        return woken - released

    assert asyncio.run(main()) < WOKEN_BY_MESSAGE


def _listened_on(node: str, entry: bytes) -> bool:
    """Whether the channel a queue *entry* names has a subscriber on *node* itself
    (``PUBSUB NUMSUB`` counts a node's own subscribers)."""
    host, port = node.rsplit(":", 1)
    on_node = redis.Redis(host=host, port=int(port), socket_timeout=5)
    channels = on_node.pubsub_channels()
    return any(n and c in entry for c, n in on_node.pubsub_numsub(*channels))


def test_an_async_waiter_listens_on_its_locks_node_and_is_woken_by_the_message_alone(
    manager: LockManager, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the blocking test above, for an asyncio waiter woken by a release of
    another thread (so through PUBLISH, not in the release's reply)."""
    backend = manager.backend()
    backend.hub().wait_ready()
    assert backend.hub_node is not None
    name = _name_off_node(manager, backend.hub_node, prefix)
    keys = backend.keyspace.keys(name)
    holder = manager.lock(name, owner=f"{prefix}holder")  # released by another thread
    holder.acquire()
    asks: list[Any] = []

    async def main() -> int:
        abackend = manager.source.abackend()
        await abackend.run_many([])  # the client learns the slots
        await abackend.hub(keys.lock.encode()).wait_ready()
        run = abackend.run

        async def counted(call: Any) -> Any:
            asks.append(asyncio.current_task())
            return await run(call)

        async def wait() -> int:
            waiter = manager.lock(name)
            assert await waiter.aacquire(timeout=10)
            sent = sum(1 for t in asks if t is asyncio.current_task())
            await waiter.arelease()
            return sent

        monkeypatch.setattr(abackend, "run", counted)
        task = asyncio.ensure_future(wait())
        await _until_queued(manager, name)
        (entry,) = [  # (without '~cur', the holder on record: not a waiter)
            e for w, e in backend.client.hgetall(keys.waiters).items() if w != b"~cur"
        ]
        assert _listened_on(primary_of(manager, name), entry), "nobody listens on its node"
        await asyncio.to_thread(holder.release)
        return await task

    assert asyncio.run(main()) == 1  # the queueing acquire only: no poll


def test_the_hub_moves_to_another_node_after_a_broken_subscription(manager: LockManager) -> None:
    picker = manager.backend()._picker
    first = picker.pubsub()
    second = picker.pubsub()
    try:
        assert first.connection_pool is not second.connection_pool  # another node's pool
    finally:
        first.close()
        second.close()


# --- C6: 3,000 locks paged through small pages ---------------------------------------


@pytest.mark.slow
def test_three_thousand_locks_page_through_exactly_once(manager: LockManager, prefix: str) -> None:
    names = [f"{prefix}{i}" for i in range(3000)]
    held = [manager.lock(name, ttl=120, auto_renew=False) for name in names]
    for lock in held:
        assert lock.acquire(blocking=False)
    try:
        listed: list[str] = []
        cursors: list[str] = []
        cursor, pattern = "0", _pattern(manager, prefix)
        while True:
            cursor, infos = manager.scan_page(cursor, count=40, pattern=pattern)
            listed += [info.name for info in infos]
            cursors.append(cursor)
            assert len(cursors) < 5000
            if cursor == "0":
                break
        assert len(listed) == len(set(listed)) == 3000 and set(listed) == set(names)
        # The pages crossed from one primary to the next (three slot ranges seen).
        assert len({c.partition(":")[0] for c in cursors if c != "0"}) == 3
    finally:
        for lock in held:
            lock.release()


# --- the admin and the management command on a cluster URL ---------------------------


@pytest.fixture
def on_cluster_url(cluster: Cluster) -> Iterator[None]:
    with override_settings(REDISLOCK_URL=cluster.url):
        yield


def test_the_url_of_a_cluster_node_is_detected(on_cluster_url: None) -> None:
    assert isinstance(locks.backend(), ClusterBackend)
    with override_settings(REDISLOCK_CLUSTER=False):
        assert not isinstance(locks.backend(), ClusterBackend)


def test_the_management_command_on_a_cluster(on_cluster_url: None, prefix: str) -> None:
    lock = locks.lock(f"{prefix}cli", owner="cli-owner")
    lock.acquire()
    out = StringIO()
    call_command("redislock", "list", "--prefix", prefix, stdout=out)
    assert f"{prefix}cli" in out.getvalue() and "1 lock(s) held" in out.getvalue()
    out = StringIO()
    call_command("redislock", "release", f"{prefix}cli", stdout=out)
    assert "released" in out.getvalue() and locks.get(f"{prefix}cli") is None


@pytest.mark.django_db
def test_the_admin_lists_locks_of_every_primary(on_cluster_url: None, prefix: str) -> None:
    names = names_on_each_primary(locks, prefix)
    held = [locks.lock(name, auto_renew=False) for name in names]
    for lock in held:
        lock.acquire()
    try:
        client = Client()
        client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
        response = client.get("/admin/django_redislock/heldlock/", {"q": prefix})
        assert response.status_code == 200
        page = response.content.decode()
        assert all(name in page for name in names)
    finally:
        for lock in held:
            lock.release()
