"""Free the lock of a revoked task (worker main process).

Two moments, both in the worker's main process:

* **when the revoke arrives** (``app.control.revoke(task_id)`` or
  ``AsyncResult.revoke()``): a task sent with a countdown or an ETA waits in
  the worker that received it, holding its enqueue-time lock
  (``unique_on_enqueue``) until its ETA, when Celery discards it. Left alone,
  every new call would be deduplicated onto a task that will never run, for
  as long as the countdown (hours, for some). So the worker's ``revoke``
  control command is wrapped: after Celery's own handling, the enqueue-time
  holds (owner: the task id itself) of the revoked tasks this worker has
  received are released. A running execution's hold is left to it (a revoke
  without ``terminate`` does not stop a running task);
* **when Celery discards the task** (``task_revoked``: revoked, expired, or
  terminated): every hold of the task id is released, the enqueue-time one and
  a terminated execution's.

Each release is checked against the holder's owner and fencing token as they
were looked at. A revoke sent while no worker has received the task frees its
lock when a worker receives and discards it; with no worker running, the
lease (enqueue TTL plus countdown) runs out.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any

from celery.signals import task_revoked, worker_init
from celery.worker.control import Panel
from kombu.utils.functional import maybe_list

from ..engine.info import HolderInfo
from .lost import release_task_holders, tracked_requests

logger = logging.getLogger("django_redislock.celery")


def connect() -> None:
    """Connect the handlers (idempotent)."""
    task_revoked.connect(_on_revoked, weak=False, dispatch_uid="django_redislock.release_on_revoke")
    worker_init.connect(_hook_revoke, weak=False, dispatch_uid="django_redislock.revoke.hook")


def _hook_revoke(sender: Any = None, **kwargs: Any) -> None:
    """``worker_init``: wrap the ``revoke`` control command (once per process)."""
    original = Panel.data.get("revoke")
    if original is None or getattr(original, "redislock_wrapped", False):
        return

    @functools.wraps(original)
    def revoke(state: Any, task_id: Any, *args: Any, **options: Any) -> Any:
        reply = original(state, task_id, *args, **options)
        release_waiting(set(maybe_list(task_id) or []))  # type: ignore[no-untyped-call]
        return reply

    revoke.redislock_wrapped = True  # type: ignore[attr-defined]
    # The worker's mailbox looks its handlers up in this very dict at each command.
    Panel.data["revoke"] = revoke


def release_waiting(task_ids: Iterable[str]) -> None:
    """Release the enqueue-time holds of the revoked *task_ids* this worker has received."""
    for task_id in task_ids:
        for request in tracked_requests(task_id):
            try:
                _release(request.task, request, _owner_is(task_id))
            except Exception:  # a control command must not break the worker
                logger.exception(
                    "redislock: could not release the lock of revoked task %s", task_id
                )


def _owner_is(owner: str) -> Callable[[HolderInfo], bool]:
    def match(holder: HolderInfo) -> bool:
        return holder.owner == owner

    return match


def _on_revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    """``task_revoked``: free every hold of the discarded task's id."""
    task_id = getattr(request, "id", None)
    if sender is None or not isinstance(task_id, str):
        return
    try:
        _release(sender, request, lambda holder: holder.task_id == task_id)
    except Exception:  # a signal handler must not break the worker
        logger.exception("redislock: could not release the lock of revoked task %s", task_id)


def _release(task: Any, request: Any, match: Callable[[HolderInfo], bool]) -> None:
    args = getattr(request, "args", None) or ()
    kwargs = getattr(request, "kwargs", None) or {}
    name, released = release_task_holders(task, args, kwargs, match)
    if released:
        logger.info("redislock: released lock %r of revoked task %s", name, request.id)
