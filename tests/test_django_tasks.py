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
