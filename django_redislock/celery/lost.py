"""Free the lock of a task whose prefork pool process died under it (SIGKILL, OOM, segfault).

A pool child killed while it runs a guarded task cannot release its lock, and
its watchdog stops: left alone, the lock stays held for the rest of its lease.
The worker's main process learns of the loss at once: billiard watches each
child's sentinel, reaps the dead child and fails its job with
:class:`~billiard.exceptions.WorkerLostError`, and Celery's
``Request.on_failure`` (main process) then fails the task, retries it
(``retry_on_worker_lost``, Celery 5.7+) or, with ``acks_late`` and
``task_reject_on_worker_lost``, requeues its message at once. Only the first
two send a signal, so the release hooks ``on_failure`` itself: when the worker
starts (``worker_init``), each guarded task's request class gets
:class:`LostAwareRequest` mixed in (Celery's documented ``Task.Request`` hook),
which frees the lock *before* Celery requeues the message, so the requeued copy
finds the lock free wherever it is delivered.

Celery notices the exit through the child's sentinel (a pipe), which the kernel
closes a moment before the child can be reaped: when Celery looks in between,
it finds no exit code and looks again only at its next pool maintenance, up to
5 s later. So the main process also runs that maintenance every
:data:`POOL_CHECK_INTERVAL` seconds (prefork pool only): a few ``waitpid``
calls, no more.

The main process also keeps a weak reference to each guarded task's
``Request`` from ``task_received`` on (the request knows its ``worker_pid``
once a child accepts it; the reference goes with the request): a worker that
shuts down (``worker_shutdown``, after its pool has stopped: a cold shutdown
kills the pool processes under their tasks) frees the locks of the requests
whose pool process is gone, and a revoke of a task that waits for its
countdown frees its enqueue-time hold (:mod:`django_redislock.celery`). A lock
is released only if a holder of it is that execution: the task id, this host,
and the dead child's pid in its metadata, with an owner- and
fencing-token-checked ``force_release``, so a lock that changed hands meanwhile
(another execution of the same task id, a retry, anyone else) is left alone.
Whatever this cannot see (the whole worker killed) still frees when the lease
runs out, or when a redelivered copy on this host finds the holder's process
gone (:mod:`django_redislock.celery.redelivery`).

The hard time limit is not handled here: Celery reports it (``task_failure``
with ``TimeLimitExceeded``) before the pool terminates the child, which may
still be running then. The pool's SIGTERM unwinds the task (billiard raises
``SystemExit`` in it), and its own release runs; a child that does not exit
within 0.1 s is SIGKILLed and its lock frees by lease expiry.
"""

from __future__ import annotations

import functools
import logging
import os
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from billiard.exceptions import WorkerLostError
from celery.signals import task_received, worker_init, worker_ready, worker_shutdown
from kombu.utils.imports import symbol_by_name

from ..engine.identity import HOSTNAME
from ..engine.info import HolderInfo
from ..guards.guard import GuardConfig, release_holders
from ..guards.keys_template import KeySpec
from .redelivery import pid_alive

logger = logging.getLogger("django_redislock.celery")

#: Seconds between two looks of the worker's main process for exited pool processes.
POOL_CHECK_INTERVAL = 0.25

ConfigOf = Callable[[Any], tuple[GuardConfig, KeySpec] | None]

#: The lock configuration of a task (``django_redislock.celery._config_of``).
_config_of: ConfigOf | None = None

#: Per task name: whether the task is guarded (so only those requests are tracked).
_guarded: dict[str, bool] = {}

#: Per task id: weak references to this process's requests of it (usually one; a
#: redelivered copy of a running message is a second).
_received: dict[str, list[weakref.ref[Any]]] = {}

#: The process that tracks them (a worker's main process; a pool child forked from
#: it has a copy of ``_received``, which it must not act on).
_tracker: int | None = None


def connect(config_of: ConfigOf) -> None:
    """Connect the handlers (idempotent); *config_of* gives a task's lock configuration."""
    global _config_of
    _config_of = config_of
    task_received.connect(_track, weak=False, dispatch_uid="django_redislock.lost.track")
    worker_init.connect(_hook_requests, weak=False, dispatch_uid="django_redislock.lost.hook")
    worker_ready.connect(_watch_pool, weak=False, dispatch_uid="django_redislock.lost.watch")
    worker_shutdown.connect(_on_shutdown, weak=False, dispatch_uid="django_redislock.lost.shutdown")


def lock_config_of(task: Any) -> tuple[GuardConfig, KeySpec] | None:
    """*task*'s lock configuration and key; None when it is not guarded."""
    return None if _config_of is None else _config_of(task)


class LostAwareRequest:
    """Mixed into a guarded task's request class (worker main process): a request
    whose pool process was lost frees its lock before Celery fails, retries or
    requeues it."""

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        """Free the lock of a lost execution, then let Celery handle the failure."""
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # an ExceptionWithTraceback wraps it
        if isinstance(exc, WorkerLostError):
            release_lost_request(self)
        return super().on_failure(  # type: ignore[misc]
            exc_info, send_failed_event=send_failed_event, return_ok=return_ok
        )


