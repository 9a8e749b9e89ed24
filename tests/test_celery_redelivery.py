"""Celery on real workers (prefork, threads, solo) whose broker redelivers fast: a
redelivered copy of a running message (same task id) never runs beside it, a
redelivery after a SIGKILLed worker still runs, and a task that locks its own guard's
name does not deadlock.

The worker's broker has a 2 s visibility timeout and looks for unacknowledged messages
every second (``REDISLOCK_TEST_VISIBILITY``, see tests/celery_app.py), so a task with
``acks_late=True`` that runs 6 s is handed out again while it runs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from kombu.transport.redis import Channel

from django_redislock import locks
from tests import celery_app as ca

pytestmark = [pytest.mark.celery, pytest.mark.slow]

VISIBILITY = "2"
QUEUE = "redeliver"


def _flush_broker() -> None:
    base = settings.REDIS_URL.rsplit("/", 1)[0]
    for db in (1, 2):
        redis.Redis.from_url(f"{base}/{db}").flushdb()


def _worker(name: str, pool: str = "prefork") -> ca.Worker:
    return ca.Worker(
        concurrency=2,
        pool=pool,
        name=name,
        queues=QUEUE,
        env={"REDISLOCK_TEST_VISIBILITY": VISIBILITY},
    )


#: These tests need the broker to hand an unacknowledged message out again within
#: a few seconds. kombu before the ``unacked_restore_interval`` transport option
#: (the oldest cell's kombu 5.3) looks for such messages on a fixed cadence of up to
#: about 100 s, so the redelivery would not come while the task runs.
needs_prompt_redelivery = pytest.mark.skipif(
    not hasattr(Channel, "unacked_restore_interval"),
    reason="this kombu cannot redeliver within seconds (no unacked_restore_interval)",
)


@pytest.fixture(params=["prefork", "threads", "solo"])
def worker(request: pytest.FixtureRequest) -> Iterator[ca.Worker]:
    """A worker on each pool. A solo worker runs one task at a time, so a redelivered
    copy can only overlap the first on another worker: with solo, a second solo worker
    consumes the same queue (how solo pools are scaled)."""
    _flush_broker()
    workers = [_worker("redeliver", request.param)]
    if request.param == "solo":
        workers.append(_worker("redeliver-2", "solo"))
    try:
        for w in workers:
            w.wait_ready()
        yield workers[0]
    finally:
        for w in workers:
            w.stop()


def _events(tag: str, timeout: float) -> list[str]:
    got = ca.probe.blpop([f"events:{tag}"], timeout=timeout)
    assert got is not None, f"no event on events:{tag} within {timeout} s"
    return got[1].decode().split()


@needs_prompt_redelivery
def test_a_redelivered_copy_never_runs_beside_the_running_one(worker: ca.Worker, name: str) -> None:
    result = ca.long_acks_late.apply_async((name, 6.0), queue=QUEUE)
    start = _events(name, 20)
    assert start[:2] == ["start", result.id]
    # Within the 6 s run the broker hands the same message out again (same task id).
    duplicate = _events(name, 10)
    assert duplicate == ["duplicate", result.id], "the redelivery ran its body"
    end = _events(name, 15)
    assert end[:2] == ["end", result.id]
    # Only one execution ran the body (later redeliveries, if any, were turned away too).
    rest = [e.decode().split() for e in ca.probe.lrange(f"events:{name}", 0, -1)]
    assert all(e[0] == "duplicate" for e in rest), rest
    lock = locks.get(f"redeliver:{name}")
    assert lock is None or lock.task_id == result.id


@needs_prompt_redelivery
def test_a_redelivery_after_the_worker_was_killed_still_runs(name: str) -> None:
    _flush_broker()
    first = _worker("doomed")
    try:
        first.wait_ready()
        result = ca.long_acks_late.apply_async((name, 30.0), queue=QUEUE)
        start = _events(name, 20)
        assert start[:2] == ["start", result.id]
        first.kill()  # the whole worker: nobody releases the lock, nothing is acked
    finally:
        first.stop()
    second = _worker("survivor")
    try:
        second.wait_ready()
        # The dead execution's 2 s lease runs out; the redelivered message then runs.
        again = _events(name, 30)
        assert again[:2] == ["start", result.id], again
        assert int(again[2]) != int(start[2])  # another process
        info = locks.get(f"redeliver:{name}")
        assert info is not None and info.task_id == result.id
        assert info.owner != f"{result.id}" and info.pid == int(again[2])
        ca.app.control.revoke(result.id, terminate=True)
    finally:
        second.stop()


def test_a_task_that_locks_its_own_guard_name_finishes(worker: ca.Worker, name: str) -> None:
    result = ca.locks_itself.apply_async((7, name), queue=QUEUE)
    # It re-entered its own lock (same owner, one more hold) instead of waiting for it.
    assert _events(name, 20) == ["inside", "True", "2"]
    # The function guarded by the same name re-entered it as well.
    assert result.get(timeout=20) == 2
    assert locks.get("selflock:7") is None
