"""Celery integration in-process: eager mode, stacking errors, enqueue-time dedupe details.

No worker here: tasks run with ``task_always_eager`` (what users' own test suites
do), and the enqueue-only tests publish to a queue nobody consumes on the real
test Redis (database 3), which is emptied afterwards.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, shared_task
from django.conf import settings
from django.test import override_settings
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry

from django_redislock import LockManager, LockNotAcquired, locks, signals, single_instance
from django_redislock.celery import DuplicateTaskError, SingleInstanceTask, is_skipped
from tests.tcp_proxy import TcpProxy

_BROKER = settings.REDIS_URL.rsplit("/", 1)[0] + "/3"

eager = Celery("eager", set_as_current=False)
eager.conf.update(
    task_always_eager=True,
    task_eager_propagates=True,
    broker_url=_BROKER,
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


@eager.task(
    base=SingleInstanceTask,
    lock_key="backlog-run:{n}",
    unique_on_enqueue=True,
    lock_ttl=7,
    lock_enqueue_ttl=600,
)
def backlogged_run(n: int) -> None:
    """Records its lock as its body sees it."""
    calls.append(locks.get(f"backlog-run:{n}"))


@eager.task(bind=True)
@single_instance("rec:{n}")
def recurse(self: Any, n: int, depth: int) -> str:
    """Calls itself directly (same task id, so it re-enters its own lock)."""
    if depth:
        recurse(n, depth - 1)
    calls.append(locks.get(f"rec:{n}"))
    return "done"


@eager.task(bind=True, base=SingleInstanceTask, lock_key="rec-base:{n}", unique_on_enqueue=True)
def recurse_base(self: Any, n: int, depth: int) -> str:
    """Like ``recurse``, with enqueue-time dedupe (one more hold)."""
    if depth:
        recurse_base(n, depth - 1)
    calls.append(locks.get(f"rec-base:{n}"))
    return "done"


@eager.task(bind=True, max_retries=2)
@single_instance("eager-retry:{n}")
def retries_once(self: Any, n: int) -> str:
    """Retries itself once (the lock is kept for the retry by default)."""
    calls.append(locks.get(f"eager-retry:{n}"))
    if self.request.retries == 0:
        raise self.retry(countdown=5)
    return "ran"


@shared_task(bind=True)
@single_instance("shared:{n}")
def shared(self: Any, n: int) -> str | None:
    """A shared_task with bind=True: the key leaves self out, the lock is the task's."""
    info = locks.get(f"shared:{n}")
    return info.task_id if info is not None and info.task_id == self.request.id else None


@queued.task(
    base=SingleInstanceTask,
    lock_key="backlog:{n}",
    unique_on_enqueue=True,
    lock_ttl=7,
    lock_enqueue_ttl=600,
)
def backlogged(n: int) -> None:
    """Its enqueue-time lock outlives a long wait in a busy queue."""


@queued.task(base=SingleInstanceTask, lock_key="q:{order.pk}", unique_on_enqueue=True)
def by_order(order: Any) -> None:
    """A key from an attribute of an argument."""


@queued.task(
    base=SingleInstanceTask, lock_key="q:{n}", unique_on_enqueue=True, on_duplicate="raise"
)
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
    # shared=False: Celery 5.3 keeps a shared task's constructor as a callback run
    # whenever any app is finalized, so a broken one would fail every later test; and
    # lazy=False, so that no broken promise is left pending for the app's finalize.
    with pytest.raises(ValueError, match="no argument called 'm'"):

        @eager.task(base=SingleInstanceTask, lock_key="k:{m}", shared=False, lazy=False)
        def bad(n: int) -> None: ...

    with pytest.raises(ValueError, match="no argument called 'self'|no argument called 'x'"):

        @eager.task(bind=True, base=SingleInstanceTask, lock_key="k:{x}", shared=False, lazy=False)
        def bad_bound(self: Any, n: int) -> None: ...


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


def test_a_task_calling_itself_directly_does_not_free_its_outer_lock() -> None:
    # recurse(n, 0) inside recurse's body runs under the same task id: it re-enters
    # the lock, and its end must give back only its own hold.
    assert recurse.delay(1, 1).get() == "done"
    inner, outer = calls
    assert inner is not None and inner.hold_count == 2
    assert outer is not None and outer.hold_count == 1 and outer.owner == inner.owner
    assert locks.get("rec:1") is None

    calls.clear()
    assert recurse_base.delay(2, 1).get() == "done"
    inner, outer = calls
    assert inner is not None and inner.hold_count == 3  # enqueue + outer run + inner run
    assert outer is not None and outer.hold_count == 2 and outer.owner == inner.owner
    assert locks.get("rec-base:2") is None


