"""Redlock over five real masters on loopback: masters paused (SIGSTOP), killed and
restarted empty, split votes among contenders, asyncio, and the system checks.

The behaviour every engine shares (acquire, re-entry, wake-up, watchdog,
listing, async with, no lost update) is in tests/test_engines.py.
"""

from __future__ import annotations

import asyncio
import os
import random
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
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client, override_settings

from django_redislock import LockManager, locks, single_instance
from django_redislock.checks import check_server, check_settings
from django_redislock.engine.backends.redlock import RedlockBackend
from django_redislock.exceptions import QuorumNotReached
from tests.holding import wait_until
from tests.redlock_servers import Master, shared_masters

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def masters() -> Iterator[list[Master]]:
    found = shared_masters()
    try:
        yield found
    finally:
        for master in found:
            master.resume()


@pytest.fixture
def manager(masters: list[Master]) -> LockManager:
    return LockManager(redlock_caches=[m.url for m in masters])


@pytest.fixture
def lock_name() -> str:
    return f"redlock:{uuid.uuid4().hex[:12]}"


def _holders(masters: list[Master], manager: LockManager, name: str) -> list[bytes | None]:
    key = manager.backend().keyspace.keys(name).lock
    out = []
    for master in masters:
        try:
            out.append(master.client().hget(key, "owner"))
        except Exception:
            out.append(None)
    return out


def test_two_masters_paused_still_grant_exclusively_and_promptly(
    masters: list[Master], manager: LockManager, lock_name: str
) -> None:
    manager.lock(lock_name + ":warm", auto_renew=False).acquire()  # connections made
    masters[0].pause()
    masters[3].pause()
    started = time.monotonic()
    holder = manager.lock(lock_name, owner="holder", auto_renew=False)
    assert holder.acquire(blocking=False)
    assert time.monotonic() - started < 0.5
    assert not manager.lock(lock_name, owner="other", auto_renew=False).acquire(blocking=False)
    assert holder.release() == 0
    assert manager.lock(lock_name, owner="other", auto_renew=False).acquire(blocking=False)


def test_three_masters_down_refuse_promptly_and_leave_nothing(
    masters: list[Master], manager: LockManager, lock_name: str
) -> None:
    for master in masters[:3]:
        master.pause()
    lock = manager.lock(lock_name, auto_renew=False)
    started = time.monotonic()
    with pytest.raises(QuorumNotReached, match="only 2 of 5 Redis masters answered") as caught:
        lock.acquire(blocking=False)
    assert time.monotonic() - started < 1.0
    assert (caught.value.answered, caught.value.needed) == (2, 3)
    assert lock.fencing_token is None  # nothing is recorded as held
    # The two live masters granted it and were told to give it back.
    key = manager.backend().keyspace.keys(lock_name).lock
    assert [m.client().exists(key) for m in masters[3:]] == [0, 0]


def _clear_slot(masters: list[Master], manager: LockManager, name: str) -> None:
    """Drop *name*'s slot hash on every master (other names of its slot made it)."""
    slot_key = manager.backend().keyspace.keys(name).slot
    for master in masters:
        master.client().delete(slot_key)


def _free_once_the_paused_masters_ran_the_refused_acquire(
    masters: list[Master], manager: LockManager, name: str
) -> None:
    """Wait until the resumed masters (the first three) ran what waited in their
    sockets while they were paused (the acquire made the slot hash, cleared by
    :func:`_clear_slot` before; what came after it on the same connection ran in the
    same read), then: nobody holds *name*, and a next owner gets it."""
    slot_key = manager.backend().keyspace.keys(name).slot
    wait_until(lambda: all(m.client().exists(slot_key) for m in masters[:3]), timeout=5)
    assert _holders(masters, manager, name) == [None] * 5
    fresh = LockManager(redlock_caches=[m.url for m in masters])  # no master left out
    following = fresh.lock(name, owner="next", auto_renew=False)
    assert following.acquire(blocking=False)
    assert following.release() == 0


