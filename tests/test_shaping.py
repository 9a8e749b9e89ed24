"""Rate limits and cooldowns per key (``@single_instance(rate=..., cooldown=...)``) on
plain functions (sync and async), views and across processes, on the real Redis.

Invariants are read from a recorder outside the guard: the bodies append their
start and end times (Redis's clock) to a Redis list.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client
from django.urls import path

from django_redislock import LockManager, LockNotAcquired, RunLimited, single_instance
from django_redislock.engine.lua.mutex import release_script
from django_redislock.guards.shaping import ShapingUnsupported, parse_rate, shaping_state
from django_redislock.signals import lock_released
from tests import shaping_faults
from tests.redis_server import RedisServer

pytestmark = pytest.mark.urls(__name__)

ROOT = Path(__file__).resolve().parent.parent


def now_us(r: redis.Redis) -> int:
    """Redis's clock in µs (what the scripts decide by)."""
    s, us = r.time()
    return int(s) * 1_000_000 + int(us)


# -- plain functions ------------------------------------------------------------


def test_rate_admits_n_starts_per_window_then_refuses_until_the_oldest_leaves(
    name: str,
) -> None:
    ran: list[int] = []

    @single_instance(name, rate=(3, 1.0))
    def work(i: int) -> int:
        ran.append(i)
        return i

    assert [work(i) for i in range(3)] == [0, 1, 2]
    with pytest.raises(RunLimited) as refused:
        work(3)
    assert refused.value.reason == "rate"
    assert refused.value.name == name
    assert 0 < refused.value.retry_after <= 1.0
    assert "already started 3 times in the last 1 s" in str(refused.value)
    assert isinstance(refused.value, LockNotAcquired)
    assert ran == [0, 1, 2]
    time.sleep(refused.value.retry_after + 0.01)  # the oldest start leaves the window
    assert work(4) == 4
    assert ran == [0, 1, 2, 4]


def test_a_refused_start_gives_the_lock_back_and_counts_nothing(name: str) -> None:
    @single_instance(name, rate="1/m")
    def work() -> str:
        return "ran"

    assert work() == "ran"
    for _ in range(5):
        with pytest.raises(RunLimited):
            work()
    config = work._redislock_config  # type: ignore[attr-defined]
    assert config.lock_manager().get(name) is None  # never left held
    state = shaping_state(work, name)
    assert state.count == 1 and 59 < state.window_frees_in <= 60


def test_on_limited_skip_value_and_callable(name: str) -> None:
    @single_instance(name, rate="1/h", on_limited="skip")
    def skipped() -> str:
        return "ran"

    @single_instance(name + "v", rate="1/h", on_limited={"busy": True})
    def valued() -> str:
        return "ran"

    seen: list[Any] = []

    @single_instance(name + "c", rate="1/h", on_limited=lambda r, x: seen.append((r, x)) or x)
    def called(x: int) -> int:
        return -x

    assert skipped() == "ran" and skipped() is None
    assert valued() == "ran" and valued() == {"busy": True}
    assert called(1) == -1 and called(2) == 2
    assert seen[0][0].reason == "rate" and seen[0][1] == 2


def test_keys_are_per_rendered_name(name: str) -> None:
    @single_instance(name + ":{k}", rate="1/h")
    def work(k: int) -> int:
        return k

    assert work(1) == 1 and work(2) == 2
    with pytest.raises(RunLimited):
        work(1)


def test_async_functions_share_the_decision(name: str) -> None:
    @single_instance(name, rate=(2, 60))
    async def work() -> str:
        return "ran"

    async def main() -> list[Any]:
        out: list[Any] = []
        for _ in range(3):
            try:
                out.append(await work())
            except RunLimited as refused:
                out.append(refused.reason)
        return out

    assert asyncio.run(main()) == ["ran", "ran", "rate"]


def test_rate_with_a_concurrency_limit_bounds_both(name: str) -> None:
    """limit=2 lets two run at once; rate=(3, 60) still admits only 3 starts."""
    inside = threading.Barrier(3, timeout=10)
    leave = threading.Event()
    outcomes: list[str] = []

    @single_instance(name, limit=2, rate=(3, 60))
    def work(wait: bool) -> None:
        if wait:
            inside.wait()  # two runs at once, with the test
            assert leave.wait(10)
        outcomes.append("ran")

    runners = [threading.Thread(target=work, args=(True,)) for _ in range(2)]
    for t in runners:
        t.start()
    inside.wait()  # both hold a place now
    with pytest.raises(LockNotAcquired) as full:
        work(False)  # every place taken: on_locked's refusal, not the rate's
    assert not isinstance(full.value, RunLimited)
    leave.set()
    for t in runners:
        t.join(10)
    work(False)  # the third start
    with pytest.raises(RunLimited):
        work(False)
    assert outcomes == ["ran"] * 3


