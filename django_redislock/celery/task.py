"""Single-instance Celery tasks: :class:`SingleInstanceTask` and the worker-side handlers.

Importing this module imports Celery (the ``celery`` extra:
``pip install "/path/to/django-redislock[celery]"`` from a checkout);
nothing else in the package does. It also registers the task hooks through
which ``@single_instance`` runs Celery task bodies (see
:mod:`django_redislock.guards.guard`); the app's ``ready()`` imports it whenever
Celery is installed.

How a task's lock lives:

* at enqueue time (``unique_on_enqueue``) the owner is the task id; at run
  time it is one owner per execution, ``<task id>:<token>``, which takes over
  the enqueue-time hold and releases everything when the execution ends. A
  redelivered copy of a message still running (same task id, another
  execution) therefore finds the lock held instead of re-entering it; a
  retry's execution takes over the hold the earlier one kept for it;
* the task body runs as the guard's owner for its own lock name
  (:mod:`django_redislock.engine.guarding`): ``locks.lock(name)`` on that name
  inside it re-enters the lock instead of waiting for itself;
* the run-time check happens in the worker for every execution, so tasks sent
  by name (``send_task``, beat, other services) are single-instance too;
* the watchdog renews the lease while the task runs; a killed worker's lock
  frees itself within one lease;
* every release is owner-checked (a release never deletes another task's lock).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from celery import Task
from celery._state import get_current_task
from celery.exceptions import Reject, Retry
from celery.local import Proxy
from celery.utils import uuid

from ..conf import setting
from ..engine.calls import RunCompleted
from ..engine.guarding import guard_owner, guarding
from ..engine.identity import new_nonce
from ..exceptions import DuplicateTaskError, LockError
from ..guards.guard import (
    DEFAULT,
    TASK_MODES,
    GuardConfig,
    TaskHooks,
    holder_text,
    lease_left,
    not_acquired,
    register_task_hooks,
    release_task_hold,
)
from ..guards.keys_template import KeySpec
from ..guards.shaping import (
    ASK_AGAIN,
    TASK_LIMITED_MODES,
    Shaping,
    admitting_backend,
    attempt_admitted,
    check_coalesce,
    check_debounce,
    cooling,
)
from ..primitives.lock import Lock
from ..primitives.refusals import UNREAD
from ..primitives.semaphore import validate_limit
from .autoretry import autoretry_delay
from .coalesce import ACQUIRED, attempt_swept, hand_on, pend, sweep, sweeping_backend
from .debounce import RUN as DEBOUNCE_RUN
from .debounce import debounce
from .redelivery import (
    TAKEOVER_TRIES,
    completed,
    dead_here,
    defer,
    drop,
    execution_of,
    record_completion,
    record_with_lock,
    take_over,
)
from .revoke import connect as _connect_revoke
from .revoke import free_revoked, watch_revokes
from .shaping import ADMITTED, resend, settle_start

logger = logging.getLogger("django_redislock.celery")

__all__ = ["DuplicateTaskError", "SingleInstanceTask", "is_skipped", "run_decorated_task"]


def is_skipped(result: Any) -> bool:
    """Whether a task result is the marker of a run skipped because its lock was held."""
    return isinstance(result, dict) and result.get("redislock") == "skipped"


def _skipped(name: str, holder: str | None) -> dict[str, Any]:
    return {"redislock": "skipped", "reason": "lock held", "lock": name, "holder": holder}


def _task_meta(
    task: Task, task_id: str | None, spec: KeySpec, inputs: dict[str, Any]
) -> dict[str, Any]:
    """What a task's lock records: the task, its name as the purpose, its key
    template, and the arguments its lock key was made from (shown in the admin)."""
    meta = {
        "kind": "task",
        "task_id": task_id,
        "task_name": task.name,
        "purpose": task.name,
        "template": spec.template,
    }
    if inputs:
        meta["args"] = inputs
    return meta


#: Per thread: how many runs of each (lock name, owner) are in progress, so a
#: task that calls itself directly (same task id, so it re-enters its own lock)
#: gives back only its own hold when the inner call ends.
_runs = threading.local()


def _enter(key: tuple[str, str]) -> bool:
    """Count one more run of *key*; True when it is the outermost one."""
    depths: dict[tuple[str, str], int] | None = getattr(_runs, "depths", None)
    if depths is None:
        depths = _runs.depths = {}
    depth = depths.get(key, 0)
    depths[key] = depth + 1
    return depth == 0


def _leave(key: tuple[str, str]) -> None:
    depths: dict[tuple[str, str], int] = _runs.depths
    depth = depths.pop(key) - 1
    if depth:
        depths[key] = depth


def _delay_seconds(countdown: Any = None, eta: Any = None) -> float:
    """Seconds from now until a task sent with *countdown*/*eta* (or a Retry's ``when``) runs.

    A naive ETA is UTC, as Celery reads it (whatever the local time zone).
    """
    if eta is None and isinstance(countdown, dt.datetime):
        countdown, eta = None, countdown
    if countdown is not None:
        return max(0.0, float(countdown))
    if isinstance(eta, str):
        eta = dt.datetime.fromisoformat(eta)
    if isinstance(eta, dt.datetime):
        when: dt.datetime = eta if eta.tzinfo else eta.replace(tzinfo=dt.timezone.utc)
        return max(0.0, (when - dt.datetime.now(dt.timezone.utc)).total_seconds())
    return 0.0


def run_guarded(
    task: Task,
    config: GuardConfig,
    spec: KeySpec,
    call_args: tuple[Any, ...],
    kwargs: dict[str, Any],
    body: Callable[[], Any],
) -> Any:
    """Run *body* (one execution of *task*) under its single-instance lock.

    Taking over the enqueue-time hold sets the lease to the lock's ttl (the
    enqueue-time one may be longer), so a killed worker's lock frees within one
    ttl: one round trip to start, one to end.
    """
    task_id = task.request.id
    name, inputs = spec.render_with_inputs(call_args, kwargs)
    if config.debounce and guard_owner(name) is None:  # not a nested direct call
        debounced = debounce(task, config, name, call_args, kwargs)
        if debounced is not DEBOUNCE_RUN:
            return debounced
    meta = _task_meta(task, task_id, spec, inputs)
    options: dict[str, Any] = {"meta": meta}
    running = None
    if task_id is None:
        owner = config.owner if isinstance(config.owner, str) else None
    else:
        # One owner per execution (a nested direct call shares its caller's), so a
        # redelivered copy of a running message (same task id) cannot re-enter its
        # lock; the execution takes over the hold its task id took at enqueue time
        # (or the one an earlier execution kept for its retry).
        running = guard_owner(name)
        if running is None or not running.startswith(f"{task_id}:"):
            running = None  # another task (an eager call inside the body) is another owner
        owner = running or f"{task_id}:{new_nonce()}"
        if config.limit is None:
            options["inherit_from"] = task_id
    lock = config.make_lock(name, owner, **options)
    on_locked = "skip" if config.on_locked is DEFAULT else config.on_locked
    # A new execution of a task id may be a broker's copy of another execution of it.
    copy = (
        task_id is not None
        and running is None
        and config.limit is None
        and not task.request.is_eager
    )
    seen: Any = UNREAD  # the holder, when a refused acquire read it already
    late = copy and bool(task.acks_late)
    # Where the lock keeps the completion record, its acquire reads it and its last
    # release writes it; *checked*: this grant was the lock's own answer to that read.
    with_lock = late and record_with_lock(config.lock_manager(), lock, task_id)
    checked = False
    # A rate or cooldown's admission in the first attempt's round trip, unless the
    # completion record is looked up after the acquire (a completed run starts nothing).
    # A coalescing task's question to its pending slot rides there too (read-only).
    admits = with_lock or not late
    carried: Any = ASK_AGAIN  # the answer of the call that rode with the first attempt
    try:  # with the record kept by the lock, an acquire of a completed run raises
        if copy:
            acquired, seen, at_once, carried = _acquire_execution(
                task, config, lock, name, on_locked, admits
            )
            checked = with_lock and at_once
        else:
            acquired = config.acquire(lock, wait=on_locked == "wait")
        if not acquired:
            if config.debounce and task_id is not None and not task.request.is_eager:
                if seen is UNREAD:
                    seen = config.lock_manager().get(name)
                resend(task, lease_left(seen) or 1)  # the due run
            if not config.coalesce:
                return _task_locked(task, config, on_locked, name, call_args, kwargs, seen)
            outcome = pend(task, config, lock, name, call_args, kwargs)  # the pending run
            if outcome is not ACQUIRED:
                return outcome
    except RunCompleted:
        drop(task, name)  # holding nothing
    if late and not checked:
        try:
            done = completed(config.lock_manager(), name, task_id)
        except BaseException:
            release_task_hold(lock)
            raise
        if done:
            release_task_hold(lock)
            drop(task, name)
    if running is None and config.coalesce:  # (coalescing has no rate or cooldown)
        sweep(task, config, lock, name, carried)  # a sweeper of a pending call hands it on
    if running is None and config.shaping is not None:  # a rate limit or a cooldown
        started = settle_start(task, lock, config, call_args, kwargs, _keep_for_retry, carried)
        if started is not ADMITTED:
            return started
    run_key = (name, lock.owner)
    # The outermost run of this owner ends the task: it frees every hold (its own
    # and the enqueue-time one) at once. A nested direct call gives back its own.
    outermost = _enter(run_key)
    try:
        with guarding(name, lock.owner):  # code on the task's behalf re-enters its lock
            result = body()
    except (Retry, Reject) as exc:
        if isinstance(exc, Retry) and config.lock_on_retry == "keep" and config.limit is None:
            _keep_for_retry(lock, _delay_seconds(exc.when), task.request.id)
        else:
            release_task_hold(lock, every_hold=outermost)
        raise
    except Exception as exc:
        # Celery's autoretry_for wrapper, outside this body, turns some into a Retry.
        delay = autoretry_delay(task, exc)
        if delay is None:
            _release_at_end(lock, task, outermost, config, late, with_lock)
        elif config.lock_on_retry == "keep" and config.limit is None:
            _keep_for_retry(lock, delay, task.request.id)
        else:
            release_task_hold(lock, every_hold=outermost)
        raise
    except BaseException:  # the execution was stopped: its message may come again
        _release_at_end(lock, task, outermost, config)
        raise
    finally:
        _leave(run_key)
    _release_at_end(lock, task, outermost, config, late, with_lock)
    return result


def _acquire_execution(
    task: Task, config: GuardConfig, lock: Lock, name: str, on_locked: Any, admits: bool
) -> tuple[bool, Any, bool, Any]:
    """Take *lock* for a new execution of *task*'s id, settling a broker's copy:
    ``(acquired, holder, at_once, carried)``, *holder* the lock's snapshot as read to
    refuse it (or :data:`~django_redislock.primitives.refusals.UNREAD`), *at_once*:
    granted by the lock's own acquire script, not handed over after a wait;
    *carried*: the answer of the call the granted first attempt carried, else
    ``ASK_AGAIN``: with *admits*, a shaped task's start's admission
    (``attempt_admitted``); a coalescing task's question to its pending slot
    (``attempt_swept``; the two never combine).

    When another execution of the same task id holds the lock, this one is a
    copy of it (see :mod:`django_redislock.celery.redelivery`): it takes the hold
    over when that execution died on this host, else it is deferred (Ignore).
    Any other holder gets the configured ``on_locked`` treatment (False).
    """
    task_id: str = task.request.id
    manager = config.lock_manager()
    copy_of = None
    admitting = admitting_backend(config, lock) if admits else None
    sweeping = sweeping_backend(lock) if config.coalesce else None
    for _ in range(TAKEOVER_TRIES):
        if admitting is not None:
            held, carried = attempt_admitted(config, lock, admitting)
        elif sweeping is not None:
            held, carried = attempt_swept(lock, sweeping, task)
        else:
            held, carried = lock.acquire(blocking=False), ASK_AGAIN
        if held:
            return True, UNREAD, True, carried
        info = manager.get(name)
        holder = execution_of(info, task_id)
        if holder is None:
            if info is None:
                continue  # released between our attempt and our look
            if on_locked == "wait" or config.timeout != 0:
                return config.acquire(lock, wait=on_locked == "wait"), UNREAD, False, ASK_AGAIN
            return False, info, False, ASK_AGAIN
        if not (dead_here(holder) and take_over(manager, name, holder)):
            defer(task, name, holder, lease_left(info) or 1)
        copy_of = (holder, info)
    if copy_of is not None:  # other copies won each race for the freed hold
        defer(task, name, copy_of[0], lease_left(copy_of[1]) or 1)
    return False, UNREAD, False, ASK_AGAIN


def _release_at_end(
    lock: Lock, task: Task, outermost: bool, config: GuardConfig, ran: bool = False,
    with_lock: bool = False,
) -> None:  # fmt: skip
    """End the execution's hold; *ran*: an ``acks_late`` execution ran to its end, so its
    completion record is written first (*with_lock*: by the release itself, where it can)."""
    in_release = ran and with_lock and outermost and not config.coalesce
    if ran and not in_release:  # before the lock can pass to a copy
        record_completion(config.lock_manager(), lock.name, task.request.id)
    # The cooldown starts before the lock is free, in the release's round trip.
    cool = cooling(config, lock) if outermost else None
    if outermost and config.coalesce and hand_on(task, config, lock, lock.name):
        return  # the lock went to the pending run (coalescing has no cooldown)
    if release_task_hold(lock, every_hold=outermost, complete=in_release, prior=cool) is False:
        logger.warning(
            "redislock: task %s[%s] lost its lock %r before it finished "
            "(lease expired or force-released); another run may have overlapped",
            task.name,
            task.request.id,
            lock.name,
        )


def _keep_for_retry(lock: Lock, delay: float, task_id: str | None) -> None:
    # The retry runs later (in *delay* seconds at most) under the same task id: keep
    # the lease long enough to cover the countdown, hand the hold to the task id
    # (the retry's execution takes it over), and stop renewing it from this execution.
    keep = delay + (lock.ttl_seconds or 0.0)
    owner = lock.owner
    try:
        if task_id is not None and owner != task_id:
            lock._transfer(task_id, keep)  # one round trip: new owner and lease
        else:
            lock.extend(keep, replace_ttl=True)
    except LockError:  # lost meanwhile, or Redis unreachable: the retry still runs
        pass
    lock._forget(owner)


def _task_locked(
    task: Task,
    config: GuardConfig,
    on_locked: Any,
    name: str,
    call_args: tuple[Any, ...],
    kwargs: dict[str, Any],
    info: Any = UNREAD,
) -> Any:
    """What a run that found its lock held does (*info*: the holder's snapshot, if a
    refused acquire read it already)."""
    if info is UNREAD:
        info = config.lock_manager().get(name)
    holder = None if info is None else holder_text(info)  # (every holder of a semaphore)
    logger.log(
        setting("REDISLOCK_TASK_SKIP_LOG_LEVEL"),
        "redislock: task %s[%s] found lock %r held by %s (on_locked=%s)",
        task.name,
        task.request.id,
        name,
        holder,
        getattr(on_locked, "__name__", on_locked),
    )
    if on_locked == "skip":
        return _skipped(name, holder)
    if on_locked in ("raise", "wait"):
        raise not_acquired(name, info)
    if on_locked == "retry":
        countdown = lease_left(info) or 1
        raise task.retry(countdown=countdown, exc=not_acquired(name, info))
    if callable(on_locked):
        return on_locked(info, *call_args, **kwargs)
    raise ValueError(f"on_locked for a Celery task must be one of {TASK_MODES} or a callable")


def run_decorated_task(
    task: Task,
    config: GuardConfig,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Run the body of a ``@single_instance``-decorated task under its lock."""
    spec = config.spec
    call_args = args
    if args and args[0] is task:  # bind=True: self is no part of the key
        spec, call_args = config.spec.without_self(), args[1:]
    return run_guarded(task, config, spec, call_args, kwargs, lambda: func(*args, **kwargs))


def _running_task(wrapper: Callable[..., Any]) -> Any:
    """The task whose body the ``@single_instance`` *wrapper* is, when it is running now."""
    task = get_current_task()
    if task is not None and getattr(type(task), "run", None) is wrapper:
        return task
    return None


def _refuse_task(func: Any) -> None:
    """Refuse ``@single_instance`` stacked above ``@app.task`` (applied to a task)."""
    # type(), not isinstance(): isinstance() on a lazy task proxy would evaluate it.
    if issubclass(type(func), Proxy) or issubclass(type(func), Task):
        raise TypeError(
            "@single_instance is stacked above the Celery task decorator; put it below:\n"
            "    @app.task            # or @shared_task\n"
            "    @single_instance(...)\n"
            "    def my_task(...): ..."
        )


try:  # Celery 5.4+: what Celery's Django fixup makes app.Task (delay_on_commit and co.)
    from celery.contrib.django.task import DjangoTask as _TaskBase
except ImportError:  # pragma: no cover - Celery 5.3
    _TaskBase = Task


class SingleInstanceTask(_TaskBase):  # type: ignore[misc]
    """A Celery task base class: one execution at a time per lock key.

    On Celery 5.4+ it is a ``DjangoTask`` (what Celery's Django fixup makes
    ``app.Task``), so ``delay_on_commit()`` and ``apply_async_on_commit()`` send
    the task when the transaction commits, and the enqueue-time dedupe happens
    then, when the task is really sent.

    Configure with task options (``@app.task(base=SingleInstanceTask, lock_key=...)``)
    or class attributes:

    * ``lock_key``: key template / callable / ``single_instance.ARGS`` /
      None (the task name);
    * ``lock_ttl``: lease in seconds (default ``REDISLOCK_DEFAULT_TTL``),
      renewed while the task runs;
    * ``lock_timeout``: seconds to wait for a held lock at run time (0);
    * ``lock_limit``: let up to this many executions run at once per lock key
      (a semaphore) instead of one (None); not with ``unique_on_enqueue``;
    * ``on_locked``: ``"skip"`` (default), ``"retry"``, ``"wait"``, ``"raise"``
      or a callable ``(lock_info, *args, **kwargs)``;
    * ``unique_on_enqueue``: take the lock in ``apply_async`` so a duplicate is
      not even queued (False);
    * ``lock_enqueue_ttl``: with ``unique_on_enqueue``, the lease of the lock
      while the message waits in the queue (default ``lock_ttl``), plus any
      countdown/ETA: nothing renews it until a worker starts the task;
    * ``on_duplicate``: with ``unique_on_enqueue``, ``"return"`` the holder's
      AsyncResult (default) or ``"raise"`` :class:`DuplicateTaskError`;
    * ``lock_on_retry``: ``"keep"`` (default) or ``"release"`` on ``self.retry()``;
    * ``lock_manager``: a LockManager (default ``django_redislock.locks``);
    * ``lock_coalesce``: a call that finds the key held becomes the one pending
      run, started when the running one ends (see
      :mod:`django_redislock.celery.coalesce`); not with ``unique_on_enqueue``;
    * ``lock_debounce``: run once the key was quiet this many seconds, with the
      last call's arguments (see :mod:`django_redislock.celery.debounce`);
    * ``lock_rate``: at most this many starts per sliding window per key
      (``"10/m"``, see ``single_instance(rate=...)``);
    * ``lock_cooldown``: seconds the key stays taken after each run ends
      (not with ``lock_limit``);
    * ``on_limited``: what an execution refused by ``lock_rate`` or
      ``lock_cooldown`` does: ``"defer"`` (default), ``"retry"``, ``"skip"``,
      ``"raise"`` or a callable (see :mod:`django_redislock.celery.shaping`).
    """

    lock_key: Any = None
    lock_ttl: float | None = None
    lock_timeout: float | None = 0
    lock_limit: int | None = None
    on_locked: Any = "skip"
    unique_on_enqueue: bool = False
    lock_enqueue_ttl: float | None = None
    on_duplicate: str = "return"
    lock_on_retry: str = "keep"
    lock_manager: Any = None
    lock_coalesce: bool = False
    lock_debounce: float | None = None
    lock_rate: Any = None
    lock_cooldown: float | None = None
    on_limited: Any = None

    _redislock_config: GuardConfig | None = None

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Celery's hook: record *app*'s revokes for the enqueue-time dedupe (``revoke.py``)."""
        watch_revokes(app, [cls.lock_manager] if cls.unique_on_enqueue else [])

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        run = cls.__dict__.get("run")
        if run is not None:
            # Guard ``run`` itself rather than override ``__call__``: Celery's tracer
            # calls ``run`` directly unless ``__call__`` is custom, which saves a
            # request push per task.
            cls._redislock_config = cls._build_lock_config(run)
            cls.run = _guarded_run(run)

    @classmethod
    def _build_lock_config(cls, run: Any) -> GuardConfig:
        if cls.on_duplicate not in ("return", "raise"):
            raise ValueError(f"on_duplicate must be 'return' or 'raise', not {cls.on_duplicate!r}")
        enqueue_ttl = cls.lock_enqueue_ttl
        if enqueue_ttl is not None and (
            isinstance(enqueue_ttl, bool)
            or not isinstance(enqueue_ttl, (int, float))
            or not enqueue_ttl > 0
        ):
            raise ValueError(f"lock_enqueue_ttl must be a positive number, not {enqueue_ttl!r}")
        if cls.lock_on_retry not in ("keep", "release"):
            raise ValueError(
                f"lock_on_retry must be 'keep' or 'release', not {cls.lock_on_retry!r}"
            )
        if cls.lock_limit is not None:
            validate_limit(cls.lock_limit, "lock_limit")
            if cls.unique_on_enqueue:
                raise ValueError(
                    f"{cls.__qualname__}: unique_on_enqueue (one pending task per key) and "
                    "lock_limit (several running at once) do not combine; drop one"
                )
        if not (cls.on_locked in TASK_MODES or callable(cls.on_locked)):
            raise ValueError(f"on_locked must be one of {TASK_MODES} or a callable")
        if not (
            cls.on_limited is None
            or cls.on_limited in TASK_LIMITED_MODES
            or callable(cls.on_limited)
        ):
            raise ValueError(f"on_limited must be one of {TASK_LIMITED_MODES} or a callable")
        shaping = Shaping.build(
            cls.lock_rate,
            cls.lock_cooldown,
            cls.on_limited,
            limit=cls.lock_limit,
            where=cls.__qualname__,
            names=("lock_rate", "lock_cooldown", "on_limited", "lock_limit"),
        )
        coalesce = check_coalesce(
            cls.lock_coalesce,
            limit=cls.lock_limit,
            shaping=shaping,
            on_locked=None if cls.on_locked == "skip" else cls.on_locked,  # the default
            timeout=cls.lock_timeout,
            where=cls.__qualname__,
            names=("lock_coalesce", "lock_limit", "lock_timeout"),
        )
        quiet = check_debounce(
            cls.lock_debounce,
            coalesce=coalesce,
            limit=cls.lock_limit,
            shaping=shaping,
            on_locked=None if cls.on_locked == "skip" else cls.on_locked,
            timeout=cls.lock_timeout,
            where=cls.__qualname__,
            names=("lock_debounce", "lock_coalesce", "lock_limit", "lock_timeout"),
        )
        if quiet and cls.unique_on_enqueue:
            raise ValueError(
                f"{cls.__qualname__}: lock_debounce postpones every call; unique_on_enqueue "
                "refuses the later calls before they are sent; drop one"
            )
        if coalesce and cls.unique_on_enqueue:
            raise ValueError(
                f"{cls.__qualname__}: lock_coalesce makes a call that finds the key held the "
                "pending run; unique_on_enqueue refuses it before it is sent; drop one"
            )
        bound = not isinstance(run, staticmethod)
        func = run.__func__ if isinstance(run, staticmethod) else run
        name = cls.__dict__.get("name") or f"{cls.__module__}.{cls.__qualname__}"
        return GuardConfig(
            spec=KeySpec(cls.lock_key, func, base=name, skip_self=bound),
            ttl=cls.lock_ttl,
            timeout=cls.lock_timeout,
            on_locked=cls.on_locked,
            owner=None,
            lock_on_retry=cls.lock_on_retry,
            manager=cls.lock_manager,
            limit=cls.lock_limit,
            shaping=shaping,
            coalesce=coalesce,
            debounce=quiet,
        )

    def _lock_config(self) -> GuardConfig:
        """This class's own lock options (a subclass may change them without a new ``run``)."""
        cls = type(self)
        config: GuardConfig | None = cls.__dict__.get("_redislock_config")
        if config is None:
            run = cls.run
            config = cls._build_lock_config(getattr(run, "_redislock_body", run))
            cls._redislock_config = config
        return config

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        *rest: Any,
        **options: Any,
    ) -> Any:
        """Send the task; with ``unique_on_enqueue``, only if no identical task is pending.

        Returns the new task's AsyncResult, or the AsyncResult of the identical
        task already queued or running. A canvas member (group, chord, chain,
        callbacks) is always published, taking the lock when it is free; a
        duplicate is left to the worker's run-time check.
        """
        if not self.unique_on_enqueue or "retries" in options or rest:
            # A retry re-sends the same task id, whose lock is kept or was released.
            return super().apply_async(args, kwargs, task_id, *rest, **options)
        config = self._lock_config()
        call_args, call_kwargs = tuple(args or ()), dict(kwargs or {})
        name, inputs = config.spec.render_with_inputs(call_args, call_kwargs)
        task_id = task_id or uuid()
        lease = self.lock_enqueue_ttl or config.ttl
        if lease is None:
            lease = setting("REDISLOCK_DEFAULT_TTL")
        # The lock must outlive the wait for a countdown/ETA, then the worker renews it.
        lease += _delay_seconds(options.get("countdown"), options.get("eta"))
        lock = config.lock_manager().lock(
            name,
            ttl=lease,
            owner=task_id,
            auto_renew=False,
            meta=_task_meta(self, task_id, config.spec, inputs),
        )
        lock.metrics_group = config.metrics_group
        for _ in range(3):  # the holder may release between our attempt and our look
            if lock.acquire(blocking=False):
                break
            if _in_canvas(options):
                # The canvas waits for this task id: publish it; the run-time check skips it.
                return super().apply_async(args, kwargs, task_id, **options)
            duplicate = self._duplicate(config, name)
            if duplicate is _Unlocked:
                return super().apply_async(args, kwargs, task_id, **options)
            if duplicate is not None:
                return duplicate
        else:
            raise not_acquired(name, config.lock_manager().get(name))
        try:
            return super().apply_async(args, kwargs, task_id, **options)
        except BaseException:
            release_task_hold(lock, every_hold=False)  # never sent: leave no lock behind
            raise

    def _duplicate(self, config: GuardConfig, name: str) -> Any:
        info = config.lock_manager().get(name)
        if info is None or free_revoked(config.lock_manager(), name, info):
            return None  # free, or freed from a task revoked before it started: try again
        holder = info.task_id
        running_id = getattr(getattr(get_current_task(), "request", None), "id", None)
        if holder is not None and holder == running_id:
            # The running task re-schedules itself: its new copy is guarded at run time.
            return _Unlocked
        logger.warning(
            "redislock: task %s not queued: lock %r held by task %s", self.name, name, holder
        )
        if self.on_duplicate == "raise" or holder is None:
            raise DuplicateTaskError(
                f"task {self.name} with lock {name!r} is already queued or running "
                f"(held by {holder or info.owner})",
                name=name,
                task_id=holder,
            )
        return self.AsyncResult(holder)


#: apply_async options by which Celery's canvas machinery sends a task as part of a
#: canvas: a group member or chord header (group_id, group_index, chord), a chain
#: step (chain, even empty for the last one), one with callbacks (link,
#: link_error), a callback or chain step the worker sends (parent_id, root_id), a
#: Task.replace() (replaced_task_nesting).
_CANVAS_OPTIONS = (
    "group_id",
    "group_index",
    "chord",
    "link",
    "link_error",
    "parent_id",
    "root_id",
    "replaced_task_nesting",
)


def _in_canvas(options: dict[str, Any]) -> bool:
    """Whether ``apply_async(**options)`` sends a task as part of a canvas.

    Something then waits for this very task id (a group, a chord's counter, the
    chain's next steps, callbacks): it must be published, never deduped into
    another task's id. Only the options count, not the current task's request:
    a plain call made inside a canvas member's body is no part of its canvas.
    """
    return "chain" in options or any(
        options.get(key) not in (None, [], ()) for key in _CANVAS_OPTIONS
    )


def _guarded_run(body: Any) -> Callable[..., Any]:
    """The ``run`` of a SingleInstanceTask class whose own body is *body*.

    *body* is a ``staticmethod`` (``@app.task(base=...)`` without ``bind``) or a
    function taking the task (``bind=True``, or ``run`` defined in a class body).
    The worker, ``apply()`` and a direct call all come through here.
    """
    func = body.__func__ if isinstance(body, staticmethod) else body
    bound = not isinstance(body, staticmethod)

    @functools.wraps(func)
    def run(self: SingleInstanceTask, *args: Any, **kwargs: Any) -> Any:
        config = self._lock_config()
        if bound:
            return run_guarded(
                self, config, config.spec, args, kwargs, lambda: func(self, *args, **kwargs)
            )
        return run_guarded(self, config, config.spec, args, kwargs, lambda: func(*args, **kwargs))

    run._redislock_body = body  # type: ignore[attr-defined]
    return run


_Unlocked: Any = object()  # _duplicate's answer: publish, without the enqueue-time lock


def _config_of(task: Any) -> tuple[GuardConfig, KeySpec] | None:
    if isinstance(task, SingleInstanceTask):
        own = task._lock_config()
        return own, own.spec
    run = type(task).__dict__.get("run")
    func = run.__func__ if isinstance(run, staticmethod) else run
    config: GuardConfig | None = getattr(func, "_redislock_config", None)
    if config is None:
        return None
    if isinstance(run, staticmethod):
        return config, config.spec
    return config, config.spec.without_self()


# @single_instance reaches Celery only through these (see django_redislock.guards.guard).
register_task_hooks(
    TaskHooks(
        running_task=_running_task,
        run_task=run_decorated_task,
        check_decoratable=_refuse_task,
        lock_options_of=_config_of,
    )
)

# A pool process killed under its task (SIGKILL, OOM): the main process frees its lock.
from .lost import connect as _connect_lost  # noqa: E402

_connect_lost(_config_of)

# A revoked task's lock: no dedupe target once revoke() returns; freed in the worker.
_connect_revoke()
