"""Single-instance tasks for Django 6's task framework (``django.tasks``), deduplicated at enqueue.

``@task`` over ``@single_instance`` already guards every run (see docs/views.md).
:func:`single_instance_task` adds what Django's framework has no hook for: a
second ``enqueue()`` of the same key, while the first waits in the queue or
runs, is not stored again; it returns the first one's ``TaskResult``.

How a task's lock lives (as for Celery's ``unique_on_enqueue``):

* ``enqueue()`` takes the lock before handing the task to the backend, owned by a
  fresh *hold token*, with a lease that covers the wait in the queue
  (``lock_enqueue_ttl``, plus ``run_after``); nothing renews it meanwhile. The
  hold token travels with the task as a keyword argument
  (:data:`HOLD_KWARG`, visible in the stored ``TaskResult.kwargs``), and the
  result id is recorded beside it, so a duplicate can be answered with the
  queued task's result;
* the run (``Task.call``, in whichever worker) takes the hold over (owner
  ``<hold token>:<nonce>``), is renewed by the watchdog while it runs, and
  frees every hold when it ends. A run that finds the lock held by another
  task does what ``on_locked`` says, as a guarded function does;
* a task enqueued without the dedupe (``unique_on_enqueue=False``, or by code
  that calls the backend directly) runs as a plain guarded function.

Only synchronous task functions are supported here (Django's ImmediateBackend
runs a task inside ``enqueue()``, in the calling thread: the run takes the hold
over there and the lock is free again when ``enqueue()`` returns).
"""

from __future__ import annotations

import contextvars
import datetime as dt
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

try:
    from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME, task_backends
    from django.tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskResult
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError as exc:  # pragma: no cover - Django < 6.0
    raise ImportError(
        "django_redislock.django_tasks needs Django 6.0 or later (django.tasks)"
    ) from exc

from .conf import setting
from .engine.guarding import guarding
from .engine.identity import new_nonce
from .exceptions import DuplicateTaskError
from .guards.decorators import _function_locked as function_locked
from .guards.decorators import single_instance
from .guards.guard import DEFAULT, GuardConfig, TaskHooks, not_acquired, register_task_hooks
from .guards.guard import release_task_hold as _release

if TYPE_CHECKING:
    from .primitives.manager import LockManager

__all__ = ["HOLD_KWARG", "SingleInstanceDjangoTask", "single_instance_task"]

#: The keyword argument that carries a task's enqueue-time hold token to its run.
HOLD_KWARG = "_redislock_hold"

#: The hold token of the task run this context is executing (set by ``call``).
_running_hold: contextvars.ContextVar[tuple[Callable[..., Any], str] | None] = (
    contextvars.ContextVar("redislock_django_task_hold", default=None)
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SingleInstanceDjangoTask(Task):  # type: ignore[type-arg]
    """A ``django.tasks`` Task whose ``enqueue()`` refuses a duplicate of a queued or
    running task (same lock key); made by :func:`single_instance_task`.

    :param unique_on_enqueue: take the lock in ``enqueue()`` (True).
    :param lock_enqueue_ttl: the lease while the task waits in the queue (default:
        the guard's ttl, else ``REDISLOCK_DEFAULT_TTL``), plus any ``run_after``.
    :param on_duplicate: ``"return"`` the queued task's ``TaskResult`` (when the
        backend can fetch it; else :class:`DuplicateTaskError`) or ``"raise"``.
    """

    unique_on_enqueue: bool = True
    lock_enqueue_ttl: float | None = None
    on_duplicate: str = "return"

    def __post_init__(self) -> None:
        if self.on_duplicate not in ("return", "raise"):
            raise ValueError(f"on_duplicate must be 'return' or 'raise', not {self.on_duplicate!r}")
        ttl = self.lock_enqueue_ttl
        if ttl is not None and (
            isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl <= 0
        ):
            raise ValueError(f"lock_enqueue_ttl must be a positive number, not {ttl!r}")
        if inspect.iscoroutinefunction(self.func):
            raise TypeError("single_instance_task supports synchronous task functions only")
        if _config(self) is None:
            raise TypeError(
                "SingleInstanceDjangoTask needs a function decorated with @single_instance"
            )
        Task.__post_init__(self)  # (no zero-argument super() in a slotted dataclass)

    def enqueue(self, *args: Any, **kwargs: Any) -> TaskResult[..., Any]:
        """Queue the task, unless the same key is queued or running: then the
        queued task's result (or :class:`DuplicateTaskError`)."""
        if not self.unique_on_enqueue:
            return Task.enqueue(self, *args, **kwargs)
        config = _config(self)
        assert config is not None
        name, inputs = config.spec.render_with_inputs(args, kwargs)
        hold = f"djtask:{new_nonce()}"
        lease = self._enqueue_lease(config)
        manager = config.lock_manager()
        lock = manager.lock(
            name, ttl=lease, owner=hold, auto_renew=False, meta=self._meta(config, inputs)
        )
        lock.metrics_group = config.metrics_group
        for _ in range(3):  # the holder may release between our attempt and our look
            if lock.acquire(blocking=False):
                break
            info = manager.get(name)
            if info is not None:
                return self._duplicate(manager, name, info.owner or "")
        else:
            raise not_acquired(name, manager.get(name))
        try:
            result: TaskResult[..., Any] = Task.enqueue(self, *args, **{**kwargs, HOLD_KWARG: hold})
        except BaseException:
            _release(lock)  # never queued: leave no lock behind
            raise
        manager.client.set(_result_key(manager, hold), result.id, ex=max(1, int(lease) + 1))
        return result

    async def aenqueue(self, *args: Any, **kwargs: Any) -> TaskResult[..., Any]:
        """:meth:`enqueue` for asyncio (runs it in a thread)."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.enqueue)(*args, **kwargs)

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task's function; a run carrying an enqueue-time hold takes it over."""
        hold = kwargs.pop(HOLD_KWARG, None)
        with _running(self.func, hold):
            return Task.call(self, *args, **kwargs)

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`call` for asyncio (the function is synchronous: it runs in a thread)."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.call)(*args, **kwargs)

    def _enqueue_lease(self, config: GuardConfig) -> float:
        lease = self.lock_enqueue_ttl or config.ttl or float(setting("REDISLOCK_DEFAULT_TTL"))
        if self.run_after is not None:
            wait = (self.run_after - dt.datetime.now(dt.timezone.utc)).total_seconds()
            lease += max(0.0, wait)
        return lease

    def _meta(self, config: GuardConfig, inputs: dict[str, Any]) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "kind": "task",
            "task_name": self.module_path,
            "purpose": self.module_path,
            "template": config.spec.template,
        }
        if inputs:
            meta["args"] = inputs
        return meta

    def _duplicate(self, manager: LockManager, name: str, holder: str) -> TaskResult[..., Any]:
        hold = ":".join(holder.split(":")[:2]) if holder.startswith("djtask:") else None
        raw = None if hold is None else manager.client.get(_result_key(manager, hold))
        result_id = raw.decode() if isinstance(raw, bytes) else raw
        message = f"task {self.module_path} with lock {name!r} is already queued or running"
        if result_id is None:
            raise DuplicateTaskError(f"{message} (held by {holder})", name=name)
        if self.on_duplicate == "return":
            try:
                result: TaskResult[..., Any] = self.get_result(result_id)
                return result
            except (NotImplementedError, TaskResultDoesNotExist):
                pass  # this backend cannot fetch a result: say which one it is
        raise DuplicateTaskError(f"{message} (result {result_id})", name=name, task_id=result_id)


