"""Liveness: how long ago each holder's lease was renewed, and whether it is overdue.

Holders are real child processes; a stuck one is produced for real with SIGSTOP.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_redislock import locks
from tests.holding import wait_until

ROOT = Path(__file__).resolve().parent.parent


class HolderProcess:
    """A child process that takes a lock (or permit) and holds it until killed."""

    def __init__(self, make: str) -> None:
        code = textwrap.dedent(
            f"""
            import time, django
            django.setup()
            from django_redislock import locks
            lock = {make}
            lock.acquire()
            print(lock.owner, flush=True)
            time.sleep(120)
            """
        )
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        assert ready, "the holder process did not take its lock within 30 s"
        self.owner = self.proc.stdout.readline().strip()
        assert self.owner, f"the holder process failed (rc={self.proc.poll()})"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def holders() -> Iterator[list[HolderProcess]]:
    made: list[HolderProcess] = []
    yield made
    for holder in made:
        holder.kill()


def test_a_live_holder_is_renewed_and_a_stopped_one_becomes_overdue(
    holders: list[HolderProcess], name: str
) -> None:
    holder = HolderProcess(f"locks.lock({name!r}, ttl=3)")
    holders.append(holder)
    # Renewed every second (a third of the lease): never more than that plus slack ago.
    for _ in range(12):
        info = locks.get(name)
        assert info is not None and info.owner == holder.owner
        assert info.renewing and not info.overdue, info
        assert info.renewed_ago is not None and info.renewed_ago < 1.0 + 0.6, info
        time.sleep(0.2)  # sampling: a snapshot every ~0.2 s over ~2.4 s (3 renewals)
    holder.stop()
    wait_until(lambda: getattr(locks.get(name), "overdue", False), timeout=5)
    info = locks.get(name)
    assert info is not None and info.owner == holder.owner
    assert info.renewed_ago is not None and info.renewed_ago > 2.0
    (only,) = info.holders
    assert only.overdue and only.renewed_ago == info.renewed_ago


def test_a_lease_meant_to_run_out_is_not_overdue(holders: list[HolderProcess], name: str) -> None:
    holder = HolderProcess(f"locks.lock({name!r}, ttl=3, auto_renew=False)")
    holders.append(holder)
    wait_until(lambda: (getattr(locks.get(name), "renewed_ago", 0) or 0) > 2.2, timeout=5)
    info = locks.get(name)
    assert info is not None and not info.renewing and not info.overdue
    (only,) = info.holders
    assert not only.renewing and not only.overdue


def test_the_stopped_holder_of_a_semaphore_stands_out(
    holders: list[HolderProcess], name: str
) -> None:
    live = HolderProcess(f"locks.semaphore({name!r}, limit=2, ttl=3)")
    stuck = HolderProcess(f"locks.semaphore({name!r}, limit=2, ttl=3)")
    holders.extend([live, stuck])
    stuck.stop()
    wait_until(lambda: getattr(locks.get(name), "overdue", False), timeout=5)
    info = locks.get(name)
    assert info is not None
    by_owner = {h.owner: h for h in info.holders}
    assert by_owner[stuck.owner].overdue
    assert not by_owner[live.owner].overdue
    assert by_owner[live.owner].renewed_ago is not None
    assert by_owner[live.owner].renewed_ago < 1.6
    assert info.renewed_ago == by_owner[stuck.owner].renewed_ago
