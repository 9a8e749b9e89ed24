"""A Celery execution refused by its key's rate limit or cooldown (see
:mod:`django_redislock.guards.shaping`, which decides).

The decision is made in the worker, for every execution, once the execution holds
its lock (so tasks sent by name, beat and ``send_task`` are shaped too); a new
execution's first attempt at its lock carries the admission in its round trip. What a
refused execution does is ``on_limited``:

* ``"defer"`` (default): the message is sent again with a ``countdown`` of the
  refusal's ``retry_after`` (same task id, arguments and options, the retry
  count unchanged: a deferral is no retry), and this copy ends with ``Ignore``
  (no result stored). **Nothing is lost**: every message that reaches a worker
  runs once a start is admitted. The new message is published *before* this
  execution ends (and its message is acknowledged); with ``acks_late`` a worker
  killed between the two leaves both, and the run-time guard and the rate still
  hold for them.
  Deferred calls queue up: a key that is called faster than its rate admits
  builds a backlog; use ``"skip"`` to drop them instead;
* ``"retry"``: ``self.retry(countdown=retry_after)`` (counts against
  ``max_retries``: after the last one the task fails with ``RunLimited``);
* ``"skip"``: the task succeeds without running its body, with the result
  ``{"redislock": "skipped", "reason": "rate limit" | "cooldown", ...}``
  (:func:`~django_redislock.celery.is_skipped` is true for it);
* ``"raise"``: the task fails with :class:`~django_redislock.RunLimited`;
* a callable ``(refusal, *args, **kwargs)``: its value is the task's result.

A refused execution gives its hold back at once, except with
``unique_on_enqueue`` when it comes back (``"defer"``, ``"retry"``): the hold is
then kept for it, under its task id, as for a retry, so the key stays "one
pending". Eagerly run tasks (``apply()``, ``task_always_eager``) cannot be sent
again: ``"defer"`` and ``"retry"`` raise ``RunLimited`` there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn

from celery import Task, states
from celery.exceptions import Ignore

from ..conf import setting
from ..guards.guard import release_task_hold
from ..guards.shaping import ASK_AGAIN, TASK_LIMITED_MODES, Refusal, admit
from ..primitives.lock import Lock
from .sequence import HEADER

logger = logging.getLogger("django_redislock.celery")

__all__ = ["ADMITTED", "decoded", "resend", "settle_start", "shaped_marker", "store_marker"]

#: :func:`settle_start`'s answer when the execution may run its body.
ADMITTED: Any = object()

_REASONS = {"rate": "rate limit", "cooldown": "cooldown"}


def settle_start(
    task: Task,
    lock: Lock,
    config: Any,
    call_args: tuple[Any, ...],
    kwargs: dict[str, Any],
    keep: Callable[[Lock, float, str | None], None],
    admission: Any = ASK_AGAIN,
) -> Any:
    """Admit the execution of *task* holding *lock*, or settle its refusal.

    Returns :data:`ADMITTED`, or the refused execution's result (``"skip"``, a
    callable's value); raises for ``"defer"`` (Ignore), ``"retry"`` (Retry) and
    ``"raise"`` (RunLimited). *keep* parks the hold for an execution that comes back
    (``unique_on_enqueue``); otherwise the hold is released. *admission*: what ADMIT
    answered in the acquire's round trip (see ``attempt_admitted``), else asked now.
    """
    try:
        refusal = admit(config, lock) if admission is ASK_AGAIN else admission
    except BaseException:
        release_task_hold(lock)
        raise
    if refusal is None:
        return ADMITTED
    shaping = config.shaping
    mode = shaping.on_limited if shaping.on_limited is not None else "defer"
    comes_back = mode in ("defer", "retry") and not task.request.is_eager
    if comes_back and getattr(task, "unique_on_enqueue", False):
        keep(lock, refusal.retry_after, task.request.id)
    else:
        release_task_hold(lock)
    logger.log(
        setting("REDISLOCK_TASK_SKIP_LOG_LEVEL"),
        "redislock: task %s[%s] not started: %s (on_limited=%s)",
        task.name,
        task.request.id,
        refusal.describe(shaping),
        getattr(mode, "__name__", mode),
    )
    return _refused(task, config, mode, refusal, call_args, kwargs, comes_back)


def _refused(
    task: Task,
    config: Any,
    mode: Any,
    refusal: Refusal,
    call_args: tuple[Any, ...],
    kwargs: dict[str, Any],
    comes_back: bool,
) -> Any:
    error = refusal.error(config.shaping)
    if mode == "skip":
        return {
            "redislock": "skipped",
            "reason": _REASONS[refusal.reason],
            "lock": refusal.name,
            "retry_after": refusal.retry_after,
        }
    if mode == "raise" or (mode in ("defer", "retry") and not comes_back):
        raise error
    if mode == "retry":
        raise task.retry(countdown=refusal.retry_after, exc=error)
    if mode == "defer":
        resend(task, refusal.retry_after)
    if callable(mode):
        return mode(refusal, *call_args, **kwargs)
    raise ValueError(
        f"on_limited for a Celery task must be one of {TASK_LIMITED_MODES} or a callable"
    )


def resend(task: Task, countdown: float) -> NoReturn:
    """Send *task*'s message again to come back in *countdown* seconds (same task id,
    arguments and options, the retry count unchanged: no retry), and end this copy
    (Ignore: no result stored)."""
    request = task.request
    headers = dict(request.headers or {})
    if getattr(request, HEADER, None) is not None:  # a call's number goes with it
        headers[HEADER] = getattr(request, HEADER)
    options: dict[str, Any] = {"headers": headers} if headers else {}
    task.signature_from_request(
        request, countdown=countdown, retries=request.retries, **options
    ).apply_async()
    raise Ignore()


def decoded(value: Any) -> str | None:
    """A script's text reply as str (None for nil or an empty string)."""
    if value is None or value in (b"", ""):
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def shaped_marker(reason: str, name: str, run: Any) -> dict[str, Any]:
    """The result of a call that another run serves (``"coalesced"``, ``"debounced"``):
    *run* is that run's task id (``AsyncResult(marker["run"]).get()`` waits for it)."""
    return {"redislock": "skipped", "reason": reason, "lock": name, "run": decoded(run)}


def store_marker(task: Task, marker: dict[str, Any]) -> None:
    """Store *marker* as the result of *task*'s execution, which ends with ``Ignore``
    (its message is sent again, or it handed a call on): its ``AsyncResult`` resolves
    at once, not when (or never, if) a copy of it ends."""
    request = task.request
    if request.id is None or request.is_eager or task.ignore_result:
        return
    if getattr(request, "ignore_result", False):
        return
    task.update_state(state=states.SUCCESS, meta=marker)
