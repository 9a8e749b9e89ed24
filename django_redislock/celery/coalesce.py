"""Coalescing Celery task runs: one running, at most one pending per key.

``@single_instance(key, coalesce=True)`` under ``@app.task`` (or
``SingleInstanceTask`` with ``lock_coalesce = True``): an execution that finds its
key's lock held is not dropped and does not queue up. It writes its arguments to
the key's **pending slot** (the latest call wins) and ends. When the running
execution ends (returns, fails or is stopped), it takes the pending call, hands
its lock over to a new task id and sends the pending call under that id: exactly
one more run, with the latest arguments, however many calls arrived meanwhile.
The key stays held across the hand-off, so calls arriving meanwhile pend for the
run after that one.

**Nothing is lost when the running execution dies.** The first call to pend is
also the slot's *sweeper*: its message is sent again (same task id) for when the
holder's lease runs out. If the pending call is still there when it comes back
and the lock is free, the sweeper hands it on; if someone handed it on already,
the sweeper is *retired* and its copy is dropped (``Ignore``): every copy, when a
broker hands its message out more than once.

**A call older than one that ran never runs.** Every call is numbered when it is
sent (:mod:`django_redislock.celery.sequence`); a call older than the newest call
that has run or been handed on (a message a worker reserved before a newer call
came, a broker's copy of a killed run once a newer call ran) is dropped, and a call
older than the pending one leaves the slot alone.

What a coalesced call's ``AsyncResult`` gets, at once: the marker
``{"redislock": "skipped", "reason": "coalesced", "lock": ..., "run": <task id>}``
(``is_skipped``), *run* the id of the run that serves it (the pending run, or the
newer run that made it stale): ``AsyncResult(marker["run"]).get()`` waits for that
run's result. The sweeper stores its marker before its message is sent again.

Every decision is one script on the key's hash tag (``PEND``, ``TAKE``,
``SWEEP`` in :mod:`django_redislock.engine.lua.shaping`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, cast

from celery import Task
from celery.exceptions import Ignore
from celery.utils import uuid
from kombu.utils import json as kombu_json

from ..conf import setting
from ..engine.calls import Call
from ..engine.driver import call_sync
from ..engine.lua.shaping import PEND, SWEEP, TAKE
from ..guards.guard import GuardConfig, lease_left, release_task_hold
from ..guards.shaping import ASK_AGAIN, ShapingUnsupported, attempt_carrying, shaping_key
from ..primitives import at_once
from ..primitives.lock import Lock
from .redelivery import COMPLETION_TTL
from .sequence import KEEP_MS, headers_of, order_key, seq_of
from .shaping import decoded, resend, shaped_marker, store_marker

if TYPE_CHECKING:
    from ..engine.backends.base import Backend

logger = logging.getLogger("django_redislock.celery")

__all__ = [
    "ACQUIRED",
    "RUN",
    "attempt_swept",
    "hand_on",
    "pend",
    "sweep",
    "sweeping_backend",
]

#: :func:`pend`'s answer when the lock was free after all and is now held.
ACQUIRED: Any = object()
#: :func:`sweep`'s answer when the execution runs its own call.
RUN: Any = object()

# Kombu's JSON: what Celery's serializer sends (dates, UUIDs, decimals) round-trips.
_dumps = cast(Callable[[Any], str], kombu_json.dumps)
_loads = cast(Callable[[Any], Any], kombu_json.loads)

#: How long a pending slot is kept (ms): a day.
_KEEP_MS = 86_400_000
#: How long a retired sweeper id is kept (ms): as long as a copy of its message can
#: come back (a broker's redelivery), as a completion record is.
_RETIRED_MS = COMPLETION_TTL * 1000


def _backend(config: GuardConfig, name: str) -> Any:
    backend = config.lock_manager().backend()
    if backend.features.quorum:
        raise ShapingUnsupported(
            f"coalesce (lock {name!r}) needs one Redis (or Cluster); not on Redlock"
        )
    return backend


def _coalesced(name: str, run: Any = None) -> dict[str, Any]:
    return shaped_marker("coalesced", name, run)


def pend(
    task: Task,
    config: GuardConfig,
    lock: Lock,
    name: str,
    call_args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """An execution of *task* found its key held: make its call the pending one.

    Returns :data:`ACQUIRED` when the lock turned out free and this execution now
    holds it, else the coalesced call's result (also for a call older than one that
    ran: it changes nothing); the sweeper stores that result and its message is sent
    again for when the holder's lease runs out (raises Ignore).
    """
    backend = _backend(config, name)
    keys = (
        backend.keyspace.keys(name).lock,
        *_slot_keys(backend, name),
        order_key(backend, name),
    )
    call = _dumps({"args": list(call_args), "kwargs": kwargs})
    seq = seq_of(task, backend, name)
    # A call that cannot be sent again (eager, or no task id) pends without a sweeper.
    resendable = task.request.id is not None and not task.request.is_eager
    me = task.request.id if resendable else ""
    for _ in range(3):
        reply = call_sync(
            Call(PEND, keys, (call, me, _KEEP_MS, seq, uuid()), "pend a call", name), backend
        )
        answer = int(reply[0])
        if answer == 0:  # released meanwhile: take it
            if lock.acquire(blocking=False):
                return ACQUIRED
            continue
        if answer == 3:
            _drop_retired(task, name)
        if answer == 4:
            _log_stale(task, name)
            return _coalesced(name, reply[1])
        if answer == 5:  # a copy of the newest run: back when its holder's lease ends
            resend(task, lease_left(config.lock_manager().get(name)) or 1)
        logger.info(
            "redislock: task %s[%s] coalesced: its call is the pending one of lock %r",
            task.name,
            task.request.id,
            name,
        )
        marker = _coalesced(name, reply[1])
        if answer == 1:
            store_marker(task, marker)
            resend(task, lease_left(config.lock_manager().get(name)) or 1)
        return marker
    return _coalesced(name)  # the lock changed hands three times: someone runs


def sweeping_backend(lock: Lock) -> Backend | None:
    """The backend that sends an attempt at *lock* and :func:`sweep`'s question in one
    round trip (one Redis or a Cluster), or None (a lock that waits for replicas)."""
    return at_once.batch_backend([lock], least=1)


def attempt_swept(lock: Lock, backend: Backend, task: Task) -> tuple[bool, Any]:
    """One attempt at *lock* with :func:`sweep`'s question after it, in one round trip:
    (held, the answer for :func:`sweep`: ASK_AGAIN when it could not be had). The
    answer is read after the grant, by the holder: nothing changes it while the lock
    is held (only a holder hands a pending call on); it changes the key only if the
    attempt's owner holds the lock. Raises as ``acquire()`` does."""
    seq = seq_of(task, backend, lock.name)
    held, reply = attempt_carrying(
        lock,
        backend,
        lambda made: [_sweep_call(backend, lock.name, task.request.id, seq, made[0].op.owner)],
    )
    if not held or isinstance(reply, Exception) or decoded(reply[0]) == "again":
        return held, ASK_AGAIN
    return held, reply


