"""Mutual exclusion and crash behaviour across real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from django_redislock import locks

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.proc", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def _expect_line(proc: subprocess.Popen[str], prefix: str, timeout: float = 30) -> list[str]:
    """Read stdout lines of *proc* until one starts with *prefix* (bounded by *timeout*)."""
    import selectors

    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {prefix!r} line from child within {timeout} s"
            if sel.select(remaining):
                line = proc.stdout.readline()
                assert line, f"child exited (rc={proc.poll()}) before printing {prefix!r}"
                if line.startswith(prefix):
                    return line.split()


def test_eight_processes_lose_no_update(name: str, redis_client) -> None:
    counter, inside = f"{name}:counter", f"{name}:inside"
    procs = [_spawn("count", name, "200", counter, inside) for _ in range(8)]
    try:
        overlaps = [int(_expect_line(p, "done", timeout=180)[1]) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    assert overlaps == [0] * 8
    assert int(redis_client.get(counter)) == 8 * 200


def test_sigkilled_holder_frees_the_lock_after_its_ttl(name: str) -> None:
    holder = _spawn("hold", name, "1", "1")
    try:
        _expect_line(holder, "acquired")
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        assert locks.get(name) is not None, (
            "the killed holder's lock outlives it until the lease ends"
        )
        waiter = locks.lock(name)
        started = time.monotonic()
        assert waiter.acquire(timeout=10)
        # Freed by the lease (1 s), which the waiter was told about.
        assert time.monotonic() - started < 1 + 0.5
        waiter.release()
    finally:
        holder.kill()
        holder.wait(10)


def test_sigstopped_holder_finds_lock_lost_and_its_token_lower(name: str) -> None:
    holder = _spawn("hold_until_lost", name, "0.6")
    try:
        old_token = int(_expect_line(holder, "acquired")[1])
        holder.send_signal(signal.SIGSTOP)
        thief = locks.lock(name, owner="new-holder", ttl=30)
        assert thief.acquire(timeout=10), "the paused holder's lease should run out"
        new_token = thief.fencing_token
        holder.send_signal(signal.SIGCONT)
        assert _expect_line(holder, "lost")[1] == str(old_token)
        _expect_line(holder, "LockLost")
        assert old_token < new_token
        assert locks.get(name).owner == "new-holder", (
            "the resumed holder must not release the new holder's lock"
        )
        thief.release()
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait(10)
