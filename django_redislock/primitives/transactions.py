"""Locks held until the database transaction ends: guarded views and ``locks.atomic()``.

Django's ``ATOMIC_REQUESTS`` wraps a view in ``transaction.atomic()`` *outside* the
view function, and an outer ``with transaction.atomic():`` does the same to code. A
lock released when the guarded code returns is then free while that code's writes
are not committed yet: the next holder reads the rows as they were before them and
overwrites them (a lost update). So a guarded view, and :class:`AtomicLock`
(``locks.atomic(name)``), release through :func:`release_after_transactions`, one
rule for both:

* when no database connection of this thread is inside an atomic block the
  application opened, the lock is released at once;
* else it is released once the outermost block of *each* of those databases has
  ended, committed or rolled back, and renewed by the watchdog meanwhile. A commit
  runs an ``on_commit`` callback (``robust``). Django has no rollback hook: it drops
  the ``on_commit`` callbacks of a transaction, or of a savepoint, that rolls back.
  The callback notices that it was dropped (a ``weakref.finalize``), which on
  CPython happens inside the rollback, right after the database's. A savepoint
  rolled back around the release frees the lock then: the writes it protected are
  gone with it.

The atomic blocks Django's ``TestCase`` wraps each test in are not the
application's (Django's ``durable=True`` check skips them too): they never commit,
and a lock waiting for them would be held until the test ends.
"""

from __future__ import annotations

import logging
import sys
import weakref
from types import TracebackType
from typing import TYPE_CHECKING

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..engine.guarding import guarding

if TYPE_CHECKING:
    from .lock import Lock

__all__ = ["AtomicLock", "open_transactions", "release_after_transactions"]

logger = logging.getLogger("django_redislock")


def open_transactions() -> list[BaseDatabaseWrapper]:
    """This thread's database connections inside an atomic block the application
    opened (not counting the blocks Django's ``TestCase`` wraps each test in)."""
    return [
        connection
        for connection in connections.all(initialized_only=True)
        if connection.in_atomic_block
        and not all(getattr(b, "_from_testcase", False) for b in connection.atomic_blocks)
    ]


def release_after_transactions(lock: Lock) -> bool:
    """Release one hold of *lock* (as leaving its ``with`` block does) once every
    transaction this thread's application has open has ended, committed or rolled
    back; True when that is arranged.

    False when there is no such transaction, or the hold is already lost: the
    caller releases now (and a loss is reported to it as usual).
    """
    pending = open_transactions()
    if not pending or lock.lost:
        return False
    waiting = _Waiting(lock, lock.owner, len(pending))
    for connection in pending:
        end = _End(waiting)
        callback = _OnCommit(end)
        weakref.finalize(callback, end).atexit = False
        connection.on_commit(callback, robust=True)
    logger.debug(
        "redislock: lock %r is released when the transactions of %s end",
        lock.name,
        ", ".join(c.alias for c in pending),
    )
    return True


class _Waiting:
    """One deferred release: the lock, its owner and how many transactions are open."""

    def __init__(self, lock: Lock, owner: str, transactions: int) -> None:
        self.lock = lock
        self.owner = owner
        self.left = transactions

    def one_ended(self) -> None:
        self.left -= 1
        if self.left == 0:
            _release(self.lock, self.owner)


class _End:
    """One database's transaction ended (committed, or its callback dropped): once."""

    __slots__ = ("done", "waiting")

    def __init__(self, waiting: _Waiting) -> None:
        self.waiting = waiting
        self.done = False

    def __call__(self) -> None:
        if not self.done:
            self.done = True
            self.waiting.one_ended()


class _OnCommit:
    """The ``on_commit`` callback; only Django's list holds it, so its finalizer runs
    when Django drops it (a rollback) or after it ran (a commit: then a no-op)."""

    __slots__ = ("__weakref__", "end")

    def __init__(self, end: _End) -> None:
        self.end = end

    def __call__(self) -> None:
        self.end()


def _release(lock: Lock, owner: str) -> None:
    """Release *owner*'s hold of *lock* after its transactions; never raises (it runs
    inside Django's commit or rollback), a failure or a loss is logged."""
    try:
        with guarding(lock.name, owner):  # the owner it was held as, in whatever context
            lock.__exit__(None, None, None)
    except Exception as error:
        logger.warning(
            "redislock: releasing lock %r after its transaction ended failed (%s: %s); "
            "it frees when its lease runs out",
            lock.name,
            type(error).__name__,
            error,
        )


class AtomicLock:
    """``with locks.atomic(name):`` holds the lock *name* around a
    ``transaction.atomic()`` block and releases it after that transaction has
    committed or rolled back (inside an outer atomic block, after the outermost one
    has; see docs/locks.md). Made by :meth:`LockManager.atomic
    <django_redislock.LockManager.atomic>`; ``with`` gives the :class:`Lock`.
    """

    def __init__(self, lock: Lock, using: str | None, savepoint: bool, durable: bool) -> None:
        #: The lock held over the transaction.
        self.lock = lock
        self._atomic = transaction.atomic(using=using, savepoint=savepoint, durable=durable)

    def __enter__(self) -> Lock:
        self.lock.__enter__()  # LockNotAcquired: no transaction was opened
        try:
            self._atomic.__enter__()
        except BaseException:
            self.lock.__exit__(*sys.exc_info())
            raise
        return self.lock

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._atomic.__exit__(exc_type, exc, tb)  # commit or roll back first
        except BaseException:  # the commit failed (and was rolled back)
            self._release(*sys.exc_info())
            raise
        self._release(exc_type, exc, tb)

    def _release(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not release_after_transactions(self.lock):
            self.lock.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"<AtomicLock {self.lock.name!r}>"
