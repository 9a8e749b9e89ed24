"""Debouncing Celery task runs: run once the key has been quiet for N seconds.

``@single_instance(key, debounce=N)`` under ``@app.task`` (or ``SingleInstanceTask``
with ``lock_debounce = N``): each call postpones the key's run to N seconds after
itself and replaces its arguments; the run happens once no call came for N seconds,
with the last call's arguments ("reindex after the edits stop").

How: every call writes its arguments and the new due time to the key's debounce
hash (one script, ``DEBOUNCE`` in :mod:`django_redislock.engine.lua.shaping`,
by Redis's clock). The first call of a quiet period is the **timer**: its message
is sent again (same task id, no retry counted) to come back at the due time; back
early (later calls moved the due time), it is sent again for the new due time.
Once the due time has passed, the timer sends the latest call under a new task id
and ends (``Ignore``); that execution runs under the key's lock like any other
(if the lock is held, it is sent again for when the holder's lease ends). Every call
is numbered when it is sent (:mod:`django_redislock.celery.sequence`): a call no newer
than the latest one changes nothing (it does not replace the arguments or postpone
the run), and a copy of a call no newer than the one that fired last (a broker's
second copy of the timer, back after a visibility timeout) is dropped: it never
runs after the newer call. Each call's ``AsyncResult`` resolves at once to
``{"redislock": "skipped", "reason": "debounced", "lock": ..., "run": <task id>}``,
*run* the task id of the run that serves it (the timer's too: it is stored before
its message is sent again). An eager call (``apply()``) runs at once: it cannot be
sent again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from celery import Task
from celery.exceptions import Ignore
from celery.utils import uuid
from kombu.utils import json as kombu_json

from ..engine.calls import Call
from ..engine.driver import call_sync
from ..engine.lua.shaping import DEBOUNCE
from ..guards.guard import GuardConfig
from ..guards.shaping import ShapingUnsupported, shaping_key
from .sequence import headers_of, seq_of
from .shaping import decoded, resend, shaped_marker, store_marker

logger = logging.getLogger("django_redislock.celery")

__all__ = ["RUN", "debounce"]

#: :func:`debounce`'s answer when this execution runs now.
RUN: Any = object()

_dumps = cast(Callable[[Any], str], kombu_json.dumps)
_loads = cast(Callable[[Any], Any], kombu_json.loads)

#: How long the debounce hash outlives its due time (ms): a day.
_KEEP_MS = 86_400_000


def debounce(
    task: Task,
    config: GuardConfig,
    name: str,
    call_args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Settle one call of a debounced task before it takes the lock: :data:`RUN` for
    the due call (and an eager one), the skip marker for a postponed call; the timer
    is sent again or sends the due call, and raises Ignore."""
    request = task.request
    if request.is_eager or request.id is None:
        return RUN
    backend = config.lock_manager().backend()
    if backend.features.quorum:
        raise ShapingUnsupported(f"debounce (lock {name!r}) needs one Redis; not on Redlock")
    quiet_ms = max(1, round(float(config.debounce or 0) * 1000))
    call = _dumps({"args": list(call_args), "kwargs": kwargs})
    seq = seq_of(task, backend, name)
    reply = call_sync(
        Call(
            DEBOUNCE,
            (shaping_key(backend, name, "debounce"),),
            (call, request.id, quiet_ms, uuid(), _KEEP_MS, seq),
            "debounce a call",
            name,
        ),
        backend,
    )
    answer = decoded(reply[0])
    if answer == "run":
        return RUN
    if answer == "wait":
        resend(task, int(reply[1]) / 1000)
    if answer == "timer":
        store_marker(task, _debounced(name, reply[2]))
        resend(task, int(reply[1]) / 1000)
    if answer == "fire":
        due = _loads(reply[1])
        task.apply_async(
            due["args"],
            due["kwargs"],
            task_id=decoded(reply[2]),
            retries=0,
            headers=headers_of(int(reply[3])),
        )
        raise Ignore()
    if answer == "stale":
        logger.info(
            "redislock: task %s[%s] of lock %r is no newer than the debounced call that "
            "ran already; it is dropped",
            task.name,
            request.id,
            name,
        )
    return _debounced(name, reply[1] if len(reply) > 1 else None)


def _debounced(name: str, run: Any) -> dict[str, Any]:
    return shaped_marker("debounced", name, run)