def test_eager_retry_keeps_the_lock_then_frees_it() -> None:
    eager.conf.task_eager_propagates = False  # Celery runs eager retries only then
    try:
        result = retries_once.delay(3)
    finally:
        eager.conf.task_eager_propagates = True
    assert result.get() == "ran"
    first, retried = calls
    # Each execution is its own owner; the retry's took over the hold the first kept
    # (parked under the task id meanwhile): the same grant, no new token.
    assert first is not None and retried is not None and retried.owner != first.owner
    assert retried.task_id == first.task_id and retried.fencing_token == first.fencing_token
    assert locks.get("eager-retry:3") is None  # no lock leaks into the next test


def test_shared_task_bound_key_leaves_self_out() -> None:
    result = shared.apply((4,))
    assert result.get() == result.id


def test_naive_eta_is_utc_like_celery_reads_it() -> None:
    # Celery reads a naive ETA as UTC whatever the local time zone (the test
    # settings' TIME_ZONE makes local time America/Chicago, hours behind UTC).
    eta = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) + dt.timedelta(seconds=60)
    result = lenient.apply_async((3,), eta=eta)
    info = locks.get("q:3")
    assert info is not None and info.owner == result.id
    assert 60 < info.ttl <= 67  # lock_ttl (7 s) + the wait for the ETA
    aware = dt.datetime.now(dt.timezone(dt.timedelta(hours=5))) + dt.timedelta(seconds=60)
    lenient.apply_async((4,), eta=aware)
    assert 60 < locks.get("q:4").ttl <= 67


def test_key_that_cannot_be_rendered_publishes_nothing() -> None:
    broker = redis.Redis.from_url(_BROKER)
    with pytest.raises(ValueError, match="cannot render lock key"):
        by_order.delay(None)
    with pytest.raises(TypeError, match="cannot compute the lock key"):
        by_order.apply_async(kwargs={"customer": 1})
    assert list(locks.active()) == []
    assert broker.llen("nobody-consumes-this") == 0


def test_skips_and_dedupes_are_logged_with_the_key_and_the_holder(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="django_redislock.celery")
    first = lenient.delay(5)
    assert lenient.delay(5).id == first.id
    dedupe = [r.getMessage() for r in caplog.records]
    assert any("'q:5'" in m and first.id in m for m in dedupe), dedupe

    caplog.clear()
    result = nested.delay(6, 1).get()
    assert is_skipped(result)
    skip = [r.getMessage() for r in caplog.records]
    assert any("'nested:6'" in m and result["holder"] in m for m in skip), skip


def test_redis_unreachable_as_a_task_ends_keeps_its_result_and_the_lease_runs_out() -> None:
    upstream = redis.Redis.from_url(settings.REDIS_URL).connection_pool.connection_kwargs["port"]
    proxy = TcpProxy(upstream)
    client = redis.Redis(
        host="127.0.0.1",
        port=proxy.port,
        socket_timeout=2,
        socket_connect_timeout=1,
        retry=RedisRetry(NoBackoff(), 0),
    )

    @eager.task(bind=True, name="tests.outage")
    @single_instance("outage:{n}", ttl=1, manager=LockManager(client=client))
    def outage(self: Any, n: int) -> str:
        proxy.set_down(True)  # Redis cannot be reached when the task releases its lock
        return "done"

    try:
        # The body ran: a failed release must not turn its success into a failure
        # (autoretry_for would run it again).
        assert outage.delay(1).get() == "done"
    finally:
        proxy.set_down(False)
    # Redis is back: nothing renews the finished task's lock, its 1 s lease runs out.
    deadline = time.monotonic() + 5
    while locks.get("outage:1") is not None:
        assert time.monotonic() < deadline, "a finished task's lock is still renewed"
        time.sleep(0.05)
    proxy.close()


def test_enqueue_lease_can_outlive_a_backlog() -> None:
    # A message may wait behind others longer than lock_ttl; nothing renews the
    # enqueue-time lock meanwhile, so lock_enqueue_ttl sets its lease.
    result = backlogged.delay(1)
    info = locks.get("backlog:1")
    assert info is not None and info.owner == result.id and 590 < info.ttl <= 600
    backlogged.apply_async((2,), countdown=60)
    assert 650 < locks.get("backlog:2").ttl <= 660
    lenient.delay(1)
    assert 0 < locks.get("q:1").ttl <= 7  # by default, lock_ttl
    # Once the task runs, the lease is lock_ttl again (renewed by the watchdog), so
    # a killed worker's lock still frees within one lock_ttl.
    backlogged_run.delay(3)
    assert calls[0] is not None and calls[0].hold_count == 2 and 0 < calls[0].ttl <= 7
    assert locks.get("backlog-run:3") is None


