"""What ``@single_instance`` and the Celery integration share.

:mod:`django_redislock.guards.decorators` (the decorator) and
:mod:`django_redislock.celery` (``SingleInstanceTask`` and the worker-side
handlers) both build on this module; neither imports the other. It holds:

* :class:`GuardConfig`, the options of one guarded function or task class, and
  the ``on_locked`` vocabulary (:data:`DEFAULT`, :data:`TASK_MODES`);
* the helpers that describe a refusal: :func:`holder_text`,
  :func:`not_acquired`, :func:`lease_left`, :func:`retry_after`;
* the **task hooks**: how the decorator reaches a task framework without
  importing it. The Celery integration registers its :class:`TaskHooks` when
  it is imported, which ``RedisLockConfig.ready()`` does whenever Celery is
  installed. :func:`task_hooks` is the one fallback for code decorated before
  the apps are ready: if Celery is imported but the integration is not, it
  imports the integration.
"""

from __future__ import annotations

import importlib
import logging
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..engine.history import HistoryEvent, hold_spread
from ..engine.info import HolderInfo, LockInfo
from ..exceptions import LockBackendError, LockNotAcquired, LockNotOwned
from .keys_template import KeySpec

logger = logging.getLogger("django_redislock.celery")

if TYPE_CHECKING:
    from ..engine.calls import Prior
    from ..primitives.lock import Lock
    from ..primitives.manager import LockManager
    from .shaping import Shaping

__all__ = [
    "DEFAULT",
    "TASK_MODES",
    "GuardConfig",
    "TaskHooks",
    "holder_text",
    "lease_left",
    "not_acquired",
    "register_task_hooks",
    "release_holders",
    "release_task_hold",
    "retry_after",
    "task_hooks",
]


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


#: ``on_locked`` default: raise (functions), 409 (views), ``"skip"`` (tasks).
DEFAULT: Any = _Default()

#: The ``on_locked`` modes understood by Celery tasks.
TASK_MODES = ("skip", "retry", "wait", "raise")


@dataclass(frozen=True)
class GuardConfig:
    """The options of one ``single_instance`` use, shared by every call path."""

    spec: KeySpec
    ttl: float | None
    timeout: float | None
    on_locked: Any
    owner: str | Callable[..., str] | None
    lock_on_retry: str
    manager: LockManager | None
    #: At most this many concurrent holders per rendered name (a semaphore);
    #: None: one (a mutex).
    limit: int | None = None
    #: Views only: what a request does when Redis cannot be reached: ``"closed"``
    #: (503), ``"open"`` (run unguarded), a callable ``(request, error)``, or
    #: :data:`DEFAULT` (``REDISLOCK_VIEW_ON_REDIS_ERROR``).
    on_redis_error: Any = DEFAULT
    #: Rate limit and cooldown per key (:mod:`django_redislock.guards.shaping`); None: neither.
    shaping: Shaping | None = None
    #: Celery tasks: coalesce calls that find the key held into one pending run
    #: (:mod:`django_redislock.celery.coalesce`).
    coalesce: bool = False
    #: Celery tasks: run once the key was quiet this many seconds, with the last
    #: call's arguments (:mod:`django_redislock.celery.debounce`); None: no debounce.
    debounce: float | None = None

    def lock_manager(self) -> LockManager:
        """The manager to make locks with (default: ``django_redislock.locks``)."""
        if self.manager is not None:
            return self.manager
        return _default_manager()

    def make_lock(self, name: str, owner: str | None, **options: Any) -> Lock:
        """A Lock on *name* with this config's lease (a Semaphore with a ``limit``),
        labelled for metrics with :attr:`metrics_group`."""
        if self.ttl is not None:
            options["ttl"] = self.ttl
        shaping = self.shaping_meta
        if shaping is not None:  # shown in the admin beside the key's shaping state
            options["meta"] = {**(options.get("meta") or {}), "shaping": shaping}
        lock: Lock
        if self.limit is not None:
            lock = self.lock_manager().semaphore(name, self.limit, owner=owner, **options)
        else:
            lock = self.lock_manager().lock(name, owner=owner, **options)
        lock.metrics_group = self.metrics_group
        return lock

    @cached_property
    def shaping_meta(self) -> dict[str, Any] | None:
        """What this guard's locks record of its shaping in their metadata: ``rate``
        ([starts, window seconds]), ``cooldown`` (s), ``coalesce``, ``debounce`` (s);
        None when it shapes nothing. Made once per guard: every guarded call's lock
        carries it."""
        described: dict[str, Any] = {}
        if self.shaping is not None:
            if self.shaping.rate_count:
                described["rate"] = [self.shaping.rate_count, self.shaping.window]
            if self.shaping.cooldown:
                described["cooldown"] = self.shaping.cooldown
        if self.coalesce:
            described["coalesce"] = True
        if self.debounce:
            described["debounce"] = self.debounce
        return described or None

    @property
    def metrics_group(self) -> str:
        """The bounded label of this guard's locks in metrics (and in the contention
        overview): :attr:`KeySpec.template
        <django_redislock.guards.keys_template.KeySpec.template>`."""
        return self.spec.template

    def acquire(self, lock: Lock, *, wait: bool = False) -> bool:
        """Try *lock* within ``timeout`` (0: one attempt; None: no limit)."""
        return lock.acquire(timeout=self._wait(wait))

    async def aacquire(self, lock: Lock, *, wait: bool = False) -> bool:
        """:meth:`acquire` for asyncio."""
        return await lock.aacquire(timeout=self._wait(wait))

    def attempts_once(self, wait: bool) -> bool:
        """Whether one call makes one attempt at its lock (``timeout=0``, unless *wait*)."""
        return self._wait(wait) == 0

    def _wait(self, wait: bool) -> float | None:
        """How long one call waits: ``timeout``, where 0 means one attempt, unless *wait*."""
        if wait and self.timeout == 0:
            return None
        return self.timeout


