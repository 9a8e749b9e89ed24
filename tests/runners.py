"""Helpers of the runner and beat tests: a ``python -m django_redislock run`` process with
its stderr read line by line, the events and writes of tests/runner_child.py, and
bounded waits (a line, an event, a queue, a process gone)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis

from django_redislock import LockManager
from tests.starts import alive

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def clean_env() -> dict[str, str]:
    """The environment of a runner: no Django settings and no REDISLOCK_URL (``--url`` only)."""
    env = dict(os.environ)
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the standalone path: --url only
    env.pop("REDISLOCK_URL", None)
    return env


class Runner:
    """One ``python -m django_redislock run`` process (in a session of its own, so its
    process group is the runner and its command), with its stderr read by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env or clean_env(), stdout=subprocess.DEVNULL,
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
        """SIGKILL what is left of the runner's process group and of its command's (the
        watcher's group; clean-up)."""
        groups = [self.proc.pid]
        with self._cond:
            groups += [int(line.split("(process group ")[1].rstrip(")")) for line in self.lines
                       if "(process group " in line]  # fmt: skip
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
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


def wait_for_standbys(manager: LockManager, name: str, count: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while True:
        info = manager.get(name)
        if info is not None and len(info.waiters) >= count:
            return
        assert time.monotonic() < deadline, f"fewer than {count} standbys queued"
        time.sleep(0.02)


def wait_gone(pid: int, timeout: float) -> None:
    """Wait until *pid* no longer runs (a zombie counts as gone); fails after *timeout*."""
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} still running after {timeout} s"
        time.sleep(0.02)
