""" "Latest wins" on real workers that reserve messages ahead of their runs (issue 41,
defect 2): a copy of an old call never runs after a newer one, the last run carries
the latest call's arguments, and every call's ``AsyncResult`` resolves.

* Coalescing on two, then three ``celery worker -c 1`` with Celery's default prefetch
  (4): while run 0 is busy, its worker has reserved some of the 50 calls that follow;
  they must not run after the pending run (the 50th call's) that run 0 hands on.
* Coalescing with ``acks_late``: the worker running call 100 is SIGKILLed, whole;
  newer calls pend meanwhile and the latest (150) is handed on; the broker's copy of
  call 100 (after its visibility timeout, 12 s) must not run or pend after it.
* Debouncing (2 s) on a worker whose broker hands a message out again after 1 s: the
  copies of the timer (call 1's message, waiting for its countdown) must not run the
  stale first call after the due run (call 8's).

What ran is read from the recorder the task bodies append to (tests/shaping_celery.py).
The reserved-calls checker is also run against workers that number a call when they
start it (tests/shaping_faults.py): it must fail there.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.result import AsyncResult

from django_redislock import locks
from django_redislock.celery import is_skipped
from tests import celery_app as ca
from tests import shaping_celery as sc
from tests import shaping_faults
from tests.brokers import needs_prompt_redelivery
from tests.shaping_scenarios import await_, flush_broker, logs, new_tag, records, worker_of

pytestmark = [pytest.mark.celery, pytest.mark.slow]

#: Workers that reserve messages ahead (Celery's default prefetch), one process each;
#: the broker hands an unacknowledged message out again after 12 s.
PREFETCHING = {
    "REDISLOCK_TEST_PREFETCH": "4",
    "REDISLOCK_TEST_VISIBILITY": "12",
    "REDISLOCK_TEST_LOG_LEVEL": "INFO",
}
#: How long any call's AsyncResult may take to resolve once its key settled (s).
RESOLVES = 30


@pytest.fixture(scope="module")
def _pool() -> Iterator[list[ca.Worker]]:
    flush_broker()
    pool: list[ca.Worker] = []
    try:
        yield pool
    finally:
        for w in pool:
            w.stop()


def _workers(pool: list[ca.Worker], count: int, fault: str = "") -> list[ca.Worker]:
    """*count* live prefetching workers (-c 1) on one broker; dead ones are replaced;
    *fault*: with a deliberately broken guard (tests/shaping_faults.py)."""
    env = {**PREFETCHING, shaping_faults.ENV: fault}
    for w in [w for w in pool if w.env != env]:
        w.stop()
    pool[:] = [w for w in pool if w.process.poll() is None and w.env == env]
    while len(pool) > count:
        pool.pop().stop()
    while len(pool) < count:
        name = f"latest{len(pool)}x{time.monotonic_ns() % 10_000}"
        worker = ca.Worker(concurrency=1, name=name, app_module="tests.shaping_celery", env=env)
        pool.append(worker)
        worker.wait_ready()
    for w in pool:
        w.peers = pool
    return pool


def _starts(tag: str) -> list[str]:
    return [r[2] for r in records(tag) if r[0] == "start"]


def _resolved(results: list[AsyncResult]) -> list[Any]:
    """Every result's value, each awaited with a bound (a PENDING-forever one fails)."""
    values = []
    for r in results:
        try:
            values.append(r.get(timeout=RESOLVES))
        except Exception as exc:  # a timeout: the result stayed PENDING
            raise AssertionError(f"call {r.id} never resolved: {exc!r}") from exc
    return values


def _served_by(values: list[Any], run_value: int, name: str) -> None:
    """Each coalesced or debounced call's marker names the run that served it, whose
    own result is *run_value*."""
    for value in values:
        assert is_skipped(value) and value["lock"] == name, value
        assert value["run"], f"the marker names no run: {value}"
        assert AsyncResult(value["run"]).get(timeout=RESOLVES) == run_value, value


def burst_during_a_busy_run(
    workers: list[ca.Worker],
) -> tuple[str, list[Any], list[AsyncResult], bool]:
    """Run 0 of ``coalesced`` holds its key (until its gate); calls 1-50 are sent at
    once; once every call was taken (and call 50 pended, unless run 0's worker reserved
    it) run 0 ends. Returns the tag, run 0's and the calls' results, once the key
    settled (the first pending call's sweeper came back and was dropped), and whether
    call 50 pended before run 0 ended."""
    tag = new_tag()
    first = sc.coalesced.delay(tag, 0)
    await_(lambda: len(records(tag)) == 1, "run 0 never started")
    calls = [sc.coalesced.delay(tag, n) for n in range(1, 51)]
    await_(lambda: _queued() == 0, "the calls were never all taken")  # reserved or run
    exact = _settles(calls[-1].ready, 10)  # call 50 pended (unless the busy worker has it)
    ca.probe.rpush(f"gate:{tag}:0", "go")
    zero = first.get(timeout=RESOLVES)
    dropped = "was the sweeper of a pending call of lock 'co:" + tag
    await_(lambda: dropped in logs(workers), "the sweeper was never dropped", timeout=40)
    await_(lambda: locks.get(f"co:{tag}") is None, "the key never settled")
    return tag, [zero], calls, exact