def _default_manager() -> LockManager:
    """``django_redislock.locks`` (imported on first use: the manager imports this module)."""
    global _locks
    if _locks is None:
        from ..primitives.manager import locks

        _locks = locks
    return _locks


_locks: LockManager | None = None


def release_holders(
    manager: LockManager, name: str, match: Callable[[HolderInfo], bool]
) -> list[HolderInfo]:
    """Force-release the holders of *name* that *match*, as read now; returns those
    released. Each release is checked against the holder's owner and fencing
    token, so a hold that changed hands since it was read is left alone (the
    worker's handlers for revoked tasks and lost pool processes)."""
    info = manager.get(name)
    if info is None:
        return []
    return [
        h
        for h in info.holders
        if h.owner is not None
        and match(h)
        and manager.force_release(name, owner=h.owner, fencing_token=h.fencing_token)
    ]


def release_task_hold(
    lock: Lock, *, every_hold: bool = True, complete: bool = False, prior: Prior | None = None
) -> bool | None:
    """Release the caller's hold of *lock*, or with *every_hold* all its owner's holds;
    with *complete*, every hold, writing the run's completion record in the same script
    (see ``Lock._with_completion``; also when the hold was lost); *prior*: a call sent
    just before the release, in its round trip (a cooldown's start).

    ``every_hold`` frees the enqueue-time hold and the worker's re-entry in one
    round trip. Owner-checked: returns False (and changes nothing) when the lock
    is no longer this owner's, e.g. because its lease ran out.

    When Redis cannot confirm the release, the hold is no longer renewed (so
    its lease runs out within one ``ttl``), the error is logged and None is
    returned: a task whose body has run is not failed (nor auto-retried) for it.
    (Celery tasks and ``django.tasks`` runs both end through here.)
    """
    try:
        lock._release(*lock._caller(), every_hold or complete, complete, prior)
    except LockNotOwned:
        return False
    except LockBackendError:
        lock._forget(lock.owner)
        logger.error(
            "redislock: could not release lock %r (owner %s); it frees when its lease runs out%s",
            lock.name,
            lock.owner,
            "; the run's completion record was not written either: a redelivered copy "
            "of its message may run it again"
            if complete
            else "",
            exc_info=True,
        )
        return None
    return True


