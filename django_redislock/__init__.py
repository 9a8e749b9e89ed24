"""Correct, fast, observable distributed locks for Django and Celery on Redis.

The public API::

    from django_redislock import locks, Lock, LockNotAcquired

    with locks.lock("report:42", ttl=30, timeout=10) as held:
        held.fencing_token

Everything not listed in ``__all__`` is private or documented as advanced.
"""

from typing import Any

from .engine.info import LockInfo
from .exceptions import (
    LimitMismatch,
    LockBackendError,
    LockDeadlock,
    LockError,
    LockLost,
    LockMismatch,
    LockNotAcquired,
    LockNotOwned,
    LockUpgradeError,
    RunLimited,
    StaleFencingToken,
)
from .guards.decorators import single_instance
from .primitives.lock import Lock
from .primitives.manager import LockManager, locks
from .primitives.rwlock import ReadWriteLock
from .primitives.semaphore import Semaphore

__all__ = [
    "LimitMismatch",
    "Lock",
    "LockBackendError",
    "LockDeadlock",
    "LockError",
    "LockInfo",
    "LockLost",
    "LockManager",
    "LockMismatch",
    "LockNotAcquired",
    "LockNotOwned",
    "LockUpgradeError",
    "ReadWriteLock",
    "RunLimited",
    "Semaphore",
    "StaleFencingToken",
    "locks",
    "single_instance",
]


def __getattr__(name: str) -> Any:
    # SingleInstanceTask needs Celery: import it only when asked for (and keep it
    # out of __all__ so that a star import works without Celery).
    if name == "SingleInstanceTask":
        from .celery import SingleInstanceTask

        return SingleInstanceTask
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__version__ = "0.1.0"
