"""Single-instance Celery tasks on a real worker (prefork, 2 processes) and the real Redis."""

from __future__ import annotations

import datetime as dt
import decimal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import kombu.exceptions
import pytest
import redis
from django.conf import settings

from django_redislock import locks
from django_redislock.celery import is_skipped
from tests import celery_app as ca

pytestmark = [pytest.mark.celery, pytest.mark.slow]

RESULT_WAIT = 30
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def worker() -> Iterator[ca.Worker]:
    """One real worker for the module (broker/results on DBs 1 and 2, emptied first)."""
    base = settings.REDIS_URL.rsplit("/", 1)[0]
    for db in (1, 2):
        redis.Redis.from_url(f"{base}/{db}").flushdb()
    w = ca.Worker(concurrency=2)
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()


def runs_as(info, task_id: str) -> bool:  # type: ignore[no-untyped-def]
    """Whether *info* is held by a running execution of *task_id* (its own owner)."""
    return info.task_id == task_id and (info.owner or "").startswith(f"{task_id}:")


def wait_event(tag: str, timeout: float = RESULT_WAIT) -> list[str]:
    """The next event a task pushed to events:<tag>, split into words (fails on timeout)."""
    got = ca.probe.blpop([f"events:{tag}"], timeout=timeout)
    assert got is not None, f"no event on events:{tag} within {timeout} s"
    return got[1].decode().split()


