"""Which owner holds a guarded name on behalf of the code running now (pure).

A guard (``@single_instance`` on a task, view or function) holds its lock as an
owner of its own: a task execution's token, a fresh token per request or call.
Code that runs on the guard's behalf -- the task body, the view, what they call
in the same thread or task -- would otherwise be a different owner, and a
``locks.lock(name)`` on the guard's own name would wait for itself forever.
While a guarded body runs, its (name → owner) is recorded in a context
variable, and a ``Lock`` on that name without an explicit owner takes that
owner: it re-enters the guard's lock instead of deadlocking.

The record follows the context: asyncio tasks started by the body inherit it,
threads the body starts do not (they are other owners, as always).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType

_guards: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "redislock_guards", default=None
)


def guard_owner(name: str) -> str | None:
    """The owner of the guard on *name* running in this context, if any."""
    guards = _guards.get()
    return None if guards is None else guards.get(name)


@contextmanager
def guarding(name: str, owner: str) -> Iterator[None]:
    """Record that the code in the ``with`` block runs under *owner*'s hold of *name*."""
    guards = _guards.get()
    token = _guards.set(MappingProxyType({**(guards or {}), name: owner}))
    try:
        yield
    finally:
        _guards.reset(token)