def check_latest_won(tag: str, zero: list[Any], calls: list[AsyncResult], exact: bool) -> None:
    """Run 0, then (*exact*: call 50 pended before run 0 ended) exactly one more run,
    with the 50th call's arguments, else runs with ever newer arguments, the last the
    50th call's; every call resolved, to a marker that names the run that served it
    (the 50th call's)."""
    starts = [int(n) for n in _starts(tag)]
    if exact:
        assert starts == [0, 50], f"runs {starts}"
    assert starts[0] == 0 and starts[-1] == 50, f"runs {starts}"
    assert starts == sorted(set(starts)), f"a run's arguments went back: {starts}"
    assert [r[0] for r in records(tag)] == ["start", "end"] * len(starts)
    assert zero == [0]
    _served_by(_resolved(calls), 50, f"co:{tag}")


def _queued() -> int:
    """Messages waiting in the broker's queue (not taken by a worker)."""
    return int(redis.Redis.from_url(ca.BROKER_URL).llen("celery"))


def _settles(predicate: Any, timeout: float) -> bool:
    """Whether *predicate* becomes true within *timeout* s (it may not: no failure)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("count", [2, 3])
def test_a_call_reserved_before_a_newer_one_never_runs_after_it(
    _pool: list[ca.Worker], count: int
) -> None:
    check_latest_won(*burst_during_a_busy_run(_workers(_pool, count)))


@needs_prompt_redelivery
def test_a_killed_runs_copy_never_runs_or_pends_after_a_newer_run(
    _pool: list[ca.Worker],
) -> None:
    workers = _workers(_pool, 3)  # one is killed; one runs call 150; one is free
    tag = new_tag()
    name = f"col:{tag}"
    old = sc.coalesced_late.delay(tag, 100)  # acks_late, waits for its gate
    await_(lambda: len(records(tag)) == 1, "call 100 never started")
    doomed = worker_of(int(records(tag)[0][3]), workers)
    doomed.kill()  # nothing releases the lock (5 s lease), nothing is acknowledged
    survivors = [w for w in workers if w is not doomed]
    newer = [sc.coalesced_late.delay(tag, n) for n in (1, 2, 3, 4, 150)]  # they pend
    # The first pending call's sweeper comes back at the lease's end and hands 150 on.
    await_(lambda: "150" in _starts(tag), "call 150 never ran", timeout=30)
    # The broker hands call 100's message out again (visibility 12 s) while 150 runs.
    received = f"coalesced_late[{old.id}] received"
    await_(lambda: received in logs(survivors), "call 100 never came back", timeout=40)
    _settles(lambda: old.ready() or f"[{old.id}] ignored" in logs(survivors), 5)
    ca.probe.rpush(f"gate:{tag}:150", "go")
    ca.probe.rpush(f"gate:{tag}:100", "go")  # a stale run of call 100 does not wait
    await_(lambda: any(r[0] == "end" and r[2] == "150" for r in records(tag)), "150 never ended")
    pending = f"redislock:pending:{{{name}}}"
    settled = lambda: locks.get(name) is None and not ca.probe.exists(pending)  # noqa: E731
    await_(settled, "the key never settled", timeout=40)
    runs = [(r[0], r[2]) for r in records(tag)]
    assert runs == [("start", "100"), ("start", "150"), ("end", "150")], runs
    _served_by(_resolved([old, *newer]), 150, name)


def test_the_latest_checker_fails_when_calls_are_numbered_at_their_start(
    _pool: list[ca.Worker],
) -> None:
    """The reserved-calls scenario against workers that number a call when they start
    it (a deliberate fault, the order before the numbering): the checker fails."""
    workers = _workers(_pool, 2, fault="calls-numbered-at-start")
    with pytest.raises(AssertionError, match="runs|went back"):
        check_latest_won(*burst_during_a_busy_run(workers))


@pytest.fixture(scope="module")
def hasty() -> Iterator[ca.Worker]:
    """A worker whose broker hands an unacknowledged message out again after 1 s: a
    countdown of 2 s (the debounce timer) comes back more than once."""
    env = {"REDISLOCK_TEST_VISIBILITY": "1", "REDISLOCK_TEST_LOG_LEVEL": "INFO"}
    flush_broker()
    worker = ca.Worker(concurrency=2, name="hasty", app_module="tests.shaping_celery", env=env)
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()


@needs_prompt_redelivery
def test_copies_of_the_debounce_timer_never_run_the_stale_first_call(
    _pool: list[ca.Worker], hasty: ca.Worker
) -> None:
    for w in _pool:  # only the hasty worker consumes this test's messages
        w.stop()
    _pool.clear()
    tag = new_tag()
    calls = []
    for n in range(1, 9):
        calls.append(sc.debounced_two.delay(tag, n))
        time.sleep(0.1)  # the calls' spacing is the scenario, not a wait for an event
    await_(lambda: "8" in _starts(tag), "call 8 never ran", timeout=30)
    # The timer's copies come back (each at its countdown, then every second while a
    # worker holds them unacknowledged): every one is settled within a few seconds of
    # the due run. Watch for 8 s (four quiet periods) that nothing else starts.
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and _starts(tag) == ["8"]:
        time.sleep(0.1)
    assert _starts(tag) == ["8"], f"runs {_starts(tag)}"
    _served_by(_resolved(calls), 8, f"db2:{tag}")