def test_async_cooldown_refuses_and_the_lock_is_free(name: str) -> None:
    @single_instance(name, cooldown=30)
    async def work() -> str:
        return "ran"

    async def main() -> tuple[str, str]:
        first = await work()
        try:
            await work()
        except RunLimited as refused:
            return first, refused.reason
        return first, "ran twice"

    assert asyncio.run(main()) == ("ran", "cooldown")
    assert work._redislock_config.lock_manager().get(name) is None  # type: ignore[attr-defined]


def test_cooldown_refuses_until_it_ends_then_admits(name: str, redis_client: redis.Redis) -> None:
    @single_instance(name, cooldown=0.4)
    def work() -> str:
        return "ran"

    assert work() == "ran"
    ended = now_us(redis_client)
    with pytest.raises(RunLimited) as refused:
        work()
    assert refused.value.reason == "cooldown"
    assert 0.2 < refused.value.retry_after <= 0.4
    time.sleep(refused.value.retry_after + 0.01)
    assert work() == "ran"
    assert now_us(redis_client) - ended >= 400_000


def test_cooldown_starts_when_the_run_ends_even_when_it_raises(name: str) -> None:
    @single_instance(name, cooldown=30)
    def work(fail: bool) -> None:
        if fail:
            raise KeyError("boom")

    with pytest.raises(KeyError):
        work(True)
    with pytest.raises(RunLimited) as refused:
        work(False)
    assert refused.value.reason == "cooldown" and refused.value.retry_after > 29


@pytest.mark.parametrize("cool_unknown", [False, True], ids=["scripts-loaded", "cool-unknown"])
def test_a_waiter_handed_the_lock_at_the_release_still_sees_the_cooldown(
    name: str, redis_client: redis.Redis, cool_unknown: bool
) -> None:
    """The race: B waits for the lock A holds; A's release hands it to B at once. The
    cooldown is set before that release (in its round trip), so B's start is refused.
    To widen the race window, A's thread is held right after its release
    (``lock_released``) until B has decided: a cooldown sent only after the release
    would come too late. *cool_unknown*: Redis knows the release script but not the
    cooldown's (a server that never ran it), so a batch whose cooldown failed with
    NOSCRIPT, sent again after its release ran, would set the cooldown too late."""
    inside = threading.Event()
    leave = threading.Event()
    b_decided = threading.Event()
    outcomes: list[str] = []

    @single_instance(name, cooldown=5, timeout=10)
    def work(who: str) -> None:
        outcomes.append(f"{who} ran")
        if who == "A":
            inside.set()
            assert leave.wait(10)
        else:
            b_decided.set()

    def hold_a_after_its_release(sender: Any, **kwargs: Any) -> None:
        if threading.current_thread() is a and kwargs.get("hold_count") == 0:
            b_decided.wait(3)  # bounded: B refused never sets it

    a = threading.Thread(target=work, args=("A",))
    a.start()
    assert inside.wait(10)

    def b() -> None:
        try:
            work("B")
        except RunLimited as refused:
            outcomes.append(f"B refused {refused.reason}")
        b_decided.set()

    waiter = threading.Thread(target=b)
    waiter.start()
    config = work._redislock_config  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while not (info := config.lock_manager().get(name)) or not info.waiters:
        assert time.monotonic() < deadline, "B never queued"
        time.sleep(0.01)
    if cool_unknown:
        redis_client.script_flush()
        redis_client.script_load(release_script.source)
    lock_released.connect(hold_a_after_its_release)
    try:
        leave.set()
        a.join(10)
        waiter.join(10)
    finally:
        lock_released.disconnect(hold_a_after_its_release)
    assert outcomes == ["A ran", "B refused cooldown"]


# -- views ----------------------------------------------------------------------


