"""The watchdog: one thread per process renewing every held auto-renewed lock.

Each held lock is renewed at about a third of its lease. When the thread wakes
it renews, in one pipelined round trip per backend, every lock that is due or
will be within a short slack, so many locks cost one batch; each backend's
batch runs in its own short-lived thread, so one stalled Redis holds up no
other. A renewal that finds the lock gone or owned by someone else marks the
lock lost (the holder learns it when leaving its ``with`` block, and
``lock_lost`` fires). If Redis cannot be reached the renewal is retried; once
no renewal has been confirmed for a lease less a safety margin (a tenth of
it, at most a second), the lock is marked lost -- before it can have expired
in Redis, even while a renewal is still stuck on the network.

The thread exits about a second after nothing is left to renew and is
started again on the next registration. After ``os.fork()`` the child starts with an empty
registry: it neither renews nor releases its parent's locks.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from ..exceptions import LockBackendError
from .calls import AmbiguousReply, Call
from .identity import on_fork_in_child
from .lua.common import LOST_SCRIPT
from .mutex import FAIR, Kind

if TYPE_CHECKING:
    from .backends.base import Backend

logger = logging.getLogger("django_redislock")

#: The thread exits after this long with nothing to renew.
IDLE_EXIT_SECONDS = 1.0


class Renewable(Protocol):
    """What the watchdog needs from a lock."""

    def _mark_lost(self, owner: str, reason: str) -> None: ...

    def _renewed(self, owner: str, error: BaseException | None, sent_at: float) -> None: ...


class WatchEntry:
    """One (lock, owner) the watchdog keeps alive."""

    __slots__ = (
        "lock_ref", "owner", "backend", "keys", "name", "ttl_ms", "due", "confirmed_at",
        "in_flight", "slack", "active", "replicas", "kind", "lease_ms", "retry_in",
    )  # fmt: skip

    def __init__(
        self,
        lock: Renewable,
        owner: str,
        backend: Backend,
        keys: Sequence[bytes],
        ttl_ms: int,
        name: str,
        claim_ms: int | None = None,
        replicas: int = 0,
        kind: Kind = FAIR,
        lease_ms: int | None = None,
    ) -> None:
        now = time.monotonic()
        # A Lock garbage-collected while held stops being renewed (its lease then
        # runs out) instead of being kept alive by an orphaned entry.
        self.lock_ref = weakref.ref(lock, self._collected)
        self.owner = owner
        self.backend = backend
        #: The keys of the hold's *kind* (``kind.keys``).
        self.keys = keys
        #: What is renewed: a mutex, a permit, a read or a write; it makes the call.
        self.kind = kind
        self.name = name
        self.ttl_ms = ttl_ms
        #: The lease a renewal sets in Redis: the ttl, plus a lock-delay (the holder
        #: counts itself lost by the ttl; the key outlives that by the delay).
        self.lease_ms = ttl_ms if lease_ms is None else lease_ms
        #: Replicas that must acknowledge a renewal for it to count.
        self.replicas = replicas
        self.active = True
        self.due = now + ttl_ms / 3000.0
        #: When the last renewal Redis confirmed was sent (the lease runs at least a ttl from it).
        self.confirmed_at = now
        self.in_flight = False
        #: How soon a failed renewal is tried again.
        self.retry_in = min(1.0, ttl_ms / 6000.0)
        #: How early a due renewal may join a batch that is sent anyway.
        self.slack = self.retry_in
        if claim_ms is not None:
            # A hand-off, leased for the claim window only: renew (claim) within a
            # third of it (a short hold is released before that and costs nothing),
            # and count it lost by the end of the window.
            window = min(ttl_ms, claim_ms) / 1000.0
            self.due = now + window / 3
            self.confirmed_at = now - max(0, ttl_ms - claim_ms) / 1000.0
            self.slack = window / 6

    def _collected(self, _ref: object) -> None:
        if self.active:  # not unwatched yet: its Lock was dropped while held
            watchdog.unwatch(self, wait=False)

    @property
    def call(self) -> Call:
        """The renewal script call (made when a batch is sent, not on every acquire)."""
        return self.kind.renew_call(self.keys, self.owner, self.lease_ms, self.name, self.replicas)

    @property
    def lost_at(self) -> float:
        """When the hold counts as lost unless a renewal is confirmed first.

        A safety margin before the lease can have run out in Redis, so the holder
        learns of the loss before somebody else can hold the lock.
        """
        ttl = self.ttl_ms / 1000.0
        return self.confirmed_at + ttl - min(1.0, ttl / 10)


class Watchdog:
    """The process-wide renewal thread and its registry.

    The thread schedules; each batch runs in a short-lived thread of its own,
    one batch per backend at a time, so a stalled Redis delays neither the
    renewals of another Redis nor the news that a stalled hold is lost.
    """

    def __init__(self) -> None:
        self._entries: dict[int, WatchEntry] = {}
        # watch() and unwatch() take the condition's lock itself: one C call each way
        # on every acquire and release (the condition's own methods are Python's).
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")
        self._busy: set[int] = set()  # backends with a batch in flight

    def watch(
        self,
        lock: Renewable,
        owner: str,
        backend: Backend,
        keys: Sequence[bytes],
        ttl_ms: int,
        name: str,
        claim_ms: int | None = None,
        replicas: int = 0,
        kind: Kind = FAIR,
        lease_ms: int | None = None,
    ) -> WatchEntry:
        """Renew the lock at *keys* on *backend* for *owner* every ~ttl/3 while *lock* lives.

        *claim_ms*: the hold was handed off and is leased for that long only, so
        the first renewal (which claims it) is due within a third of that.
        *replicas*: a renewal counts only once that many replicas acknowledged it.
        *keys* and *kind*: the keys of the hold and what it is (a mutex, a permit, a
        read or a write), which makes the renewal call. *lease_ms*: the lease each
        renewal sets in Redis when it is longer than the ttl (a lock-delay).
        """
        entry = WatchEntry(
            lock, owner, backend, keys, ttl_ms, name, claim_ms, replicas, kind, lease_ms
        )
        with self._mutex:
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

    def unwatch(self, entry: WatchEntry, *, wait: bool = True) -> None:
        """Stop renewing *entry*.

        Without *wait* (a collected Lock's callback) this never blocks: at
        interpreter exit the callback runs while the stopped daemon thread may hold
        the condition for ever. If the condition is busy, the entry is left for the
        thread's next round, which drops entries whose Lock is gone.
        """
        entry.active = False
        if not self._mutex.acquire(blocking=wait):
            return
        try:
            self._entries.pop(id(entry), None)
            # Let an idle thread start its short linger now rather than after a
            # far-off renewal time; at most about once per linger period.
            if (
                not self._entries
                and self._thread is not None
                and self._wake_at - time.monotonic() > IDLE_EXIT_SECONDS
            ):
                self._cond.notify()
        finally:
            self._mutex.release()

    @property
    def running(self) -> bool:
        """Whether the watchdog thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def watched(self) -> int:
        """How many (lock, owner) pairs are being renewed."""
        return len(self._entries)

    def entries(self) -> list[WatchEntry]:
        """The holds being renewed, a snapshot (each names its lock and its owner)."""
        with self._mutex:
            return list(self._entries.values())

    def _run(self) -> None:
        empty_since: float | None = None
        while True:
            with self._cond:
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
                lost, batches = self._take_work(now)
                if not lost and not batches:
                    # No entry left (their locks were collected meanwhile): no
                    # wake-up time either; the next round lingers, as above.
                    if self._entries:
                        self._cond.wait(max(0.0, self._wake_at - now))
                    continue
            try:
                for entry in lost:
                    self._lose(entry, "no renewal was confirmed in time; the lease may run out")
                for backend_id, entries in batches.items():
                    threading.Thread(
                        target=self._renew_batch,
                        args=(backend_id, entries),
                        name="redislock-renewal",
                        daemon=True,
                    ).start()
            except Exception:  # pragma: no cover - a bug; the thread must survive it
                logger.exception("redislock watchdog: renewal round failed")

    def _take_work(self, now: float) -> tuple[list[WatchEntry], dict[int, list[WatchEntry]]]:
        """(holds past their safety margin, due batches by backend); sets ``_wake_at``."""
        lost: list[WatchEntry] = []
        batches: dict[int, list[WatchEntry]] = {}
        wake_at = float("inf")
        for entry in list(self._entries.values()):
            if entry.lock_ref() is None:
                self._entries.pop(id(entry), None)
                continue
            if now >= entry.lost_at:
                self._entries.pop(id(entry), None)
                lost.append(entry)
                continue
            wake_at = min(wake_at, entry.lost_at)
            if entry.in_flight:
                continue
            backend_id = id(entry.backend)
            if entry.due <= now + entry.slack and backend_id not in self._busy:
                batches.setdefault(backend_id, []).append(entry)
            else:
                wake_at = min(wake_at, entry.due)
        for backend_id, entries in batches.items():
            self._busy.add(backend_id)
            for entry in entries:
                entry.in_flight = True
        self._wake_at = wake_at
        return lost, batches

    def _renew_batch(self, backend_id: int, entries: list[WatchEntry]) -> None:
        started = time.monotonic()
        failure: BaseException | None = None
        results: list[object] = []
        try:
            results = entries[0].backend.run_many([e.call for e in entries])
        except (AmbiguousReply, LockBackendError) as exc:
            failure = exc
        except Exception as exc:  # never let a renewal take the process's renewals down
            logger.exception("redislock renewal batch failed unexpectedly")
            failure = exc
        lost: list[tuple[WatchEntry, str]] = []
        renewed: list[tuple[WatchEntry, BaseException | None]] = []  # (sent at *started*)
        with self._cond:
            self._busy.discard(backend_id)
            now = time.monotonic()
            for i, entry in enumerate(entries):
                entry.in_flight = False
                if id(entry) not in self._entries:
                    continue  # released, or already declared lost, meanwhile
                result = failure if failure is not None else results[i]
                if isinstance(result, BaseException):
                    logger.warning(
                        "redislock renewal of %r failed, retrying: %s", entry.name, result
                    )
                    entry.due = now + entry.retry_in
                    entry.slack = 0.0  # retry at that time, not at once
                    renewed.append((entry, result))
                elif result == 1:
                    entry.confirmed_at = started
                    entry.due = started + entry.ttl_ms / 3000.0
                    entry.slack = entry.retry_in
                    renewed.append((entry, None))
                else:
                    self._entries.pop(id(entry), None)
                    lost.append((entry, "the lock was no longer held by this owner at renewal"))
            self._cond.notify()
        for entry, error in renewed:  # outside the condition: receivers may take time
            lock = entry.lock_ref()
            try:
                if lock is not None:
                    lock._renewed(entry.owner, error, started)
            except Exception:  # a receiver's failure must not skip the losses below
                logger.exception("redislock: a lock_renewed receiver failed")
        for entry, reason in lost:
            self._lose(entry, reason)
            if not entry.backend.features.quorum:  # (Redlock records no history)
                self._record_lost(entry)

    def _lose(self, entry: WatchEntry, reason: str) -> None:
        self.unwatch(entry)
        lock = entry.lock_ref()
        if lock is not None:
            lock._mark_lost(entry.owner, reason)

    @staticmethod
    def _record_lost(entry: WatchEntry) -> None:
        """Put a hold its renewal found gone into the lock's history (best effort: the
        loss is already reported; a Redis error here changes nothing)."""
        keys = entry.keys  # (the lock's key names the event in its slot's history)
        args = (entry.owner, keys[0])
        call = Call(LOST_SCRIPT, (keys[1],), args, "record a lost lock", entry.name)
        try:
            entry.backend.run(call)
        except Exception:  # (the history is for operators; never fail the watchdog)
            logger.debug("redislock: could not record the loss of %r", entry.name, exc_info=True)

    def _reset_after_fork(self) -> None:
        self._entries = {}
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._thread = None
        self._wake_at = float("inf")
        self._busy = set()


#: The process's watchdog.
watchdog = Watchdog()
on_fork_in_child(watchdog._reset_after_fork)