def holder_text(info: LockInfo | None) -> str:
    """Who holds the lock *info* describes, for messages: task id, else owner (of
    every holder of a semaphore)."""
    if info is None:
        return "(released meanwhile)"
    holders = info.holders
    if len(holders) > 1:
        return ", ".join(h.task_id or h.owner or "?" for h in holders)
    return info.task_id or info.owner or "?"


def not_acquired(name: str, info: LockInfo | None) -> LockNotAcquired:
    """The LockNotAcquired raised when *name* is held (by *info*'s holders)."""
    if info is not None and info.limit is not None:
        return LockNotAcquired(
            f"all {info.limit} places of lock {name!r} are taken, by {holder_text(info)}",
            name=name,
        )
    return LockNotAcquired(f"lock {name!r} is held by {holder_text(info)}", name=name)


def lease_left(info: LockInfo | None) -> int | None:
    """Whole seconds (at least 1) until the holder's lease runs out (a semaphore's
    first); None if unknown."""
    if info is None:
        return None
    ttl = info.ttl
    if info.limit is not None:  # a semaphore: a place frees when the first lease ends
        ttl = min((h.ttl for h in info.holders if h.ttl is not None), default=ttl)
    if ttl is not None and not math.isinf(ttl):
        return max(1, math.ceil(ttl))
    return None


def retry_after(
    info: LockInfo | None, config: GuardConfig, history: Sequence[HistoryEvent] = ()
) -> int:
    """The ``Retry-After`` seconds for a refused request.

    When the lock's *history* has recent holds, when the holder will likely be
    done: the first of their median, 90th percentile and longest that its age
    has not passed yet, minus that age. Never more than the holder's remaining
    lease (else our ttl), which is also the answer without a history.
    """
    most = lease_left(info) or max(1, math.ceil(config.ttl or 1))
    holds = hold_spread(history)
    age = None if info is None or info.age is None else info.age.total_seconds()
    if holds is None or age is None:
        return most
    for typical in (holds.median, holds.p90, holds.longest):
        if typical > age:
            return min(most, max(1, math.ceil(typical - age)))
    return most


# -- task hooks ----------------------------------------------------------------


@dataclass(frozen=True)
class TaskHooks:
    """What a task framework integration lends ``@single_instance``."""

    #: ``running_task(wrapper)``: the task whose body *wrapper* is, when that
    #: task is running now in this thread; else None.
    running_task: Callable[[Callable[..., Any]], Any]
    #: ``run_task(task, config, func, args, kwargs)``: run one execution of the
    #: decorated *func* as the body of *task*, under its lock.
    run_task: Callable[[Any, GuardConfig, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]
    #: ``check_decoratable(func)``: raise TypeError when *func* is already a
    #: task (the decorator is stacked above the task decorator).
    check_decoratable: Callable[[Any], None]
    #: ``lock_options_of(task)``: build a task's lock options (the system checks'
    #: test of a Celery task), raising TypeError/ValueError when they are wrong;
    #: None for a framework whose tasks the checks do not look at.
    lock_options_of: Callable[[Any], Any] | None = None


_task_hooks: tuple[TaskHooks, ...] = ()

#: The module that registers the Celery hooks when imported.
_CELERY_INTEGRATION = "django_redislock.celery"


def register_task_hooks(hooks: TaskHooks) -> None:
    """Install *hooks* beside those of other task frameworks (once each); the Celery
    integration calls this when it is imported, the ``django.tasks`` one too."""
    global _task_hooks
    if hooks not in _task_hooks:
        _task_hooks = (*_task_hooks, hooks)


def task_hooks() -> tuple[TaskHooks, ...]:
    """The registered task hooks; empty when no task framework is in use.

    ``RedisLockConfig.ready()`` imports the Celery integration (which registers
    them) whenever Celery is installed. This is the one fallback, for a function
    decorated or called before the apps are ready: when this process has
    imported Celery but not the integration yet, it is imported here.
    """
    if sys.modules.get("celery") is not None and _CELERY_INTEGRATION not in sys.modules:
        importlib.import_module(_CELERY_INTEGRATION)
    return _task_hooks
