"""A prefork pool process SIGKILLed under a guarded task: the worker's main process frees
the task's lock at once (owner-checked), instead of leaving it for the rest of its lease.

Real worker (prefork, one process, its own queue) and the real Redis; the release
helpers are also called directly, where a holder is easier to arrange than in a worker.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import time
from typing import Any

import celery
import pytest

from django_redislock import locks
from django_redislock.celery import lost as celery_lost
from tests import celery_app as ca
from tests.test_celery_worker import open_gate, wait_event, wait_until

QUEUE = f"lost-{os.getpid()}"  # no message of an earlier run is left in it
RESULT_WAIT = 30


@pytest.fixture(scope="module")
def worker(request: pytest.FixtureRequest) -> ca.Worker:
    """A prefork worker with one pool process, on a queue of this run's own."""
    w = ca.Worker(concurrency=1, name="lost", queues=QUEUE)
    request.addfinalizer(w.stop)
    w.wait_ready()
    return w


def _start(task: Any, name: str) -> tuple[Any, int]:
    """Send *task* and wait until it runs; return its result and its pool process's pid."""
    result = task.apply_async((name, name), queue=QUEUE)
    event = wait_event(name)
    assert event[:2] == ["start", result.id]
    return result, int(event[2])


def _freed_within_a_second(lock_name: str, killed: float) -> None:
    """Wait (bounded) until *lock_name* is free, at most 1 s after the kill at *killed*."""
    wait_until(lambda: locks.get(lock_name) is None, 1.0, "the lost process's lock release")
    assert time.monotonic() - killed <= 1.0


def _worker_lost(result: Any) -> None:
    """Wait until Celery reports the task failed with WorkerLostError."""
    wait_until(lambda: result.state == "FAILURE", RESULT_WAIT, "the FAILURE state")
    assert type(result.result).__name__ == "WorkerLostError", repr(result.result)


@pytest.mark.celery
@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "prefix"), [(ca.lost_decorated, "lost"), (ca.lost_based, "lost-base")]
)
def test_a_killed_pool_process_lock_is_released_within_a_second(
    worker: ca.Worker, name: str, task: Any, prefix: str
) -> None:
    # Several kills: Celery may look at a dying process before it can be reaped, and
    # then (left to itself) notices the loss only at its next look, up to 5 s later.
    for attempt in range(3):
        tag = f"{name}-{attempt}"
        result, pid = _start(task, tag)
        lock_name = f"{prefix}:{tag}"
        info = locks.get(lock_name)
        assert info is not None and info.task_id == result.id and info.pid == pid
        assert info.ttl is not None and info.ttl > 20  # only a release frees it this soon

        os.kill(pid, signal.SIGKILL)  # as the OOM killer does: no code of the task runs
        killed = time.monotonic()
        _freed_within_a_second(lock_name, killed)
        _worker_lost(result)


@pytest.mark.celery
@pytest.mark.slow
def test_a_lock_that_changed_hands_is_left_alone(worker: ca.Worker, name: str) -> None:
    result, pid = _start(ca.lost_decorated, name)
    lock_name = f"lost:{name}"
    info = locks.get(lock_name)
    assert info is not None and info.pid == pid
    # Someone else holds the name now: same task id in its metadata, same host, not the child.
    assert locks.force_release(lock_name, owner=info.owner)
    other = locks.lock(
        lock_name,
        ttl=30,
        owner=f"{result.id}:elsewhere",
        meta={"kind": "task", "task_id": result.id},
        auto_renew=False,
    )
    assert other.acquire(blocking=False)
    held = locks.get(lock_name)
    assert held is not None and held.task_id == result.id and held.pid == os.getpid()

    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    _worker_lost(result)
    time.sleep(max(0.0, killed + 1.5 - time.monotonic()))  # the handler acts within 1 s
    after = locks.get(lock_name)
    assert after is not None and after.owner == held.owner
    assert after.fencing_token == held.fencing_token
    other.release()