@single_instance("report:{pk}", rate=(2, 60))
def report(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("ok")


@single_instance("areport:{pk}", cooldown=30)
async def areport(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("ok")


@single_instance("own:{pk}", rate=(1, 60), on_limited=lambda request, r: HttpResponse(r.reason))
def own(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("report/<int:pk>/", report),
    path("areport/<int:pk>/", areport),
    path("own/<int:pk>/", own),
]


def test_a_rate_limited_view_answers_429_with_retry_after_from_the_window() -> None:
    client = Client()
    assert [client.get("/report/1/").status_code for _ in range(2)] == [200, 200]
    refused = client.get("/report/1/")
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert client.get("/report/2/").status_code == 200  # another key


def test_an_async_view_in_its_cooldown_answers_429() -> None:
    async def main() -> tuple[int, int, str]:
        client = AsyncClient()
        first = await client.get("/areport/1/")
        second = await client.get("/areport/1/")
        return first.status_code, second.status_code, second["Retry-After"]

    first, second, retry_after = asyncio.run(main())
    assert (first, second) == (200, 429)
    assert 29 <= int(retry_after) <= 30


def test_a_view_on_limited_callable_gets_the_refusal() -> None:
    client = Client()
    assert client.get("/own/1/").content == b"ok"
    assert client.get("/own/1/").content == b"rate"


# -- misuse -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"cooldown": 5, "limit": 2}, ValueError, "never overlap"),
        ({"on_limited": "skip"}, ValueError, "give one of them"),
        ({"rate": "10/fortnight"}, ValueError, "must look like '10/m'"),
        ({"rate": "0/m"}, ValueError, "from 1 to 10000"),
        ({"rate": 10}, TypeError, "a string like '10/m'"),
        ({"rate": (5, 0)}, ValueError, "window must be from"),
        ({"cooldown": -1}, ValueError, "cooldown must be from"),
        ({"cooldown": "5"}, TypeError, "number of seconds"),
        ({"rate": "1/s", "on_limited": "later"}, ValueError, "must be one of"),
        ({"coalesce": True, "limit": 2}, ValueError, "keeps one running"),
        ({"coalesce": True, "cooldown": 5}, ValueError, "a rate or a cooldown"),
        ({"coalesce": True, "on_locked": "retry"}, ValueError, "becomes pending"),
        ({"coalesce": True, "timeout": 5}, ValueError, "no timeout"),
        ({"coalesce": "yes"}, TypeError, "True or False"),
        ({"debounce": 5, "coalesce": True}, ValueError, "not after a quiet time"),
        ({"debounce": 5, "rate": "1/s"}, ValueError, "a rate or a cooldown"),
        ({"debounce": 5, "limit": 2}, ValueError, "runs once"),
        ({"debounce": 5, "timeout": 3}, ValueError, "no timeout"),
        ({"debounce": 0}, ValueError, "from 0.01 s to a day"),
        ({"debounce": "5"}, TypeError, "number of seconds"),
    ],
)
def test_misuse_is_refused_when_the_decorator_is_applied(
    options: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        single_instance("k", **options)


def test_parse_rate_spellings() -> None:
    assert parse_rate("10/m") == (10, 60.0)
    assert parse_rate("3/30s") == (3, 30.0)
    assert parse_rate("100/h") == (100, 3600.0)
    assert parse_rate(" 2 / 0.5 sec ") == (2, 0.5)
    assert parse_rate((4, 2)) == (4, 2.0)


def test_a_task_mode_on_a_plain_function_is_a_type_error_at_the_refusal(name: str) -> None:
    @single_instance(name, rate="1/h", on_limited="defer")
    def work() -> None:
        pass

    work()
    with pytest.raises(TypeError, match="only works on Celery tasks"):
        work()


@pytest.mark.parametrize("option", [{"coalesce": True}, {"debounce": 1}])
def test_coalesce_and_debounce_on_a_plain_function_are_a_type_error_at_the_call(
    name: str, option: dict[str, Any]
) -> None:
    @single_instance(name, **option)
    def work() -> None:
        pass

    with pytest.raises(TypeError, match="only work on Celery tasks"):
        work()


def test_redlock_is_refused_with_a_clear_error(masters: list[RedisServer], name: str) -> None:
    manager = LockManager(redlock_caches=[s.url for s in masters])

    @single_instance(name, rate="1/s", manager=manager)
    def work() -> None:
        pass

    with pytest.raises(ShapingUnsupported, match="Redlock"):
        work()
    assert manager.get(name) is None  # the hold was given back


# -- across processes ----------------------------------------------------------------


def _spawn(*args: str, fault: str = "") -> subprocess.Popen[str]:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT))
    env[shaping_faults.ENV] = fault  # a deliberately broken guard, for the checkers' twins
    return subprocess.Popen(
        [sys.executable, "-m", "tests.shaping_proc", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def _run_callers(
    redis_client: redis.Redis, mode: str, name: str, spec: str, seconds: float, fault: str = ""
) -> list[list[int | str]]:
    """4 processes × 5 threads call the guarded function for *seconds*; the recorder's
    entries in order: ``["start", µs, µs before the call]``, ``["end", µs]``. *fault*:
    the deliberate faults the processes install (tests/shaping_faults.py)."""
    recorder = f"rec:{name}"
    procs = [_spawn(mode, name, spec, str(seconds), "5", recorder, fault=fault) for _ in range(4)]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().split() == ["ready"], f"child rc={p.poll()}"
        redis_client.rpush(f"{recorder}:go", *["go"] * len(procs))
        for p in procs:
            out, _ = p.communicate(timeout=seconds + 60)
            assert p.returncode == 0, out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    entries = [e.decode().split() for e in redis_client.lrange(recorder, 0, -1)]
    return [[e[0], *map(int, e[1:-1])] for e in entries]


#: The scripts score starts and set cooldowns in whole ms (Redis's TIME, floored).
MS_US = 1_000


def _starts(events: list[list[int | str]]) -> list[tuple[int, int]]:
    """Each start as (latest, earliest) time its admission can have had, in order. Runs
    of one key never overlap, so the recorded order is the admission order."""
    return sorted((int(e[1]), int(e[2])) for e in events if e[0] == "start")


def check_rate_never_exceeded(starts: list[tuple[int, int]], count: int, window_us: int) -> None:
    """No window of *window_us*, wherever it begins (sliding), holds more than *count*
    starts: any count + 1 starts in order span at least the window (the latest the
    last can have been admitted vs the earliest the first can have been)."""
    for k in range(len(starts) - count):
        span = starts[k + count][0] - starts[k][1]
        assert span >= window_us - MS_US, f"starts {k}-{k + count} within {span} µs"


def check_rate_reached(
    starts: list[tuple[int, int]], count: int, window_us: int, seconds: float
) -> None:
    """The limit is reached: the callers (always eager) started at least 90% of the
    most the rate admits over *seconds*, and at least 80% of the windows that begin
    at a start hold *count* starts (their admissions certainly within the window)."""
    most = count * seconds * 1_000_000 / window_us
    assert len(starts) >= 0.9 * most, f"{len(starts)} starts of at most {most:.0f}"
    windows = range(len(starts) - count + 1)
    full = sum(1 for k in windows if starts[k + count - 1][0] - starts[k][1] < window_us)
    assert full >= 0.8 * len(windows), f"only {full} of {len(windows)} windows held {count}"


def check_cooldown(events: list[list[int | str]], cooldown_us: int) -> None:
    """Runs never overlap, and from each end (recorded before the cooldown was set) to
    the next start (recorded after it was admitted) the whole cooldown passed."""
    kinds = [e[0] for e in events]
    assert kinds == ["start", "end"] * (len(events) // 2), "two runs overlapped"
    times = [int(e[1]) for e in events]
    for i in range(1, len(events) - 1, 2):
        assert times[i + 1] - times[i] >= cooldown_us - MS_US, (i, times[i + 1] - times[i])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_rate_across_four_processes_never_exceeds_n_per_window_and_reaches_it(
    name: str, redis_client: redis.Redis
) -> None:
    """15 s of 20 callers (4 processes × 5 threads) on "5/1s": about 75 starts, every
    sliding window of the run checked (longer runs find nothing more: 60 s ran clean)."""
    events = _run_callers(redis_client, "rate", name, "5/1s", 15.0)
    starts = _starts(events)
    check_rate_never_exceeded(starts, 5, 1_000_000)
    check_rate_reached(starts, 5, 1_000_000, 15.0)


def test_the_rate_checker_fails_when_the_guard_admits_every_start(
    name: str, redis_client: redis.Redis
) -> None:
    events = _run_callers(redis_client, "rate", name, "5/1s", 2.0, fault="rate-admits-all")
    with pytest.raises(AssertionError, match="within"):
        check_rate_never_exceeded(_starts(events), 5, 1_000_000)


def test_the_reached_checker_fails_when_the_guard_wastes_starts(
    name: str, redis_client: redis.Redis
) -> None:
    events = _run_callers(redis_client, "rate", name, "5/1s", 4.0, fault="rate-wastes-starts")
    starts = _starts(events)
    check_rate_never_exceeded(starts, 5, 1_000_000)  # it still never admits too many
    with pytest.raises(AssertionError, match="starts of at most|windows held"):
        check_rate_reached(starts, 5, 1_000_000, 4.0)


def test_cooldown_across_four_processes_spaces_starts_and_never_overlaps(
    name: str, redis_client: redis.Redis
) -> None:
    events = _run_callers(redis_client, "cooldown", name, "0.3", 3.0)
    assert len(events) >= 8
    check_cooldown(events, 300_000)


def test_the_cooldown_checker_fails_when_the_guard_sets_no_cooldown(
    name: str, redis_client: redis.Redis
) -> None:
    events = _run_callers(redis_client, "cooldown", name, "0.3", 1.0, fault="cooldown-not-set")
    with pytest.raises(AssertionError) as failed:
        check_cooldown(events, 300_000)
    assert "overlapped" not in str(failed.value)  # the runs still never overlap