def test_a_refused_acquire_leaves_no_hold_on_paused_masters_when_they_resume(
    masters: list[Master], manager: LockManager, lock_name: str
) -> None:
    """3 of 5 masters are paused (SIGSTOP) with the client's connections open: the
    acquire is refused at once, but its writes wait in the paused masters' sockets and
    run when they resume. The give-back must run there too, after them: the lock is
    free afterwards, and the next owner gets it."""
    warm = manager.lock(lock_name + ":warm", auto_renew=False)
    assert warm.acquire()  # a connection per master, left open in the pools
    assert warm.release() == 0
    _clear_slot(masters, manager, lock_name)
    for master in masters[:3]:
        master.pause()
    lock = manager.lock(lock_name, auto_renew=False)
    started = time.monotonic()
    with pytest.raises(QuorumNotReached):
        lock.acquire(timeout=5)
    assert time.monotonic() - started < 1.0
    for master in masters[:3]:
        master.resume()
    _free_once_the_paused_masters_ran_the_refused_acquire(masters, manager, lock_name)


def test_a_refused_aacquire_leaves_no_hold_on_paused_masters_when_they_resume(
    masters: list[Master], manager: LockManager, lock_name: str
) -> None:
    """The asyncio twin of the test above."""

    async def refused() -> None:
        async with manager.lock(lock_name + ":warm", auto_renew=False):
            pass  # a connection per master, left open in the loop's pools
        _clear_slot(masters, manager, lock_name)
        for master in masters[:3]:
            master.pause()
        lock = manager.lock(lock_name, auto_renew=False)
        started = time.monotonic()
        with pytest.raises(QuorumNotReached):
            await lock.aacquire(timeout=5)
        assert time.monotonic() - started < 1.0
        for master in masters[:3]:
            master.resume()

    asyncio.run(refused())
    _free_once_the_paused_masters_ran_the_refused_acquire(masters, manager, lock_name)


def test_a_master_restarted_empty_does_not_lose_a_renewed_lock(
    masters: list[Master], manager: LockManager, lock_name: str
) -> None:
    holder = manager.lock(lock_name, ttl=1.0, owner="holder", raise_on_lost=False)
    assert holder.acquire()
    masters[1].restart_empty()
    time.sleep(1.5)  # more than a lease: renewals on the other four keep it
    assert not holder.lost and holder.owned()
    assert not manager.lock(lock_name, owner="other").acquire(blocking=False)
    # Two more restarted: only two masters still have the key, fewer than a majority.
    masters[2].restart_empty()
    masters[4].restart_empty()
    deadline = time.monotonic() + 3
    while not holder.lost:
        assert time.monotonic() < deadline, "losing the majority was not noticed"
        time.sleep(0.05)
    manager.force_release(lock_name)


def test_contenders_with_split_votes_all_progress(manager: LockManager, lock_name: str) -> None:
    barrier = threading.Barrier(10)
    winners: list[str] = []
    done: list[float] = []

    def contend(i: int) -> None:
        lock = manager.lock(lock_name, owner=f"c{i}", auto_renew=False)
        barrier.wait(5)
        if lock.acquire(blocking=False):
            winners.append(f"c{i}")
        barrier.wait(5)
        if winners and winners[0] == f"c{i}":
            lock.release()
        assert lock.acquire(timeout=20)  # blocking: everyone gets it in the end
        lock.release()
        done.append(time.monotonic())

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads)
    assert len(winners) <= 1
    assert len(done) == 10


def test_async_with_two_masters_paused(
    masters: list[Master], manager: LockManager, lock_name: str
) -> None:
    async def scenario() -> None:
        async with manager.lock(lock_name + ":warm", auto_renew=False):
            pass
        masters[1].pause()
        masters[2].pause()
        holder = manager.lock(lock_name, owner="holder", auto_renew=False)
        started = time.monotonic()
        assert await holder.aacquire(blocking=False)
        assert time.monotonic() - started < 0.5
        assert not await manager.lock(lock_name, owner="x").aacquire(blocking=False)
        info = await manager.aget(lock_name)
        assert info is not None and info.owner == "holder" and not info.fencing_monotonic
        assert await holder.arelease() == 0

    asyncio.run(scenario())


