"""A hand-off's claim window: a release hands the lock to the first waiter, leased
for a short window until the waiter claims it (engine/scripts.py, ``handoff``).

* The new holder is live from the grant on: ``locks.get()`` does not read the
  claim window as renewals that never came (it shows it as claiming).
* A waiter that died (SIGKILL) just before the release costs the live waiter
  behind it no claim window: its wake-up reaches nobody, so the lock passes on.
* A waiter that is alive but stopped (SIGSTOP) keeps the claim window, and once
  the lock passed on it cannot claim it any more (it queues again).
* An operator's release names, in the history, the waiter it handed the lock to.

Waiters are real child processes (``tests/proc.py wait_timed``), the holder this
test's process; times are ``time.monotonic()``, system-wide on Linux.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from django_redislock import Lock, locks
from django_redislock.engine.lua.common import HANDOFF_CLAIM_MS
from tests.holding import QueuedWaiters, queued, wait_until
from tests.test_multiprocess import _expect_line, _spawn

pytestmark = pytest.mark.slow

KINDS = ["lock", "semaphore"]


def _lock(kind: str, name: str, owner: str) -> Lock:
    if kind == "lock":
        return locks.lock(name, ttl=30, owner=owner)
    return locks.semaphore(name, 1, ttl=30, owner=owner)


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    made: list[subprocess.Popen[str]] = []
    yield made
    for proc in made:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(10)


def _queue(
    children: list[subprocess.Popen[str]], kind: str, name: str, redis_client
) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    """A child process queued for *name* (after it subscribed its wake-up hub)."""
    before = queued(redis_client, name)
    child = _spawn("wait_timed", kind, name, "30")
    children.append(child)
    _expect_line(child, "waiting")
    wait_until(lambda: queued(redis_client, name) == before + 1, timeout=20)
    return child


def _two_queued(
    children: list[subprocess.Popen[str]], kind: str, name: str, redis_client
) -> tuple[Lock, int, subprocess.Popen[str], subprocess.Popen[str]]:  # type: ignore[no-untyped-def]
    """*name* held by this process (the lock and its token), two child processes
    queued for it, first in line first."""
    holder = _lock(kind, name, "holder")
    assert holder.acquire() and holder.fencing_token is not None
    first = _queue(children, kind, name, redis_client)
    second = _queue(children, kind, name, redis_client)
    info = locks.get(name)
    assert info is not None and [w.pid for w in info.waiters] == [first.pid, second.pid]
    return holder, holder.fencing_token, first, second


def _holder_pid(name: str) -> int | None:
    info = locks.get(name)
    return None if info is None or not info.holders else info.holders[0].pid


@pytest.mark.parametrize("kind", KINDS)
def test_a_waiter_handed_the_lock_is_live_from_the_grant(
    kind: str, name: str, redis_client, children: list[subprocess.Popen[str]]
) -> None:
    holder = _lock(kind, name, "holder")
    assert holder.acquire()
    child = _queue(children, kind, name, redis_client)
    holder.release()
    # From the first snapshot on, through the claim (the watchdog's first renewal,
    # within a third of the window): never overdue, renewed (or handed) just now.
    seen = 0
    until = time.monotonic() + HANDOFF_CLAIM_MS / 1000 * 0.6
    while time.monotonic() < until:
        info = locks.get(name)
        assert info is not None and info.holders, "the lock was handed to the waiter"
        assert info.holders[0].pid == child.pid, info
        assert not info.overdue, info
        assert info.renewed_ago is not None and info.renewed_ago < 1.0, info
        assert info.lease == 30.0, info
        seen += 1
        time.sleep(0.02)  # sampling
    assert seen > 3
    _expect_line(child, "acquired", timeout=10)
    wait_until(lambda: not getattr(locks.get(name), "claiming", True), timeout=5)
    info = locks.get(name)
    assert info is not None and info.ttl is not None and info.ttl > 20, "claimed: its lease"


@pytest.mark.parametrize("kind", KINDS)
def test_a_stopped_grantee_is_claiming_then_passed_over_and_cannot_claim_late(
    kind: str, name: str, redis_client, children: list[subprocess.Popen[str]]
) -> None:
    holder, held, stopped, behind = _two_queued(children, kind, name, redis_client)
    os.kill(stopped.pid, signal.SIGSTOP)  # alive (its connections stay open), not running
    holder.release()
    info = locks.get(name)
    assert info is not None and info.holders[0].pid == stopped.pid
    assert info.claiming and not info.overdue, info
    assert info.renewed_ago is not None and info.renewed_ago < 0.5, info
    granted = info.fencing_token
    assert granted is not None and granted > held
    # Never claimed: its window runs out and the lock passes to the waiter behind it.
    token = int(_expect_line(behind, "acquired", timeout=HANDOFF_CLAIM_MS / 1000 + 10)[1])
    assert token > granted
    assert _holder_pid(name) == behind.pid
    os.kill(stopped.pid, signal.SIGCONT)
    # Resumed, it finds the grant it was sent gone and queues again behind the holder.
    wait_until(lambda: queued(redis_client, name) == 1, timeout=10)
    info = locks.get(name)
    assert info is not None and [w.pid for w in info.waiters] == [stopped.pid]
    assert info.holders[0].pid == behind.pid and info.fencing_token == token


@pytest.mark.parametrize("kind", KINDS)
def test_a_hand_off_to_a_sigkilled_waiter_passes_to_the_next_one_at_once(
    kind: str, name: str, redis_client, children: list[subprocess.Popen[str]]
) -> None:
    holder, held, doomed, survivor = _two_queued(children, kind, name, redis_client)
    doomed.kill()  # its queue entry stays valid for seconds
    doomed.wait(10)
    released_at = time.monotonic()
    holder.release()  # first in line: the dead waiter
    line = _expect_line(survivor, "acquired", timeout=HANDOFF_CLAIM_MS / 1000 + 10)
    token, acquired_at = int(line[1]), float(line[2])
    waited = acquired_at - released_at
    print(f"the live waiter behind a SIGKILLed one waited {waited:.3f} s")
    assert waited <= 0.5, f"the dead waiter cost the live one {waited:.3f} s"
    # One holder at a time: the survivor's token follows the holder's, and nobody else
    # holds it (the dead waiter was never granted it).
    assert token > held
    info = locks.get(name)
    assert info is not None and len(info.holders) == 1
    assert info.holders[0].pid == survivor.pid and info.fencing_token == token
    handoffs = [e for e in locks.history(name) if e.event == "handoff"]
    assert handoffs and handoffs[0].holder == "holder"
    assert handoffs[0].waiter_meta.get("pid") == survivor.pid


@pytest.mark.parametrize("kind", KINDS)
def test_an_operator_release_names_the_waiter_it_handed_the_lock_to(kind: str, name: str) -> None:
    holder = _lock(kind, name, "stuck")
    assert holder.acquire()
    waiters = QueuedWaiters(name)
    try:
        waiters.add(_lock(kind, name, "next"), timeout=10)
        assert locks.force_release(name)
        info = locks.get(name)  # handed on by the operator: live from the grant too
        assert info is not None and info.holders[0].owner == "next"
        assert not info.overdue and info.renewed_ago is not None and info.renewed_ago < 1.0
        forced = [e for e in locks.history(name) if e.event == "forced"]
        assert len(forced) == 1, locks.history(name)
        assert forced[0].holder == "stuck" and forced[0].waiter == "next", forced[0]
        assert forced[0].waited is not None and forced[0].waited >= 0
    finally:
        waiters.close()


def test_an_operator_release_with_nobody_waiting_records_no_waiter(name: str) -> None:
    holder = locks.lock(name, owner="stuck")
    assert holder.acquire()
    assert locks.force_release(name)
    forced = [e for e in locks.history(name) if e.event == "forced"]
    assert len(forced) == 1 and forced[0].holder == "stuck" and forced[0].waiter is None


def test_a_process_s_first_wait_names_its_confirmed_channel_then_dies_costing_nothing(
    name: str, redis_client, children: list[subprocess.Popen[str]]
) -> None:
    """A process's first wait queues before its wake-up hub is subscribed; once it is,
    the wait asks again and its queue entry names the channel as confirmed, so its
    death costs the waiter behind it nothing either."""
    holder = locks.lock(name, owner="holder", ttl=30)
    assert holder.acquire()
    waiters_key = locks.backend().keyspace.keys(name).waiters

    def confirmed(count: int) -> bool:
        entries = [  # (without the holder on record, '~cur': not a waiter)
            e for w, e in redis_client.hgetall(waiters_key).items() if w != b"~cur"
        ]
        return len(entries) == count and all(e.split(b"|")[4][:1] == b"!" for e in entries)

    doomed = _spawn("wait_for", name, "30")  # its first wait: nothing subscribed before
    children.append(doomed)
    _expect_line(doomed, "waiting")
    wait_until(lambda: confirmed(1), timeout=20)
    survivor = _spawn("wait_for", name, "30")
    children.append(survivor)
    _expect_line(survivor, "waiting")
    wait_until(lambda: confirmed(2), timeout=20)
    doomed.kill()
    doomed.wait(10)
    released_at = time.monotonic()
    holder.release()
    _expect_line(survivor, "acquired", timeout=HANDOFF_CLAIM_MS / 1000 + 10)
    waited = time.monotonic() - released_at
    assert waited <= 0.5, f"the dead waiter cost the live one {waited:.3f} s"
    assert _holder_pid(name) == survivor.pid
