"""Celery integration in-process: eager mode, stacking errors, enqueue-time dedupe details.

No worker here: tasks run with ``task_always_eager`` (what users' own test suites
do), and the enqueue-only tests publish to a queue nobody consumes on the real
test Redis (database 3), which is emptied afterwards.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, shared_task
from django.conf import settings

from django_redislock import LockNotAcquired, locks, signals, single_instance
from django_redislock.celery import DuplicateTaskError, SingleInstanceTask, is_skipped

_BROKER = settings.REDIS_URL.rsplit("/", 1)[0] + "/3"

eager = Celery("eager", set_as_current=False)
eager.conf.update(
    task_always_eager=True, task_eager_propagates=True, broker_url=_BROKER,
    result_backend=None,
)
queued = Celery("queued", set_as_current=False)
queued.conf.update(broker_url=_BROKER, task_default_queue="nobody-consumes-this")

calls: list[Any] = []


@eager.task(base=SingleInstanceTask, lock_key="eager:{n}", unique_on_enqueue=True)
def fails(n: int) -> None:
    """Always fails."""
    calls.append(locks.get(f"eager:{n}"))
    raise RuntimeError("boom")


@eager.task(bind=True)
@single_instance("nested:{n}")
def nested(self: Any, n: int, depth: int) -> Any:
    """Calls itself (a duplicate) while holding its lock."""
    calls.append(self.request.id)
    if depth:
        return nested.delay(n, depth - 1).result
    return "inner ran"


@eager.task(bind=True, max_retries=2)
@single_instance("busy:{n}", on_locked="retry")
def retries(self: Any, n: int) -> str:
    """Retries while busy:<n> is held."""
    return "ran"


@eager.task
@single_instance("wait:{n}", on_locked="wait", timeout=10)
def waits(n: int) -> str:
    """Waits up to 10 s for wait:<n>."""
    return "ran"


@eager.task
@single_instance("wait:{n}", on_locked="wait", timeout=0.2)
def waits_briefly(n: int) -> str:
    """Waits up to 0.2 s for wait:<n>."""
    return "ran"


@queued.task(base=SingleInstanceTask, lock_key="q:{n}", unique_on_enqueue=True,
             on_duplicate="raise")
def strict(n: int) -> None:
    """Raises DuplicateTaskError on a duplicate enqueue."""


@queued.task(base=SingleInstanceTask, lock_key="q:{n}", unique_on_enqueue=True, lock_ttl=7)
def lenient(n: int) -> None:
    """Returns the pending task on a duplicate enqueue."""


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    calls.clear()
    yield
    redis.Redis.from_url(_BROKER).flushdb()


def test_eager_failure_with_propagation_releases_the_lock() -> None:
    with pytest.raises(RuntimeError):
        fails.delay(1)
    # The enqueue hold and the run hold were both live while the body ran...
    assert calls[0] is not None and calls[0].hold_count == 2 and calls[0].kind == "task"
    # ...and both are gone although the exception propagated out of apply().
    assert locks.get("eager:1") is None


def test_eager_duplicate_inside_the_body_is_skipped_with_the_holder() -> None:
    result = nested.delay(5, 1).get()
    assert is_skipped(result) and result["holder"] == calls[0]
    assert len(calls) == 1  # the duplicate never ran its body
    assert locks.get("nested:5") is None


def test_retry_mode_honours_max_retries() -> None:
    holder = locks.lock("busy:1", owner="someone")
    assert holder.acquire(blocking=False)
    # Celery runs eager retries only when exceptions do not propagate.
    eager.conf.task_eager_propagates = False
    try:
        result = retries.delay(1)
    finally:
        eager.conf.task_eager_propagates = True
        holder.release()
    assert result.state == "FAILURE" and isinstance(result.result, LockNotAcquired)
    assert "someone" in str(result.result)
    assert retries.delay(1).get() == "ran"


def test_duplicate_enqueue_returns_pending_or_raises() -> None:
    contended: list[str] = []

    def receiver(name: str, **kwargs: Any) -> None:
        contended.append(name)

    signals.lock_contended.connect(receiver)
    try:
        first = lenient.delay(1)
        info = locks.get("q:1")
        assert info is not None and info.task_id == first.id and info.task_name == lenient.name
        assert 0 < info.ttl <= 7
        assert lenient.delay(n=1).id == first.id
        with pytest.raises(DuplicateTaskError) as excinfo:
            strict.delay(1)
        assert excinfo.value.task_id == first.id
    finally:
        signals.lock_contended.disconnect(receiver)
    assert contended == ["q:1", "q:1"]
    assert lenient.delay(2).id != first.id


def test_lock_held_by_a_non_task_refuses_the_enqueue() -> None:
    holder = locks.lock("q:9", owner="a-script")
    assert holder.acquire(blocking=False)
    try:
        with pytest.raises(DuplicateTaskError, match="a-script"):
            lenient.delay(9)
    finally:
        holder.release()


def test_decorator_above_the_task_decorator_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="put it below"):

        @single_instance("x")
        @eager.task
        def wrong(n: int) -> None: ...

    with pytest.raises(TypeError, match="put it below"):

        @single_instance("x")
        @shared_task
        def wrong_shared(n: int) -> None: ...


def test_task_key_template_is_checked_when_the_task_is_made() -> None:
    with pytest.raises(ValueError, match="no argument called 'm'"):

        @eager.task(base=SingleInstanceTask, lock_key="k:{m}")
        def bad(n: int) -> None: ...

        bad.name  # noqa: B018  (a lazy task is created when first used)

    with pytest.raises(ValueError, match="no argument called 'self'|no argument called 'x'"):

        @eager.task(bind=True, base=SingleInstanceTask, lock_key="k:{x}")
        def bad_bound(self: Any, n: int) -> None: ...

        bad_bound.name  # noqa: B018


def test_wait_mode_blocks_until_the_holder_releases_or_the_timeout() -> None:
    holder = locks.lock("wait:1", owner="someone")
    assert holder.acquire(blocking=False)
    with pytest.raises(LockNotAcquired, match="someone"):
        waits_briefly.delay(1)
    timer = threading.Timer(0.3, holder.release)
    timer.start()
    try:
        assert waits.delay(1).get() == "ran"
    finally:
        timer.cancel()
    assert locks.get("wait:1") is None