def open_gate(tag: str) -> None:
    """Let the task waiting on gate:<tag> finish."""
    ca.probe.rpush(f"gate:{tag}", "go")


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """Poll *predicate* until it is truthy (bounded); return its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(interval)


def test_duplicate_is_skipped_and_says_why(worker: ca.Worker, name: str) -> None:
    first = ca.hold.delay(7, f"{name}-a")
    assert wait_event(f"{name}-a") == ["start", first.id]
    info = locks.get("acct:7")
    assert info is not None and runs_as(info, first.id)
    assert info.task_name == "tests.celery_app.hold" and info.kind == "task"

    second = ca.hold.delay(account_id=7, tag=f"{name}-b")  # keyword spelling, same key
    skipped = second.get(timeout=RESULT_WAIT)
    assert is_skipped(skipped)
    assert skipped["lock"] == "acct:7" and skipped["holder"] == first.id

    # Published by name, bypassing apply_async (as beat's send_task does): still guarded.
    third = ca.app.send_task("tests.celery_app.hold", args=[7, f"{name}-c"])
    assert is_skipped(third.get(timeout=RESULT_WAIT))
    assert ca.probe.llen(f"events:{name}-b") == 0 and ca.probe.llen(f"events:{name}-c") == 0

    open_gate(f"{name}-a")
    assert first.get(timeout=RESULT_WAIT) == "done"
    assert locks.get("acct:7") is None


def test_lock_limit_lets_that_many_run_at_once(worker: ca.Worker, name: str) -> None:
    # This test process takes one of the two places; a worker task takes the other.
    outsider = locks.semaphore(f"limited:{name}", 2, ttl=30, owner="outsider")
    assert outsider.acquire(blocking=False)
    first = ca.limited.delay(name, f"{name}-a")
    assert wait_event(f"{name}-a") == ["start", first.id]
    info = locks.get(f"limited:{name}")
    assert info.primitive == "semaphore" and info.limit == 2
    assert {h.task_id or h.owner for h in info.holders} == {"outsider", first.id}

    second = ca.limited.delay(name, f"{name}-b")  # both places taken: skipped
    skipped = second.get(timeout=RESULT_WAIT)
    assert is_skipped(skipped) and first.id in skipped["holder"]
    assert ca.probe.llen(f"events:{name}-b") == 0

    outsider.release()  # a place frees: the next one runs beside the first
    third = ca.limited.delay(name, f"{name}-c")
    assert wait_event(f"{name}-c") == ["start", third.id]
    open_gate(f"{name}-a")
    open_gate(f"{name}-c")
    assert first.get(timeout=RESULT_WAIT) == "done" and third.get(timeout=RESULT_WAIT) == "done"
    assert locks.get(f"limited:{name}") is None


def test_duplicate_retries_then_runs(worker: ca.Worker, name: str) -> None:
    first = ca.hold_or_retry.delay(3, f"{name}-a")
    assert wait_event(f"{name}-a")[0] == "start"
    open_gate(f"{name}-b")  # the duplicate may finish as soon as it gets to run
    second = ca.hold_or_retry.delay(3, f"{name}-b")
    # The duplicate found the lock held and was retried (same task id, later).
    wait_until(lambda: second.state == "RETRY", RESULT_WAIT, "the duplicate to be retried")
    assert ca.probe.llen(f"events:{name}-b") == 0
    open_gate(f"{name}-a")
    assert first.get(timeout=RESULT_WAIT) == "done"
    assert second.get(timeout=RESULT_WAIT) == "done"
    start = wait_event(f"{name}-b")
    assert start[:2] == ["start", second.id] and int(start[2]) >= 1
    assert locks.get("retrying:3") is None


def test_unique_on_enqueue_returns_the_queued_task(worker: ca.Worker, name: str) -> None:
    first = ca.unique.apply_async((1, f"{name}-a"), countdown=2)
    info = locks.get("uniq:1")
    assert info is not None and info.owner == first.id
    # The countdown is added to the lease, so the lock outlives the wait.
    assert info.ttl is not None and info.ttl > 30

    dup = ca.unique.delay(item=1, tag=f"{name}-b")
    assert dup.id == first.id

    assert wait_event(f"{name}-a") == ["start", first.id]
    running = locks.get("uniq:1")
    # The execution took over the enqueue-time hold (same key, 2 holds), as its own owner.
    assert running is not None and runs_as(running, first.id) and running.hold_count == 2
    assert ca.unique.delay(1, f"{name}-c").id == first.id

    open_gate(f"{name}-a")
    assert first.get(timeout=RESULT_WAIT) == "done"
    assert locks.get("uniq:1") is None
    again = ca.unique.delay(1, f"{name}-d")
    assert again.id != first.id
    open_gate(f"{name}-d")
    assert again.get(timeout=RESULT_WAIT) == "done"
    assert ca.probe.llen(f"events:{name}-b") == 0 and ca.probe.llen(f"events:{name}-c") == 0


def test_key_is_the_same_at_enqueue_and_in_the_worker(worker: ca.Worker, name: str) -> None:
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    day = dt.date(2026, 1, 2)
    amount = decimal.Decimal("10.50")
    at = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    expected = f"typed:{ident}:2026-01-02:10.50:2026-01-02T03:04:05+00:00"
    result = ca.typed.apply_async((ident, day), {"amount": amount, "at": at, "tag": name})
    assert wait_event(name) == ["start", result.id]
    info = locks.get(expected)
    assert info is not None and runs_as(info, result.id) and info.hold_count == 2
    # Positional/keyword spelling of the same call is a duplicate.
    assert ca.typed.delay(ident=ident, day=day, amount=amount, at=at).id == result.id
    open_gate(name)
    assert result.get(timeout=RESULT_WAIT) == "done"
    assert locks.get(expected) is None


def test_publish_failure_leaves_no_lock(worker: ca.Worker) -> None:
    with pytest.raises(kombu.exceptions.EncodeError):
        ca.unique.delay(5, object())  # not JSON-serialisable: publishing fails
    assert locks.get("uniq:5") is None


def test_retry_keeps_the_lock_then_releases(worker: ca.Worker, name: str) -> None:
    result = ca.retry_once.delay(1, name)
    first = wait_event(name)
    assert first[:3] == ["run", result.id, "0"]
    # Between the attempts the lock stays with the same task (and a duplicate is deduped).
    wait_until(lambda: result.state == "RETRY", RESULT_WAIT, "the retry")
    info = locks.get("retry-keep:1")
    assert info is not None and info.owner == result.id
    assert ca.retry_once.delay(1, name).id == result.id
    assert result.get(timeout=RESULT_WAIT) == "done"
    assert wait_event(name)[:3] == ["run", result.id, "1"]
    assert locks.get("retry-keep:1") is None


def test_retry_can_release_the_lock_meanwhile(worker: ca.Worker, name: str) -> None:
    result = ca.retry_releasing.delay(2, name)
    assert wait_event(name)[:3] == ["run", result.id, "0"]
    wait_until(lambda: result.state == "RETRY", RESULT_WAIT, "the retry")
    assert locks.get("retry-release:2") is None
    assert result.get(timeout=RESULT_WAIT) == "done"
    assert wait_event(name)[:3] == ["run", result.id, "1"]
    assert locks.get("retry-release:2") is None


def test_self_rescheduling_task_does_not_deadlock(worker: ca.Worker, name: str) -> None:
    ca.reschedule.delay(2, name)
    lefts = [wait_event(name)[2] for _ in range(3)]
    assert lefts == ["2", "1", "0"]
    wait_until(lambda: locks.get("resched") is None, 10, "the last run's release")


def test_ignore_releases_the_lock(worker: ca.Worker, name: str) -> None:
    ca.ignored.delay(4, name)
    assert wait_event(name)[0] == "run"
    wait_until(lambda: locks.get("ignored:4") is None, 10, "the release after Ignore")


def test_revoke_terminate_releases_the_lock(worker: ca.Worker, name: str) -> None:
    result = ca.hold.delay(11, name)
    assert wait_event(name) == ["start", result.id]
    assert locks.get("acct:11") is not None
    # SIGKILL: the task's own code cannot release; the worker's revoke handler must.
    ca.app.control.revoke(result.id, terminate=True, signal="SIGKILL")
    wait_until(lambda: locks.get("acct:11") is None, 10, "the revoke handler's release")
    wait_until(lambda: result.state == "REVOKED", RESULT_WAIT, "the REVOKED state")


def test_task_longer_than_its_lease_stays_exclusive(worker: ca.Worker, name: str) -> None:
    result = ca.short_hold.delay(1, f"{name}-a")  # lease 1 s
    assert wait_event(f"{name}-a") == ["start", result.id]
    # Watch for three leases: the watchdog must keep the lock with its holder throughout.
    deadline = time.monotonic() + 3.0
    checks = 0
    while time.monotonic() < deadline:
        info = locks.get("short:1")
        assert info is not None and runs_as(info, result.id), "lock expired under a live task"
        checks += 1
        time.sleep(0.1)
    assert checks >= 10
    dup = ca.short_hold.delay(1, f"{name}-b")
    assert is_skipped(dup.get(timeout=RESULT_WAIT))
    open_gate(f"{name}-a")
    assert result.get(timeout=RESULT_WAIT) == "done"
    assert locks.get("short:1") is None


def test_killed_worker_lock_expires_within_one_lease(name: str) -> None:
    # Locks held by others (e.g. other workers' running tasks) survive a worker's start-up.
    others = locks.lock("acct:99", owner="another-workers-task")
    assert others.acquire(blocking=False)
    w = ca.Worker(concurrency=1, name="doomed", queues="doomed")
    try:
        w.wait_ready()
        info = locks.get("acct:99")
        assert info is not None and info.owner == "another-workers-task"
        # Its own queue, so the module's worker (if running) cannot take it.
        result = ca.short_hold.apply_async((2, name), queue="doomed")  # lease 1 s, renewed
        assert wait_event(name) == ["start", result.id]
        info = locks.get("short:2")
        assert info is not None and runs_as(info, result.id)
        w.kill()
        killed_at = time.monotonic()
    finally:
        w.stop()
    wait_until(lambda: locks.get("short:2") is None, 5, "the dead worker's lease to expire")
    assert time.monotonic() - killed_at <= 2.5  # one lease (1 s) plus polling slack


def test_revoked_and_expired_queued_tasks_release_their_enqueue_lock(
    worker: ca.Worker, name: str
) -> None:
    expiring = ca.unique.apply_async((21, f"{name}-a"), countdown=1, expires=0.5)
    revoked = ca.unique.apply_async((22, f"{name}-b"), countdown=1)
    for item, result in ((21, expiring), (22, revoked)):
        info = locks.get(f"uniq:{item}")
        assert info is not None and info.owner == result.id and info.ttl > 30
    ca.app.control.revoke(revoked.id)
    # Well within the 31 s lease: only the worker's revoke handler can free them this soon.
    wait_until(
        lambda: locks.get("uniq:21") is None and locks.get("uniq:22") is None,
        15,
        "the revoke handler to release both enqueue locks",
    )
    assert ca.probe.llen(f"events:{name}-a") == 0 and ca.probe.llen(f"events:{name}-b") == 0
    wait_until(
        lambda: expiring.state == "REVOKED" and revoked.state == "REVOKED",
        RESULT_WAIT,
        "the REVOKED states",
    )


def test_autoretry_keeps_the_lock_for_the_retry_and_frees_it_at_the_end(
    worker: ca.Worker, name: str
) -> None:
    first = ca.flaky.delay(name)
    assert wait_event(name) == ["run", first.id, "0"]
    # During the 2 s backoff the lock is kept for the retry: a duplicate is skipped.
    duplicate = ca.flaky.delay(name)
    skipped = duplicate.get(timeout=RESULT_WAIT)
    assert is_skipped(skipped) and skipped["holder"] == first.id
    assert wait_event(name) == ["run", first.id, "1"]
    assert first.get(timeout=RESULT_WAIT) == "done"
    wait_until(lambda: locks.get(f"autoretry:{name}") is None, 5, "the release")


def test_autoretry_with_no_retries_left_releases_the_lock(worker: ca.Worker, name: str) -> None:
    result = ca.flaky.delay(name, always=True)
    assert wait_event(name) == ["run", result.id, "0"]
    assert wait_event(name) == ["run", result.id, "1"]
    with pytest.raises(ValueError):
        result.get(timeout=RESULT_WAIT)
    # The last failure ends the task: released at once, not kept for a retry.
    info = locks.get(f"autoretry:{name}")
    assert info is None, info


def test_revoking_a_countdown_task_frees_its_enqueue_lock_at_once(
    worker: ca.Worker, name: str
) -> None:
    result = ca.unique.apply_async((23, name), countdown=120)
    info = locks.get("uniq:23")
    assert info is not None and info.owner == result.id and info.ttl > 120
    # The worker has received it and keeps it until its ETA (nothing has discarded it).
    wait_until(
        lambda: f"[{result.id}] received" in worker.log_text(full=True),
        15,
        "the worker to hold the countdown task",
    )
    ca.app.control.revoke(result.id)
    # Freed when the revoke arrives, not at the ETA two minutes from now.
    wait_until(lambda: locks.get("uniq:23") is None, 10, "the release on revoke")
    # A new call is queued again instead of being deduplicated onto the revoked task.
    again = ca.unique.apply_async((23, name), countdown=120)
    assert again.id != result.id
    ca.app.control.revoke(again.id)
    wait_until(lambda: locks.get("uniq:23") is None, 10, "the second release on revoke")


@pytest.mark.parametrize(
    "how", ["AsyncResult.revoke", "control.revoke", "control.revoke list", "a fresh process"]
)
def test_a_call_right_after_a_revoke_is_queued_and_runs(
    worker: ca.Worker, name: str, how: str
) -> None:
    # Issue 41, defect 3: the revoke reaches the worker only later; from the moment
    # revoke() returns, the same call must not be deduplicated onto the revoked task.
    first = ca.unique.apply_async((name, name), countdown=3)
    info = locks.get(f"uniq:{name}")
    assert info is not None and info.owner == first.id
    if how == "AsyncResult.revoke":
        ca.unique.AsyncResult(first.id).revoke()
    elif how == "control.revoke":
        ca.app.control.revoke(first.id)
    elif how == "control.revoke list":
        ca.app.control.revoke([str(uuid.uuid4()), first.id])
    if how != "a fresh process":
        again = ca.unique.apply_async((name, name), countdown=3)  # at once: same call, same key
    else:  # its app made after django.setup(), its tasks not loaded until the re-send
        code = (  # Redis and the broker connected first: the re-send follows at once
            "from tests import celery_app as ca\n"
            f"ca.locks.get({name!r}); ca.app.control.ping(timeout=0.1)\n"
            f"ca.app.control.revoke({first.id!r})\n"
            f"print(ca.unique.apply_async(({name!r}, {name!r}), countdown=3).id)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60, capture_output=True
        )
        again = ca.unique.AsyncResult(out.stdout.decode().split()[-1])
    assert again.id != first.id, "the new call was deduplicated onto the revoked task"
    info = locks.get(f"uniq:{name}")
    assert info is not None and info.owner == again.id
    assert wait_event(name) == ["start", again.id]
    open_gate(name)
    assert again.get(timeout=RESULT_WAIT) == "done"
    # The revoked task is discarded at its ETA, never run.
    wait_until(lambda: first.state == "REVOKED", RESULT_WAIT, "the revoked task's REVOKED state")
    events = [e.decode() for e in ca.probe.lrange(f"events:{name}", 0, -1)]
    assert events == [f"end {again.id}"]
    wait_until(lambda: locks.get(f"uniq:{name}") is None, 10, "the release at the end")
