"""Exceptions raised by django-redislock.

Every error the package raises on purpose derives from :class:`LockError`, so
``except LockError`` catches all of them. Invalid arguments (an empty lock name,
a negative TTL, ...) raise the built-in :class:`ValueError` / :class:`TypeError`
instead: they are programming errors, not lock outcomes.
"""

from __future__ import annotations


class LockError(Exception):
    """Base class of every lock error. ``name`` is the lock's name when known.

    ``lock_name`` is the same value under redis-py's spelling, so handlers
    written for ``redis.exceptions.LockError`` keep working.
    """

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name
        self.lock_name = name


class LockNotAcquired(LockError):
    """The lock is held by someone else and could not be acquired in time."""


class RunLimited(LockNotAcquired):
    """A guarded call was not started because its key's rate limit is reached
    (``reason == "rate"``) or its cooldown runs (``reason == "cooldown"``).

    ``retry_after`` is the number of seconds (by Redis's clock, at the refusal) until
    a start could be admitted. Rebuilt from its message alone (a Celery task's
    result read by a client that serialises exceptions as JSON), ``reason`` is
    ``""`` and ``retry_after`` 0.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        reason: str = "",
        retry_after: float = 0.0,
    ) -> None:
        super().__init__(message, name=name)
        self.reason = reason
        self.retry_after = retry_after


class LockNotOwned(LockError):
    """A release, extend or renewal was attempted by an owner that does not hold the lock.

    Nothing was changed in Redis.
    """


class LockLost(LockError):
    """A held lock was lost: its lease expired, or it was force-released or taken over.

    Raised when leaving a ``with`` block whose lock was lost while the block ran
    (unless ``raise_on_lost=False``).
    """


class LockBackendError(LockError):
    """Redis could not be reached, timed out, or answered with an error.

    The original exception is chained as ``__cause__``. Raised by a call about
    one lock, it carries the lock's ``name`` and its message begins with it
    (``lock 'invoice:17': Redis error while trying to acquire the lock: ...``).
    """

    def __init__(self, message: str, *, name: str | None = None) -> None:
        if name is not None and not message.startswith(f"lock {name!r}"):
            message = f"lock {name!r}: {message}"
        super().__init__(message, name=name)


def about_lock(error: LockBackendError, name: str) -> LockBackendError:
    """*error*, raised by a call that did not know it was about the lock *name* (a
    snapshot read for several names), naming that lock as :class:`LockBackendError`
    does; returned for ``raise``."""
    if error.name is None:
        error.name = error.lock_name = name
        error.args = (f"lock {name!r}: {error.args[0] if error.args else ''}", *error.args[1:])
    return error


class ScriptingUnavailable(LockBackendError):
    """Redis refused to run a Lua script: every lock operation is one.

    Raised on the first lock call to a server without scripting: a Valkey 9.1+
    built or run without its Lua module, or a server whose ``EVAL``,
    ``EVALSHA`` or ``SCRIPT`` commands are renamed away or denied to the lock
    client's user by an ACL. System check ``django_redislock.E006`` reports the
    same. The server's reply is chained as ``__cause__``.
    """


class BlockingCallInEventLoop(LockError, RuntimeError):
    """A blocking lock call was made inside a running asyncio event loop.

    A blocking wait there would freeze every task of the loop; use the ``a``
    methods (``await lock.aacquire()``) or ``async with lock:`` instead.
    """


class LockNotReplicated(LockNotAcquired):
    """Too few replicas acknowledged a grant, hand-off, renewal or extension in time.

    Raised for locks with ``wait_replicas``: after a failover the primary's
    unacknowledged writes may be gone, so a grant only counts once ``acks`` of
    the ``required`` replicas confirmed it (Redis ``WAIT``). A grant that was not
    confirmed has been given back (same nonce, so nobody else is hurt); an
    extension stays on the primary but may be lost in a failover.
    """

    def __init__(
        self, message: str, *, name: str | None = None, acks: int = 0, required: int = 0
    ) -> None:
        super().__init__(message, name=name)
        self.acks = acks
        self.required = required


class QuorumNotReached(LockBackendError):
    """Too few Redlock masters answered for a majority decision.

    Raised on Redlock (``REDISLOCK_REDLOCK_CACHES``) when fewer than a majority of
    the masters answered a call in time: ``answered`` of ``masters`` answered; a
    majority is ``needed``. Whatever a refused acquire got has been given back.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        answered: int = 0,
        masters: int = 0,
        needed: int = 0,
    ) -> None:
        super().__init__(message, name=name)
        self.answered = answered
        self.masters = masters
        self.needed = needed


