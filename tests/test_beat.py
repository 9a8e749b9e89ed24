"""Celery beat with a hot standby: the LeaderOnly scheduler hook, in process and with real
``celery beat`` processes under runners, ticks counted at a real worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from celery import Celery
from celery.beat import ScheduleEntry

from django_redislock import LockManager
from django_redislock.election import ElectionError
from django_redislock.runner.beat import LeaderScheduler
from django_redislock.runner.runner import EXIT_LOST
from tests.redis_server import RedisServer
from tests.runners import ROOT, Runner, clean_env, wait_for_standbys, wait_gone
from tests.starts import alive, next_start, starts

PY = sys.executable
LEASE = 2.0

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    started = RedisServer()
    yield started
    started.stop()


@pytest.fixture
def name() -> str:
    return f"beat:{uuid.uuid4().hex[:10]}"


def _scheduler(server: RedisServer, tmp_path: Path) -> tuple[LeaderScheduler, ScheduleEntry]:
    app = Celery("hook", broker=f"{server.url[:-2]}/1")
    app.conf.broker_connection_retry_on_startup = True
    scheduler = LeaderScheduler(app=app, schedule_filename=str(tmp_path / "schedule"), lazy=True)
    entry = ScheduleEntry(name="t", task="hook.task", schedule=timedelta(seconds=1), app=app)
    return scheduler, entry


def test_leader_only_sends_while_its_term_leads_and_never_after(
    server: RedisServer, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = redis.Redis.from_url(f"{server.url[:-2]}/1")
    broker.flushdb()
    manager = LockManager(url=server.url)
    lock = manager.lock(name, ttl=5)
    assert lock.acquire()
    monkeypatch.setenv("REDISLOCK_NAME", name)
    monkeypatch.setenv("REDISLOCK_TERM", str(lock.fencing_token))
    monkeypatch.setenv("REDISLOCK_URL", server.url)
    scheduler, entry = _scheduler(server, tmp_path)
    scheduler.apply_async(entry, advance=False)
    assert broker.llen("celery") == 1  # sent
    lock.release()
    assert manager.lock(name, ttl=5, owner="next-leader").acquire()  # a newer term leads
    with pytest.raises(SystemExit) as stopped:
        scheduler.apply_async(entry, advance=False)
    assert stopped.value.code == EXIT_LOST
    assert broker.llen("celery") == 1, "a stale term's beat must send nothing"
    manager.force_release(name)


def test_leader_only_outside_a_runner_says_what_to_do(
    server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDISLOCK_NAME", raising=False)
    monkeypatch.delenv("REDISLOCK_TERM", raising=False)
    with pytest.raises(ElectionError, match="run beat under the runner"):
        _scheduler(server, tmp_path)


#: The scheduler classes beat runs with: Celery's default, and django-celery-beat's
#: DatabaseScheduler (its schedule in a SQLite file the beats share) with LeaderOnly.
SCHEDULERS = {
    "persistent": "django_redislock.runner.beat:LeaderScheduler",
    "database": "tests.beat_db:Scheduler",
}


def _beat_env(server: RedisServer, scheduler: str, tmp_path: Path) -> dict[str, str]:
    env = clean_env()
    env["BEAT_TEST_REDIS"] = server.url[:-2]
    if scheduler == "database":
        pytest.importorskip("django_celery_beat")
        env.update(
            DJANGO_SETTINGS_MODULE="tests.settings_beat",
            BEAT_TEST_DB=str(tmp_path / "beat.sqlite3"),
            REDISLOCK_TEST_REDIS_URL=server.url,
        )
        django_admin = str(Path(PY).parent / "django-admin")
        subprocess.run(
            [django_admin, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=120
        )
    return env


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_two_beats_under_runners_send_every_tick_once(
    server: RedisServer, name: str, tmp_path: Path, scheduler: str
) -> None:
    client = redis.Redis.from_url(server.url, decode_responses=True)
    redis.Redis.from_url(f"{server.url[:-2]}/1").flushdb()
    client.delete("beat:ticks", "beat:events")
    env = _beat_env(server, scheduler, tmp_path)
    worker = subprocess.Popen(
        [PY, "-m", "celery", "-A", "tests.beat_app", "worker", "-P", "solo", "-l", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    runners: list[Runner] = []

    def beat_runner(number: int) -> Runner:
        beat = [
            PY, "-m", "celery", "-A", "tests.beat_app", "beat", "-l", "info",
            "-S", SCHEDULERS[scheduler],
            "--schedule", str(tmp_path / f"schedule-{number}"),
        ]  # fmt: skip
        argv = [PY, "-m", "django_redislock", "run", name, "--url", server.url, "--wait",
                "--ttl", str(LEASE), "--grace", "0.5", "--", *beat]  # fmt: skip
        runners.append(runner := Runner(argv, env))
        return runner

    def ticks(count: int, timeout: float = 30) -> None:
        for _ in range(count):
            assert client.blpop(["beat:events"], timeout=timeout), "no tick arrived in time"

    manager = LockManager(url=server.url)
    try:
        first = beat_runner(1)
        ticks(3)
        second = beat_runner(2)
        wait_for_standbys(manager, name, 1)
        # The leader's runner is SIGKILLed: its beat dies with it; the standby's beat
        # takes over within about a lease.
        os.kill(first.proc.pid, signal.SIGKILL)
        wait_gone(first.child_pid, 5)
        killed_at = time.time()
        ticks(3)
        third = beat_runner(3)
        wait_for_standbys(manager, name, 1)
        # The leader (runner and beat) is paused past its lease, then resumes.
        os.killpg(second.proc.pid, signal.SIGSTOP)
        try:
            paused_at = time.time()
            third.wait_line("holds the lock", timeout=LEASE + 10)
            ticks(2)
        finally:
            os.killpg(second.proc.pid, signal.SIGCONT)
        assert second.wait(15) == EXIT_LOST
        ticks(3)
    finally:
        for runner in runners:
            runner.kill()
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(15)
    arrived = [float(t) for t in client.lrange("beat:ticks", 0, -1)]
    gaps = [later - earlier for earlier, later in zip(arrived, arrived[1:], strict=False)]
    assert min(gaps) > 0.5, f"a tick was sent twice (gaps {gaps})"
    # The gap at each failover: about a lease (plus the 1 s schedule and start-up).
    for event, at in (("kill", killed_at), ("pause", paused_at)):
        gap = _gap_around(arrived, at)
        assert gap < LEASE + 4, f"{event}: no tick for {gap:.1f} s (gaps {gaps})"
    print("tick gaps:", [round(g, 2) for g in gaps])


def test_a_beat_whose_runner_alone_is_stopped_is_gone_before_the_standbys_starts(
    server: RedisServer, name: str, tmp_path: Path
) -> None:
    # Issue 41, defect 1, for beat: SIGSTOP of the leading runner's pid alone; its beat
    # runs on (a 60 s schedule: it sends once at its start, then nothing the term check
    # could catch). The command's watcher must stop that beat before the lease runs out,
    # so the standby's beat starts only once the old one is gone.
    client = redis.Redis.from_url(server.url, decode_responses=True)
    env = _beat_env(server, "persistent", tmp_path)
    env.update(BEAT_TEST_STARTS=name, BEAT_TEST_INTERVAL="60")
    runners: list[Runner] = []
    for number in (1, 2):
        beat = [
            PY,
            "-m",
            "celery",
            "-A",
            "tests.beat_app",
            "beat",
            "-l",
            "warning",
            "-S",
            SCHEDULERS["persistent"],
            "--schedule",
            str(tmp_path / f"s-{number}"),
        ]
        argv = [PY, "-m", "django_redislock", "run", name, "--url", server.url, "--wait",
                "--ttl", str(LEASE), "--grace", "0.5", "--", *beat]  # fmt: skip
        runners.append(Runner(argv, env))
        if number == 1:
            first = next_start(client, name, 60)
            assert first == runners[0].child_pid
    leader, standby = runners
    try:
        wait_for_standbys(LockManager(url=server.url), name, 1)
        os.kill(leader.proc.pid, signal.SIGSTOP)  # the runner only, not its beat
        try:
            second = next_start(client, name, 60)
            assert not alive(first), "the standby's beat started while the old one ran"
            assert second == standby.child_pid
        finally:
            os.kill(leader.proc.pid, signal.SIGCONT)
        recorded = starts(client, name)
        assert [s.pid for s in recorded] == [first, second]
        assert recorded[1].running == (), f"started beside {recorded[1].running}"
        assert leader.wait(15) == EXIT_LOST
        assert "the watcher stopped" in leader.wait_line("LOST the lock")
    finally:
        for runner in runners:
            runner.kill()


def _gap_around(arrived: list[float], at: float) -> float:
    """Seconds between the last tick before *at* and the first one after it."""
    before = max(t for t in arrived if t <= at)
    after = min(t for t in arrived if t > at)
    return after - before