def single_instance_task(
    key: str | Callable[..., str] | None = None,
    *,
    ttl: float | None = None,
    timeout: float | None = 0,
    on_locked: Any = DEFAULT,
    manager: LockManager | None = None,
    unique_on_enqueue: bool = True,
    lock_enqueue_ttl: float | None = None,
    on_duplicate: str = "return",
    priority: int = DEFAULT_TASK_PRIORITY,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
) -> Callable[[Callable[..., Any]], SingleInstanceDjangoTask]:
    """``@task`` and ``@single_instance`` in one, with enqueue-time dedupe.

    *key*, *ttl*, *timeout*, *on_locked* and *manager* are ``@single_instance``'s
    (a run that finds the lock held raises ``LockNotAcquired`` by default: the
    run is FAILED); *priority*, *queue_name*, *backend* and *takes_context* are
    ``@task``'s; the others are :class:`SingleInstanceDjangoTask`'s.
    """
    if takes_context and key is not None and not isinstance(key, str):
        raise TypeError("with takes_context, the key must be a template or None")

    def decorate(func: Callable[..., Any]) -> SingleInstanceDjangoTask:
        base = task_backends[backend].task_class
        if not issubclass(SingleInstanceDjangoTask, base):
            raise TypeError(
                f"task backend {backend!r} makes its own task class ({base.__qualname__}); "
                "single_instance_task works with backends whose task class is Django's Task"
            )
        guarded = single_instance(
            key, ttl=ttl, timeout=timeout, on_locked=on_locked, manager=manager
        )(func)
        return SingleInstanceDjangoTask(
            func=guarded,
            priority=priority,
            queue_name=queue_name,
            backend=backend,
            takes_context=takes_context,
            unique_on_enqueue=unique_on_enqueue,
            lock_enqueue_ttl=lock_enqueue_ttl,
            on_duplicate=on_duplicate,
        )

    return decorate


def _config(django_task: Task[..., Any]) -> GuardConfig | None:
    config: GuardConfig | None = getattr(django_task.func, "_redislock_config", None)
    return config


def _result_key(manager: LockManager, hold: str) -> str:
    return f"{manager.backend().keyspace.prefix}:djtask-result:{hold}"


@contextmanager
def _running(func: Callable[..., Any], hold: str | None) -> Iterator[None]:
    token = _running_hold.set(None if hold is None else (func, hold))
    try:
        yield
    finally:
        _running_hold.reset(token)


def _running_task(wrapper: Callable[..., Any]) -> str | None:
    """The hold token of the run whose guarded function *wrapper* is, if one runs now."""
    running = _running_hold.get()
    if running is not None and running[0] is wrapper:
        return running[1]
    return None


def _run_task(
    hold: str,
    config: GuardConfig,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Run one execution of a deduplicated task under its lock, taking over its hold."""
    _running_hold.set(None)  # code the body calls is no part of this run's takeover
    name, inputs = config.spec.render_with_inputs(args, kwargs)
    meta: dict[str, Any] = {"kind": "task", "purpose": f"{func.__module__}.{func.__qualname__}"}
    meta["template"] = config.spec.template
    if inputs:
        meta["args"] = inputs
    lock = config.make_lock(name, f"{hold}:{new_nonce()}", inherit_from=hold, meta=meta)
    if not config.acquire(lock, wait=config.on_locked == "wait"):
        return function_locked(config, name, config.lock_manager().get(name), args, kwargs)
    try:
        with guarding(name, lock.owner):
            return func(*args, **kwargs)
    finally:
        _release(lock)


def _refuse_nothing(func: Any) -> None:
    """``@single_instance`` over a ``django.tasks`` Task is refused already: a Task is
    not callable."""


register_task_hooks(
    TaskHooks(running_task=_running_task, run_task=_run_task, check_decoratable=_refuse_nothing)
)