@pytest.mark.celery
@pytest.mark.slow
@pytest.mark.skipif(
    not hasattr(celery.Task, "retry_on_worker_lost"), reason="retry_on_worker_lost: Celery 5.7+"
)
def test_retry_on_worker_lost_frees_the_lock_for_the_retry(worker: ca.Worker, name: str) -> None:
    result, pid = _start(ca.lost_retried, name)
    lock_name = f"lost-retry:{name}"
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    _freed_within_a_second(lock_name, killed)
    # The retry (1 s later, same task id) finds the lock free and runs: not skipped.
    event = wait_event(name)
    assert event[:2] == ["start", result.id] and int(event[2]) != pid
    open_gate(name)
    assert result.get(timeout=RESULT_WAIT) == "done"
    assert locks.get(lock_name) is None


# -- the release itself, without a worker ------------------------------------------


def _task(proxy: Any) -> Any:
    """The task object itself (what a worker's signals carry), not the app's lazy proxy."""
    return proxy._get_current_object()


def _hold(lock_name: str, task_id: str) -> Any:
    """Hold *lock_name* in this process as an execution of *task_id* would."""
    lock = locks.lock(
        lock_name,
        ttl=30,
        owner=f"{task_id}:run",
        meta={"kind": "task", "task_id": task_id},
        auto_renew=False,
    )
    assert lock.acquire(blocking=False)
    return lock


def test_release_needs_the_task_id_and_the_dead_pid(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="django_redislock.celery")
    lock_name = f"lost:{name}"
    _hold(lock_name, "t1")
    release = celery_lost.release_dead_holder
    task = _task(ca.lost_decorated)
    here = os.getpid()
    assert release(task, "t2", (name, name), {}, {here}) == []  # another task id
    assert release(task, "t1", (name, name), {}, {here + 1}) == []  # another pid
    assert release(task, "t1", ("other", name), {}, {here}) == []  # another name
    assert locks.get(lock_name) is not None
    assert release(task, "t1", (), {"n": name, "tag": name}, {here}) == ["t1:run"]
    assert locks.get(lock_name) is None
    assert f"released lock {lock_name!r} of task {task.name}[t1]" in caplog.text
    assert release(task, "t1", (name, name), {}, {here}) == []  # nothing held
    assert release(_task(ca.plain), "t1", (1,), {}, {here}) == []  # not a guarded task


def test_release_frees_only_the_dead_executions_place_of_a_semaphore(name: str) -> None:
    lock_name = f"limited:{name}"
    outsider = locks.semaphore(lock_name, 2, ttl=30, owner="outsider", auto_renew=False)
    assert outsider.acquire(blocking=False)
    mine = locks.semaphore(
        lock_name,
        2,
        ttl=30,
        owner="t1:run",
        meta={"kind": "task", "task_id": "t1"},
        auto_renew=False,
    )
    assert mine.acquire(blocking=False)
    released = celery_lost.release_dead_holder(
        _task(ca.limited), "t1", (name, name), {}, {os.getpid()}
    )
    assert released == ["t1:run"]
    info = locks.get(lock_name)
    assert info is not None and [h.owner for h in info.holders] == ["outsider"]
    outsider.release()


class _Request:
    """Stands for a worker's Request (the fields the handlers read; weakly referenceable)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def test_requests_are_tracked_only_while_they_live_and_only_when_guarded() -> None:
    guarded = _Request(id="tracked-1", task=_task(ca.lost_decorated))
    plain = _Request(id="tracked-2", task=_task(ca.plain))
    celery_lost._track(request=guarded)
    celery_lost._track(request=plain)
    assert celery_lost._requests("tracked-1") == [guarded]
    assert celery_lost._requests("tracked-2") == []
    del guarded
    gc.collect()
    assert "tracked-1" not in celery_lost._received


def test_a_live_process_is_not_taken_for_the_lost_one(name: str) -> None:
    lock_name = f"lost:{name}"
    _hold(lock_name, "t3")
    request = _Request(
        id="t3", task=_task(ca.lost_decorated), worker_pid=os.getpid(), args=[name, name], kwargs={}
    )
    celery_lost._track(request=request)
    celery_lost.release_lost_request(request)  # this process is alive: not lost
    assert locks.get(lock_name) is not None
