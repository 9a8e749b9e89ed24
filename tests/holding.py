"""Helpers for the in-process tests of semaphores, read-write locks and fairness:
bounded waits, the queue length of a lock, and a thread that holds a lock until told."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

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
