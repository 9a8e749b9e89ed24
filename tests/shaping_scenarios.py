"""The shaping scenarios of Celery tasks on real workers, and the checkers of their
invariants, shared by tests/test_shaping_celery.py (one worker), tests/test_shaping_workers.py
(two workers, a SIGKILL) and tests/test_shaping_celery_faults.py (a deliberately
broken guard, on which every checker must fail).

A scenario drives the tasks of tests/shaping_celery.py and returns what the recorder
(the Redis list ``rec:<tag>`` the task bodies append to, outside the guard) holds once
it settled; a checker raises AssertionError when an invariant does not hold. Every
wait is bounded.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import redis
from celery.result import AsyncResult
from django.conf import settings

from django_redislock.celery import is_skipped
from django_redislock.guards.shaping import shaping_state
from tests import celery_app as ca
from tests import shaping_celery as sc
from tests import shaping_faults

#: The scripts score starts and set cooldowns in whole ms (Redis's TIME, floored).
MS_US = 1_000

Event = tuple[str, int, int]


def new_tag() -> str:
    """A tag unique to one scenario (its keys and its recorder)."""
    return uuid.uuid4().hex[:8]


def await_(predicate: Callable[[], object], what: str, timeout: float = 30) -> None:
    """Return once *predicate* is true; fail with "*what* within *timeout* s" after."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.05)


def records(tag: str) -> list[list[str]]:
    """The recorder's entries: ``[kind, µs, n, pid]`` (coalesced tasks)."""
    return [e.decode().split() for e in ca.probe.lrange(f"rec:{tag}", 0, -1)]


def events(tag: str, expected_starts: int, timeout: float) -> list[Event]:
    """The recorder's events once *expected_starts* runs ended (bounded by *timeout*)."""
    deadline = time.monotonic() + timeout
    while True:
        raw = [e.decode().split() for e in ca.probe.lrange(f"rec:{tag}", 0, -1)]
        if sum(1 for e in raw if e[0] == "end") >= expected_starts:
            return [(k, int(t), int(i)) for k, t, i in raw]
        assert time.monotonic() < deadline, f"only {raw} within {timeout} s"
        time.sleep(0.05)


def admitted(found: list[Event]) -> list[tuple[int, int]]:
    """Each start as (latest, earliest) time its admission can have had: its ``start``
    entry, and the last ``pre`` of its call before it; in the order of the starts."""
    before: dict[int, int] = {}
    starts = []
    for kind, t, i in found:
        if kind == "pre":
            before[i] = t
        elif kind == "start":
            starts.append((t, before[i]))
    return sorted(starts)


def logs(workers: Sequence[ca.Worker]) -> str:
    """All the workers' logs so far."""
    return "".join(w.log_text(full=True) for w in workers)


# -- rate and cooldown ----------------------------------------------------------------


def nine_rated_calls() -> tuple[list[Event], list[int]]:
    """9 calls of ``rated`` (3 starts per 2 s, refused ones deferred) at once: the
    recorder's events once 9 runs ended, and the calls' results."""
    tag = new_tag()
    results = [sc.rated.delay(tag, i) for i in range(9)]
    found = events(tag, 9, timeout=40)
    return found, [r.get(timeout=30) for r in results]


def check_rated(found: list[Event], results: list[int]) -> None:
    """Each call ran once, no 2 s window held more than 3 starts, the limit was reached,
    and each deferred message kept its task id (each AsyncResult has its value)."""
    assert sorted(i for k, _, i in found if k == "start") == list(range(9))
    starts = admitted(found)
    # No 2 s window holds more than 3 starts: start n+3 admitted >= 2 s after start n.
    gaps = [starts[n + 3][0] - starts[n][1] for n in range(len(starts) - 3)]
    assert min(gaps) >= 2_000_000 - MS_US, f"4 starts within {min(gaps)} µs"
    assert starts[2][0] - starts[0][1] < 2_000_000, "the first window held fewer than 3"
    assert sorted(results) == list(range(9))


def three_cooled_calls() -> list[Event]:
    """3 calls of ``cooled`` (runs 0.1 s, then a 1 s cooldown; deferred) at once."""
    tag = new_tag()
    for i in range(3):
        sc.cooled.delay(tag, i)
    return events(tag, 3, timeout=40)


def check_cooled(found: list[Event]) -> None:
    """Runs never overlapped, and from each end to the next start the cooldown passed."""
    runs = [(k, t) for k, t, _ in found if k != "pre"]
    assert [k for k, _ in runs] == ["start", "end"] * 3, "two runs overlapped"
    times = [t for _, t in runs]
    for n in (1, 3):  # from each end (before the cooldown) to the next start: 1 s
        assert times[n + 1] - times[n] >= 1_000_000 - MS_US, f"cooled {times[n + 1] - times[n]}"


