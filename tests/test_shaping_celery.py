"""Rate limits and cooldowns of Celery tasks on a real worker (prefork, 2 processes):
what runs is read from the recorder the task bodies append to (tests/shaping_celery.py)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings

from django_redislock import RunLimited, locks
from django_redislock.celery import SingleInstanceTask, is_skipped
from django_redislock.guards.shaping import shaping_state
from tests import celery_app as ca
from tests import shaping_celery as sc

pytestmark = [pytest.mark.celery, pytest.mark.slow]

#: The scripts score starts and set cooldowns in whole ms (Redis's TIME, floored).
MS_US = 1_000


@pytest.fixture(scope="module")
def worker() -> Iterator[ca.Worker]:
    """One real worker running this module's tasks (broker/results on DBs 1 and 2)."""
    base = settings.REDIS_URL.rsplit("/", 1)[0]
    for db in (1, 2):
        redis.Redis.from_url(f"{base}/{db}").flushdb()
    w = ca.Worker(concurrency=2, app_module="tests.shaping_celery")
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()


def _events(tag: str, expected_starts: int, timeout: float) -> list[tuple[str, int, int]]:
    """The recorder's events once *expected_starts* runs ended (bounded by *timeout*)."""
    deadline = time.monotonic() + timeout
    while True:
        raw = [e.decode().split() for e in ca.probe.lrange(f"rec:{tag}", 0, -1)]
        if sum(1 for e in raw if e[0] == "end") >= expected_starts:
            return [(k, int(t), int(i)) for k, t, i in raw]
        assert time.monotonic() < deadline, f"only {raw} within {timeout} s"
        time.sleep(0.05)


def _admitted(events: list[tuple[str, int, int]]) -> list[tuple[int, int]]:
    """Each start as (latest, earliest) time its admission can have had: its ``start``
    entry, and the last ``pre`` of its call before it; in the order of the starts."""
    before: dict[int, int] = {}
    starts = []
    for kind, t, i in events:
        if kind == "pre":
            before[i] = t
        elif kind == "start":
            starts.append((t, before[i]))
    return sorted(starts)


def test_a_rate_limited_task_defers_refused_starts_and_loses_none(worker: ca.Worker) -> None:
    tag = uuid.uuid4().hex[:8]
    results = [sc.rated.delay(tag, i) for i in range(9)]
    events = _events(tag, 9, timeout=40)
    assert sorted(i for k, _, i in events if k == "start") == list(range(9))  # each ran once
    starts = _admitted(events)
    # No 2 s window holds more than 3 starts: start n+3 admitted >= 2 s after start n.
    gaps = [starts[n + 3][0] - starts[n][1] for n in range(len(starts) - 3)]
    assert min(gaps) >= 2_000_000 - MS_US, gaps
    # The limit is reached: the first window holds 3 starts.
    assert starts[2][0] - starts[0][1] < 2_000_000
    # The deferred messages kept their task ids: each AsyncResult has its value.
    assert sorted(r.get(timeout=30) for r in results) == list(range(9))


def test_a_task_in_its_cooldown_is_deferred_and_runs_after_it(worker: ca.Worker) -> None:
    tag = uuid.uuid4().hex[:8]
    for i in range(3):
        sc.cooled.delay(tag, i)
    events = _events(tag, 3, timeout=40)
    runs = [(k, t) for k, t, _ in events if k != "pre"]
    assert [k for k, _ in runs] == ["start", "end"] * 3, "two runs overlapped"
    times = [t for _, t in runs]
    for n in (1, 3):  # from each end (before the cooldown) to the next start: 1 s
        assert times[n + 1] - times[n] >= 1_000_000 - MS_US, times


