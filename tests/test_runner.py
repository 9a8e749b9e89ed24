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
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from django_redislock import LockManager
from django_redislock.election import Election
from django_redislock.election.runner import EXIT_BUSY, EXIT_LOST, EXIT_UNAVAILABLE, EXIT_USAGE
from example_project.embedded_redis import EmbeddedRedis
from tests.redis_server import RedisServer, free_port
from tests.tcp_proxy import TcpProxy

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

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


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the standalone path: --url only
    env.pop("REDISLOCK_URL", None)
    return env


class Runner:
    """One ``python -m django_redislock run`` process (in a session of its own, so its
    process group is the runner and its command), with its stderr read by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env or _env(), stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    @classmethod
    def start(
        cls, url: str, name: str, prefix: str, *options: str, mode: str = "run",
        child_url: str | None = None,
    ) -> Runner:  # fmt: skip
        """A runner of tests/runner_child.py under the lock *name*."""
        child = [PY, "-m", "tests.runner_child", child_url or url, prefix, mode]
        return cls(
            [PY, "-m", "django_redislock", "run", name, "--url", url, *options, "--", *child]
        )

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append("<eof>")
            self._cond.notify_all()

    def wait_line(self, text: str, timeout: float = 15.0) -> str:
        """The first stderr line containing *text*; fails after *timeout* seconds."""
        with self._cond:
            found = self._cond.wait_for(lambda: any(text in line for line in self.lines), timeout)
            assert found, f"no line with {text!r} within {timeout} s: {self.lines}"
            return next(line for line in self.lines if text in line)

    @property
    def child_pid(self) -> int:
        """The command's pid, from the runner's "started pid N" line."""
        return int(self.wait_line("started pid").rsplit(" ", 1)[1])

    @property
    def token(self) -> int:
        """The hold's fencing token (the command's term), from the runner's line."""
        return int(self.wait_line("(token ").split("(token ")[1].split(")")[0])

    def wait(self, timeout: float = 15.0) -> int:
        """The runner's exit status; fails after *timeout* seconds."""
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL what is left of the runner's process group (clean-up)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(10)


class Events:
    """The events the children push to ``PREFIX:events``, read with a bounded ``BLPOP``."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client, self.key = client, f"{prefix}:events"

    def next(self, timeout: float = 15.0, *, skip_ticks: bool = True) -> tuple[int, str]:
        """The next (term, event) (ticks skipped); fails after *timeout* seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no event on {self.key} within {timeout} s"
            popped = self.client.blpop([self.key], timeout=max(0.01, min(left, 1.0)))
            if popped is None:
                continue
            term, event = popped[1].split(" ", 1)
            if skip_ticks and event == "tick":
                continue
            return int(term), event

    def wait_for(self, wanted: str, term: int | None = None, timeout: float = 15.0) -> int:
        """Skip events until *wanted* (of *term*, if given); returns its term."""
        deadline = time.monotonic() + timeout
        while True:
            got_term, event = self.next(max(0.01, deadline - time.monotonic()))
            if event == wanted and (term is None or got_term == term):
                return got_term


def attempts(client: redis.Redis, prefix: str) -> list[tuple[int, str, int]]:
    """Every write the children tried, in the order Redis ran them: (term, event, pid)."""
    rows = []
    for row in client.lrange(f"{prefix}:attempts", 0, -1):
        term, rest = row.split(" ", 1)
        event, pid = rest.rsplit(" ", 1)
        rows.append((int(term), event, int(pid)))
    return rows


def assert_one_at_a_time(client: redis.Redis, prefix: str) -> list[int]:
    """No two commands' writes interleave, and each command's term is larger than the one
    before; returns the terms in order."""
    order: list[int] = []
    for term, _event, _pid in attempts(client, prefix):
        if not order or order[-1] != term:
            assert term not in order, f"term {term} wrote again after another: {order + [term]}"
            order.append(term)
    assert order == sorted(order), f"terms not increasing: {order}"
    return order


# -- bad input --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "status", "message"),
    [
        (["--url", "URL"], EXIT_USAGE, "no command given"),
        (["--url", "URL", "--limit", "0", "--", "CMD"], EXIT_USAGE, "--limit must be 1 or more"),
        (["--url", "URL", "--bogus", "--", "CMD"], EXIT_USAGE, "unrecognized arguments: --bogus"),
        (["--url", "URL", "CMD"], EXIT_USAGE, "the command after it"),
        (["--url", "URL", "--ttl", "-1", "--", "CMD"], EXIT_USAGE, "--ttl must be a positive"),
        (["--url", "URL", "--limit", "two", "--", "CMD"], EXIT_USAGE, "invalid int value"),
        (["--url", "URL", "--wait", "--no-wait", "--", "CMD"], EXIT_USAGE, "not allowed with"),
        (["--", "CMD"], EXIT_USAGE, "no Redis to use"),
        (["--url", "DOWN", "--", "CMD"], EXIT_UNAVAILABLE, "cannot reach Redis"),
        (["--url", "DOWN", "--wait", "--", "CMD"], EXIT_UNAVAILABLE, "cannot reach Redis"),
    ],
    ids=["no-command", "limit-0", "unknown-option", "command-without-dashes", "bad-ttl",
         "bad-limit", "wait-and-no-wait", "no-url", "redis-down", "redis-down-standby"],
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
    result = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == status, result.stderr
    assert message in result.stderr
    assert not marker.exists(), "the command ran despite the bad input"