# -- coalescing -----------------------------------------------------------------------


class Held(NamedTuple):
    """Run 0 holding its key, and call 1 pending (:func:`run_zero_and_a_sweeper`)."""

    tag: str
    #: Run 0's result.
    first: AsyncResult
    #: Call 1's task id: the pending call's sweeper.
    sweeper: str
    #: The log line of each time the sweeper's message ends ignored.
    ignored: str


def run_zero_and_a_sweeper(workers: Sequence[ca.Worker]) -> Held:
    """Run 0 of ``coalesced`` holds its key (until ``gate:<tag>:0``) and call 1 pends:
    its sweeper, sent again (Ignore)."""
    tag = new_tag()
    first = sc.coalesced.delay(tag, 0)
    await_(lambda: len(records(tag)) == 1, "run 0 never started")
    sweeper = sc.coalesced.delay(tag, 1)
    ignored = f"coalesced[{sweeper.id}] ignored"
    await_(lambda: ignored in logs(workers), "call 1 never pended")
    return Held(tag, first, sweeper.id, ignored)


def fifty_calls_during_a_run(
    workers: Sequence[ca.Worker], sweeper_back: bool = True
) -> tuple[str, list[list[str]]]:
    """Run 0 of ``coalesced`` holds its key; calls 1-50 arrive one after the other (so
    the last is known), each taken by whichever worker's free process is first; once
    call 1's sweeper came back (the key still held; not waited for when not
    *sweeper_back*), run 0 ends. Returns the tag and the recorder's entries once the
    sweeper came back again (and was dropped)."""
    tag, first, _, ignored = run_zero_and_a_sweeper(workers)
    for n in range(2, 51):
        assert is_skipped(sc.coalesced.delay(tag, n).get(timeout=20))
    assert shaping_state(sc.coalesced, f"co:{tag}").pending
    # The sweeper comes back while run 0 holds the key: sent again for the lease's end
    # (>= 6.6 s of the 10 s lease), so only the hand-on can start the pending run soon.
    if sweeper_back:
        await_(lambda: logs(workers).count(ignored) == 2, "no sweeper back", 15)
    ca.probe.rpush(f"gate:{tag}:0", "go")
    assert first.get(timeout=20) == 0
    await_(lambda: len(records(tag)) >= 4, "the pending run never ran")
    # The sweeper comes back once more and is dropped: by then any other run ran.
    await_(lambda: logs(workers).count(ignored) == 2 + sweeper_back, "no sweeper drop", 15)
    return tag, records(tag)


def check_one_more_run(found: list[list[str]], last: str) -> None:
    """Run 0, then exactly one more run, with the *last* call's arguments, started at
    once when run 0 ended (handed on, not found later by the sweeper)."""
    runs = [(r[0], r[2]) for r in found]
    assert runs == [("start", "0"), ("end", "0"), ("start", last), ("end", last)], runs
    ended, started = int(found[1][1]), int(found[2][1])
    assert started - ended < 2_000_000, "the pending run waited for the sweeper"


# -- two workers, a SIGKILL (tests/test_shaping_workers.py) ------------------------------


#: The broker's visibility timeout of the two-worker scenarios: short, so the killed
#: run's message comes back soon, and longer than the sweepers' countdowns (the
#: leases), so that a message waiting for its countdown is not handed out twice (its
#: copies would be dropped, but the scenarios count the sweepers' log lines).
VISIBILITY = "12"
#: The two workers' environment: the broker's visibility timeout, our INFO log lines.
WORKER_ENV = {"REDISLOCK_TEST_VISIBILITY": VISIBILITY, "REDISLOCK_TEST_LOG_LEVEL": "INFO"}


def worker_pair(fault: str = "") -> list[ca.Worker]:
    """Two workers (not yet ready) on a flushed broker; *fault*: a broken guard."""
    flush_broker()
    env = {**WORKER_ENV, shaping_faults.ENV: fault}
    tag = "broken" if fault else "shaping"
    pair = [
        ca.Worker(concurrency=2, name=f"{tag}{i}", app_module="tests.shaping_celery", env=env)
        for i in (1, 2)
    ]
    for w in pair:
        w.peers = pair
    return pair


def flush_broker() -> None:
    """Empty the broker and the results (databases 1 and 2): no message of another
    module's scenario reaches this module's workers."""
    base = settings.REDIS_URL.rsplit("/", 1)[0]
    for db in (1, 2):
        redis.Redis.from_url(f"{base}/{db}").flushdb()


