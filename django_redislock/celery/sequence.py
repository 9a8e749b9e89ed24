"""The order of a coalescing or debounced task's calls: one number per call, per key.

"Latest wins" needs to know which call is the latest, and the order in which
workers *start* messages is not it: a worker reserves messages ahead of its runs
(the prefetch), a broker hands a message out again (``acks_late``, a visibility
timeout), a countdown brings a message back later. So every call of a task with
``coalesce`` or ``debounce`` is numbered when it is **sent**: Celery's
``before_task_publish`` signal, in the sender's process, takes the next number of
the call's key (``HINCRBY`` on ``<prefix>:order:{<name>}``, in the lock's slot) and
writes it to the message's headers (:data:`HEADER`). Every copy of the message
carries the same number; the re-sends of this package (a sweeper's, the debounce
timer's, the hand-on of a pending call) carry theirs on.

The key's scripts then refuse a call older than the newest one that has run or
been handed on (``ran`` in the same hash; see
:mod:`django_redislock.engine.lua.shaping`): a copy of an old call never runs,
or becomes pending, after a newer one.

A message sent where this package is not imported (another service sending the
task by name) has no number: the worker numbers it when it starts it (one round
trip more), so for such messages the order is the order in which workers start
them, and a broker's second copy of one counts as a new call.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from celery import Task, current_app
from celery.signals import before_task_publish

from ..engine.calls import Call
from ..engine.driver import call_sync
from ..engine.lua.shaping import NUMBER
from ..guards.guard import GuardConfig, task_hooks
from ..guards.keys_template import KeySpec
from ..guards.shaping import shaping_key

logger = logging.getLogger("django_redislock.celery")

__all__ = ["HEADER", "KEEP_MS", "headers_of", "next_number", "order_key", "seq_of"]

#: The message header that carries a call's number.
HEADER = "redislock_seq"
#: How long a key's numbers and its newest run are kept after the last call (ms): a day.
KEEP_MS = 86_400_000


def order_key(backend: Any, name: str) -> str:
    """The hash of lock *name*'s call numbers (``next``) and newest run (``ran``,
    ``ran_id``)."""
    return shaping_key(backend, name, "order")


def next_number(backend: Any, name: str) -> int:
    """The next number of a call of lock *name* (one round trip)."""
    call = Call(NUMBER, (order_key(backend, name),), (KEEP_MS,), "number a call", name)
    return int(call_sync(call, backend))


def seq_of(task: Task, backend: Any, name: str) -> int:
    """The number of the call *task* is executing: its message's, or, for a message
    sent without one (eagerly, or by a sender without this package), a new one,
    remembered on the request (so the re-sends carry it)."""
    request = task.request
    value = getattr(request, HEADER, None)
    if value is None:
        value = next_number(backend, name)
        request.update({HEADER: value})
    return int(value)


def headers_of(seq: int) -> dict[str, Any]:
    """The headers that carry call number *seq* in a message sent on a call's behalf."""
    return {HEADER: seq}


def _ordered(task: Any) -> tuple[GuardConfig, KeySpec] | None:
    """*task*'s lock options and key when it coalesces or debounces, else None."""
    for hooks in task_hooks():
        found = hooks.lock_options_of(task) if hooks.lock_options_of else None
        if found is not None:
            config, spec = found
            return (config, spec) if (config.coalesce or config.debounce) else None
    return None


def _call_of(body: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(body, Mapping):  # Celery's message protocol 1
        return tuple(body.get("args") or ()), dict(body.get("kwargs") or {})
    return tuple(body[0] or ()), dict(body[1] or {})


def _number_message(sender: Any = None, body: Any = None, headers: Any = None, **_: Any) -> None:
    """``before_task_publish``: number a call of a coalescing or debounced task."""
    if not isinstance(headers, dict) or headers.get(HEADER) is not None:
        return  # a re-send on a call's behalf carries the call's number already
    task = current_app.tasks.get(sender) if isinstance(sender, str) else None
    if task is None:
        return
    try:
        found = _ordered(task)
        if found is None:
            return
        config, spec = found
        backend = config.lock_manager().backend()
        if backend.features.quorum:
            return  # refused by the worker (ShapingUnsupported)
        headers[HEADER] = next_number(backend, spec.render(*_call_of(body)))
    except Exception:
        logger.warning(
            "redislock: could not number a call of task %s before sending it; the worker "
            "numbers it when it starts it",
            sender,
            exc_info=True,
        )


before_task_publish.connect(_number_message, weak=False, dispatch_uid="django_redislock.sequence")
