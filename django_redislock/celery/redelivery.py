"""What an execution does when its lock is held by another execution of the same task id.

Brokers hand a message out again while, or after, an execution of it ran: the
Redis transport's visibility timeout redelivers an ``acks_late`` message that
runs longer than it; ``task_reject_on_worker_lost`` requeues the message of a
pool process that died; a worker's cold shutdown (Celery 5.5+) restores its
unacknowledged messages; a whole worker killed leaves its ``acks_late``
messages to be redelivered. Each such *copy* carries the task id of the
execution it repeats, which may be running, dead, or finished. A copy must
never run beside a running execution, never be dropped when that execution is
dead (its work would be lost), never run again once the execution completed,
and never store a result under the task id of the execution it repeats.

So a copy that finds its lock held by another execution of its task id:

* takes the hold over and runs at once when that execution is known to be dead:
  it ran on this host and its process is gone (host names are assumed unique
  among the processes sharing the Redis, as they are on separate machines,
  containers and pods). The worker's main process frees the hold of a pool
  process it lost before Celery requeues or fails the message
  (:mod:`django_redislock.celery.lost`), so most copies find the lock free;
* otherwise (the execution runs, or died on another host unseen) is *deferred*:
  the same message (task id, arguments, options, retry count) is sent again
  to come back when the holder's lease runs out, and the copy ends with
  :class:`~celery.exceptions.Ignore`: no result is stored and the message it
  came in is acknowledged. When it comes back, the execution has completed
  (the copy is dropped), died (its lease ran out: the copy runs) or still runs
  (deferred again, once per lease).

An ``acks_late`` execution that ends, returning or raising (not a retry or a
requeue), writes a **completion record** under its lock's name and task id
(:data:`COMPLETION_TTL` seconds) as it releases its lock; every ``acks_late``
execution looks for the record as it takes its lock, so a copy that takes
the lock after the execution released it sees that it completed, and is
dropped (Ignore) instead of running the work twice. On one Redis or a Cluster
the record is kept under the lock's hash tag and read and written by the lock's
own acquire and release scripts (:func:`record_with_lock`), atomically with the
grant and the release, at no round trip of its own; a coalescing run that hands
its lock on, an acquire that waited (its grant is a hand-off, made by another
script) and Redlock use :func:`record_completion` and :func:`completed`. Tasks
without ``acks_late`` are acknowledged when they start and are not redelivered
after that: they pay for none of this.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, NoReturn

from celery.exceptions import Ignore

from ..engine.identity import HOSTNAME
from ..engine.info import HolderInfo, LockInfo
from ..exceptions import LockBackendError

if TYPE_CHECKING:
    from ..primitives.lock import Lock
    from ..primitives.manager import LockManager

logger = logging.getLogger("django_redislock.celery")

#: Seconds a completion record is kept: longer than a copy can take to come back
#: (the Redis transport's default visibility timeout is one hour).
COMPLETION_TTL = 3 * 3600

#: How many times a copy tries to take over a dead execution's hold before it
#: defers (another copy may win each race).
TAKEOVER_TRIES = 3


def execution_of(info: LockInfo | None, task_id: str) -> HolderInfo | None:
    """The holder of *info* that is an execution of *task_id* (owner ``<task id>:...``)."""
    if info is None:
        return None
    prefix = f"{task_id}:"
    for holder in info.holders:
        if holder.owner is not None and holder.owner.startswith(prefix):
            return holder
    return None


def dead_here(holder: HolderInfo) -> bool:
    """Whether *holder* ran on this host in a process that no longer exists."""
    pid = holder.pid
    return holder.host == HOSTNAME and isinstance(pid, int) and pid > 0 and not pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Whether a process *pid* exists on this host (a reaped one does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def take_over(manager: LockManager, name: str, holder: HolderInfo) -> bool:
    """Free *holder*'s hold of *name*, checked against its owner and fencing token."""
    released = manager.force_release(name, owner=holder.owner, fencing_token=holder.fencing_token)
    if released:
        logger.warning(
            "redislock: lock %r: execution %s of task %s died on this host (pid %s); "
            "its redelivered copy takes the lock over",
            name,
            holder.owner,
            holder.task_id,
            holder.pid,
        )
    return released


def _completion_key(manager: LockManager, name: str, task_id: str) -> str:
    return manager.backend().keyspace.keys(name).completion(task_id)


def record_with_lock(manager: LockManager, lock: Lock, task_id: str) -> bool:
    """Let *lock*'s own calls read and write *task_id*'s completion record (its acquire
    refuses a completed run, its completing release writes the record): True where the
    record is kept with the lock (one Redis, a Cluster); False on Redlock, where
    :func:`completed` and :func:`record_completion` make round trips of their own."""
    if manager.backend().features.quorum:
        return False
    lock._with_completion(task_id, COMPLETION_TTL)
    return True


def record_completion(manager: LockManager, name: str, task_id: str) -> None:
    """Write *task_id*'s completion record (logged, never raised, when Redis fails)."""
    try:
        manager.client.set(_completion_key(manager, name, task_id), b"1", ex=COMPLETION_TTL)
    except Exception:
        logger.error(
            "redislock: could not record that task %s completed; a redelivered copy "
            "of its message may run it again",
            task_id,
            exc_info=True,
        )


def completed(manager: LockManager, name: str, task_id: str) -> bool:
    """Whether an execution of *task_id* completed (its record is still kept)."""
    try:
        return bool(manager.client.exists(_completion_key(manager, name, task_id)))
    except Exception as exc:
        raise LockBackendError(
            f"could not read the completion record of task {task_id}: {exc}"
        ) from exc


def drop(task: Any, name: str) -> NoReturn:
    """End a copy of an execution that completed: acknowledged, nothing stored."""
    logger.info(
        "redislock: task %s[%s] already completed; its redelivered copy is dropped (lock %r)",
        task.name,
        task.request.id,
        name,
    )
    raise Ignore()


def defer(task: Any, name: str, holder: HolderInfo, countdown: float) -> NoReturn:
    """Send *task*'s message again to come back in *countdown* seconds, and end this copy.

    The message keeps its task id, arguments, options and retry count (a deferral
    is no retry); the copy stores no result, so the running execution's stands.
    """
    request = task.request
    signature = task.signature_from_request(request, countdown=countdown)
    signature.apply_async()
    logger.info(
        "redislock: task %s[%s] is a redelivered copy of execution %s, which holds lock %r "
        "(host %s, pid %s); the copy comes back in %.0f s",
        task.name,
        request.id,
        holder.owner,
        name,
        holder.host,
        holder.pid,
        countdown,
    )
    raise Ignore()
