"""Deadlock detection (``deadlock_timeout``) for locks nested by hand: a cycle of
waiters is broken by refusing its youngest wait with ``LockDeadlock``, within the
timeout and a small margin; busy queues without a cycle are never refused."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_redislock import LockManager, LockNotAcquired, locks
from django_redislock.exceptions import LockDeadlock, LockError

#: The deadlock_timeout of these tests, and the margin a refusal may take beyond it.
TIMEOUT, MARGIN = 0.5, 1.5


def _nest(
    first: str, second: str, both_hold: threading.Barrier, results: dict[str, Any], key: str,
    manager: LockManager = locks,
) -> Callable[[], None]:  # fmt: skip
    """A thread body: hold *first*, wait until every thread holds its first, then take
    *second*; records ("deadlock", seconds waited, error) or ("acquired", seconds)."""

    def run() -> None:
        with manager.lock(first, ttl=30):
            both_hold.wait(10)
            started = time.monotonic()
            try:
                with manager.lock(second, ttl=30, timeout=20, deadlock_timeout=TIMEOUT):
                    results[key] = ("acquired", time.monotonic() - started)
            except LockDeadlock as error:
                results[key] = ("deadlock", time.monotonic() - started, error)
            except LockNotAcquired as error:
                results[key] = ("timeout", time.monotonic() - started, error)

    return run


def _cycle(names: list[str], manager: LockManager = locks) -> dict[str, Any]:
    """One thread per name, each holding its name and then waiting for the next one's."""
    barrier = threading.Barrier(len(names))
    results: dict[str, Any] = {}
    threads = [
        threading.Thread(target=_nest(n, names[(i + 1) % len(names)], barrier, results, n, manager))
        for i, n in enumerate(names)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive(), "a thread is still waiting (the deadlock was not broken)"
    return results


@pytest.mark.parametrize("size", [2, 3])
def test_a_cycle_of_waiters_refuses_exactly_one_wait_in_time(name: str, size: int) -> None:
    names = [f"{name}:{i}" for i in range(size)]
    results = _cycle(names)
    refused = [k for k, r in results.items() if r[0] == "deadlock"]
    assert len(refused) == 1, results
    assert all(r[0] in ("deadlock", "acquired") for r in results.values()), results
    _, waited, error = results[refused[0]]
    assert waited < TIMEOUT + MARGIN, f"refused after {waited:.2f} s"
    assert isinstance(error, LockNotAcquired)
    assert len(error.cycle) == size
    assert {edge[1] for edge in error.cycle} == set(names)
    assert "deadlock" in str(error) and "youngest" in str(error)
    assert locks.get_many(names) == []  # nothing left held


def test_the_refused_wait_is_the_youngest(name: str) -> None:
    a, b = f"{name}:a", f"{name}:b"
    results: dict[str, Any] = {}
    hold_a, hold_b = locks.lock(a, owner="old", ttl=30), locks.lock(b, owner="young", ttl=30)
    assert hold_a.acquire() and hold_b.acquire()

    def wait(owner: str, target: str) -> None:
        try:
            with locks.lock(target, owner=owner, ttl=30, timeout=20, deadlock_timeout=TIMEOUT):
                results[owner] = "acquired"
        except LockDeadlock as error:
            results[owner] = error

    old = threading.Thread(target=wait, args=("old", b))
    old.start()
    time.sleep(0.3)  # "old" waits first; "young" closes the cycle
    young = threading.Thread(target=wait, args=("young", a))
    young.start()
    young.join(20)
    assert isinstance(results.get("young"), LockDeadlock), results
    hold_b.release()  # the refused "young" lets its lock go: "old" gets it
    old.join(20)
    assert results["old"] == "acquired"
    hold_a.release()


def test_busy_queues_without_a_cycle_are_never_refused(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Threads nest random pairs in one global order (smaller name first): chains of
    # waiters, no cycle. A short deadlock_timeout makes every wait look.
    import random

    from django_redislock.engine.deadlock import DeadlockWatch

    looks: list[bool] = []
    walk = DeadlockWatch._walk

    def counted(self: DeadlockWatch, run: Any) -> Any:
        found = yield from walk(self, run)
        looks.append(bool(found))
        return found

    monkeypatch.setattr(DeadlockWatch, "_walk", counted)

    names = [f"{name}:{i}" for i in range(4)]
    problems: list[str] = []
    stop = time.monotonic() + 4.0

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < stop:
            outer, inner = sorted(rng.sample(names, 2))
            try:
                with locks.lock(outer, ttl=30, timeout=20, deadlock_timeout=0.05):
                    with locks.lock(inner, ttl=30, timeout=20, deadlock_timeout=0.05):
                        time.sleep(rng.uniform(0, 0.02))
            except LockError as error:
                problems.append(repr(error))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive()
    assert problems == []
    assert len(looks) > 20, f"only {len(looks)} looks: the test did not exercise detection"
    assert not any(looks)


def test_an_async_cycle(name: str) -> None:
    a, b = f"{name}:a", f"{name}:b"

    async def nest(first: str, second: str, both: asyncio.Barrier) -> str:
        async with locks.lock(first, ttl=30):
            await both.wait()
            try:
                async with locks.lock(second, ttl=30, timeout=20, deadlock_timeout=TIMEOUT):
                    return "acquired"
            except LockDeadlock:
                return "deadlock"

    async def main() -> list[str]:
        try:
            both = asyncio.Barrier(2)
            return sorted(await asyncio.gather(nest(a, b, both), nest(b, a, both)))
        finally:
            await locks.source.abackend().aclose()

    if not hasattr(asyncio, "Barrier"):
        pytest.skip("asyncio.Barrier is Python 3.11+")
    assert asyncio.run(main()) == ["acquired", "deadlock"]


def test_misuse_is_refused_with_a_named_error(name: str) -> None:
    with pytest.raises(ValueError, match="mutexes"):
        locks.semaphore(name, limit=2, deadlock_timeout=1)
    with pytest.raises(ValueError):
        locks.lock(name, deadlock_timeout=-1)
    with pytest.raises(TypeError):
        locks.lock(name, deadlock_timeout="1")  # type: ignore[arg-type]


def test_redlock_refuses_deadlock_detection(name: str) -> None:
    from tests.redis_server import RedisServer

    servers = [RedisServer() for _ in range(3)]
    try:
        m = LockManager(redlock_caches=[f"{s.url}?socket_timeout=5" for s in servers])
        with pytest.raises(LockError, match="deadlock_timeout needs one Redis or a Redis Cluster"):
            m.lock(name, deadlock_timeout=1).acquire(timeout=1)
        held = m.lock(name, deadlock_timeout=1)
        assert held.acquire(blocking=False)  # no wait: no look
        held.release()
    finally:
        for server in servers:
            server.stop()


@pytest.mark.slow
def test_a_cycle_across_cluster_slots() -> None:
    import uuid

    from tests.redis_cluster import shared_cluster
    from tests.test_cluster import names_on_each_primary

    m = LockManager(client=shared_cluster().client())
    names = names_on_each_primary(m, f"dl{uuid.uuid4().hex[:6]}:")
    results = _cycle(names, m)
    assert sorted(r[0] for r in results.values()) == ["acquired", "acquired", "deadlock"], results
    assert m.get_many(names) == []


def test_a_stale_pointer_is_no_wait(name: str) -> None:
    # "x" holds a and left a pointer saying it waits for b (an earlier wait's, still
    # alive); "y" holds b and waits for a. x waits for nothing: no cycle, no refusal.
    from django_redislock.engine.deadlock import DeadlockWatch

    a, b = f"{name}:a", f"{name}:b"
    x, y = locks.lock(a, owner="x", ttl=30), locks.lock(b, owner="y", ttl=30)
    assert x.acquire() and y.acquire()
    backend = locks.backend()
    pointer = DeadlockWatch(backend.keyspace, "x", a, "n", 1.0).pointer_key("x")
    backend.client.set(pointer, f"an-earlier-nonce|{b}", px=10_000)
    try:
        # Times out (False); a LockDeadlock would be a false positive.
        assert (
            locks.lock(a, owner="y", ttl=30, timeout=1.5, deadlock_timeout=0.2).acquire() is False
        )
    finally:
        x.release()
        y.release()


def test_the_youngest_wait_is_picked_by_every_waiter() -> None:
    from django_redislock.engine.deadlock import Wait, victim

    cycle = (Wait("a", "n1", "1", 100, "b"), Wait("b", "n2", "2", 300, "c"),
             Wait("c", "n3", "3", 200, "a"))  # fmt: skip
    assert victim(cycle) == "b"
    assert victim(cycle[1:] + cycle[:1]) == "b"  # whoever walks it
    tie = (Wait("a", "n1", "1", 300, "b"), Wait("b", "n2", "2", 300, "a"))
    assert victim(tie) == victim(tie[::-1]) == "b"


# -- real processes -------------------------------------------------------------------------


def _children(*commands: list[str]) -> list[Any]:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(root))
    return [
        subprocess.Popen(
            [sys.executable, "-m", "tests.deadlock_proc", *command],
            cwd=root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for command in commands
    ]


def _go(children: list[Any], ready: str) -> None:
    from tests.test_multiprocess import _expect_line

    for child in children:
        _expect_line(child, ready, 60)
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 3])
def test_processes_nesting_in_a_cycle(name: str, size: int) -> None:
    from tests.test_multiprocess import _expect_line

    names = [f"{name}:{i}" for i in range(size)]
    children = _children(
        *(["cycle", n, names[(i + 1) % size], str(TIMEOUT)] for i, n in enumerate(names))
    )
    try:
        _go(children, "holding")
        outcomes = [
            _expect_line(child, "", 30) for child in children
        ]  # the first line after "go": its outcome
        for child in children:
            _expect_line(child, "done", 30)
    finally:
        for child in children:
            child.kill()
            child.wait(10)
    kinds = sorted(o[0] for o in outcomes)
    assert kinds == ["acquired"] * (size - 1) + ["deadlock"], outcomes
    waited = next(float(o[1]) for o in outcomes if o[0] == "deadlock")
    assert waited < TIMEOUT + MARGIN, f"refused after {waited:.2f} s"
    assert locks.get_many(names) == []


@pytest.mark.slow
def test_processes_nesting_without_cycles_are_never_refused(name: str) -> None:
    from tests.test_multiprocess import _expect_line

    children = _children(*(["nest", f"{name}:", "8", str(i)] for i in range(3)))
    try:
        _go(children, "ready")
        results = [_expect_line(child, "done", 60)[1:] for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait(10)
    assert [int(r[1]) for r in results] == [0, 0, 0], results
    assert all(int(r[0]) > 20 for r in results), results


def test_every_deadlock_script_names_its_keys(name: str) -> None:
    from django_redislock.engine.lua import deadlock as deadlock_scripts
    from tests.redis_server import RedisServer
    from tests.test_script_keys import (
        Monitor,
        _assert_every_script_names_a_key,
        _package_scripts,
    )

    server = RedisServer()
    try:
        m = LockManager(url=f"{server.url}?socket_timeout=5")
        monitor = Monitor(server.url)
        results = _cycle([f"{name}:a", f"{name}:b"], m)
        assert sorted(r[0] for r in results.values()) == ["acquired", "deadlock"]
        sent = _assert_every_script_names_a_key(monitor.stop())
    finally:
        server.stop()
    assert set(_package_scripts(deadlock_scripts)) <= sent
