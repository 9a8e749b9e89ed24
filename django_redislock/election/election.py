""":class:`Election`: one leader at a time for a name, with a term that fences stale leaders.

Leadership *is* a mutex held with auto-renewal (a :class:`~django_redislock.Lock`
with an owner token of its own), so it has the lock's guarantees and nothing of
its own to get wrong: the standbys wait in the lock's FIFO queue and are handed
the leadership by the release (no polling); a dead leader's lease runs out and
the first standby takes over within one lease; the watchdog tells the leader
that its lease is lost before anybody else can be granted it. The **term** is the
hold's fencing token: it increases strictly from one leader to the next (see
"Fencing tokens" in docs/architecture.md), and ``is_current(term)`` asks Redis in
one round trip whether that leadership still holds (fencing's CHECK, engine/fenced.py).

Sync and async methods share every decision (the ``_begin_*`` / ``_settle_*`` /
``_*_call`` helpers); only the I/O call differs.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from django_redislock.engine.calls import Call
from django_redislock.engine.driver import call_async, call_sync, run_async, run_sync
from django_redislock.engine.fenced import check_call, check_outcome
from django_redislock.engine.identity import new_nonce, process_token
from django_redislock.engine.info import LockInfo, WaiterInfo
from django_redislock.engine.validate import (
    json_dict,
    validate_name,
    validate_seconds,
    validate_wait,
)
from django_redislock.exceptions import (
    LockBackendError,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
)
from django_redislock.signals import lock_lost

from . import signals
from .observe import announce_call, watch

if TYPE_CHECKING:
    from django_redislock import Lock, LockManager
    from django_redislock.engine.backends.base import AsyncBackend, Backend

logger = logging.getLogger("django_redislock")


class ElectionError(LockError):
    """An election was used in a way it cannot work; the message says what to do instead."""


class LeadershipLost(LockLost):
    """The leadership ended while a ``with election.leading():`` block ran (deposed).

    ``term`` is the term that was lost. Work done after the loss may have
    overlapped the next leader's: writes fenced with the term
    (``election.is_current(term)``, or a fencing check in the storage) are safe.
    """

    def __init__(self, message: str, *, name: str, term: int) -> None:
        super().__init__(message, name=name)
        self.term = term


@dataclass(frozen=True)
class Leader:
    """Who leads an election, as Redis says at one moment (``election.leader()``).

    ``term`` is the leadership's fencing token; ``since`` when it began (Redis's
    clock); ``ttl`` the lease left in seconds; ``standbys`` the processes waiting
    to lead, first in line first; ``info`` the whole lock snapshot.
    """

    name: str
    term: int | None
    owner: str | None
    host: str | None
    pid: int | None
    purpose: str | None
    since: datetime | None
    ttl: float | None
    standbys: tuple[WaiterInfo, ...]
    info: LockInfo

    @classmethod
    def from_info(cls, info: LockInfo) -> Leader:
        """The leader described by a lock snapshot."""
        return cls(
            name=info.name, term=info.fencing_token, owner=info.owner, host=info.host,
            pid=info.pid, purpose=info.purpose, since=info.acquired_at, ttl=info.ttl,
            standbys=info.waiters, info=info,
        )  # fmt: skip


class Change(NamedTuple):
    """What :meth:`Election.wait_for_change` saw: whether the term changed, and the leader."""

    changed: bool
    leader: Leader | None


class Election:
    """A leader election on Redis: at most one leader per *name* at a time.

    Usually made with ``locks.election(name, ttl=..., purpose=...)``.

    :param name: the election's name (a lock name: the leadership is that lock).
    :param manager: the :class:`~django_redislock.LockManager` whose Redis holds the
        leadership (``locks.election(name)`` passes itself).
    :param ttl: the lease in seconds (default ``REDISLOCK_DEFAULT_TTL``): a dead
        leader is replaced within about one lease; the watchdog renews it every
        third of it.
    :param purpose: a short description, shown with the leader (admin, CLI).
    :param extra: further JSON metadata, shown with the leader.

    One ``Election`` object is one candidate: its process leads at most once at
    a time, whichever thread or task campaigned. Make one per candidate.
    """

    def __init__(
        self,
        name: str,
        *,
        manager: LockManager,
        ttl: float | None = None,
        purpose: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.name = validate_name(name)
        self.manager = manager
        self.ttl = None if ttl is None else validate_seconds(ttl, "ttl", "REDISLOCK_DEFAULT_TTL")
        if purpose is not None and not isinstance(purpose, str):
            raise TypeError(f"purpose must be a str, not {type(purpose).__name__}")
        self.purpose = purpose
        self.extra = None if extra is None else json_dict(extra, "extra")
        self._guard = threading.Lock()
        #: The lock of the campaign under way or the leadership held (kept referenced:
        #: the watchdog renews only locks that are alive).
        self._lock: Lock | None = None
        self._term: int | None = None
        self._deposed: str | None = None
        self._pid = os.getpid()
        lock_lost.connect(self._on_lock_lost, weak=True)

    # -- state (no I/O) --------------------------------------------------------

    @property
    def term(self) -> int | None:
        """The term of this candidate's leadership, or None when it does not lead (as far
        as this process knows: ``is_current()`` asks Redis)."""
        if os.getpid() != self._pid:
            return None  # a forked child does not inherit the leadership
        return self._term

    @property
    def is_leader(self) -> bool:
        """Whether this candidate leads, as far as this process knows (no round trip)."""
        return self.term is not None

    @property
    def deposed_reason(self) -> str | None:
        """Why the last leadership of this candidate was lost, or None if it was not."""
        return self._deposed

    def _begin_campaign(self, timeout: float | None) -> tuple[Lock, float | None]:
        timeout = validate_wait(timeout, "timeout")
        if os.getpid() != self._pid:
            raise ElectionError(
                f"election {self.name!r} was made in process {self._pid}, not this one "
                f"({os.getpid()}): make a new Election after fork"
            )
        self._refuse_quorum(self.manager.backend(), "campaign()")
        with self._guard:
            if self._term is not None:
                raise ElectionError(
                    f"election {self.name!r}: this candidate already leads (term "
                    f"{self._term}); call resign() first, or use election.term"
                )
            if self._lock is not None:
                raise ElectionError(
                    f"election {self.name!r}: a campaign of this candidate is already "
                    "running; make one Election per candidate"
                )
            self._lock = lock = self._new_lock()
        return lock, timeout

    def _new_lock(self) -> Lock:
        options: dict[str, Any] = {
            # A token of its own: any thread or task of the process may resign.
            "owner": f"{process_token()}:e{secrets.token_hex(6)}",
            "auto_renew": True,
            "raise_on_lost": False,
            "purpose": self.purpose,
            "extra": self.extra,
            "meta": {"kind": "election"},
        }
        if self.ttl is not None:
            options["ttl"] = self.ttl
        return self.manager.lock(self.name, **options)

    def _settle_campaign(self, lock: Lock, acquired: bool, timeout: float | None) -> int:
        term = lock.fencing_token if acquired and not lock.lost else None
        with self._guard:
            if term is None:
                self._lock = None
            else:
                self._term, self._deposed = term, None
        if term is None:
            within = "" if timeout is None else f" within {timeout:g} s"
            raise LockNotAcquired(
                f"election {self.name!r}: not elected{within} (another candidate leads; "
                "election.leader() says which)",
                name=self.name,
            )
        signals.elected.send(sender=Election, election=self, name=self.name, term=term)
        self._changed(term, None)
        return term

    def _abandon(self, lock: Lock) -> None:
        with self._guard:
            if self._lock is lock and self._term is None:
                self._lock = None

    def _begin_resign(self) -> tuple[Lock, int] | None:
        with self._guard:
            lock, term = self._lock, self._term
            if lock is None or term is None or os.getpid() != self._pid:
                return None
            self._lock, self._term = None, None
        return lock, term

    def _restore(self, lock: Lock, term: int) -> None:
        with self._guard:
            if self._lock is None:
                self._lock, self._term = lock, term

    def _on_lock_lost(self, sender: object, lock: object = None, **kwargs: Any) -> None:
        if lock is None or lock is not self._lock:
            return
        self._depose(lock, str(kwargs.get("reason") or "the lease was lost"))

    def _depose(self, lock: object, reason: str) -> None:
        with self._guard:
            term = self._term
            if lock is not self._lock or term is None:
                return
            self._lock, self._term, self._deposed = None, None, reason
        logger.error("redislock: election %r: deposed (term %s): %s", self.name, term, reason)
        signals.deposed.send(
            sender=Election, election=self, name=self.name, term=term, reason=reason
        )
        self._changed(None, term)

    def _changed(self, term: int | None, previous: int | None) -> None:
        signals.leader_changed.send(
            sender=Election, election=self, name=self.name, term=term, previous=previous
        )

    def _term_call(self, backend: Backend | AsyncBackend, term: int | None) -> Call | None:
        if term is None:
            term = self.term
            if term is None:
                return None
        if isinstance(term, bool) or not isinstance(term, int):
            raise TypeError(f"term must be an int (a fencing token), not {term!r}")
        self._refuse_quorum(backend, "is_current()")
        return check_call(backend, self.name, term)

    # -- campaign / resign -----------------------------------------------------

    def campaign(self, timeout: float | None = None) -> int:
        """Wait until this candidate leads, and return its term.

        :param timeout: seconds to wait (None: for as long as it takes; 0: one
            attempt). Raises :class:`~django_redislock.LockNotAcquired` when it
            passes. A blocking campaign inside a running event loop raises
            ``BlockingCallInEventLoop``: use :meth:`acampaign` there.
        """
        lock, timeout = self._begin_campaign(timeout)
        try:
            acquired = lock.acquire(blocking=True, timeout=timeout)
        except BaseException:
            self._abandon(lock)
            raise
        term = self._settle_campaign(lock, acquired, timeout)
        self._announce()
        return term

    async def acampaign(self, timeout: float | None = None) -> int:
        """:meth:`campaign` for asyncio (a cancelled campaign leaves the queue)."""
        lock, timeout = self._begin_campaign(timeout)
        try:
            acquired = await lock.aacquire(blocking=True, timeout=timeout)
        except BaseException:
            self._abandon(lock)
            raise
        term = self._settle_campaign(lock, acquired, timeout)
        await self._aannounce()
        return term

    def resign(self) -> bool:
        """Give up the leadership at once (the first standby is handed it).

        Returns True if this candidate led and resigned, False if it did not lead
        (never elected, resigned already, or deposed: then the ``deposed`` signal
        is sent, if it was not yet). A Redis error is raised as
        ``LockBackendError`` and the candidate still leads (retry, or let the
        lease run out).
        """
        begun = self._begin_resign()
        if begun is None:
            return False
        lock, term = begun
        try:
            lock.release_all()
        except LockNotOwned:
            return self._settle_taken(lock, term)
        except BaseException:
            self._restore(lock, term)
            raise
        self._changed(None, term)
        self._announce()
        return True

    async def aresign(self) -> bool:
        """:meth:`resign` for asyncio."""
        begun = self._begin_resign()
        if begun is None:
            return False
        lock, term = begun
        try:
            await lock.arelease_all()
        except LockNotOwned:
            return self._settle_taken(lock, term)
        except BaseException:
            self._restore(lock, term)
            raise
        self._changed(None, term)
        await self._aannounce()
        return True

    def _settle_taken(self, lock: Lock, term: int) -> bool:
        self._restore(lock, term)
        self._depose(lock, "the leadership was gone when resigning (lease ran out or taken)")
        return False

    def leading(self, timeout: float | None = None) -> Leading:
        """``with election.leading() as term:`` (or ``async with``): campaign, run the
        block as leader, resign. Raises :class:`LeadershipLost` at the end of a block
        during which the leadership was lost (unless the block raised)."""
        return Leading(self, timeout)

    # -- who leads -------------------------------------------------------------

    def leader(self) -> Leader | None:
        """Who leads now (any process may ask), or None when nobody does."""
        info = self.manager.get(self.name)
        return None if info is None else Leader.from_info(info)

    async def aleader(self) -> Leader | None:
        """:meth:`leader` for asyncio."""
        info = await self.manager.aget(self.name)
        return None if info is None else Leader.from_info(info)

    def is_current(self, term: int | None = None) -> bool:
        """Whether *term* (default: this candidate's own) still leads, in one round trip.

        Check it before an action only the leader may take: a leader that was
        paused past its lease finds its term stale here even before its watchdog
        has told it.
        """
        backend = self.manager.backend()
        call = self._term_call(backend, term)
        return call is not None and check_outcome(call_sync(call, backend), self.name)[0]

    async def ais_current(self, term: int | None = None) -> bool:
        """:meth:`is_current` for asyncio."""
        backend = self.manager.source.abackend()
        call = self._term_call(backend, term)
        return call is not None and check_outcome(await call_async(call, backend), self.name)[0]

    def wait_for_change(self, known: int | None, timeout: float) -> Change:
        """Wait until the leading term is not *known* (None: nobody leads), at most
        *timeout* seconds; sends ``leader_changed`` when it changed.

        For observers, which do not campaign: they are poked by the new leader's
        election or the leader's resign (``election/observe.py``), and also look again when the
        leader's lease would have run out (a dead leader announces nothing).
        """
        deadline = self._deadline(timeout)
        backend = self.manager.backend()
        self._refuse_quorum(backend, "wait_for_change()")
        while run_sync(watch(backend.keyspace, self.name, new_nonce(), known, deadline), backend):
            leader = _same_or(known, self.leader())
            if leader is not _SAME:
                return self._report(known, leader)
        return Change(False, None)

    async def await_for_change(self, known: int | None, timeout: float) -> Change:
        """:meth:`wait_for_change` for asyncio."""
        deadline = self._deadline(timeout)
        backend = self.manager.source.abackend()
        self._refuse_quorum(backend, "await_for_change()")
        while await run_async(
            watch(backend.keyspace, self.name, new_nonce(), known, deadline), backend
        ):
            leader = _same_or(known, await self.aleader())
            if leader is not _SAME:
                return self._report(known, leader)
        return Change(False, None)

    @staticmethod
    def _deadline(timeout: float) -> float:
        return time.monotonic() + validate_seconds(timeout, "timeout")

    def _refuse_quorum(self, backend: Backend | AsyncBackend, call: str) -> None:
        if backend.features.quorum:
            raise ElectionError(
                f"election {self.name!r}: {call} needs monotonic fencing tokens, which "
                "Redlock (REDISLOCK_REDLOCK_CACHES) does not give; use a manager on one "
                "Redis, Sentinel or Cluster"
            )

    def _announce(self) -> None:
        backend = self.manager.backend()
        try:
            call_sync(announce_call(backend.keyspace, self.name), backend)
        except LockBackendError as error:  # observers still look again at the lease's end
            logger.warning("redislock: election %r: could not poke observers: %s", self.name, error)

    async def _aannounce(self) -> None:
        backend = self.manager.source.abackend()
        try:
            await call_async(announce_call(backend.keyspace, self.name), backend)
        except LockBackendError as error:
            logger.warning("redislock: election %r: could not poke observers: %s", self.name, error)

    def _report(self, known: int | None, leader: Any) -> Change:
        self._changed(None if leader is None else leader.term, known)
        return Change(True, leader)

    def __repr__(self) -> str:
        return f"<Election {self.name!r} term={self.term}>"


_SAME = object()


def _same_or(known: int | None, leader: Leader | None) -> Leader | None | object:
    """*leader*, or :data:`_SAME` when its term is *known* (nothing changed)."""
    term = None if leader is None else leader.term
    return _SAME if term == known else leader


class Leading:
    """What :meth:`Election.leading` returns: a sync and async context manager whose
    value is the term."""

    def __init__(self, election: Election, timeout: float | None) -> None:
        self.election = election
        self.timeout = timeout
        self._term = 0

    def __enter__(self) -> int:
        self._term = self.election.campaign(self.timeout)
        return self._term

    async def __aenter__(self) -> int:
        self._term = await self.election.acampaign(self.timeout)
        return self._term

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._ended(self.election.resign(), exc_type)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._ended(await self.election.aresign(), exc_type)

    def _ended(self, resigned: bool, exc_type: type[BaseException] | None) -> None:
        if resigned or exc_type is not None:
            return
        election = self.election
        raise LeadershipLost(
            f"election {election.name!r}: the leadership (term {self._term}) was lost "
            f"while the block ran: {election.deposed_reason or 'it was gone at the end'}",
            name=election.name,
            term=self._term,
        )
