"""The watchdog: one thread per process renewing every held auto-renewed lock.

Each held lock is renewed at about a third of its lease. When the thread wakes
it renews, in one pipelined round trip per backend, every lock that is
due or will be within a short slack, so many locks cost one batch. A renewal
that finds the lock gone or owned by someone else marks the lock lost (the
holder learns it when leaving its ``with`` block, and ``lock_lost`` fires).
If Redis cannot be reached the renewal is retried; once a whole lease has
passed without a confirmed renewal the lock is marked lost, because it may have
expired.

The thread exits about a second after nothing is left to renew and is
started again on the next registration. After ``os.fork()`` the child starts with an empty
registry: it neither renews nor releases its parent's locks.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Protocol

from ..exceptions import LockBackendError
from .calls import AmbiguousReply, Call
from .identity import on_fork_in_child
from .scripts import renew_script

if TYPE_CHECKING:
    from .backends.base import Backend

logger = logging.getLogger("django_redislock")

#: The thread exits after this long with nothing to renew.
IDLE_EXIT_SECONDS = 1.0


class Renewable(Protocol):
    """What the watchdog needs from a lock."""

    def _mark_lost(self, owner: str, reason: str) -> None: ...


class WatchEntry:
    """One (lock, owner) the watchdog keeps alive."""

    __slots__ = ("lock_ref", "owner", "backend", "call", "ttl_ms", "due", "confirmed_at")

    def __init__(
        self, lock: Renewable, owner: str, backend: Backend, key: bytes, ttl_ms: int, name: str
    ) -> None:
        now = time.monotonic()
        # A Lock garbage-collected while held stops being renewed (its lease then
        # runs out) instead of being kept alive by an orphaned entry.
        self.lock_ref = weakref.ref(lock, lambda _ref: watchdog.unwatch(self))
        self.owner = owner
        self.backend = backend
        self.call = Call(renew_script, (key,), (owner, ttl_ms), "renew the lock", name)
        self.ttl_ms = ttl_ms
        self.due = now + ttl_ms / 3000.0
        self.confirmed_at = now


class Watchdog:
    """The process-wide renewal thread and its registry."""

    def __init__(self) -> None:
        self._entries: dict[int, WatchEntry] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")

    def watch(
        self, lock: Renewable, owner: str, backend: Backend, key: bytes, ttl_ms: int, name: str
    ) -> WatchEntry:
        """Start renewing *key* on *backend* for *owner* every ~ttl/3 while *lock* is alive."""
        entry = WatchEntry(lock, owner, backend, key, ttl_ms, name)
        with self._cond:
            self._entries[id(entry)] = entry
            if self._thread is None:
                self._wake_at = entry.due
                self._thread = threading.Thread(
                    target=self._run, name="redislock-watchdog", daemon=True
                )
                self._thread.start()
            elif entry.due < self._wake_at:
                self._cond.notify()
        return entry

    def unwatch(self, entry: WatchEntry) -> None:
        """Stop renewing *entry*."""
        with self._cond:
            self._entries.pop(id(entry), None)
            # Let an idle thread start its short linger now rather than after a
            # far-off renewal time; at most about once per linger period.
            if (
                not self._entries
                and self._thread is not None
                and self._wake_at - time.monotonic() > IDLE_EXIT_SECONDS
            ):
                self._cond.notify()

    @property
    def running(self) -> bool:
        """Whether the watchdog thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def watched(self) -> int:
        """How many (lock, owner) pairs are being renewed."""
        return len(self._entries)

    def _run(self) -> None:
        empty_since: float | None = None
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    if not self._entries:
                        # Linger briefly: a process that takes and releases locks in
                        # a loop must not pay for a thread start on every acquire.
                        empty_since = empty_since or now
                        if now - empty_since >= IDLE_EXIT_SECONDS:
                            self._thread = None
                            self._wake_at = float("inf")
                            return
                        self._wake_at = empty_since + IDLE_EXIT_SECONDS
                        self._cond.wait(self._wake_at - now)
                        continue
                    empty_since = None
                    self._wake_at = min(e.due for e in self._entries.values())
                    if self._wake_at <= now:
                        break
                    self._cond.wait(self._wake_at - now)
                batch = [
                    e for e in self._entries.values() if e.due <= now + min(1.0, e.ttl_ms / 6000.0)
                ]
            try:
                self._renew(batch)
            except Exception:  # pragma: no cover - a bug; the thread must survive it
                logger.exception("redislock watchdog: renewal round failed")

    def _renew(self, batch: list[WatchEntry]) -> None:
        by_backend: dict[int, list[WatchEntry]] = {}
        for entry in batch:
            if entry.lock_ref() is None:
                self.unwatch(entry)
                continue
            by_backend.setdefault(id(entry.backend), []).append(entry)
        for entries in by_backend.values():
            started = time.monotonic()
            try:
                results = entries[0].backend.run_many([e.call for e in entries])
            except (AmbiguousReply, LockBackendError) as exc:
                self._renewal_failed(entries, exc)
                continue
            except Exception as exc:  # never let the watchdog die
                logger.exception("redislock renewal batch failed unexpectedly")
                self._renewal_failed(entries, exc)
                continue
            for entry, result in zip(entries, results, strict=True):
                if isinstance(result, Exception):
                    self._renewal_failed([entry], result)
                elif result == 1:
                    entry.confirmed_at = started
                    entry.due = started + entry.ttl_ms / 3000.0
                else:
                    self._lose(entry, "the lock was no longer held by this owner at renewal")

    def _renewal_failed(self, entries: list[WatchEntry], exc: BaseException) -> None:
        now = time.monotonic()
        for entry in entries:
            if now - entry.confirmed_at >= entry.ttl_ms / 1000.0:
                self._lose(entry, f"no renewal could be confirmed for a whole lease ({exc})")
            else:
                logger.warning("redislock renewal of %r failed, retrying: %s", entry.call.name, exc)
                entry.due = now + min(1.0, entry.ttl_ms / 6000.0)

    def _lose(self, entry: WatchEntry, reason: str) -> None:
        self.unwatch(entry)
        lock = entry.lock_ref()
        if lock is not None:
            lock._mark_lost(entry.owner, reason)

    def _reset_after_fork(self) -> None:
        self._entries = {}
        self._cond = threading.Condition()
        self._thread = None
        self._wake_at = float("inf")


#: The process's watchdog.
watchdog = Watchdog()
on_fork_in_child(watchdog._reset_after_fork)
