"""Django 6's background tasks (``django.tasks``) with ``@task`` over ``@single_instance``.

The run-time guard needs no integration: the task's function is the guarded one, so
every run takes its lock, whichever worker calls it. Django's ImmediateBackend (the
default ``TASKS`` backend) runs the task inside ``enqueue()``, in this process, against
the real test Redis. Skipped before Django 6.0 (no ``django.tasks``).
"""

from __future__ import annotations

from typing import Any

import pytest

tasks = pytest.importorskip("django.tasks", reason="django.tasks came in Django 6.0")

from django.tasks import TaskResultStatus, task  # noqa: E402

from django_redislock import locks, single_instance  # noqa: E402


@task
@single_instance("dtask:{n}", ttl=10)
def rebuild(n: int) -> dict[str, Any]:
    """Reports the lock its run holds."""
    info = locks.get(f"dtask:{n}")
    assert info is not None
    return {"held": True, "kind": info.kind, "template": info.meta.get("template")}


@task
@single_instance("dtask-quiet:{n}", ttl=10, on_locked="skip")
def rebuild_quietly(n: int) -> str:
    """A run that finds the lock held returns None instead of failing."""
    return "ran"


@task(takes_context=True)
@single_instance("dtask-ctx:{n}", ttl=10)
def with_context(context: Any, n: int) -> int:
    """``takes_context``: the context is no part of the key."""
    return context.attempt


def test_a_run_holds_its_lock_and_frees_it() -> None:
    result = rebuild.enqueue(7)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"held": True, "kind": "function", "template": "dtask:{n}"}
    assert locks.get("dtask:7") is None


def test_a_run_that_finds_the_lock_held_fails_with_lock_not_acquired() -> None:
    # Another owner: the ImmediateBackend runs the task in this very thread, which
    # would re-enter a lock this thread holds.
    with locks.lock("dtask:8", owner="elsewhere"):
        result = rebuild.enqueue(8)
    # Django has no "skipped" status: the run is FAILED, and says why.
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == ("django_redislock.exceptions.LockNotAcquired")
    assert "dtask:8" in result.errors[0].traceback


def test_on_locked_skip_makes_a_held_lock_a_successful_run_of_nothing() -> None:
    with locks.lock("dtask-quiet:9", owner="elsewhere"):
        result = rebuild_quietly.enqueue(9)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value is None
    assert rebuild_quietly.enqueue(9).return_value == "ran"


def test_takes_context_leaves_the_context_out_of_the_key() -> None:
    with locks.lock("dtask-ctx:3", owner="elsewhere"):
        assert with_context.enqueue(3).status == TaskResultStatus.FAILED
    assert with_context.enqueue(3).return_value == 1


def test_single_instance_above_task_is_refused() -> None:
    with pytest.raises(TypeError):
        single_instance("x")(rebuild)


# -- enqueue-time dedupe (django_redislock.django_tasks) --------------------------

from django_redislock.django_tasks import (  # noqa: E402
    HOLD_KWARG,
    single_instance_task,
)
from django_redislock.exceptions import DuplicateTaskError, LockNotAcquired  # noqa: E402


@single_instance_task("uniq-dtask:{n}", ttl=10)
def unique_now(n: int) -> dict[str, Any]:
    """Runs at once (ImmediateBackend): reports the lock as its run holds it."""
    info = locks.get(f"uniq-dtask:{n}")
    assert info is not None
    return {"owner": info.owner, "count": info.hold_count, "kind": info.kind}


@single_instance_task("uniq-queued:{n}", ttl=10, backend="dummy", lock_enqueue_ttl=60)
def unique_queued(n: int) -> str:
    """Stored, not run (DummyBackend), until the test runs it as a worker would."""
    return f"ran {n}"


@single_instance_task("uniq-strict:{n}", backend="dummy", on_duplicate="raise")
def unique_strict(n: int) -> str:
    """Refuses a duplicate with DuplicateTaskError."""
    return "ran"


def test_a_deduplicated_task_runs_taking_over_its_enqueue_hold() -> None:
    result = unique_now.enqueue(1)
    assert result.status == TaskResultStatus.SUCCESSFUL
    value = result.return_value
    # The run took the enqueue-time hold over (one owner, both holds) ...
    assert value["owner"].startswith("djtask:") and value["count"] == 2, value
    assert value["kind"] == "task"
    # ... and freed everything when it ended.
    assert locks.get("uniq-dtask:1") is None
    assert unique_now.enqueue(1).status == TaskResultStatus.SUCCESSFUL


def test_a_duplicate_enqueue_returns_the_queued_tasks_result() -> None:
    first = unique_queued.enqueue(5)
    info = locks.get("uniq-queued:5")
    assert info is not None and info.owner.startswith("djtask:") and 50 < info.ttl <= 60
    again = unique_queued.enqueue(n=5)  # keyword spelling, same key
    assert again.id == first.id
    other = unique_queued.enqueue(6)
    assert other.id != first.id
    # The worker's run of the queued task takes the hold over and frees the lock.
    assert first.kwargs[HOLD_KWARG] == info.owner
    assert first.task.call(*first.args, **first.kwargs) == "ran 5"
    assert locks.get("uniq-queued:5") is None
    assert unique_queued.enqueue(5).id != first.id  # queued again once it ran


def test_on_duplicate_raise_names_the_queued_result() -> None:
    first = unique_strict.enqueue(1)
    with pytest.raises(DuplicateTaskError) as excinfo:
        unique_strict.enqueue(1)
    assert excinfo.value.task_id == first.id and excinfo.value.name == "uniq-strict:1"
    assert isinstance(excinfo.value, LockNotAcquired)


def test_a_lock_held_by_something_else_refuses_the_enqueue() -> None:
    with locks.lock("uniq-queued:9", owner="a-script"):
        with pytest.raises(DuplicateTaskError, match="a-script"):
            unique_queued.enqueue(9)


def test_a_run_without_a_hold_is_a_plain_guarded_call() -> None:
    """A run of a task enqueued without the dedupe (here: called as a worker would, with
    no hold token) is guarded like any function: refused while another owner holds."""
    with locks.lock("uniq-dtask:4", owner="elsewhere"):
        with pytest.raises(LockNotAcquired):
            unique_now.call(4)
    assert unique_now.call(4)["count"] == 1  # its own hold only


def test_the_decorator_refuses_what_cannot_work() -> None:
    with pytest.raises(ValueError, match="on_duplicate"):
        single_instance_task("x", on_duplicate="ignore")(_module_level)
    with pytest.raises(ValueError, match="lock_enqueue_ttl"):
        single_instance_task("x", lock_enqueue_ttl=0)(_module_level)


def _module_level(n: int) -> None:
    """A function to decorate in the refusal tests."""
