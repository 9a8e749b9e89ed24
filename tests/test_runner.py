"""The command runner (``python -m django_redislock run``) with real processes on a real
redis-server: exit statuses, signals, hot standbys, SIGKILL of a runner and of its
command, a leader paused past its lease, a partitioned leader (tests/tcp_proxy.py),
an operator's release, ``--limit``, and the bad inputs that must never start CMD.

The commands are ``tests/runner_child.py``: they write every attempt, with their term
(``REDISLOCK_TERM``), to Redis in the order Redis ran them, so "no two commands ran
at once" is checked on what really ran, and their fenced log shows that a stale
term's writes are refused. Every wait is bounded: on a runner's stderr line, on a
child's event (``BLPOP``), or on a process's exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from django_redislock import LockManager
from django_redislock.election import Election
from django_redislock.runner.runner import EXIT_BUSY, EXIT_LOST, EXIT_UNAVAILABLE, EXIT_USAGE
from example_project.embedded_redis import EmbeddedRedis
from tests.redis_server import RedisServer, free_port
from tests.runners import (
    PY,
    ROOT,
    Events,
    Runner,
    assert_one_at_a_time,
    attempts,
    clean_env,
    wait_for_standbys,
    wait_gone,
)
from tests.starts import alive, next_start, starts
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    started = RedisServer()
    yield started
    started.stop()


@pytest.fixture
def client(server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(server.url, decode_responses=True)


@pytest.fixture
def name() -> str:
    return f"run:{uuid.uuid4().hex[:10]}"


@pytest.fixture
def runners() -> Iterator[list[Runner]]:
    made: list[Runner] = []
    yield made
    for runner in made:
        runner.kill()


# -- bad input --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "status", "message"),
    [
        (["--url", "URL"], EXIT_USAGE, "no command given"),
        (["--url", "URL", "--limit", "0", "--", "CMD"], EXIT_USAGE, "--limit must be 1 or more"),
        (["--url", "URL", "--bogus", "--", "CMD"], EXIT_USAGE, "unrecognized arguments: --bogus"),
        (["--url", "URL", "CMD"], EXIT_USAGE, "the command after it"),
        (["--url", "URL", "--ttl", "-1", "--", "CMD"], EXIT_USAGE, "--ttl must be a positive"),
        (["--url", "URL", "--ttl", "2", "--", "CMD"], EXIT_USAGE, "--grace 1 is too long"),
        (["--url", "URL", "--limit", "two", "--", "CMD"], EXIT_USAGE, "invalid int value"),
        (["--url", "URL", "--wait", "--no-wait", "--", "CMD"], EXIT_USAGE, "not allowed with"),
        (["--", "CMD"], EXIT_USAGE, "no Redis to use"),
        (["--url", "DOWN", "--", "CMD"], EXIT_UNAVAILABLE, "cannot reach Redis"),
        (["--url", "DOWN", "--wait", "--", "CMD"], EXIT_UNAVAILABLE, "cannot reach Redis"),
    ],
    ids=["no-command", "limit-0", "unknown-option", "command-without-dashes", "bad-ttl",
         "grace-too-long-for-the-lease", "bad-limit", "wait-and-no-wait", "no-url",
         "redis-down", "redis-down-standby"],
)  # fmt: skip
def test_bad_input_never_starts_the_command(
    tmp_path: Path, server: RedisServer, options: list[str], status: int, message: str
) -> None:
    marker = tmp_path / "started"
    command = [PY, "-c", f"open({str(marker)!r}, 'w')"]
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    argv = [PY, "-m", "django_redislock", "run", "bad"]
    for option in options:
        argv += {"CMD": command, "URL": [server.url], "DOWN": [down]}.get(option, [option])
    result = subprocess.run(
        argv, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == status, result.stderr
    assert message in result.stderr
    assert not marker.exists(), "the command ran despite the bad input"


def test_the_command_is_not_found(server: RedisServer, name: str) -> None:
    result = subprocess.run(
        [PY, "-m", "django_redislock", "run", name, "--url", server.url, "--", "/no/such/cmd"],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 127
    assert "cannot run '/no/such/cmd'" in result.stderr
    assert LockManager(url=server.url).get(name) is None  # released


# -- one runner ---------------------------------------------------------------------


def test_exits_with_the_commands_status_and_releases_at_once(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner]
) -> None:
    runners.append(runner := Runner.start(server.url, name, name, "--ttl", "30", mode="exit:3"))
    assert runner.wait() == 3
    assert LockManager(url=server.url).get(name) is None, "released when the command ended"
    term = attempts(client, name)[0][0]
    assert term == runner.token
    assert not Election(name, manager=LockManager(url=server.url)).is_current(term)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_are_forwarded_to_the_command(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner], sig: int
) -> None:
    runners.append(runner := Runner.start(server.url, name, name))
    events = Events(client, name)
    events.wait_for("start")
    os.kill(runner.proc.pid, sig)  # the runner only, not its group
    events.wait_for(f"signal {int(sig)}")
    assert runner.wait() == 128 + sig
    assert LockManager(url=server.url).get(name) is None


def test_no_wait_gives_up_when_the_lock_is_held(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner]
) -> None:
    runners.append(leader := Runner.start(server.url, name, name))
    events = Events(client, name)
    events.wait_for("start")
    runners.append(other := Runner.start(server.url, name, name, "--no-wait"))
    assert other.wait() == EXIT_BUSY
    assert f"pid {leader.proc.pid}" in other.wait_line("held by")
    assert {t for t, _, _ in attempts(client, name)} == {leader.token}
    os.kill(leader.proc.pid, signal.SIGTERM)
    assert leader.wait() == 128 + signal.SIGTERM


def test_a_waiting_standby_stopped_by_a_signal_leaves_the_queue(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner]
) -> None:
    runners.append(leader := Runner.start(server.url, name, name))
    Events(client, name).wait_for("start")
    runners.append(standby := Runner.start(server.url, name, name, "--wait"))
    standby.wait_line("waiting for the lock")
    manager = LockManager(url=server.url)
    wait_for_standbys(manager, name, 1)
    os.kill(standby.proc.pid, signal.SIGTERM)
    assert standby.wait() == 128 + signal.SIGTERM
    assert "before the command started" in standby.wait_line("stopped by SIGTERM")
    info = manager.get(name)
    assert info is not None and info.queue_length == 0 and not info.waiters
    os.kill(leader.proc.pid, signal.SIGTERM)
    assert leader.wait() == 128 + signal.SIGTERM
    assert {t for t, _, _ in attempts(client, name)} == {leader.token}


# -- hot standbys -----------------------------------------------------------------


def test_three_runners_take_turns_in_order(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner]
) -> None:
    manager = LockManager(url=server.url)
    events = Events(client, name)
    runners.append(first := Runner.start(server.url, name, name, "--wait", "--ttl", "30"))
    events.wait_for("start")
    for count in (1, 2):
        runners.append(Runner.start(server.url, name, name, "--wait", "--ttl", "30"))
        wait_for_standbys(manager, name, count)
    second, third = runners[1], runners[2]
    # The leader's runner is told to stop: its command ends, the lock is handed on at
    # once (not after the 30 s lease), to the standby first in line.
    stopped = time.monotonic()
    os.kill(first.proc.pid, signal.SIGTERM)
    assert first.wait() == 128 + signal.SIGTERM
    term2 = events.wait_for("start")
    assert time.monotonic() - stopped < 10
    assert term2 == second.token and second.child_pid
    # SIGKILL of the second leader's command: its runner exits 137 and hands on.
    os.kill(second.child_pid, signal.SIGKILL)
    assert second.wait() == 128 + signal.SIGKILL
    term3 = events.wait_for("start")
    assert term3 == third.token
    os.kill(third.proc.pid, signal.SIGTERM)
    assert third.wait() == 128 + signal.SIGTERM
    assert assert_one_at_a_time(client, name) == [first.token, term2, term3]


def test_sigkill_of_the_leaders_runner_kills_its_command_and_a_standby_takes_over(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner]
) -> None:
    events = Events(client, name)
    options = ("--wait", "--ttl", "2", "--grace", "0.5")
    runners.append(leader := Runner.start(server.url, name, name, *options))
    events.wait_for("start")
    runners.append(standby := Runner.start(server.url, name, name, *options))
    wait_for_standbys(LockManager(url=server.url), name, 1)
    child = leader.child_pid
    killed = time.monotonic()
    os.kill(leader.proc.pid, signal.SIGKILL)
    assert leader.wait() == -signal.SIGKILL
    wait_gone(child, 5)  # the parent-death signal: the command died with its runner
    term = events.wait_for("start", timeout=15)
    took = time.monotonic() - killed
    assert term == standby.token
    assert took < 2 + 2.5, f"the standby took over {took:.1f} s after the kill (lease 2 s)"
    os.kill(standby.proc.pid, signal.SIGTERM)
    assert standby.wait() == 128 + signal.SIGTERM
    assert assert_one_at_a_time(client, name) == [leader.token, term]


def test_a_leader_paused_past_its_lease_is_told_and_its_command_stopped(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner]
) -> None:
    events = Events(client, name)
    manager = LockManager(url=server.url)
    options = ("--wait", "--ttl", "1.5", "--grace", "0.5")
    runners.append(leader := Runner.start(server.url, name, name, *options))
    old = events.wait_for("start")
    runners.append(standby := Runner.start(server.url, name, name, *options))
    wait_for_standbys(manager, name, 1)
    # The runner's process group and its command's (the watcher's): a host pause.
    groups = [leader.proc.pid, os.getpgid(leader.child_pid)]
    for group in groups:
        os.killpg(group, signal.SIGSTOP)
    try:
        new = events.wait_for("start", timeout=15)  # the standby took over meanwhile
        assert new == standby.token and new > old
        assert not Election(name, manager=manager).is_current(old), "the old term is stale"
    finally:
        for group in groups:
            os.killpg(group, signal.SIGCONT)
    resumed = time.monotonic()
    assert leader.wait(10) == EXIT_LOST
    assert time.monotonic() - resumed < 5
    assert "LOST the lock" in leader.wait_line("LOST the lock")
    wait_gone(leader.child_pid, 5)
    # What the resumed command still tried was refused by the fence (its term is stale);
    # the accepted log never goes back to an older term.
    log = [int(row.split()[0]) for row in client.lrange(f"{name}:log", 0, -1)]
    assert log == sorted(log) and log[-1] == new
    refused = [int(row.split()[0]) for row in client.lrange(f"{name}:refused", 0, -1)]
    assert set(refused) <= {old}
    os.kill(standby.proc.pid, signal.SIGTERM)
    assert standby.wait() == 128 + signal.SIGTERM


def test_a_leader_whose_runner_alone_is_stopped_never_runs_beside_the_standby(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner]
) -> None:
    # Issue 41, defect 1: SIGSTOP of the leading runner's pid alone (a GC pause, swap,
    # a debugger): its command runs on and ignores SIGTERM. The command's watcher must
    # stop it (SIGTERM, SIGKILL after the grace) before the lease runs out in Redis, so
    # the standby's command starts only once the old one is gone.
    events = Events(client, name)
    options = ("--wait", "--ttl", "2", "--grace", "0.5")
    runners.append(leader := Runner.start(server.url, name, name, *options, mode="stubborn"))
    old = events.wait_for("start")
    first = leader.child_pid
    runners.append(standby := Runner.start(server.url, name, name, *options))
    wait_for_standbys(LockManager(url=server.url), name, 1)
    os.kill(leader.proc.pid, signal.SIGSTOP)  # the runner only, not its command
    try:
        assert next_start(client, name, 5) == first
        second = next_start(client, name, 20)  # the standby's command
        assert not alive(first), "the standby's command started while the old one ran"
        new = events.wait_for("start", timeout=10)
        assert new == standby.token and second == standby.child_pid
    finally:
        os.kill(leader.proc.pid, signal.SIGCONT)
    # The outside record: when the second command started, no earlier one was running,
    # and no write of the old command came after the new one's first.
    recorded = starts(client, name)
    assert [s.pid for s in recorded] == [first, second]
    assert recorded[1].running == (), f"started beside {recorded[1].running}"
    assert assert_one_at_a_time(client, name) == [old, new]
    assert (old, f"signal {int(signal.SIGTERM)}", first) in attempts(client, name)
    # The resumed runner finds its command stopped by the watcher and exits 79.
    assert leader.wait(15) == EXIT_LOST
    assert "the watcher stopped" in leader.wait_line("LOST the lock")
    os.kill(standby.proc.pid, signal.SIGTERM)
    assert standby.wait() == 128 + signal.SIGTERM


def test_a_killed_watcher_stops_the_command(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner]
) -> None:
    # Without its watcher the command could outlive a stopped runner: the runner stops it.
    runners.append(runner := Runner.start(server.url, name, name, "--ttl", "30"))
    events = Events(client, name)
    term = events.wait_for("start")
    watcher = int(runner.wait_line("watcher is pid").split("pid ")[1].split(" ")[0])
    os.kill(watcher, signal.SIGKILL)
    assert runner.wait(15) == EXIT_LOST
    assert "exited: the hold can no longer be guarded" in runner.wait_line("LOST the lock")
    events.wait_for(f"signal {int(signal.SIGTERM)}", term)
    wait_gone(runner.child_pid, 5)


def test_a_partitioned_leader_stops_its_command_before_a_standby_can_start(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner]
) -> None:
    proxy = TcpProxy(server.port)
    try:
        events = Events(client, name)
        options = ("--wait", "--ttl", "2", "--grace", "0.5")
        runners.append(
            leader := Runner.start(proxy.url, name, name, *options, child_url=server.url)
        )
        old = events.wait_for("start")
        runners.append(standby := Runner.start(server.url, name, name, *options))
        wait_for_standbys(LockManager(url=server.url), name, 1)
        proxy.blackhole(True)  # the leader's runner cannot reach Redis; its command can
        # About one lease to find the loss, the grace to stop its command, then it exits
        # (no release behind the partition).
        assert leader.wait(10) == EXIT_LOST
        assert "no renewal was confirmed in time" in leader.wait_line("LOST the lock")
        new = events.wait_for("start", timeout=15)
        assert new == standby.token and new > old
        # Its command was stopped before the lease ran out in Redis: no write of the old
        # term after the new command's first one.
        assert assert_one_at_a_time(client, name) == [old, new]
        os.kill(standby.proc.pid, signal.SIGTERM)
        assert standby.wait() == 128 + signal.SIGTERM
    finally:
        proxy.close()


@pytest.mark.parametrize("mode", ["run", "stubborn"])
def test_an_operator_release_stops_the_command(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner], mode: str
) -> None:
    events = Events(client, name)
    runners.append(
        runner := Runner.start(server.url, name, name, "--ttl", "1.5", "--grace", "0.5", mode=mode)
    )
    term = events.wait_for("start")
    assert LockManager(url=server.url).force_release(name)
    assert runner.wait(15) == EXIT_LOST
    events.wait_for(f"signal {int(signal.SIGTERM)}", term)
    if mode == "stubborn":  # it ignored SIGTERM: SIGKILL after the grace
        assert "SIGKILL" in runner.wait_line("still running after 0.5 s")
    else:
        assert not any("SIGKILL" in line for line in runner.lines)
    wait_gone(runner.child_pid, 5)


def test_limit_runs_up_to_n_commands_at_once(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner]
) -> None:
    events = Events(client, name)
    for _ in range(2):
        runners.append(Runner.start(server.url, name, name, "--limit", "2", "--wait"))
    terms = {events.wait_for("start"), events.wait_for("start")}
    assert terms == {runners[0].token, runners[1].token}
    runners.append(third := Runner.start(server.url, name, name, "--limit", "2", "--wait"))
    wait_for_standbys(LockManager(url=server.url), name, 1)
    assert not any("started pid" in line for line in third.lines)
    os.kill(runners[0].proc.pid, signal.SIGTERM)
    assert runners[0].wait() == 128 + signal.SIGTERM
    assert events.wait_for("start") == third.token
    for runner in runners[1:]:
        os.kill(runner.proc.pid, signal.SIGTERM)
        assert runner.wait() == 128 + signal.SIGTERM
    # The mutex's runners are refused on a name in use as a semaphore, CMD not started.
    runners.append(holder := Runner.start(server.url, name, name, "--limit", "2"))
    events.wait_for("start")
    runners.append(mutex := Runner.start(server.url, name, name, "--no-wait"))
    assert mutex.wait() == EXIT_USAGE
    assert "semaphore" in mutex.wait_line("not starting the command")
    os.kill(holder.proc.pid, signal.SIGTERM)
    assert holder.wait() == 128 + signal.SIGTERM


def test_manage_py_redislock_run_and_project_settings(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner]
) -> None:
    env = clean_env()
    env.update(DJANGO_SETTINGS_MODULE="tests.settings", REDISLOCK_TEST_REDIS_URL=server.url)
    child = [PY, "-m", "tests.runner_child", server.url, name, "exit:4"]
    django_admin = str(Path(PY).parent / "django-admin")
    runners.append(runner := Runner([django_admin, "redislock", "run", name, "--", *child], env))
    assert runner.wait(30) == 4
    assert attempts(client, name)[0][0] == runner.token
    bad = subprocess.run(
        [django_admin, "redislock", "run", name, "--limit", "0", "--", "true"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == EXIT_USAGE and "--limit must be 1 or more" in bad.stderr
    # python -m django_redislock without --url or REDISLOCK_URL: the project's settings.
    child = [PY, "-m", "tests.runner_child", server.url, name, "exit:5"]
    runners.append(
        standalone := Runner([PY, "-m", "django_redislock", "run", name, "--", *child], env)
    )
    assert standalone.wait(30) == 5
    assert attempts(client, name)[-1][0] == standalone.token


def test_a_redis_restart_deposes_the_leader_and_the_fence_refuses_its_writes(
    name: str, runners: list[Runner]
) -> None:
    # A Redis without persistence forgets the lock: the leader learns it at its next
    # renewal (within a third of the lease); a standby may be elected before that, so
    # only the fence keeps the old command's writes out (docs/one-process.md).
    own = RedisServer()
    port = own.port
    try:
        client = redis.Redis.from_url(own.url, decode_responses=True)
        events = Events(client, name)
        runners.append(leader := Runner.start(own.url, name, name, "--wait", "--ttl", "3"))
        old = events.wait_for("start")
        runners.append(standby := Runner.start(own.url, name, name, "--wait", "--ttl", "3"))
        wait_for_standbys(LockManager(url=own.url), name, 1)
        client.set(f"{name}:max", old)  # the fence's memory, kept across the restart below
        own.stop()
        own = EmbeddedRedis(port=port)
        own.wait_ready()
        client.set(f"{name}:max", old)
        assert leader.wait(15) == EXIT_LOST
        assert "no longer held" in leader.wait_line("LOST the lock")
        new = events.wait_for("start", timeout=15)
        assert new == standby.token and new > old, "tokens keep increasing across the restart"
        log = [int(row.split()[0]) for row in client.lrange(f"{name}:log", 0, -1)]
        assert log == sorted(log) and log[-1] == new
        os.kill(standby.proc.pid, signal.SIGTERM)
        assert standby.wait() == 128 + signal.SIGTERM
    finally:
        own.stop()
