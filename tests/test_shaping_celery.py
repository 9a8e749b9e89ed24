"""Rate limits and cooldowns of Celery tasks on a real worker (prefork, 2 processes):
what runs is read from the recorder the task bodies append to (tests/shaping_celery.py)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from django_redislock import RunLimited, locks
from django_redislock.celery import SingleInstanceTask, is_skipped
from django_redislock.guards.shaping import shaping_state
from tests import celery_app as ca
from tests import shaping_celery as sc
from tests.shaping_scenarios import (
    MS_US,
    admitted,
    await_,
    check_cooled,
    check_debounced,
    check_one_more_run,
    check_rated,
    events,
    fifty_calls_during_a_run,
    flush_broker,
    new_tag,
    nine_rated_calls,
    records,
    run_zero_and_a_sweeper,
    started,
    three_cooled_calls,
    twenty_calls_100_ms_apart,
)

pytestmark = [pytest.mark.celery, pytest.mark.slow]


@pytest.fixture(scope="module")
def worker() -> Iterator[ca.Worker]:
    """One real worker running this module's tasks (broker/results on DBs 1 and 2)."""
    flush_broker()
    with started(ca.Worker(concurrency=2, app_module="tests.shaping_celery")) as (w,):
        yield w


def test_a_rate_limited_task_defers_refused_starts_and_loses_none(worker: ca.Worker) -> None:
    check_rated(*nine_rated_calls())


def test_a_task_in_its_cooldown_is_deferred_and_runs_after_it(worker: ca.Worker) -> None:
    check_cooled(three_cooled_calls())


def test_a_task_in_its_cooldown_with_on_limited_skip_is_skipped(worker: ca.Worker) -> None:
    tag = new_tag()
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
    tag = new_tag()
    assert sc.limited_raise.delay(tag, 1).get(timeout=30) == 1
    refused = sc.limited_raise.delay(tag, 2)
    with pytest.raises(RunLimited) as error:
        refused.get(timeout=30)
    assert "already started 1 times" in str(error.value)


def test_on_limited_callable_gives_the_result(worker: ca.Worker) -> None:
    tag = new_tag()
    assert sc.limited_callable.delay(tag, 1).get(timeout=30) == 1
    assert sc.limited_callable.delay(tag, 2).get(timeout=30) == "refused rate 2"


def test_on_limited_retry_retries_after_the_window(worker: ca.Worker) -> None:
    tag = new_tag()
    first, second = sc.limited_retry.delay(tag, 1), sc.limited_retry.delay(tag, 2)
    assert sorted([first.get(timeout=30), second.get(timeout=30)]) == [1, 2]
    attempts = [e.decode().split() for e in ca.probe.lrange(f"retries:{tag}", 0, -1)]
    assert attempts[0][1] == "0" and attempts[1][1] != "0"  # the second ran as a retry
    starts = admitted(events(tag, 2, timeout=10))
    assert starts[1][0] - starts[0][1] >= 1_500_000 - MS_US


def test_a_deferred_unique_task_keeps_its_key_pending(worker: ca.Worker) -> None:
    tag = new_tag()
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
    found = events(tag, 2, timeout=30)
    assert [i for k, _, i in found if k == "start"] == [1, 2]
    starts = admitted(found)
    assert starts[1][0] - starts[0][1] >= 2_000_000 - MS_US


def test_eager_runs_cannot_be_deferred_so_they_raise() -> None:
    tag = new_tag()
    assert [sc.rated.apply(args=(tag, i)).get() for i in range(3)] == [0, 1, 2]
    refused = sc.rated.apply(args=(tag, 3))
    with pytest.raises(RunLimited) as error:
        refused.get()
    assert error.value.reason == "rate" and 0 < error.value.retry_after <= 2


def test_shaping_state_of_tasks(worker: ca.Worker) -> None:
    tag = new_tag()
    assert sc.cooled_skip.delay(tag, 1).get(timeout=30) == 1
    state = shaping_state(sc.cooled_skip, f"cooled:{tag}")
    assert state.count == 0 and 25 < state.cooldown_left <= 30
    assert sc.rated.delay(tag, 1).get(timeout=30) == 1
    state = shaping_state(sc.rated, f"rated:{tag}")
    assert state.count == 1 and 0 < state.window_frees_in <= 2