def sweep(task: Task, config: GuardConfig, lock: Lock, name: str, answer: Any = ASK_AGAIN) -> Any:
    """An execution of *task* just took its key's lock: :data:`RUN` its own call, or,
    when it is the pending call's sweeper or a newer call pends, hand that call on;
    when it is a retired sweeper or its call is older than one that ran, give the lock
    back and drop this copy (all three store the coalesced marker and raise Ignore).
    *answer*: the question's answer when the lock's attempt carried it
    (:func:`attempt_swept`)."""
    task_id = task.request.id
    if task_id is None:
        return RUN
    if answer is ASK_AGAIN:
        backend = _backend(config, name)
        seq = seq_of(task, backend, name)
        answer = call_sync(_sweep_call(backend, name, task_id, seq, lock.owner), backend)
    verdict = decoded(answer[0])
    if verdict in ("run", "again"):  # again: the hold is gone (force-released); run as ever
        return RUN
    marker = _coalesced(name, answer[1] if len(answer) > 1 else None)
    if verdict == "sweep" and hand_on(task, config, lock, name):
        store_marker(task, marker)
        raise Ignore()
    release_task_hold(lock)
    if verdict == "drop":
        _drop_retired(task, name)  # a retired sweeper: its marker was stored when it pended
    if verdict == "stale":
        _log_stale(task, name)
    store_marker(task, marker)  # (or the hand-on failed: logged, the call is lost)
    raise Ignore()


def _sweep_call(backend: Any, name: str, task_id: str, seq: int, owner: str) -> Call:
    """``SWEEP`` for the execution *task_id* (call number *seq*, lock owner *owner*) of
    lock *name*'s runs."""
    keys = (*_slot_keys(backend, name), order_key(backend, name), backend.keyspace.keys(name).lock)
    args = (task_id, seq, owner, _RETIRED_MS, KEEP_MS)
    return Call(SWEEP, keys, args, "look for a pending call", name)


def _log_stale(task: Task, name: str) -> None:
    logger.info(
        "redislock: task %s[%s] of lock %r is older than a call that ran or was handed "
        "on already; it is dropped",
        task.name,
        task.request.id,
        name,
    )


def _slot_keys(backend: Any, name: str) -> tuple[str, str]:
    """Lock *name*'s pending slot and retired sweepers (the keys of ``PEND``, ``TAKE``
    and ``SWEEP``)."""
    return (shaping_key(backend, name, "pending"), shaping_key(backend, name, "retired"))


def _drop_retired(task: Task, name: str) -> NoReturn:
    logger.info(
        "redislock: task %s[%s] was the sweeper of a pending call of lock %r that was "
        "handed on already; this copy is dropped",
        task.name,
        task.request.id,
        name,
    )
    raise Ignore()


def hand_on(task: Task, config: GuardConfig, lock: Lock, name: str) -> bool:
    """The execution holding *lock* ends: when a call is pending, hand the lock to a new
    task id and send the pending call under it (True); False when none is pending.
    Errors are logged, not raised: the execution's own outcome stands (the sweeper
    still covers a call that was not handed on)."""
    try:
        backend = _backend(config, name)
        keys = (*_slot_keys(backend, name), order_key(backend, name))
        take = Call(TAKE, keys, (_RETIRED_MS, KEEP_MS), "take the pending call", name)
        pending = call_sync(take, backend)
        if pending is None:
            return False
        call, new_id, seq = _loads(pending[0]), decoded(pending[1]) or uuid(), int(pending[2])
        lease = config.ttl or float(setting("REDISLOCK_DEFAULT_TTL"))
        lock._transfer(new_id, lease)  # the key stays held for the pending run
        task.apply_async(
            call["args"], call["kwargs"], task_id=new_id, retries=0, headers=headers_of(seq)
        )
    except Exception:
        logger.error(
            "redislock: task %s[%s] could not hand the pending call of lock %r on",
            task.name,
            task.request.id,
            name,
            exc_info=True,
        )
        return False
    logger.info(
        "redislock: task %s[%s] handed lock %r on to its pending call, task %s",
        task.name,
        task.request.id,
        name,
        new_id,
    )
    return True
