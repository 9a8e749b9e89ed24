""":class:`ReadWriteLock`: many readers or one writer.

``locks.rw_lock(name)`` gives a read-write lock; its :meth:`~ReadWriteLock.read`
and :meth:`~ReadWriteLock.write` are lock objects with everything a
:class:`~django_redislock.Lock` has. Many owners may hold the read at
once, or one owner the write. Each reader has its own lease, renewed by the
watchdog, so a crashed reader frees its share when its lease runs out and a
short reader never shortens a long one.

The queue is phase-fair: a reader arriving while a writer waits queues behind
it, and a write's release admits every reader at the head of the queue at once,
so neither side starves the other. Holds are re-entrant per owner; a writer may
take the read too (a downgrade: release the write and keep reading); an owner
holding the read that asks for the write gets
:class:`~django_redislock.exceptions.LockUpgradeError` at once rather than
waiting for itself forever. A re-entrant read is granted even while a writer
waits. Every grant gets a fencing token larger than those granted before it.
"""

from __future__ import annotations

from typing import Any

from ..engine.shared import Shared
from ..engine.validate import validate_name
from .lock import HasSource, Lock


class ReadLock(Lock):
    """The read side of a :class:`ReadWriteLock` (a :class:`~django_redislock.Lock`)."""

    def __init__(self, name: str, **options: Any) -> None:
        self._shared = Shared("r")
        super().__init__(name, **options)

    def __repr__(self) -> str:
        return f"<ReadLock {self.name!r} ttl={self.ttl_seconds}>"


class WriteLock(Lock):
    """The write side of a :class:`ReadWriteLock` (a :class:`~django_redislock.Lock`)."""

    def __init__(self, name: str, **options: Any) -> None:
        self._shared = Shared("w")
        super().__init__(name, **options)

    def __repr__(self) -> str:
        return f"<WriteLock {self.name!r} ttl={self.ttl_seconds}>"


class ReadWriteLock:
    """A distributed read-write lock (``locks.rw_lock(name, **options)``).

    *options* are the :class:`~django_redislock.Lock` options shared by both
    sides (``ttl``, ``timeout``, ``purpose``, ...; not ``fair`` nor
    ``no_expiry``); :meth:`read` and :meth:`write` may override them.
    """

    def __init__(self, name: str, *, manager: HasSource | None = None, **options: Any) -> None:
        self.name = validate_name(name)
        self.manager = manager
        self.options = options
        # Built now, so that a wrong option fails here rather than at first use.
        self._read = ReadLock(name, manager=manager, **options)
        self._write = WriteLock(name, manager=manager, **options)

    def read(self, **overrides: Any) -> ReadLock:
        """The read lock; the same object on every call without *overrides*."""
        if not overrides:
            return self._read
        return ReadLock(self.name, manager=self.manager, **{**self.options, **overrides})

    def write(self, **overrides: Any) -> WriteLock:
        """The write lock; the same object on every call without *overrides*."""
        if not overrides:
            return self._write
        return WriteLock(self.name, manager=self.manager, **{**self.options, **overrides})

    def __repr__(self) -> str:
        return f"<ReadWriteLock {self.name!r}>"
