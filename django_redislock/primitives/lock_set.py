"""Several locks held together: ``locks.lock_many(names, ...)`` (a :class:`LockSet`).

Every caller takes the names in one global order (sorted), so two callers wanting
``account:1`` and ``account:2`` never each hold one and wait for the other (no ABBA
deadlock, whatever order they list them in). The set is taken all or none: one
timeout covers every lock, and when a lock cannot be had in time the ones already
taken are given back, newest first. On a Redis Cluster each name is in its own slot
and each lock is taken there; nothing needs the names to share a slot.

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
        taken: list[Lock] = []
        try:
            for lock in self.locks:
                if not lock.acquire(**self._wait(blocking, deadline)):
                    self.missed = lock.name
                    break
                taken.append(lock)
            else:
                self.missed = None
                return True
        except BaseException:
            _log_all([_outcome(lock.release) for lock in reversed(taken)])
            raise
        _raise_first([_outcome(lock.release) for lock in reversed(taken)])
        return False

    async def aacquire(self, blocking: bool | None = None, timeout: float | None = _UNSET) -> bool:
        """:meth:`acquire` for asyncio (cancelled, it gives back what it took)."""
        blocking, deadline = self._policy(blocking, timeout)
        taken: list[Lock] = []
        try:
            for lock in self.locks:
                if not await lock.aacquire(**self._wait(blocking, deadline)):
                    self.missed = lock.name
                    break
                taken.append(lock)
            else:
                self.missed = None
                return True
        except BaseException:
            _log_all(await _aoutcomes([lock.arelease for lock in reversed(taken)]))
            raise
        _raise_first(await _aoutcomes([lock.arelease for lock in reversed(taken)]))
        return False

    def release(self) -> None:
        """Release one hold of every lock, newest first (each is tried; the first error
        is raised once all were)."""
        _raise_first([_outcome(lock.release) for lock in reversed(self.locks)])

    async def arelease(self) -> None:
        """:meth:`release` for asyncio."""
        _raise_first(await _aoutcomes([lock.arelease for lock in reversed(self.locks)]))

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
        steps = [partial(lock.__exit__, exc_type, exc, tb) for lock in reversed(self.locks)]
        _raise_first([_outcome(step) for step in steps])

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        steps = [partial(lock.__aexit__, exc_type, exc, tb) for lock in reversed(self.locks)]
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