def test_replies_that_came_while_the_client_was_stalled_still_count(
    masters: list[Master], manager: LockManager, lock_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client descheduled past the node timeout (a loaded machine) finds the masters'
    replies waiting in its sockets: they count, the grant stands. The stall is injected
    (a real loaded scheduler cannot be timed): the first ``select`` reports one master
    only, as if the process lost the CPU right after, and sleeps past the deadline."""
    from django_redislock.engine.backends import redlock as module

    real_select = module.select.select
    stalls: list[float] = []

    def stalled_select(
        readable: list[Any], writable: list[Any], errors: list[Any], timeout: float
    ) -> tuple[list[Any], list[Any], list[Any]]:
        ready, _, _ = real_select(readable, writable, errors, timeout)
        if not stalls and ready:
            stalls.append(timeout)
            time.sleep(timeout + 0.05)
            return ready[:1], [], []
        return ready, [], []

    class _Select:
        select = staticmethod(stalled_select)

    lock = manager.lock(lock_name, auto_renew=False)
    assert lock.acquire(blocking=False)  # warm: connections and scripts in place
    assert lock.release() == 0
    monkeypatch.setattr(module, "select", _Select)
    assert lock.acquire(blocking=False)
    assert stalls, "the stall was not injected"
    monkeypatch.undo()
    assert sum(h == lock.owner.encode() for h in _holders(masters, manager, lock_name)) == 5
    assert lock.release() == 0


def test_replies_that_came_while_the_event_loop_was_blocked_still_count(
    manager: LockManager, lock_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The asyncio twin: the loop is blocked (a real ``time.sleep`` in it) past the node
    timeout right after the first master answered; the other masters' replies, read in
    the next loop turns, still count. The block is injected around one master's call."""
    from django_redislock.engine.backends.aredlock import AsyncRedlockBackend

    real_exchange = AsyncRedlockBackend._exchange
    blocked: list[bool] = []

    async def blocking_exchange(self: AsyncRedlockBackend, *args: Any) -> Any:
        reply = await real_exchange(self, *args)
        if not blocked:
            blocked.append(True)
            time.sleep(0.15)  # longer than the 100 ms node timeout of a 30 s lease
        return reply

    async def scenario() -> None:
        lock = manager.lock(lock_name, auto_renew=False)
        async with lock:  # warm: connections and scripts in place
            pass
        monkeypatch.setattr(AsyncRedlockBackend, "_exchange", blocking_exchange)
        assert await lock.aacquire(blocking=False)
        assert blocked, "the block was not injected"
        monkeypatch.undo()
        assert await lock.arelease() == 0

    asyncio.run(scenario())


def test_checks_refuse_one_server_twice_and_warn_about_the_count(
    masters: list[Master],
) -> None:
    same = [masters[0].url, masters[0].url.replace("/0", "/1"), masters[1].url]
    with override_settings(REDISLOCK_REDLOCK_CACHES=same):
        ids = [m.id for m in check_server(databases=["default"])]
        assert "django_redislock.E004" in ids
    with override_settings(REDISLOCK_REDLOCK_CACHES=[m.url for m in masters[:4]]):
        assert [m.id for m in check_server(databases=["default"])] == ["django_redislock.W005"]
    with override_settings(REDISLOCK_REDLOCK_CACHES=[m.url for m in masters]):
        assert check_server(databases=["default"]) == []
        masters[2].pause()
        try:
            messages = check_server(databases=["default"])
        finally:
            masters[2].resume()
        assert [m.id for m in messages] == ["django_redislock.W006"]
    with override_settings(REDISLOCK_REDLOCK_CACHES="redis://127.0.0.1:1/0"):
        assert [m.id for m in check_settings()] == ["django_redislock.E002"]  # a str, not a list


@pytest.mark.slow
def test_processes_lose_no_update(masters: list[Master], lock_name: str) -> None:
    store = redis.Redis.from_url(settings.REDIS_URL)  # the data the lock guards
    counter, inside = f"{lock_name}:counter", f"{lock_name}:inside"
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONPATH=str(ROOT),
        REDISLOCK_TEST_REDLOCK=",".join(m.url for m in masters),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.proc", "count", lock_name, "40", counter, inside],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [out.split()[-2:] for out in outputs] == [["done", "0"]] * 4
    assert int(store.get(counter) or 0) == 4 * 40


@pytest.fixture
def on_redlock(masters: list[Master]) -> Iterator[None]:
    with override_settings(REDISLOCK_REDLOCK_CACHES=[m.url for m in masters]):
        yield


def test_the_default_manager_is_a_quorum_manager(on_redlock: None, lock_name: str) -> None:
    assert isinstance(locks.backend(), RedlockBackend)
    assert locks.backend().features.quorum
    with locks.lock(lock_name) as held:
        info = locks.get(lock_name)
        assert info is not None and info.owner == held.owner
        assert info.fencing_monotonic is False


def test_the_management_command_and_a_guarded_function(on_redlock: None, lock_name: str) -> None:
    holder = locks.lock(lock_name, owner="cli-owner", auto_renew=False)
    assert holder.acquire()
    out = StringIO()
    call_command("redislock", "list", "--prefix", lock_name, stdout=out)
    assert lock_name in out.getvalue() and "1 lock(s) held" in out.getvalue()
    out = StringIO()
    call_command("redislock", "release", lock_name, stdout=out)
    assert "released" in out.getvalue() and locks.get(lock_name) is None

    @single_instance(lock_name + ":{n}", on_locked="skip")
    def guarded(n: int) -> str:
        assert locks.get(f"{lock_name}:{n}") is not None  # held while it runs
        return "ran"

    assert guarded(1) == "ran"
    blocker = locks.lock(f"{lock_name}:2", owner="someone else", auto_renew=False)
    assert blocker.acquire()
    assert guarded(2) is None  # skipped: held by someone else on a majority
    blocker.release()


@pytest.mark.django_db
def test_the_admin_lists_and_releases_redlock_locks(on_redlock: None, lock_name: str) -> None:
    held = [locks.lock(f"{lock_name}:{i}", auto_renew=False) for i in range(3)]
    for lock in held:
        assert lock.acquire()
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    response = client.get("/admin/django_redislock/heldlock/", {"q": lock_name})
    assert response.status_code == 200
    page = response.content.decode()
    assert all(f"{lock_name}:{i}" in page for i in range(3))
    for lock in held:
        lock.release()


@pytest.mark.slow
def test_monotonic_tokens_increase_while_masters_come_and_go(
    masters: list[Master], lock_name: str
) -> None:
    with override_settings(REDISLOCK_REDLOCK_MONOTONIC_FENCING=True):
        manager = LockManager(redlock_caches=[m.url for m in masters])
        assert manager.backend().features.monotonic_fencing
        stop = threading.Event()

        def chaos() -> None:
            rng = random.Random(7)
            while not stop.is_set():
                paused = rng.sample(masters, 2)
                for master in paused:
                    master.pause()
                stop.wait(0.05)
                for master in paused:
                    master.resume()
                stop.wait(0.02)

        thread = threading.Thread(target=chaos)
        thread.start()
        tokens: list[int] = []
        try:
            for i in range(120):
                lock = manager.lock(lock_name, owner=f"holder-{i}", auto_renew=False)
                for _ in range(200):  # a round may find a majority out: ask again
                    try:
                        if lock.acquire(timeout=2):
                            break
                    except QuorumNotReached:
                        time.sleep(0.01)
                else:
                    raise AssertionError("never acquired")
                assert lock.fencing_token is not None
                tokens.append(lock.fencing_token)
                for _ in range(200):
                    try:
                        lock.release()
                        break
                    except QuorumNotReached:
                        time.sleep(0.01)
        finally:
            stop.set()
            thread.join(5)
        assert all(b > a for a, b in zip(tokens, tokens[1:], strict=False)), tokens
        info_lock = manager.lock(lock_name, owner="last", auto_renew=False)
        assert info_lock.acquire(timeout=5)
        info = manager.get(lock_name)
        assert info is not None and info.fencing_monotonic
        assert info.fencing_token == info_lock.fencing_token
        info_lock.release()


def test_an_event_loop_starved_while_the_replies_come_still_counts_them(
    manager: LockManager, lock_name: str
) -> None:
    """The asyncio Redlock's masters answer at once, but the loop is not scheduled until
    well past the node timeout (a starved process on a loaded machine: here the loop's
    own thread is blocked for 0.4 s just after the calls are written). The replies are
    there when it runs again: the loop was late, not the masters, so they count."""

    async def scenario() -> list[bool]:
        loop = asyncio.get_running_loop()
        lock = manager.lock(lock_name, auto_renew=False)
        got = [await lock.aacquire(timeout=0)]  # warm: connections made, scripts loaded
        await lock.arelease()
        for _ in range(5):
            # Blocks the loop after this task has run up to its first wait on a reply.
            loop.call_soon(time.sleep, 0.4)
            got.append(await lock.aacquire(timeout=0))
            await lock.arelease()
        return got

    assert asyncio.run(scenario()) == [True] * 6