def _hook_requests(sender: Any = None, **kwargs: Any) -> None:
    """``worker_init``: mix :class:`LostAwareRequest` into each guarded task's request class."""
    app = getattr(sender, "app", None)
    if app is None:
        return
    for task in list(app.tasks.values()):
        try:
            if not _is_guarded(task):
                continue
            cls = type(task)
            base = symbol_by_name(cls.Request)  # type: ignore[no-untyped-call]
            if not issubclass(base, LostAwareRequest):
                cls.Request = type(base.__name__, (LostAwareRequest, base), {})
        except Exception:  # a signal handler must not break the worker
            logger.exception("redislock: could not hook the requests of task %s", task)


def _on_shutdown(sender: Any = None, **kwargs: Any) -> None:
    """``worker_shutdown`` (its pool has stopped): free the locks of the tracked
    requests whose pool process is gone (a cold shutdown kills them under their
    tasks, and restores their messages for another worker)."""
    if _tracker != os.getpid():
        return
    for refs in list(_received.values()):
        for request in [r() for r in list(refs)]:
            if request is not None:
                release_lost_request(request)


def _watch_pool(sender: Any = None, **kwargs: Any) -> None:
    """``worker_ready`` (once per worker): look for exited pool processes every
    :data:`POOL_CHECK_INTERVAL` seconds, beside Celery's own look every 5 s."""
    from celery.concurrency.prefork import TaskPool as PreforkPool  # (only a worker needs it)

    hub = getattr(sender, "hub", None)
    pool = getattr(sender, "pool", None)
    if hub is None or not isinstance(pool, PreforkPool):
        return
    # As Celery's own timer does (the hub logs or raises what it raises).
    hub.call_repeatedly(POOL_CHECK_INTERVAL, pool.maintain_pool)


def _is_guarded(task: Any) -> bool:
    name = getattr(task, "name", None)
    if not isinstance(name, str) or _config_of is None:
        return False
    guarded = _guarded.get(name)
    if guarded is None:
        guarded = _guarded[name] = _config_of(task) is not None
    return guarded


def _track(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    """``task_received`` (worker main process): remember a guarded task's request."""
    global _tracker
    try:
        task_id = getattr(request, "id", None)
        if not isinstance(task_id, str) or not _is_guarded(getattr(request, "task", None)):
            return
        _tracker = os.getpid()
        ref = weakref.ref(request, functools.partial(_untrack, task_id))
        refs = _received.get(task_id)
        if refs is None:
            _received[task_id] = [ref]
        else:
            refs.append(ref)
    except Exception:  # a signal handler must not break the worker
        logger.exception("redislock: could not track the request of task %s", request)


def _untrack(task_id: str, ref: weakref.ref[Any]) -> None:
    refs = _received.get(task_id)
    if refs is None:
        return
    try:
        refs.remove(ref)
    except ValueError:
        pass
    if not refs and _received.get(task_id) is refs:
        del _received[task_id]


def release_lost_request(request: Any) -> None:
    """Release the lock of *request*'s execution when its pool process is gone."""
    if _tracker != os.getpid():
        return
    task_id = getattr(request, "id", None)
    try:
        pid = getattr(request, "worker_pid", None)
        if isinstance(task_id, str) and isinstance(pid, int) and not pid_alive(pid):
            release_dead_holder(
                request.task,
                task_id,
                tuple(getattr(request, "args", None) or ()),
                dict(getattr(request, "kwargs", None) or {}),
                {pid},
            )
    except Exception:  # a signal handler must not break the worker
        logger.exception("redislock: could not release the lock of lost task %s", task_id)


def tracked_requests(task_id: str) -> list[Any]:
    """This worker's live requests of *task_id* (guarded tasks only, main process)."""
    if _tracker != os.getpid():
        return []
    return _requests(task_id)


def _requests(task_id: str) -> list[Any]:
    refs = _received.get(task_id) or []
    return [request for request in (ref() for ref in list(refs)) if request is not None]


def release_task_holders(
    task: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    match: Callable[[HolderInfo], bool],
) -> tuple[str, list[HolderInfo]]:
    """Force-release the holders of *task*'s lock for these arguments that *match*
    (owner- and fencing-token-checked); returns the lock's name and those released
    (none when *task* is not guarded). The worker's handlers of lost pool processes
    and of revoked tasks both free holds through here."""
    spec_config = lock_config_of(task)
    if spec_config is None:
        return "", []
    config, spec = spec_config
    name = spec.render(tuple(args), dict(kwargs))
    return name, release_holders(config.lock_manager(), name, match)


def release_dead_holder(
    task: Any,
    task_id: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dead_pids: Iterable[int],
) -> list[str]:
    """Force-release the holds of *task*'s lock (for these arguments) that an execution
    of *task_id* took in one of *dead_pids* on this host; returns the owners released.

    Each release is checked against the holder's owner and fencing token as they
    were looked at, so a hold that changed hands since is left alone.
    """
    pids = set(dead_pids)
    name, holders = release_task_holders(
        task, args, kwargs, lambda h: h.task_id == task_id and h.host == HOSTNAME and h.pid in pids
    )
    released = []
    for holder in holders:
        logger.info(
            "redislock: released lock %r of task %s[%s]: its pool process %s was lost "
            "(owner %s, fencing token %s)",
            name,
            getattr(task, "name", "?"),
            task_id,
            holder.pid,
            holder.owner,
            holder.fencing_token,
        )
        released.append(holder.owner or "")
    if not released:
        logger.info(
            "redislock: lock %r of lost task %s left alone: no holder is its dead process %s",
            name,
            task_id,
            ", ".join(str(pid) for pid in sorted(pids)),
        )
    return released
