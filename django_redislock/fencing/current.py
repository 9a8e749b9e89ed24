"""Is a hold still current? One round trip to Redis, sync and asyncio.

``held.check()`` and ``locks.is_current(name, token)`` (and their ``a`` twins) call
these: the call and the decision are :mod:`django_redislock.engine.fenced`'s, so the
two flavours differ only by ``await``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django_redislock.engine.driver import call_async, call_sync
from django_redislock.engine.fenced import check_call, check_outcome, checked
from django_redislock.exceptions import FencingUnsupported, LockNotOwned

if TYPE_CHECKING:
    from django_redislock.engine.backends.base import AsyncBackend, Backend


def is_current(backend: Backend, name: str, token: int | None) -> bool:
    """Whether the lock *name* is held with the fencing token *token* right now."""
    return check_outcome(call_sync(check_call(backend, name, token), backend), name)[0]


async def ais_current(backend: AsyncBackend, name: str, token: int | None) -> bool:
    """:func:`is_current` for asyncio."""
    reply = await call_async(check_call(backend, name, token), backend)
    return check_outcome(reply, name)[0]


def check(backend: Backend, name: str, token: int) -> int:
    """Return *token* when the lock *name* is held with it, else raise
    :class:`~django_redislock.exceptions.StaleFencingToken` (a ``LockLost``)."""
    return checked(call_sync(check_call(backend, name, token), backend), name, token)


async def acheck(backend: AsyncBackend, name: str, token: int) -> int:
    """:func:`check` for asyncio."""
    return checked(await call_async(check_call(backend, name, token), backend), name, token)


def held_token(name: str, primitive: str, token: int | None) -> int:
    """The token a hold's own check or guarded write carries: *token* (the caller's hold
    of the lock *name*, a *primitive*), else a named refusal."""
    if primitive != "mutex":
        raise FencingUnsupported(
            f"lock {name!r}: check() and guarded writes are for mutexes (locks.lock): a "
            f"{primitive}'s holders share the name, so its hash has no one current token"
        )
    if token is None:
        raise LockNotOwned(
            f"lock {name!r} is not held by this owner: check() and guarded() need a hold "
            "(inside 'with lock:', or after acquire())",
            name=name,
        )
    return token