class LockUpgradeError(LockError):
    """A read-write lock's write hold was asked for by an owner holding a read.

    Upgrading a read to a write would wait for every reader to leave, the asking
    owner included, so it would never end: release the read first (or take the
    write first; a writer may take reads).
    """


class LockMismatch(LockError):
    """A name is in use as another kind of lock (a mutex used as a semaphore, ...).

    ``existing`` is the primitive holding the name (``"mutex"``, ``"semaphore"``
    or ``"rwlock"``).
    """

    def __init__(self, message: str, *, name: str | None = None, existing: str = "") -> None:
        super().__init__(message, name=name)
        self.existing = existing


class LimitMismatch(LockMismatch):
    """A semaphore was asked for with another ``limit`` than the one in use.

    ``limit`` is the limit asked for, ``existing`` the one its current holders
    use; the limit can change once the semaphore is free.
    """

    def __init__(
        self, message: str, *, name: str | None = None, limit: int = 0, existing: int = 0
    ) -> None:
        super().__init__(message, name=name, existing="semaphore")
        self.limit = limit
        self.existing_limit = existing


class DuplicateTaskError(LockNotAcquired):
    """Enqueueing found the same task already queued or running (``on_duplicate="raise"``,
    or a duplicate whose result cannot be fetched).

    ``task_id`` is the id of the task (a Celery task id, a ``django.tasks`` result id)
    holding the lock; None if it is not a task or its id is unknown. Importable from
    ``django_redislock.celery`` too.
    """

    def __init__(self, message: str, *, name: str | None = None, task_id: str | None = None):
        super().__init__(message, name=name)
        self.task_id = task_id


class StaleFencingToken(LockLost):
    """A write carrying a fencing token was refused by the store: a newer holder's token
    is current there (or nobody holds the lock any more). Nothing was written.

    Raised by ``held.check()``, by the guarded Redis writes (``held.guarded()``) and by
    ``fenced_update()`` (see docs/fencing.md). ``token`` is the refused token;
    ``current`` the token the store holds now when it told (None: nobody holds the
    lock, or the store did not say); ``target`` what was to be written (a key, a
    table), or None for a check.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        token: int = 0,
        current: int | None = None,
        target: str | None = None,
    ) -> None:
        super().__init__(message, name=name)
        self.token = token
        self.current = current
        self.target = target


class ShapingUnsupported(TypeError):
    """``rate=``, ``cooldown=``, coalescing or debouncing used where they cannot be kept:
    on Redlock, whose masters would each count starts with their own clock."""


class FencingUnsupported(LockError):
    """A store-enforced fencing call (``check()``, a guarded write) was asked of a
    backend where one script cannot check the hold and act on it: Redlock, whose
    masters each keep their own copy of the lock (see docs/fencing.md)."""


class LockDeadlock(LockNotAcquired):
    """A wait was refused because it closed a cycle of waiters: each waits for a lock
    the next one holds, so none of them would ever get it.

    Raised by an acquire with ``deadlock_timeout`` that has waited that long: the
    youngest wait of the cycle (the one that began last) is refused, and nothing it
    waited for is held by it. ``cycle`` lists the cycle's edges as ``(owner, lock
    name it waits for, owner holding that lock)``, starting with this wait's.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        cycle: tuple[tuple[str, str, str], ...] = (),
    ) -> None:
        super().__init__(message, name=name)
        self.cycle = cycle