@contextmanager
def started(*workers: ca.Worker) -> Iterator[list[ca.Worker]]:
    """*workers*, once they answer a ping; stopped at the end (even one not ready)."""
    running = list(workers)
    try:
        for w in running:
            w.wait_ready()
        yield running
    finally:
        for w in running:
            w.stop()


def worker_of(pid: int, pair: list[ca.Worker]) -> ca.Worker:
    """The worker whose pool process *pid* is (its process group is the worker's)."""
    group = os.getpgid(pid)
    (worker,) = [w for w in pair if w.process.pid == group]
    return worker


def pending_run_killed(pair: list[ca.Worker]) -> tuple[list[list[str]], int]:
    """Run 0 of ``coalesced_late`` holds its key; calls 1-20, then 150 (the last, whose
    run waits for its gate) pend; run 0 ends; the worker running the pending run is
    SIGKILLed, whole. Returns the recorder's entries once the broker's copy of the
    killed run was settled by the other worker (ran, or was dropped), and when the kill
    happened (Redis's clock, µs)."""
    tag = new_tag()
    first = sc.coalesced_late.delay(tag, 0)
    await_(lambda: len(records(tag)) == 1, "run 0 never started")
    sweeper = sc.coalesced_late.delay(tag, 1)
    await_(lambda: ca.probe.exists(f"redislock:pending:{{col:{tag}}}"), "call 1 never pended")
    for n in [*range(2, 21), 150]:
        assert is_skipped(sc.coalesced_late.delay(tag, n).get(timeout=20))
    ca.probe.rpush(f"gate:{tag}:0", "go")
    assert first.get(timeout=20) == 0
    await_(lambda: len(records(tag)) == 3, "the pending run never started")
    pid, task_id = int(records(tag)[2][3]), records(tag)[2][4]
    doomed = worker_of(pid, pair)
    doomed.kill()  # the whole worker: nothing releases the lock, nothing is acknowledged
    seconds, micros = ca.probe.time()
    killed = int(seconds) * 1_000_000 + int(micros)
    (survivor,) = [w for w in pair if w is not doomed]

    def settled() -> bool:
        ran = any(r[0] == "start" and r[4] == task_id for r in records(tag)[3:])
        return ran or f"coalesced_late[{task_id}] ignored" in survivor.log_text(full=True)

    await_(settled, "the killed run's message never came back", timeout=40)
    ca.probe.rpush(f"gate:{tag}:150", "go")
    if len(records(tag)) > 3:
        await_(lambda: records(tag)[-1][0] == "end", "the run never ended", timeout=20)
    # The retired sweeper (call 1) comes back and is dropped; nothing else runs.
    dropped = f"coalesced_late[{sweeper.id}] was the sweeper"
    await_(lambda: dropped in logs(pair), "the sweeper was never dropped", timeout=30)
    return records(tag), killed


def check_killed_pending_run_ran_once_more(found: list[list[str]], killed: int) -> None:
    """Run 0; the pending run with the last arguments (150), killed; the same run once
    more, in another process, after the kill (never beside it), to its end."""
    runs = [(r[0], r[2]) for r in found]
    assert runs == [
        ("start", "0"),
        ("end", "0"),
        ("start", "150"),
        ("start", "150"),
        ("end", "150"),
    ], runs
    assert found[2][4] == found[3][4], "another task ran, not the killed run's message"
    assert found[3][3] != found[2][3] and int(found[3][1]) > killed


# -- debouncing -----------------------------------------------------------------------


def twenty_calls_100_ms_apart() -> tuple[str, list[Event], int, float | None]:
    """20 calls of ``debounced`` (1 s) 100 ms apart: the tag, the recorder's events once
    no timer is pending, when the last call was sent (Redis's clock, µs), and the run's
    ``debounce_due_in`` read right after the calls."""
    tag = new_tag()
    last_sent = 0
    for n in range(20):
        if n == 19:
            seconds, micros = ca.probe.time()
            last_sent = int(seconds) * 1_000_000 + int(micros)
        sc.debounced.delay(tag, n)
        time.sleep(0.1)  # the calls' spacing is the scenario, not a wait for an event
    due_in = shaping_state(sc.debounced, f"db:{tag}").debounce_due_in
    events(tag, 1, timeout=30)
    state = f"redislock:debounce:{{db:{tag}}}"
    await_(lambda: ca.probe.hget(state, "timer") is None, "a timer is still pending")
    return tag, events(tag, 1, timeout=1), last_sent, due_in


def check_debounced(found: list[Event], last_sent: int) -> None:
    """One run, with the last call's arguments, a quiet second after the last call."""
    assert [(k, i) for k, _, i in found] == [("start", 19), ("end", 19)], found
    waited = found[0][1] - last_sent
    assert 1_000_000 - MS_US <= waited < 2_500_000, f"ran {waited} µs after the last call"
