"""Free the lock of a revoked task: in the caller's process, then in the worker's.

**When** ``revoke()`` **returns** in the caller's process, the revoked task is no
longer a dedupe target: the revoke reaches a worker only later (half a second
or more), and until then a new call would be answered with the revoked task's
handle and never run. So every revoke sent through an app's control
(``AsyncResult.revoke()``, ``GroupResult.revoke()``, ``app.control.revoke(id or
ids)``, ``app.control.terminate()``, ``app.control.broadcast("revoke", ...)``)
writes a record per task id, ``<prefix>:task-revoked:<task id>``, kept
:data:`REVOKE_RECORD_TTL` seconds (as long as Celery's workers remember a
revoke), once the broadcast is sent. An enqueue-time dedupe that finds the lock
held by a task id that has not started (its enqueue-time hold, or the hold kept
for its retry: owner == task id) looks the record up and, when it is there,
frees that hold (owner- and fencing-token-checked) and takes the lock for the
new call. A running execution (owner ``<task id>:<token>``) is left alone: a
revoke without ``terminate`` does not stop it, and a terminated one frees its
lock when the worker has stopped it.

The record is hooked in through Celery's documented ``control`` class of the
app (``Celery(control=...)``, kept in ``app.control_cls``): the app's control
class gets :class:`RecordsRevokes` mixed in by :func:`watch_revokes`, for every
app a :class:`~django_redislock.celery.SingleInstanceTask` is bound to
(``Task.on_bound``), for the current app when this package is imported (the
Django app's ``ready()``), and, as ``Celery``'s default control class from then
on (:class:`RevokeRecordingControl`), for the apps made later. It is written
through the lock managers of the ``unique_on_enqueue`` tasks bound in this
process (the default manager when there are none).

Then two moments, both in the worker's main process:

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
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.app import app_or_default
from celery.app.control import Control
from celery.signals import task_revoked, worker_init
from celery.worker.control import Panel
from celery.worker.state import REVOKE_EXPIRES
from django.core.exceptions import ImproperlyConfigured
from kombu.utils.functional import maybe_list
from kombu.utils.imports import symbol_by_name

from ..engine.info import HolderInfo, LockInfo
from ..exceptions import LockBackendError
from .lost import release_task_holders, tracked_requests

if TYPE_CHECKING:
    from ..primitives.manager import LockManager

logger = logging.getLogger("django_redislock.celery")

#: Seconds a revoke's record is kept: as long as Celery's workers remember a revoke
#: (``CELERY_WORKER_REVOKE_EXPIRES``, 3 hours by default); after that a worker would
#: run the task at its ETA anyway.
REVOKE_RECORD_TTL = max(1, int(REVOKE_EXPIRES))

#: The lock managers of the ``unique_on_enqueue`` tasks bound in this process (None:
#: the default manager), through which a revoke is recorded.
_dedupe_managers: list[LockManager | None] = []


def connect() -> None:
    """Connect the handlers (idempotent), and record the revokes of the current app and
    of the apps made from now on (the default control class of ``Celery``)."""
    task_revoked.connect(_on_revoked, weak=False, dispatch_uid="django_redislock.release_on_revoke")
    worker_init.connect(_hook_revoke, weak=False, dispatch_uid="django_redislock.revoke.hook")
    default = symbol_by_name(Celery.control_cls)  # type: ignore[no-untyped-call]
    Celery.control_cls = recording_control(default)
    watch_revokes(app_or_default())


class RecordsRevokes:
    """Mixed into an app's control class: a revoke it sends is recorded for the
    enqueue-time dedupe once the broadcast is sent (see the module's docstring)."""

    def broadcast(self, command: str, arguments: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Celery's ``Control.broadcast``; a ``revoke`` is recorded once it is sent."""
        reply = super().broadcast(command, arguments, *args, **kwargs)  # type: ignore[misc]
        if command == "revoke":
            task_ids = dict(arguments or {}, **kwargs).get("task_id")
            record_revoked(maybe_list(task_ids) or [])  # type: ignore[no-untyped-call]
        return reply


class RevokeRecordingControl(RecordsRevokes, Control):  # type: ignore[misc]
    """Celery's own control class, recording revokes (:class:`RecordsRevokes`)."""


def recording_control(base: type) -> type:
    """*base*, a control class, with :class:`RecordsRevokes` mixed in (made once per
    class, and kept as a module attribute so an app that names it can be pickled)."""
    if issubclass(base, RecordsRevokes):
        return base
    if base is Control:
        return RevokeRecordingControl
    name = f"RevokeRecording_{base.__module__}_{base.__qualname__}".replace(".", "_")
    made = globals().get(name)
    if made is None:
        made = globals()[name] = type(name, (RecordsRevokes, base), {"__module__": __name__})
    return made


def watch_revokes(app: Any, managers: Iterable[LockManager | None] = ()) -> None:
    """Record the revokes sent through *app*'s control (idempotent); *managers*: the lock
    managers of *app*'s ``unique_on_enqueue`` tasks (None: the default one)."""
    for manager in managers:
        if manager not in _dedupe_managers:
            _dedupe_managers.append(manager)
    base = symbol_by_name(app.control_cls)  # type: ignore[no-untyped-call]
    if issubclass(base, RecordsRevokes):
        return
    app.control_cls = recording_control(base)
    try:  # a control made already is made again, of the new class, at its next use
        del app.control
    except AttributeError:
        pass


def record_revoked(task_ids: Iterable[Any]) -> None:
    """Write the record that each of *task_ids* was revoked (logged, never raised:
    the revoke itself was sent)."""
    ids = [task_id for task_id in task_ids if isinstance(task_id, str)]
    if not ids:
        return
    for manager in _recording_managers():
        try:
            keyspace = manager.backend().keyspace
            pipe = manager.client.pipeline(transaction=False)
            for task_id in ids:
                pipe.set(keyspace.revoked(task_id), b"1", ex=REVOKE_RECORD_TTL)
            pipe.execute()
        except ImproperlyConfigured:  # no Redis for locks here: no lock to dedupe onto either
            logger.debug("redislock: revoke of %s not recorded: no Redis", ", ".join(ids))
        except Exception:
            logger.error(
                "redislock: could not record the revoke of task(s) %s; until the revoke "
                "reaches a worker, a new call may be deduplicated onto them",
                ", ".join(ids),
                exc_info=True,
            )


def _recording_managers() -> list[LockManager]:
    from ..primitives.manager import locks  # (the manager imports the guards)

    managers: list[LockManager] = []
    for manager in _dedupe_managers or [None]:
        resolved = locks if manager is None else manager
        if all(resolved is not other for other in managers):
            managers.append(resolved)
    return managers


def free_revoked(manager: LockManager, name: str, info: LockInfo) -> bool:
    """Whether a holder of *name* (as *info* shows it) is a task that was revoked before
    it started; its hold is then freed (owner- and fencing-token-checked), so the
    enqueue-time dedupe takes the lock instead of answering with the revoked task."""
    waiting = {h.owner: h for h in info.holders if h.owner is not None and h.owner == h.task_id}
    if not waiting:
        return False
    keyspace = manager.backend().keyspace
    try:
        revoked = [h for o, h in waiting.items() if manager.client.exists(keyspace.revoked(o))]
    except Exception as exc:
        raise LockBackendError(
            f"lock {name!r}: could not read whether task {', '.join(waiting)} was revoked: {exc}"
        ) from exc
    for holder in revoked:
        if manager.force_release(name, owner=holder.owner, fencing_token=holder.fencing_token):
            logger.info(
                "redislock: released lock %r of revoked task %s for a new call", name, holder.owner
            )
    return bool(revoked)


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