def test_a_task_in_its_cooldown_with_on_limited_skip_is_skipped(worker: ca.Worker) -> None:
    tag = uuid.uuid4().hex[:8]
    assert sc.cooled_skip.delay(tag, 1).get(timeout=30) == 1
    skipped = sc.cooled_skip.delay(tag, 2).get(timeout=30)
    assert is_skipped(skipped) and skipped["reason"] == "cooldown"
    assert 25 < skipped["retry_after"] <= 30
    assert [e.split()[0] for e in ca.probe.lrange(f"rec:{tag}", 0, -1)] == [b"start", b"end"]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"lock_cooldown": 5, "lock_limit": 2}, "never overlap"),
        ({"on_limited": "skip"}, "give one of them"),
        ({"lock_rate": "5/m", "on_limited": "later"}, "must be one of"),
        ({"lock_rate": "five a minute"}, "must look like"),
        ({"lock_coalesce": True, "unique_on_enqueue": True}, "drop one"),
        ({"lock_coalesce": True, "lock_rate": "1/s"}, "a rate or a cooldown"),
        ({"lock_coalesce": True, "on_locked": "wait"}, "becomes pending"),
        ({"lock_debounce": 2, "unique_on_enqueue": True}, "drop one"),
        ({"lock_debounce": 2, "lock_cooldown": 5}, "a rate or a cooldown"),
    ],
)
def test_task_class_misuse_is_refused_when_the_class_is_made(
    options: dict[str, object], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        type("Bad", (SingleInstanceTask,), {"run": lambda self: None, **options})


def test_on_limited_raise_fails_the_task_with_run_limited(worker: ca.Worker) -> None:
    tag = uuid.uuid4().hex[:8]
    assert sc.limited_raise.delay(tag, 1).get(timeout=30) == 1
    refused = sc.limited_raise.delay(tag, 2)
    with pytest.raises(RunLimited) as error:
        refused.get(timeout=30)
    assert "already started 1 times" in str(error.value)


def test_on_limited_callable_gives_the_result(worker: ca.Worker) -> None:
    tag = uuid.uuid4().hex[:8]
    assert sc.limited_callable.delay(tag, 1).get(timeout=30) == 1
    assert sc.limited_callable.delay(tag, 2).get(timeout=30) == "refused rate 2"


def test_on_limited_retry_retries_after_the_window(worker: ca.Worker) -> None:
    tag = uuid.uuid4().hex[:8]
    first, second = sc.limited_retry.delay(tag, 1), sc.limited_retry.delay(tag, 2)
    assert sorted([first.get(timeout=30), second.get(timeout=30)]) == [1, 2]
    attempts = [e.decode().split() for e in ca.probe.lrange(f"retries:{tag}", 0, -1)]
    assert attempts[0][1] == "0" and attempts[1][1] != "0"  # the second ran as a retry
    starts = _admitted(_events(tag, 2, timeout=10))
    assert starts[1][0] - starts[0][1] >= 1_500_000 - MS_US


def test_a_deferred_unique_task_keeps_its_key_pending(worker: ca.Worker) -> None:
    tag = uuid.uuid4().hex[:8]
    assert sc.unique_rated.delay(tag, 1).get(timeout=30) == 1
    second = sc.unique_rated.delay(tag, 2)  # runs at once, refused by the rate: deferred
    deadline = time.monotonic() + 30
    while f"[{second.id}] not started" not in worker.log_text():
        assert time.monotonic() < deadline, "the second execution was never refused"
        time.sleep(0.05)
    info = locks.get(f"lu:{tag}")
    assert info is not None and info.owner == second.id  # kept for it, under its task id
    third = sc.unique_rated.delay(tag, 3)  # a duplicate of the pending one: not queued
    assert third.id == second.id
    assert second.get(timeout=30) == 2
    events = _events(tag, 2, timeout=30)
    assert [i for k, _, i in events if k == "start"] == [1, 2]
    starts = _admitted(events)
    assert starts[1][0] - starts[0][1] >= 2_000_000 - MS_US


def test_eager_runs_cannot_be_deferred_so_they_raise() -> None:
    tag = uuid.uuid4().hex[:8]
    assert [sc.rated.apply(args=(tag, i)).get() for i in range(3)] == [0, 1, 2]
    refused = sc.rated.apply(args=(tag, 3))
    with pytest.raises(RunLimited) as error:
        refused.get()
    assert error.value.reason == "rate" and 0 < error.value.retry_after <= 2


def test_shaping_state_of_tasks(worker: ca.Worker) -> None:
    tag = uuid.uuid4().hex[:8]
    assert sc.cooled_skip.delay(tag, 1).get(timeout=30) == 1
    state = shaping_state(sc.cooled_skip, f"cooled:{tag}")
    assert state.count == 0 and 25 < state.cooldown_left <= 30
    assert sc.rated.delay(tag, 1).get(timeout=30) == 1
    state = shaping_state(sc.rated, f"rated:{tag}")
    assert state.count == 1 and 0 < state.window_frees_in <= 2


def _records(tag: str) -> list[list[str]]:
    return [e.decode().split() for e in ca.probe.lrange(f"rec:{tag}", 0, -1)]


def _await(predicate: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.05)


def test_fifty_calls_during_a_run_coalesce_into_one_more_run_with_the_last_arguments(
    worker: ca.Worker,
) -> None:
    tag = uuid.uuid4().hex[:8]
    first = sc.coalesced.delay(tag, 0)
    _await(lambda: len(_records(tag)) == 1, "run 0 never started")
    sweeper = sc.coalesced.delay(tag, 1)  # the pending call's sweeper: sent again, Ignore
    ignored = f"coalesced[{sweeper.id}] ignored"
    _await(lambda: ignored in worker.log_text(full=True), "call 1 never pended")
    for n in range(2, 51):  # one after the other, so the last arguments are known
        assert is_skipped(sc.coalesced.delay(tag, n).get(timeout=20))
    assert shaping_state(sc.coalesced, f"co:{tag}").pending
    # The sweeper comes back while run 0 holds the key: sent again for the lease's end
    # (>= 6.6 s of the 10 s lease), so only the hand-on can start the pending run soon.
    _await(lambda: worker.log_text(full=True).count(ignored) == 2, "no sweeper back", 15)
    ca.probe.rpush(f"gate:{tag}:0", "go")
    assert first.get(timeout=20) == 0
    _await(lambda: len(_records(tag)) >= 4, "the pending run never ran")
    ended, started = int(_records(tag)[1][1]), int(_records(tag)[2][1])
    assert started - ended < 2_000_000, "the pending run waited for the sweeper"
    # The sweeper comes back once more and is dropped: nothing more runs.
    _await(lambda: worker.log_text(full=True).count(ignored) == 3, "no sweeper drop", 15)
    records = _records(tag)
    assert [(r[0], r[2]) for r in records] == [
        ("start", "0"),
        ("end", "0"),
        ("start", "50"),
        ("end", "50"),
    ]
    assert not shaping_state(sc.coalesced, f"co:{tag}").pending


def test_a_pending_call_runs_once_after_the_lease_when_the_running_one_is_killed(
    worker: ca.Worker,
) -> None:
    tag = uuid.uuid4().hex[:8]
    sc.coalesced.delay(tag, 0)
    _await(lambda: len(_records(tag)) == 1, "run 0 never started")
    sc.coalesced.delay(tag, 7)
    pending = f"redislock:pending:{{co:{tag}}}"
    _await(lambda: ca.probe.exists(pending), "call 7 never pended")
    os.kill(int(_records(tag)[0][3]), signal.SIGKILL)  # the pool process running run 0
    _await(lambda: len(_records(tag)) >= 3, "the pending call never ran", timeout=40)
    records = _records(tag)
    assert [(r[0], r[2]) for r in records] == [("start", "0"), ("start", "7"), ("end", "7")]
    ca.probe.rpush(f"gate:{tag}:0", "go")  # nobody waits any more: tidy


def test_a_retired_sweeper_back_while_the_key_is_held_is_dropped(worker: ca.Worker) -> None:
    """Sweeper S1's call was handed on; it comes back while a later run holds the key
    and call 2 pends: S1 is dropped, and the pending run is call 2's, not S1's."""
    tag = uuid.uuid4().hex[:8]
    first = sc.coalesced.delay(tag, 0)
    _await(lambda: len(_records(tag)) == 1, "run 0 never started")
    s1 = sc.coalesced.delay(tag, 1)
    ignored = f"coalesced[{s1.id}] ignored"
    _await(lambda: ignored in worker.log_text(full=True), "call 1 never pended")
    ca.probe.rpush(f"gate:{tag}:0", "go")
    assert first.get(timeout=20) == 0
    _await(lambda: len(_records(tag)) == 4, "call 1's run never ran")  # handed on
    hold = sc.coalesced.delay(tag, 100)
    _await(lambda: len(_records(tag)) == 5, "run 100 never started")
    sc.coalesced.delay(tag, 2)  # pends: the slot's new sweeper
    _await(lambda: ca.probe.exists(f"redislock:pending:{{co:{tag}}}"), "call 2 never pended")
    _await(lambda: worker.log_text(full=True).count(ignored) == 2, "S1 never came back", 15)
    ca.probe.rpush(f"gate:{tag}:100", "go")
    assert hold.get(timeout=20) == 100
    _await(lambda: len(_records(tag)) == 8, "the pending run never ran")
    assert [r[2] for r in _records(tag) if r[0] == "start"] == ["0", "1", "100", "2"]


def test_twenty_calls_100_ms_apart_debounce_into_one_run_a_quiet_second_after_the_last(
    worker: ca.Worker,
) -> None:
    tag = uuid.uuid4().hex[:8]
    last_sent = 0
    for n in range(20):
        if n == 19:
            seconds, micros = ca.probe.time()
            last_sent = int(seconds) * 1_000_000 + int(micros)
        sc.debounced.delay(tag, n)
        time.sleep(0.1)  # the calls' spacing is the scenario, not a wait for an event
    due_in = shaping_state(sc.debounced, f"db:{tag}").debounce_due_in
    assert due_in is not None and 0 < due_in <= 1.0
    events = _events(tag, 1, timeout=30)
    state = f"redislock:debounce:{{db:{tag}}}"
    _await(lambda: ca.probe.hget(state, "timer") is None, "a timer is still pending")
    events = _events(tag, 1, timeout=1)
    assert [(k, i) for k, _, i in events] == [("start", 19), ("end", 19)]
    waited = events[0][1] - last_sent
    assert 1_000_000 - MS_US <= waited < 2_500_000, waited
    assert shaping_state(sc.debounced, f"db:{tag}").debounce_due_in is None