def test_lock_limit_does_not_combine_with_unique_on_enqueue() -> None:
    # lazy=False: an app that is not finalized yet would make the class only on first use.
    with pytest.raises(ValueError, match="unique_on_enqueue .* and lock_limit"):

        @eager.task(
            base=SingleInstanceTask,
            lock_key="x",
            lock_limit=2,
            unique_on_enqueue=True,
            lazy=False,
            shared=False,  # see test_task_key_template_is_checked_when_the_task_is_made
        )
        def both() -> None:
            """Never runs."""

    with pytest.raises(ValueError, match="lock_limit must be between 1 and"):

        @eager.task(base=SingleInstanceTask, lock_key="x", lock_limit=0, lazy=False, shared=False)
        def zero() -> None:
            """Never runs."""


def test_lock_limit_runs_eagerly_as_a_semaphore(name: str) -> None:
    seen: list[Any] = []

    @eager.task(base=SingleInstanceTask, lock_key="eager-limited:{n}", lock_limit=3)
    def limited(n: int) -> None:
        seen.append(locks.get(f"eager-limited:{n}"))

    limited.delay(5)
    (info,) = seen
    assert info.primitive == "semaphore" and info.limit == 3 and info.kind == "task"
    assert locks.get("eager-limited:5") is None


class _ClassDefined(SingleInstanceTask):
    """A task defined as a class with its own ``run``."""

    name = "tests.class_defined"
    lock_key = "classdef:{n}"

    def run(self, n: int) -> Any:
        return locks.get(f"classdef:{n}"), locks.get(f"classdef-sub:{n}")


class _ClassDefinedSub(_ClassDefined):
    """Inherits ``run``, changes only the key."""

    name = "tests.class_defined_sub"
    lock_key = "classdef-sub:{n}"


def test_a_class_defined_task_and_a_subclass_each_take_their_own_key() -> None:
    task = eager.register_task(_ClassDefined())
    sub = eager.register_task(_ClassDefinedSub())
    own, other = task.apply((1,)).get()
    assert own is not None and own.name == "classdef:1" and other is None
    own, other = sub.apply((1,)).get()
    assert own is None and other is not None and other.name == "classdef-sub:1"
    # Called directly (no worker), the body is guarded too.
    own, _ = task(2)
    assert own is not None and own.name == "classdef:2"
    assert locks.get("classdef:1") is None and locks.get("classdef-sub:1") is None


def test_the_worker_calls_run_directly_with_no_custom_call() -> None:
    """Celery's tracer skips ``__call__`` (one request push less per task) unless it is custom."""
    from celery.app.trace import task_has_custom

    assert not task_has_custom(fails, "__call__")


class _Opaque:
    """An argument with no JSON form (shown as its repr)."""

    def __repr__(self) -> str:
        return "<Opaque>"


@eager.task
@single_instance("says:{account}:{mode}")
def says_what_it_guards(account: int, mode: str, note: Any = None, blob: str = "") -> Any:
    """Returns its own lock as the body sees it."""
    return locks.get(f"says:{account}:{mode}")


@eager.task(base=SingleInstanceTask, lock_key=lambda n, opaque, blob: f"every:{n}")
def by_every_argument(n: int, opaque: Any, blob: str) -> Any:
    """Locked by a key callable (which may read every argument); returns its lock."""
    return locks.get(f"every:{n}")


def test_a_task_lock_names_the_task_and_the_arguments_of_its_key() -> None:
    info = says_what_it_guards.apply((7, "full"), {"note": _Opaque()}).get()
    assert info.purpose == says_what_it_guards.name == info.task_name
    assert info.meta["args"] == {"account": 7, "mode": "full"}  # the key's inputs only


def test_every_argument_of_a_key_callable_is_shown_and_long_ones_are_cut() -> None:
    info = by_every_argument.apply((3, _Opaque(), "x" * 1000)).get()
    shown = info.meta["args"]
    assert shown["n"] == 3 and shown["opaque"] == "<Opaque>"
    assert len(shown["blob"]) == 200 and shown["blob"].endswith("…")


def test_the_level_of_skip_lines_is_a_setting(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="django_redislock.celery")
    with override_settings(REDISLOCK_TASK_SKIP_LOG_LEVEL="INFO"):
        result = nested.delay(8, 1).get()
    assert is_skipped(result)
    (line,) = [r for r in caplog.records if "'nested:8'" in r.getMessage()]
    assert line.levelno == logging.INFO


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    not hasattr(SingleInstanceTask, "delay_on_commit"), reason="Celery 5.3 has no DjangoTask"
)
def test_delay_on_commit_sends_and_dedupes_when_the_transaction_commits() -> None:
    from django.db import transaction

    with transaction.atomic():
        lenient.delay_on_commit(31)
        lenient.apply_async_on_commit((31,))
        # Nothing is sent (or locked) before the commit.
        assert locks.get("q:31") is None
    info = locks.get("q:31")
    assert info is not None and info.task_name == lenient.name
    # The second call was deduplicated onto the first when both were really sent.
    assert lenient.delay(31).id == info.task_id
    with transaction.atomic():
        lenient.delay_on_commit(32)
        transaction.set_rollback(True)
    assert locks.get("q:32") is None  # rolled back: never sent, never locked