def test_the_command_is_not_found(server: RedisServer, name: str) -> None:
    result = subprocess.run(
        [PY, "-m", "django_redislock", "run", name, "--url", server.url, "--", "/no/such/cmd"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60,
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
    _wait_for_standbys(manager, name, 1)
    os.kill(standby.proc.pid, signal.SIGTERM)
    assert standby.wait() == 128 + signal.SIGTERM
    assert "before the command started" in standby.wait_line("stopped by SIGTERM")
    info = manager.get(name)
    assert info is not None and info.queue_length == 0 and not info.waiters
    os.kill(leader.proc.pid, signal.SIGTERM)
    assert leader.wait() == 128 + signal.SIGTERM
    assert {t for t, _, _ in attempts(client, name)} == {leader.token}


def _wait_for_standbys(manager: LockManager, name: str, count: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while True:
        info = manager.get(name)
        if info is not None and len(info.waiters) >= count:
            return
        assert time.monotonic() < deadline, f"fewer than {count} standbys queued"
        time.sleep(0.02)


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
        _wait_for_standbys(manager, name, count)
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
    runners.append(leader := Runner.start(server.url, name, name, "--wait", "--ttl", "2"))
    events.wait_for("start")
    runners.append(standby := Runner.start(server.url, name, name, "--wait", "--ttl", "2"))
    _wait_for_standbys(LockManager(url=server.url), name, 1)
    child = leader.child_pid
    killed = time.monotonic()
    os.kill(leader.proc.pid, signal.SIGKILL)
    assert leader.wait() == -signal.SIGKILL
    _wait_gone(child, 5)  # the parent-death signal: the command died with its runner
    term = events.wait_for("start", timeout=15)
    took = time.monotonic() - killed
    assert term == standby.token
    assert took < 2 + 2.5, f"the standby took over {took:.1f} s after the kill (lease 2 s)"
    os.kill(standby.proc.pid, signal.SIGTERM)
    assert standby.wait() == 128 + signal.SIGTERM
    assert assert_one_at_a_time(client, name) == [leader.token, term]


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        # (A zombie still answers kill 0: reaped by init soon after it died.)
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(") ", 1)[1].startswith("Z"):
                return
        assert time.monotonic() < deadline, f"pid {pid} still running after {timeout} s"
        time.sleep(0.02)


def test_a_leader_paused_past_its_lease_is_told_and_its_command_stopped(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner]
) -> None:
    events = Events(client, name)
    manager = LockManager(url=server.url)
    runners.append(leader := Runner.start(server.url, name, name, "--wait", "--ttl", "1.5"))
    old = events.wait_for("start")
    runners.append(standby := Runner.start(server.url, name, name, "--wait", "--ttl", "1.5"))
    _wait_for_standbys(manager, name, 1)
    os.killpg(leader.proc.pid, signal.SIGSTOP)  # the runner and its command (a host pause)
    try:
        new = events.wait_for("start", timeout=15)  # the standby took over meanwhile
        assert new == standby.token and new > old
        assert not Election(name, manager=manager).is_current(old), "the old term is stale"
    finally:
        os.killpg(leader.proc.pid, signal.SIGCONT)
    resumed = time.monotonic()
    assert leader.wait(10) == EXIT_LOST
    assert time.monotonic() - resumed < 5
    assert "LOST the lock" in leader.wait_line("LOST the lock")
    _wait_gone(leader.child_pid, 5)
    # What the resumed command still tried was refused by the fence (its term is stale);
    # the accepted log never goes back to an older term.
    log = [int(row.split()[0]) for row in client.lrange(f"{name}:log", 0, -1)]
    assert log == sorted(log) and log[-1] == new
    refused = [int(row.split()[0]) for row in client.lrange(f"{name}:refused", 0, -1)]
    assert set(refused) <= {old}
    os.kill(standby.proc.pid, signal.SIGTERM)
    assert standby.wait() == 128 + signal.SIGTERM


def test_a_partitioned_leader_stops_its_command_before_a_standby_can_start(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner]
) -> None:
    proxy = TcpProxy(server.port)
    try:
        events = Events(client, name)
        runners.append(
            leader := Runner.start(
                proxy.url, name, name, "--wait", "--ttl", "2", child_url=server.url
            )
        )
        old = events.wait_for("start")
        runners.append(standby := Runner.start(server.url, name, name, "--wait", "--ttl", "2"))
        _wait_for_standbys(LockManager(url=server.url), name, 1)
        proxy.blackhole(True)  # the leader's runner cannot reach Redis; its command can
        assert leader.wait(20) == EXIT_LOST
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
    _wait_gone(runner.child_pid, 5)


def test_limit_runs_up_to_n_commands_at_once(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner]
) -> None:
    events = Events(client, name)
    for _ in range(2):
        runners.append(Runner.start(server.url, name, name, "--limit", "2", "--wait"))
    terms = {events.wait_for("start"), events.wait_for("start")}
    assert terms == {runners[0].token, runners[1].token}
    runners.append(third := Runner.start(server.url, name, name, "--limit", "2", "--wait"))
    _wait_for_standbys(LockManager(url=server.url), name, 1)
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


def test_manage_py_redislock_run(
    server: RedisServer, client: redis.Redis, name: str, runners: list[Runner]
) -> None:
    env = _env()
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
        _wait_for_standbys(LockManager(url=own.url), name, 1)
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
