"""The waiters of a lock as ``locks.get()`` shows them: in order, with what they wait
for, and gone once they give up or die. Waiters are threads, asyncio tasks and real
child processes (one SIGKILLed while it waits)."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_redislock import locks
from django_redislock.engine.lua.common import ENTRY_LIFE_MS
from tests.holding import wait_until

ROOT = Path(__file__).resolve().parent.parent


def _owners(name: str) -> list[str]:
    info = locks.get(name)
    return [] if info is None else [w.owner for w in info.waiters]


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    made: list[subprocess.Popen[str]] = []
    yield made
    for proc in made:
        proc.kill()
        proc.wait(10)


def _waiting_child(name: str, owner: str) -> subprocess.Popen[str]:
    code = textwrap.dedent(
        f"""
        import django
        django.setup()
        from django_redislock import locks
        print("waiting", flush=True)
        locks.lock({name!r}, owner={owner!r}).acquire()
        """
    )
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    assert ready and proc.stdout.readline().strip() == "waiting"
    return proc


def test_a_waiter_that_dies_leaves_the_list_within_its_entry_life(
    children: list[subprocess.Popen[str]], name: str
) -> None:
    holder = locks.lock(name, owner="holder")
    assert holder.acquire()
    try:
        doomed = _waiting_child(name, "doomed")
        children.append(doomed)
        children.append(_waiting_child(name, "alive"))
        wait_until(lambda: _owners(name) == ["doomed", "alive"], timeout=10)
        info = locks.get(name)
        assert info is not None and info.waiters[0].pid == doomed.pid
        doomed.send_signal(signal.SIGKILL)
        # Its entry is no longer refreshed: listed no longer than its life (+ a refresh).
        wait_until(lambda: _owners(name) == ["alive"], timeout=ENTRY_LIFE_MS / 1000 + 2)
    finally:
        holder.release()


def test_a_waiter_that_gives_up_leaves_the_list_at_once(name: str) -> None:
    holder = locks.lock(name, owner="holder")
    assert holder.acquire()
    gave_up = threading.Event()

    def wait() -> None:
        assert not locks.lock(name, owner="impatient").acquire(timeout=0.5)
        gave_up.set()

    thread = threading.Thread(target=wait)
    try:
        thread.start()
        wait_until(lambda: _owners(name) == ["impatient"])
        assert gave_up.wait(5)
        assert _owners(name) == []
    finally:
        thread.join(5)
        holder.release()


def test_read_and_write_waiters_say_what_they_wait_for(name: str) -> None:
    rw = locks.rw_lock(name, owner="writer")
    assert rw.write().acquire()
    done = threading.Event()

    def wait(owner: str, mode: str) -> None:
        side = locks.rw_lock(name, owner=owner)
        lock = side.read() if mode == "read" else side.write()
        if lock.acquire(timeout=10):
            done.wait(10)
            lock.release()

    threads = [
        threading.Thread(target=wait, args=("reader", "read")),
        threading.Thread(target=wait, args=("next writer", "write")),
    ]
    try:
        for count, thread in enumerate(threads, 1):
            thread.start()
            wait_until(lambda n=count: len(_owners(name)) == n)
        info = locks.get(name)
        assert info is not None
        assert [(w.owner, w.mode) for w in info.waiters] == [
            ("reader", "read"),
            ("next writer", "write"),
        ]
    finally:
        done.set()
        rw.write().release()
        for thread in threads:
            thread.join(15)


def test_asyncio_waiters_are_listed_and_read_with_aget(name: str) -> None:
    async def listed(count: int) -> list[str]:
        for _ in range(500):
            info = await locks.aget(name)
            if info is not None and len(info.waiters) == count:
                return [w.owner for w in info.waiters]
            await asyncio.sleep(0.01)
        raise AssertionError(f"{count} asyncio waiters were not listed in time")

    async def scenario() -> list[str]:
        holder = locks.lock(name, owner="holder")
        assert await holder.aacquire()
        waiting: list[asyncio.Task[bool]] = []
        try:
            for i in range(2):
                lock = locks.lock(name, owner=f"task {i}")
                waiting.append(asyncio.create_task(lock.aacquire(timeout=10)))
                owners = await listed(i + 1)
            return owners
        finally:
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            await holder.arelease()

    assert asyncio.run(scenario()) == ["task 0", "task 1"]
