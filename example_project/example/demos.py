"""The lock code the example pages run -- the part worth reading.

* :func:`count_in_threads` -- several threads do a read-modify-write on one
  Redis counter, inside ``locks.lock("demo:counter")`` (or, to see what goes
  wrong, without it).
* :func:`hold_in_background` -- take a lock now and release it from a
  background thread N seconds later, so the admin has something to show.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field

from django_redislock import LockNotAcquired, LockNotOwned, locks

logger = logging.getLogger(__name__)

#: The Redis key of the demo counter.
COUNTER_KEY = "example:counter"
COUNTER_LOCK = "demo:counter"


def read_counter() -> int:
    """The counter's current value (0 when it was never written)."""
    return int(locks.client.get(COUNTER_KEY) or 0)


def _increment_once(use_lock: bool, fences: list[int]) -> None:
    """One non-atomic read-modify-write; INCR would be atomic, which is not the point."""
    client = locks.client
    if not use_lock:
        value = int(client.get(COUNTER_KEY) or 0)
        time.sleep(0.001)  # the window in which another thread reads the same value
        client.set(COUNTER_KEY, value + 1)
        return
    with locks.lock(COUNTER_LOCK, ttl=10, timeout=10, purpose="example: counter demo") as held:
        value = int(client.get(COUNTER_KEY) or 0)
        time.sleep(0.001)
        client.set(COUNTER_KEY, value + 1)
        fences.append(held.fencing_token or 0)


@dataclass
class CountResult:
    """What one run of :func:`count_in_threads` did."""

    threads: int
    per_thread: int
    use_lock: bool
    before: int
    after: int
    seconds: float
    fences: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def expected(self) -> int:
        """How many increments were made."""
        return self.threads * self.per_thread

    @property
    def lost(self) -> int:
        """Increments that were overwritten by a concurrent writer."""
        return self.expected - (self.after - self.before)


def count_in_threads(threads: int = 4, per_thread: int = 25, use_lock: bool = True) -> CountResult:
    """Run *threads* threads that each increment the counter *per_thread* times."""
    fences: list[int] = []
    errors: list[str] = []

    def work() -> None:
        try:
            for _ in range(per_thread):
                _increment_once(use_lock, fences)
        except LockNotAcquired as exc:
            errors.append(str(exc))

    before = read_counter()
    started = time.monotonic()
    workers = [threading.Thread(target=work, name=f"counter-{i}") for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return CountResult(
        threads=threads,
        per_thread=per_thread,
        use_lock=use_lock,
        before=before,
        after=read_counter(),
        seconds=time.monotonic() - started,
        fences=fences,
        errors=errors,
    )


def hold_in_background(name: str, seconds: float, ttl: float = 10) -> bool:
    """Take lock *name* now and release it from a background thread after *seconds*.

    The lock gets an explicit owner token, so the thread that releases it need
    not be the request thread that took it. Its lease (*ttl*) is shorter than the
    hold: the watchdog renews it every ttl/3 seconds. Returns False when the lock
    is already held.
    """
    lock = locks.lock(
        name,
        ttl=ttl,
        owner=f"example-hold:{secrets.token_hex(8)}",
        purpose=f"held for {seconds:g} s from the example home page",
        extra={"requested_seconds": seconds},
    )
    if not lock.acquire(blocking=False):
        return False

    def release_later() -> None:
        time.sleep(seconds)
        try:
            lock.release()
        except LockNotOwned:
            logger.info("lock %r was released by someone else (the admin?)", name)

    threading.Thread(target=release_later, name=f"hold-{name}", daemon=True).start()
    return True
