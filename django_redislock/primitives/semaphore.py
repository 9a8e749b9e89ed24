""":class:`Semaphore`: at most ``limit`` holders of one name at once.

A semaphore is a :class:`~django_redislock.primitives.lock.Lock` whose name admits
``limit`` holders instead of one: the same ``acquire`` / ``release`` /
``with`` / ``async with`` / timeouts / ``extend`` / ``owned``, and the same
owners. Each holder (permit) has its own lease, renewed by the watchdog, its
own fencing token and record (shown in the admin); waiters queue in FIFO order
and a release hands the permit to the first of them. Like a ``Lock``, a permit
is re-entrant per owner: an owner (a thread, an asyncio task, or an explicit
``owner``) holds at most one permit, and acquiring again counts one more hold
of it. The scripts are in :mod:`django_redislock.engine.lua.shared`.
"""

from __future__ import annotations

from typing import Any

from ..engine.shared import Shared
from .lock import Lock


class Semaphore(Lock):
    """A distributed semaphore of ``limit`` permits (``locks.semaphore(name, limit)``).

    :param limit: how many holders at once (1 or more). Every user of a name
        must pass the same limit while it is held: another limit raises
        :class:`~django_redislock.exceptions.LimitMismatch` (it can change once
        nobody holds the semaphore).

    The other parameters are :class:`~django_redislock.primitives.lock.Lock`'s, except
    ``fair`` (a semaphore is always FIFO) and ``no_expiry`` (every permit needs
    its own lease).
    """

    def __init__(self, name: str, limit: int, **options: Any) -> None:
        self._shared = Shared("s", validate_limit(limit))
        super().__init__(name, **options)

    @property
    def limit(self) -> int:
        """How many holders the semaphore admits at once."""
        assert self._shared is not None
        return self._shared.limit

    def __repr__(self) -> str:
        return f"<Semaphore {self.name!r} limit={self.limit} ttl={self.ttl_seconds}>"


#: The largest limit a semaphore accepts (a bound, not a target).
MAX_LIMIT = 1_000_000


def validate_limit(limit: object, what: str = "limit") -> int:
    """*limit* as a number of permits; raises TypeError/ValueError with what to do."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"{what} must be a whole number of holders, not {limit!r}")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"{what} must be between 1 and {MAX_LIMIT}, not {limit}")
    return limit