def test_fifty_calls_during_a_run_coalesce_into_one_more_run_with_the_last_arguments(
    worker: ca.Worker,
) -> None:
    tag, found = fifty_calls_during_a_run([worker])
    check_one_more_run(found, "50")  # it fails when the hand-on is removed
    assert not shaping_state(sc.coalesced, f"co:{tag}").pending


def test_a_pending_call_runs_once_after_the_lease_when_the_running_one_is_killed(
    worker: ca.Worker,
) -> None:
    tag = new_tag()
    sc.coalesced.delay(tag, 0)
    await_(lambda: len(records(tag)) == 1, "run 0 never started")
    sc.coalesced.delay(tag, 7)
    pending = f"redislock:pending:{{co:{tag}}}"
    await_(lambda: ca.probe.exists(pending), "call 7 never pended")
    os.kill(int(records(tag)[0][3]), signal.SIGKILL)  # the pool process running run 0
    await_(lambda: len(records(tag)) >= 3, "the pending call never ran", timeout=40)
    found = records(tag)
    assert [(r[0], r[2]) for r in found] == [("start", "0"), ("start", "7"), ("end", "7")]
    ca.probe.rpush(f"gate:{tag}:0", "go")  # nobody waits any more: tidy


def test_a_retired_sweeper_back_while_the_key_is_held_is_dropped(worker: ca.Worker) -> None:
    """Sweeper S1's call was handed on; it comes back while a later run holds the key
    and call 2 pends: S1 is dropped, and the pending run is call 2's, not S1's."""
    tag, first, _, ignored = run_zero_and_a_sweeper([worker])  # S1: call 1's sweeper
    ca.probe.rpush(f"gate:{tag}:0", "go")
    assert first.get(timeout=20) == 0
    await_(lambda: len(records(tag)) == 4, "call 1's run never ran")  # handed on
    hold = sc.coalesced.delay(tag, 100)
    await_(lambda: len(records(tag)) == 5, "run 100 never started")
    sc.coalesced.delay(tag, 2)  # pends: the slot's new sweeper
    await_(lambda: ca.probe.exists(f"redislock:pending:{{co:{tag}}}"), "call 2 never pended")
    await_(lambda: worker.log_text(full=True).count(ignored) == 2, "S1 never came back", 15)
    ca.probe.rpush(f"gate:{tag}:100", "go")
    assert hold.get(timeout=20) == 100
    await_(lambda: len(records(tag)) == 8, "the pending run never ran")
    assert [r[2] for r in records(tag) if r[0] == "start"] == ["0", "1", "100", "2"]


def test_twenty_calls_100_ms_apart_debounce_into_one_run_a_quiet_second_after_the_last(
    worker: ca.Worker,
) -> None:
    tag, found, last_sent, due_in = twenty_calls_100_ms_apart()
    assert due_in is not None and 0 < due_in <= 1.0
    check_debounced(found, last_sent)
    assert shaping_state(sc.debounced, f"db:{tag}").debounce_due_in is None


def test_every_copy_of_a_retired_sweeper_is_dropped(worker: ca.Worker) -> None:
    """A broker may hand a sweeper's message out twice (``acks_late`` and a worker
    killed between its re-send and its ack; a countdown longer than the Redis
    transport's visibility timeout). Once its call was handed on, every copy is
    dropped: none runs, or makes pending, its stale call."""
    tag, first, sweeper, ignored = run_zero_and_a_sweeper([worker])
    assert is_skipped(sc.coalesced.delay(tag, 50).get(timeout=20))
    sc.coalesced.apply_async((tag, 1), task_id=sweeper, countdown=2)  # the copy
    ca.probe.rpush(f"gate:{tag}:0", "go")
    assert first.get(timeout=20) == 0
    # The copy comes back in 2 s, the sweeper's own message at its lease's end (<= 10 s).

    def settled() -> bool:
        stale = any(r[0] == "start" and r[2] == "1" for r in records(tag))
        return stale or worker.log_text(full=True).count(ignored) == 3

    await_(settled, "the sweeper and its copy never came back", timeout=20)
    check_one_more_run(records(tag), "50")
