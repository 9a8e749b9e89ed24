"""The watchdog: one thread per process renewing every held auto-renewed lock.

Each held lock is renewed at about a third of its lease. When the thread wakes
it renews, in pipelined round trips per backend (at most :data:`CHUNK` renewals
each), every lock that is due or will be within a short slack, so many locks
cost one batch; each backend's batch runs in its own short-lived thread, so one
stalled Redis holds up no other. A renewal that finds the lock gone or owned by
someone else marks the lock lost (the holder learns it when leaving its ``with``
block, and ``lock_lost`` fires). If Redis cannot be reached the renewal is
retried; once no renewal has been confirmed for a lease less a safety margin (a
tenth of it, at most a second), the lock is marked lost -- before it can have
expired in Redis, even while a renewal is still stuck on the network.

The holds wait in a heap ordered by when each is next due, so a wake-up costs
what it renews, not what the process holds: an acquire, a release and a renewal
are each O(log n) in C (amortised O(1) for an acquire, whose renewal is due after
every other of its lease), whatever the number of holds. A hold on its way to
Redis leaves the heap; its batch remembers the earliest moment one of its holds
counts as lost, and only a batch stuck past that moment is looked into.

The watchdog warns (a log line, and :attr:`Watchdog.on_overload`, which the
package turns into the ``watchdog_overloaded`` signal and a metric) when the
holds need more renewals a second than its ceiling (:attr:`Watchdog.ceiling`,
``REDISLOCK_WATCHDOG_CEILING``), and when a renewal goes out more than halfway
from when it was due to when its hold would count as lost.

The thread exits about a second after nothing is left to renew and is
started again on the next registration. After ``os.fork()`` the child starts with an empty
registry: it neither renews nor releases its parent's locks.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Protocol

from ..exceptions import LockBackendError
from .calls import AmbiguousReply, Call
from .identity import on_fork_in_child
from .lua.common import LOST_SCRIPT
from .mutex import FAIR, Kind
from .watch_load import DEFAULT_CEILING, LoadWarnings, Overload, tell
from .watch_parts import Group, level_of

if TYPE_CHECKING:
    from .backends.base import Backend

logger = logging.getLogger("django_redislock")

#: The thread exits after this long with nothing to renew.
IDLE_EXIT_SECONDS = 1.0
#: The most renewals one round trip carries; a larger batch is sent in several, one
#: after another on the batch's thread (each confirmed as its replies come).
CHUNK = 1000
#: The heap is rebuilt without released holds' entries once they are more than
#: half of it (and at least this many).
COMPACT_MIN = 1024


class Renewable(Protocol):
    """What the watchdog needs from a lock."""

    def _mark_lost(self, owner: str, reason: str) -> None: ...

    def _renewed(self, owner: str, error: BaseException | None, sent_at: float) -> None: ...


class WatchEntry:
    """One (lock, owner) the watchdog keeps alive."""

    __slots__ = (
        "lock_ref", "owner", "backend", "keys", "name", "ttl_ms", "due", "confirmed_at",
        "in_flight", "slack", "active", "replicas", "kind", "lease_ms", "retry_in",
        "lost_at", "seq", "_call",
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
        #: Which heap item is this entry's (0: none).
        self.seq = 0
        self._call: Call | None = None
        if claim_ms is not None:
            # A hand-off, leased for the claim window only: renew (claim) within a
            # third of it (a short hold is released before that and costs nothing),
            # and count it lost by the end of the window.
            window = min(ttl_ms, claim_ms) / 1000.0
            self.due = now + window / 3
            self.confirmed_at = now - max(0, ttl_ms - claim_ms) / 1000.0
            self.slack = window / 6
        #: When the hold counts as lost unless a renewal is confirmed first: a safety
        #: margin before the lease can have run out in Redis, so the holder learns of
        #: the loss before somebody else can hold the lock.
        ttl = ttl_ms / 1000.0  # (inline: a call fewer on every acquire)
        self.lost_at = self.confirmed_at + ttl - min(1.0, ttl / 10)

    def _lost_after(self, confirmed_at: float) -> float:
        ttl = self.ttl_ms / 1000.0
        return confirmed_at + ttl - min(1.0, ttl / 10)

    def _collected(self, _ref: object) -> None:
        if self.active:  # not unwatched yet: its Lock was dropped while held
            watchdog.unwatch(self, wait=False)

    def confirm(self, sent_at: float) -> None:
        """Redis confirmed the renewal sent at *sent_at*: the next is due a third of
        the ttl later, and the hold counts as lost a lease (less the margin) later."""
        self.confirmed_at = sent_at
        self.due = sent_at + self.ttl_ms / 3000.0
        self.slack = self.retry_in
        self.lost_at = self._lost_after(sent_at)

    @property
    def call(self) -> Call:
        """The renewal script call (made at the first renewal, not on every acquire;
        the same for every renewal of the hold)."""
        call = self._call
        if call is None:
            call = self._call = self.kind.renew_call(
                self.keys, self.owner, self.lease_ms, self.name, self.replicas
            )
        return call


#: The slack level of each slack met so far (see :func:`.watch_parts.level_of`).
_LEVELS: dict[float, float] = {}


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
        #: Each idle entry's next renewal, (when, its seq, entry), in a heap per slack
        #: level (see :func:`_level`): all in a heap may join a batch as early.
        self._heaps: dict[float, list[tuple[float, int, WatchEntry]]] = {}
        self._queued = 0  # items in the heaps
        self._seqs = itertools.count(1)
        self._stale = 0  # released entries left in the heap
        self._compact = False
        #: Backends with a batch in flight: its chunks not confirmed yet.
        self._busy: dict[int, deque[Group]] = {}
        #: Due renewals waiting for their backend's batch in flight to end.
        self._waiting: dict[int, Group] = {}
        #: Renewals a second the entries need.
        self._per_second = 0.0
        self._load = LoadWarnings()
        #: The ceiling in renewals a second (read at every round; the package reads
        #: ``REDISLOCK_WATCHDOG_CEILING``).
        self.ceiling: Callable[[], float] = lambda: DEFAULT_CEILING
        #: Told of each warning, outside the watchdog's lock (the package sends the
        #: ``watchdog_overloaded`` signal); its failure is logged.
        self.on_overload: Callable[[Overload], None] | None = None

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
            # _add(), inline: two calls fewer on every acquire.
            self._entries[id(entry)] = entry
            self._per_second += 3000.0 / ttl_ms
            entry.seq = seq = next(self._seqs)
            heap = self._heaps.get(_LEVELS.get(entry.slack, -1.0))
            if heap is None:
                self._push(entry, entry.due)
            else:
                heappush(heap, (entry.due, seq, entry))
                self._queued += 1
            if self._thread is None:
                self._wake_at = entry.due
                self._thread = threading.Thread(
                    target=self._run, name="redislock-watchdog", daemon=True
                )
                self._thread.start()
            elif entry.due < self._wake_at:
                self._cond.notify()
        return entry

    def _add(self, entry: WatchEntry) -> None:
        """Register *entry* (the caller holds the lock)."""
        self._entries[id(entry)] = entry
        self._per_second += 3000.0 / entry.ttl_ms
        self._push(entry, entry.due)

    def _push(self, entry: WatchEntry, at: float) -> None:
        entry.seq = seq = next(self._seqs)
        slack = entry.slack
        level = _LEVELS.get(slack)
        if level is None:
            if len(_LEVELS) > 4096:  # (a process of many different ttls)
                _LEVELS.clear()
            level = _LEVELS[slack] = level_of(slack)
        heap = self._heaps.get(level)
        if heap is None:
            heap = self._heaps[level] = []
        heappush(heap, (at, seq, entry))
        self._queued += 1

    def _remove(self, entry: WatchEntry) -> bool:
        """Forget *entry* (the caller holds the lock); False if it was gone already."""
        entry.active = False
        if self._entries.pop(id(entry), None) is None:
            return False
        self._per_second = self._per_second - 3000.0 / entry.ttl_ms if self._entries else 0.0
        if entry.seq and not entry.in_flight:
            self._stale += 1
            if self._stale >= COMPACT_MIN and 2 * self._stale > self._queued:
                self._compact = True
        return True

    def unwatch(self, entry: WatchEntry, *, wait: bool = True) -> None:
        """Stop renewing *entry*.

        Without *wait* (a collected Lock's callback) this never blocks: at
        interpreter exit the callback runs while the stopped daemon thread may hold
        the condition for ever. If the condition is busy, the entry is left for the
        thread, which drops an entry whose Lock is gone when it comes due.
        """
        entry.active = False
        if not self._mutex.acquire(blocking=wait):
            return
        try:
            # _remove(), inline: a call fewer on every release.
            if self._entries.pop(id(entry), None) is not None:
                self._per_second -= 3000.0 / entry.ttl_ms
                if not self._entries:
                    self._per_second = 0.0
                if entry.seq and not entry.in_flight:
                    self._stale += 1
                    if self._stale >= COMPACT_MIN and 2 * self._stale > self._queued:
                        self._compact = True
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

    def renewals_per_second(self) -> float:
        """How many renewals a second the holds being renewed need (each every third
        of its ttl): what :attr:`ceiling` is compared with."""
        return max(0.0, self._per_second)

    def _run(self) -> None:
        empty_since: float | None = None
        while True:
            with self._cond:
                now = time.monotonic()
                if not self._entries:
                    # Linger briefly: a process that takes and releases locks in
                    # a loop must not pay for a thread start on every acquire.
                    empty_since = empty_since or now
                    self._load.idle()  # nothing needs renewing: below any ceiling
                    if now - empty_since >= IDLE_EXIT_SECONDS:
                        self._thread = None
                        self._wake_at = float("inf")
                        self._heaps, self._stale, self._queued = {}, 0, 0
                        return
                    self._wake_at = empty_since + IDLE_EXIT_SECONDS
                    self._cond.wait(self._wake_at - now)
                    continue
                empty_since = None
                lost, batches = self._take_work(now)
                overloads = self._overloads(now)
                if not lost and not batches and not overloads:
                    if self._entries:
                        self._cond.wait(max(0.0, min(self._wake_at - now, 3600.0)))
                    continue
            try:
                self._tell(overloads)
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
        if self._compact:
            for level, heap in self._heaps.items():
                heap = self._heaps[level] = [i for i in heap if i[2].active and i[1] == i[2].seq]
                heapify(heap)
            self._queued = sum(len(heap) for heap in self._heaps.values())
            self._stale, self._compact = 0, False
        # Renewals stuck on the network, or waiting behind a stuck batch.
        for groups in [*self._busy.values(), [*self._waiting.values()]]:
            for group in groups:
                if group.deadline <= now:
                    lost += [e for e in group.expired(now) if self._remove(e)]
        # Those that waited for a backend free again go first.
        for backend_id in [b for b in self._waiting if b not in self._busy]:
            waiting = []
            for e in self._waiting.pop(backend_id).entries:
                if e.active:
                    waiting.append(e)
                else:
                    self._remove(e)  # (see the heaps' loop below)
            if waiting:
                batches[backend_id] = waiting
        later: list[WatchEntry] = []
        for level, heap in self._heaps.items():
            horizon = now + level
            while heap and heap[0][0] <= horizon:
                _, seq, entry = heappop(heap)
                self._queued -= 1
                if seq != entry.seq:
                    continue  # pushed again since: that item counts
                if not entry.active:
                    # Released meanwhile -- or unwatched by a collected Lock's callback
                    # that could not take the lock (unwatch(wait=False)): forget it here.
                    self._remove(entry)
                    continue
                if entry.lock_ref() is None:  # collected; its callback could not unwatch
                    self._remove(entry)
                elif now >= entry.lost_at:
                    if self._remove(entry):
                        lost.append(entry)
                elif entry.due > horizon:
                    later.append(entry)  # looked at by when it counts as lost: not due
                else:
                    self._due(entry, batches)
        for entry in later:
            self._push(entry, min(entry.due, entry.lost_at))
        for backend_id, entries in batches.items():
            chunks: deque[Group] = deque()
            for start in range(0, len(entries), CHUNK):
                chunks.append(Group(entries[start : start + CHUNK]))
            self._busy[backend_id] = chunks
            for entry in entries:
                entry.in_flight = True
                late = now - entry.due
                if late > self._load.late and 2 * late > entry.lost_at - entry.due:
                    self._load.late = late
        wake_at = min((heap[0][0] for heap in self._heaps.values() if heap), default=float("inf"))
        for chunks in self._busy.values():
            for group in chunks:
                wake_at = min(wake_at, group.deadline)
        for group in self._waiting.values():
            wake_at = min(wake_at, group.deadline)
        self._wake_at = wake_at
        return lost, batches

    def _due(self, entry: WatchEntry, batches: dict[int, list[WatchEntry]]) -> None:
        """Put the due *entry* in its backend's batch, or in the renewals waiting for
        that backend's batch in flight."""
        backend_id = id(entry.backend)
        if backend_id in self._busy:
            waiting = self._waiting.get(backend_id)
            if waiting is None:
                self._waiting[backend_id] = Group([entry])
            else:
                waiting.add(entry)
        else:
            batches.setdefault(backend_id, []).append(entry)

    def _overloads(self, now: float) -> list[Overload]:
        """The warnings due now (the caller holds the lock)."""
        return self._load.check(now, self.renewals_per_second(), len(self._entries), self.ceiling)

    def _tell(self, overloads: list[Overload]) -> None:
        tell(overloads, self.on_overload)

    def _renew_batch(self, backend_id: int, entries: list[WatchEntry]) -> None:
        try:
            for start in range(0, len(entries), CHUNK):
                self._renew_chunk(backend_id, entries[start : start + CHUNK])
        finally:
            with self._cond:
                self._busy.pop(backend_id, None)
                self._cond.notify()  # renewals may wait for this backend

    def _renew_chunk(self, backend_id: int, entries: list[WatchEntry]) -> None:
        started = time.monotonic()
        backend = entries[0].backend
        failure: BaseException | None = None
        results: list[object] = []
        try:
            results = backend.run_many([e.call for e in entries])
        except (AmbiguousReply, LockBackendError) as exc:
            failure = exc
        except Exception as exc:  # never let a renewal take the process's renewals down
            logger.exception("redislock renewal batch failed unexpectedly")
            failure = exc
        if failure is not None:
            logger.warning(
                "redislock renewal of %d lock(s) (%r first) failed, retrying: %s",
                len(entries), entries[0].name, failure,
            )  # fmt: skip
        lost: list[tuple[WatchEntry, str]] = []
        renewed: list[tuple[WatchEntry, BaseException | None]] = []  # (sent at *started*)
        with self._cond:
            chunks = self._busy.get(backend_id)
            if chunks:
                chunks.popleft()
            now = time.monotonic()
            earliest = float("inf")
            for i, entry in enumerate(entries):
                entry.in_flight = False
                if not entry.active:
                    # Released, or already declared lost, meanwhile -- or unwatched by a
                    # collected Lock's callback that could not take the lock: forgotten.
                    self._remove(entry)
                    continue
                result = failure if failure is not None else results[i]
                if isinstance(result, BaseException):
                    if failure is None:
                        logger.warning(
                            "redislock renewal of %r failed, retrying: %s", entry.name, result
                        )
                    entry.due = now + entry.retry_in
                    entry.slack = 0.0  # retry at that time, not at once
                    at = min(entry.due, entry.lost_at)
                    renewed.append((entry, result))
                elif result == 1:
                    entry.confirm(started)
                    at = entry.due
                    renewed.append((entry, None))
                else:
                    self._remove(entry)
                    lost.append((entry, "the lock was no longer held by this owner at renewal"))
                    continue
                self._push(entry, at)
                if at < earliest:
                    earliest = at
            if earliest < self._wake_at:
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
        self._record_lost([e for e, _ in lost if not e.backend.features.quorum])

    def _lose(self, entry: WatchEntry, reason: str) -> None:
        self.unwatch(entry)
        lock = entry.lock_ref()
        if lock is not None:
            lock._mark_lost(entry.owner, reason)

    @staticmethod
    def _record_lost(entries: list[WatchEntry]) -> None:
        """Put holds their renewal found gone into their locks' history, in one round
        trip per chunk (best effort: the losses are reported already; a Redis error
        here changes nothing). Redlock records no history."""
        for start in range(0, len(entries), CHUNK):
            chunk = entries[start : start + CHUNK]
            calls = [
                # (the lock's key names the event in its slot's history)
                Call(
                    LOST_SCRIPT,
                    (e.keys[1],),
                    (e.owner, e.keys[0], e.backend.retention_arg),
                    "record a lost lock",
                    e.name,
                )
                for e in chunk
            ]
            try:
                chunk[0].backend.run_many(calls)
            except Exception:  # (the history is for operators; never fail the watchdog)
                logger.debug("redislock: could not record %d lost locks", len(chunk), exc_info=True)

    def _reset_after_fork(self) -> None:
        self._entries = {}
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._thread = None
        self._wake_at = float("inf")
        self._heaps, self._queued = {}, 0
        self._stale, self._compact = 0, False
        self._busy = {}
        self._waiting = {}
        self._per_second = 0.0
        self._load = LoadWarnings()


#: The process's watchdog.
watchdog = Watchdog()
on_fork_in_child(watchdog._reset_after_fork)
