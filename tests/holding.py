"""Helpers for the in-process tests of semaphores, read-write locks and fairness:
bounded waits, the queue length of a lock, and a thread that holds a lock until told."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from django_redislock import Lock, locks


def wait_until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll *check* every 10 ms until it is true; fail after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def queued(redis_client, name: str) -> int:  # type: ignore[no-untyped-def]
    """How many waiters the queue of the lock *name* has."""
    return int(redis_client.llen(locks.lock(name).key.replace(":{", ":queue:{", 1)))


class Holder(threading.Thread):
    """A thread that takes *lock*, appends *tag* to *log*, and holds it until ``leave``."""

    def __init__(self, lock: Lock, log: list[str], tag: str) -> None:
        super().__init__(daemon=True)
        self.lock, self.log, self.tag = lock, log, tag
        self.holding = threading.Event()
        self.leave = threading.Event()
        self.token: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.lock:
                self.token = self.lock.fencing_token
                self.log.append(self.tag)
                self.holding.set()
                self.leave.wait(10)
        except BaseException as exc:  # reported by the test
            self.error = exc


class QueuedWaiters:
    """Threads waiting in a lock's queue: :meth:`add` returns once ``locks.get`` lists
    the new waiter; :meth:`close` lets each waiter that got the lock release it, and
    joins them (the test releases the holder first)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.done = threading.Event()
        self.threads: list[threading.Thread] = []

    def listed(self) -> list[str]:
        """The owners waiting for the lock, first in line first."""
        info = locks.get(self.name)
        return [w.owner for w in info.waiters] if info else []

    def add(self, lock: Lock, timeout: float | None) -> None:
        """Start a thread waiting for *lock* (at most *timeout* seconds; None: no limit)."""

        def run() -> None:
            if lock.acquire(timeout=timeout):
                self.done.wait(10)
                lock.release()

        before = len(self.listed())
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)
        wait_until(lambda: len(self.listed()) == before + 1, timeout=10)

    def close(self) -> None:
        """Let every waiter finish; each is joined for at most 40 s."""
        self.done.set()
        for thread in self.threads:
            thread.join(40)


def contend(guarded: Callable[[float], object], name: str, hold: float = 0.3) -> None:
    """Two calls of *guarded* (a function guarded by the lock *name*, taking how long to
    hold it): the second waits for the first and is handed the lock (one hand-off)."""
    first = threading.Thread(target=guarded, args=(hold,))
    first.start()
    wait_until(lambda: locks.get(name) is not None)
    second = threading.Thread(target=guarded, args=(0,))
    second.start()
    first.join(10)
    second.join(10)


def queued_waiter(
    redis_client: redis.Redis, name: str, **options: Any
) -> tuple[threading.Thread, threading.Event]:
    """A thread that waits for the lock *name* (``locks.lock(name, **options)``), sets
    the event once it holds it and leaves at once; returned once it is queued."""
    got = threading.Event()

    def wait() -> None:
        with locks.lock(name, **options):
            got.set()

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: queued(redis_client, name) == 1)
    return thread, got
