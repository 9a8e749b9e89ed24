"""Several locks held together: ``locks.lock_many(names, ...)`` (a :class:`LockSet`).

Every caller takes the names in one global order (sorted), so two callers wanting
``account:1`` and ``account:2`` never each hold one and wait for the other (no ABBA
deadlock, whatever order they list them in). The set is taken all or none: one
timeout covers every lock, and when a lock cannot be had in time the ones already
taken are given back, newest first. On a Redis Cluster each name is in its own slot
and each lock is taken there; nothing needs the names to share a slot.

Free locks are taken in one round trip, and a set is released in one (see
:mod:`.at_once`); a busy lock is waited for as one :class:`Lock` waits.

The order only protects callers that take their locks through ``lock_many``: a lock
held by hand while calling it, outside the order, can still deadlock with another
caller.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from functools import partial
from time import monotonic
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..engine.validate import validate_name, validate_wait
from ..exceptions import LockNotAcquired
from . import at_once
from .event_loop import refuse_in_event_loop
from .lock import _start_clock

if TYPE_CHECKING:
    from .lock import Lock

logger = logging.getLogger("django_redislock")

_UNSET: Any = object()


class LockSet:
    """Locks on *names*, taken in sorted order, all or none (``with`` / ``async with``).

    :param names: the lock names (at least one, no repeats; any order).
    :param make: makes each :class:`Lock` (a manager's ``lock``), with *options*.
    :param timeout: how long taking the whole set may wait, in seconds (``None``:
        until every lock is held; ``0``: one attempt per lock).
    :param blocking: False: one attempt per lock, whatever the timeout.
    :param options: the other :class:`Lock` options (``ttl``, ``owner``, ...), the same
        for every lock.
    """

    def __init__(
        self,
        names: Sequence[str],
        make: Callable[..., Lock],
        *,
        timeout: float | None = None,
        blocking: bool = True,
        **options: Any,
    ) -> None:
        if isinstance(names, (str, bytes)):
            raise TypeError("lock_many takes a list of names, not one name (use locks.lock)")
        names = [validate_name(n) for n in names]
        if not names:
            raise ValueError("lock_many needs at least one name")
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"lock_many was given the same name twice: {repeated}")
        #: The names in the order they are taken (the global order: sorted).
        self.names: tuple[str, ...] = tuple(sorted(names))
        self.timeout = None if timeout is None else validate_wait(timeout, "timeout")
        self.blocking = bool(blocking)
        #: One :class:`Lock` per name, in :attr:`names` order.
        self.locks: tuple[Lock, ...] = tuple(make(n, **options) for n in self.names)
        #: The name whose lock the last failed acquire could not take.
        self.missed: str | None = None

    def __getitem__(self, name: str) -> Lock:
        """The :class:`Lock` of *name* (for its ``fencing_token``, ``guarded()``, ...)."""
        try:
            return self.locks[self.names.index(name)]
        except ValueError:
            raise KeyError(name) from None

    def __iter__(self) -> Iterator[Lock]:
        return iter(self.locks)

    def __len__(self) -> int:
        return len(self.locks)

    @property
    def fencing_tokens(self) -> dict[str, int | None]:
        """Each name's fencing token of the caller's hold (None where not held)."""
        return {lock.name: lock.fencing_token for lock in self.locks}

    # -- acquire and release --------------------------------------------------------

    def _policy(self, blocking: bool | None, timeout: float | None) -> tuple[bool, float | None]:
        """(blocking, deadline by ``monotonic()`` or None) of one acquire of the set."""
        blocking = self.blocking if blocking is None else bool(blocking)
        timeout = self.timeout if timeout is _UNSET else validate_wait(timeout, "timeout")
        if not blocking or timeout == 0:
            return False, None
        return True, None if timeout is None else monotonic() + timeout

    @staticmethod
    def _wait(blocking: bool, deadline: float | None) -> dict[str, Any]:
        """The acquire arguments of the next lock: the time left of the set's wait (a
        lock still free when it is up gets one attempt)."""
        if not blocking:
            return {"blocking": False}
        if deadline is None:
            return {"blocking": True, "timeout": None}
        return {"blocking": True, "timeout": max(0.0, deadline - monotonic())}

    def acquire(self, blocking: bool | None = None, timeout: float | None = _UNSET) -> bool:
        """Take every lock, in order; True when all are held. When one cannot be had in
        time, those taken are released (newest first) and False is returned."""
        blocking, deadline = self._policy(blocking, timeout)
        if blocking:
            refuse_in_event_loop(self.names[0], "lock_many's acquire()", "aacquire()")
        taken: list[Lock] = []
        try:
            if self._take_all(taken, blocking, deadline):
                self.missed = None
                return True
        except BaseException:
            _log_all(self._give_back(taken[::-1]))
            raise
        _raise_first(self._give_back(taken[::-1]))
        return False

    async def aacquire(self, blocking: bool | None = None, timeout: float | None = _UNSET) -> bool:
        """:meth:`acquire` for asyncio (cancelled, it gives back what it took)."""
        blocking, deadline = self._policy(blocking, timeout)
        taken: list[Lock] = []
        try:
            if await self._atake_all(taken, blocking, deadline):
                self.missed = None
                return True
        except BaseException:
            _log_all(await self._agive_back(taken[::-1]))
            raise
        _raise_first(await self._agive_back(taken[::-1]))
        return False

    def _take_all(self, taken: list[Lock], blocking: bool, deadline: float | None) -> bool:
        """Take the locks in order, into *taken*: the locks left in one attempt each at
        once (see :meth:`_take_at_once`), then a wait for the first one not granted, and
        so on; False (and :attr:`missed` set) when one could not be had in time."""
        start: int | None = 0
        while start is not None and start < len(self.locks):
            start = self._take_at_once(start, taken, blocking)
            if start is None or start == len(self.locks):
                break
            lock = self.locks[start]
            if not lock.acquire(**self._wait(blocking, deadline)):
                self.missed = lock.name
                return False
            taken.append(lock)
            start += 1
        return start is not None

    async def _atake_all(self, taken: list[Lock], blocking: bool, deadline: float | None) -> bool:
        """:meth:`_take_all` for asyncio."""
        start: int | None = 0
        while start is not None and start < len(self.locks):
            start = await self._atake_at_once(start, taken, blocking)
            if start is None or start == len(self.locks):
                break
            lock = self.locks[start]
            if not await lock.aacquire(**self._wait(blocking, deadline)):
                self.missed = lock.name
                return False
            taken.append(lock)
            start += 1
        return start is not None

    def _take_at_once(self, start: int, taken: list[Lock], blocking: bool) -> int | None:
        """One attempt at each lock from *start* on, all in one round trip, where the
        backend allows (see :mod:`.at_once`); what they got goes to *taken* (those
        granted after a lock that was not are given back before the set waits, or with
        the rest when it is not acquired). Returns the index of the lock to wait for
        next (*start* when nothing was tried; the number of locks when all are held), or
        None when the set is not acquired (see :meth:`_go_on_from`)."""
        rest = self.locks[start:]
        backend = at_once.batch_backend(rest)
        if backend is None:
            return start
        started = _start_clock()
        got, _ = at_once.take_sync(rest, backend, started, taken)
        if not blocking:
            at_once.tell_refused(got, started, backend)
        if self._waits_after(got, blocking):
            del taken[-len(got.surplus) :]
            _raise_first(at_once.release_sync(got.surplus[::-1], backend, at_once.released))
        return self._go_on_from(got, start, blocking)

    async def _atake_at_once(self, start: int, taken: list[Lock], blocking: bool) -> int | None:
        """:meth:`_take_at_once` for asyncio."""
        rest = self.locks[start:]
        backend = at_once.abatch_backend(rest)
        if backend is None:
            return start
        started = _start_clock()
        got, _ = await at_once.take_async(rest, backend, started, taken)
        if not blocking:
            at_once.tell_refused(got, started, None)
        if self._waits_after(got, blocking):
            del taken[-len(got.surplus) :]
            surplus = got.surplus[::-1]
            _raise_first(await at_once.release_async(surplus, backend, at_once.released))
        return self._go_on_from(got, start, blocking)

    @staticmethod
    def _waits_after(got: at_once.Taken, blocking: bool) -> bool:
        """Whether the set waits after the attempts of *got* with locks granted out of
        order, which it gives back first (else they go back with the rest, if the set
        is not acquired: one round trip for all)."""
        return bool(got.surplus) and got.error is None and blocking

    def _go_on_from(self, got: at_once.Taken, start: int, blocking: bool) -> int | None:
        """Where the acquire goes on after the attempts of *got* at the locks from
        *start* on (raising their error): the lock to wait for; past the end when all
        were granted; None when one was not and the set does not wait (that was its one
        attempt at each lock: :attr:`missed` says which failed)."""
        if got.error is not None:
            raise got.error
        if got.missed is None:
            return len(self.locks)
        if not blocking:
            self.missed = self.names[start + got.missed]
            return None
        return start + got.missed

    def release(self) -> None:
        """Release one hold of every lock, newest first (each is tried; the first error
        is raised once all were)."""
        _raise_first(self._give_back(self.locks[::-1]))

    async def arelease(self) -> None:
        """:meth:`release` for asyncio."""
        _raise_first(await self._agive_back(self.locks[::-1]))

    def _give_back(self, locks: Sequence[Lock]) -> list[Exception | None]:
        """Release one hold of each of *locks* (in that order: newest first), in one
        round trip where the backend allows; what each raised, or None."""
        backend = at_once.batch_backend(locks)
        if backend is None:
            return [_outcome(lock.release) for lock in locks]
        return at_once.release_sync(locks, backend, at_once.released)

    async def _agive_back(self, locks: Sequence[Lock]) -> list[Exception | None]:
        """:meth:`_give_back` for asyncio."""
        backend = at_once.abatch_backend(locks)
        if backend is None:
            return await _aoutcomes([lock.arelease for lock in locks])
        return await at_once.release_async(locks, backend, at_once.released)

    # -- with / async with --------------------------------------------------------

    def __enter__(self) -> LockSet:
        if not self.acquire():
            raise self._not_acquired()
        return self

    async def __aenter__(self) -> LockSet:
        if not await self.aacquire():
            raise self._not_acquired()
        return self

    def _not_acquired(self) -> LockNotAcquired:
        within = f" within {self.timeout:g} s" if self.timeout and self.blocking else ""
        return LockNotAcquired(
            f"could not acquire the locks {list(self.names)}{within}: {self.missed!r} was "
            "held by someone else (none of them is held now)",
            name=self.missed,
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Each lock's own end of block (LockLost when it was lost meanwhile), newest first.
        newest_first = self.locks[::-1]
        backend = at_once.batch_backend(newest_first)
        if backend is not None:
            step = partial(at_once.ended, exc_type)
            _raise_first(at_once.release_sync(newest_first, backend, step))
            return
        steps = [partial(lock.__exit__, exc_type, exc, tb) for lock in newest_first]
        _raise_first([_outcome(step) for step in steps])

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        newest_first = self.locks[::-1]
        backend = at_once.abatch_backend(newest_first)
        if backend is not None:
            step = partial(at_once.ended, exc_type)
            _raise_first(await at_once.release_async(newest_first, backend, step))
            return
        steps = [partial(lock.__aexit__, exc_type, exc, tb) for lock in newest_first]
        _raise_first(await _aoutcomes(steps))

    def __repr__(self) -> str:
        return f"<LockSet {list(self.names)}>"


def _outcome(step: Callable[[], object]) -> Exception | None:
    """Run *step*; the exception it raised, or None."""
    try:
        step()
    except Exception as error:
        return error
    return None


async def _aoutcomes(steps: Sequence[Callable[[], Awaitable[object]]]) -> list[Exception | None]:
    """Await each of *steps* in turn; what each raised, or None."""
    outcomes: list[Exception | None] = []
    for step in steps:
        try:
            await step()
        except Exception as error:
            outcomes.append(error)
        else:
            outcomes.append(None)
    return outcomes


def _raise_first(errors: Sequence[Exception | None]) -> None:
    """Raise the first of *errors*; the others are logged."""
    failed = [error for error in errors if error is not None]
    if failed:
        _log_all(failed[1:])
        raise failed[0]


def _log_all(errors: Sequence[Exception | None]) -> None:
    """Log *errors* (releases that failed while another error is on its way)."""
    for error in errors:
        if error is not None:
            logger.warning("redislock: lock_many could not release a lock: %s", error)
