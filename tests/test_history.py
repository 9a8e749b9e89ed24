"""A lock's history: hand-offs, expiries waited through, timeouts and operator releases,
recorded by the scripts on slow paths only, capped, newest first. The expired holder
is a real child process, SIGKILLed while it holds the lock."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import redis
from django.conf import settings

from django_redislock import locks
from django_redislock.engine.history import hold_spread, wait_spread
from django_redislock.engine.scripts import HISTORY_MAX
from tests.holding import wait_until

ROOT = Path(__file__).resolve().parent.parent


def _fence_fields(name: str) -> set[bytes]:
    key = locks.backend().keyspace.keys(name).fence
    return set(redis.Redis.from_url(settings.REDIS_URL).hkeys(key))


def _hand_over(name: str, holder: str, waiter: str, hold: float) -> None:
    """*holder* holds for about *hold* seconds while *waiter* waits, then hands over."""
    lock = locks.lock(name, owner=holder)
    assert lock.acquire()
    got = threading.Event()

    def wait() -> None:
        other = locks.lock(name, owner=waiter, purpose="waits")
        assert other.acquire(timeout=10)
        got.set()
        other.release()

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: getattr(locks.get(name), "queue_length", 0) == 1)
    time.sleep(hold)  # (the hold being measured)
    lock.release()
    thread.join(10)
    assert got.is_set()


def test_free_locks_write_no_history(name: str) -> None:
    for _ in range(3):
        with locks.lock(name):
            pass
    assert locks.history(name) == []
    assert not {b"hist", b"hn", b"h1"} & _fence_fields(name)


def test_a_hand_off_records_who_held_and_who_waited_how_long(name: str) -> None:
    _hand_over(name, "holder", "waiter", 0.3)
    (event,) = locks.history(name)
    assert (event.event, event.holder, event.waiter) == ("handoff", "holder", "waiter")
    assert event.held is not None and 0.3 <= event.held < 3
    assert event.waited is not None and 0.25 <= event.waited < 3
    assert event.waiter_meta["purpose"] == "waits" and event.holder_meta["pid"] == os.getpid()
    assert hold_spread([event]) is not None and wait_spread([event]) is not None


def test_a_waiter_that_gives_up_is_recorded_with_the_holder(name: str) -> None:
    holder = locks.lock(name, owner="holder")
    assert holder.acquire()
    try:
        assert not locks.lock(name, owner="impatient").acquire(timeout=0.3)
    finally:
        holder.release()
    (event,) = locks.history(name)
    assert (event.event, event.holder, event.waiter) == ("timeout", "holder", "impatient")
    assert event.waited is not None and 0.25 <= event.waited < 3


def test_an_operator_release_is_recorded(name: str) -> None:
    holder = locks.lock(name, owner="stuck", auto_renew=False)
    assert holder.acquire()
    assert locks.force_release(name)
    (event,) = locks.history(name)
    assert (event.event, event.holder, event.waiter) == ("forced", "stuck", None)


def test_an_expiry_someone_waited_through_names_the_dead_holder(name: str) -> None:
    code = textwrap.dedent(
        f"""
        import time, django
        django.setup()
        from django_redislock import locks
        lock = locks.lock({name!r}, owner="doomed", ttl=1.5, purpose="nightly report")
        lock.acquire()
        print("held", flush=True)
        time.sleep(120)
        """
    )
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 30)
        assert ready and child.stdout.readline().strip() == "held"
        child.kill()  # no release: its lease (renewed until now) runs out
        child.wait(10)
        waiter = locks.lock(name, owner="patient")
        assert waiter.acquire(timeout=10)
        waiter.release()
    finally:
        child.kill()
        child.wait(10)
    events = locks.history(name)
    assert [e.event for e in events] == ["expired"]
    (event,) = events
    assert (event.holder, event.waiter) == ("doomed", "patient")
    assert event.waited is not None and 0.5 < event.waited < 3
    # Which process died: what the holder recorded when it took the lock.
    assert event.holder_meta["pid"] == child.pid
    assert event.holder_meta["host"] == socket.gethostname()
    assert event.holder_meta["purpose"] == "nightly report"
    assert event.holder_meta["thread"]


def test_an_expiry_after_a_take_over_names_the_holder_that_took_it_over(name: str) -> None:
    """A Celery execution takes its enqueue-time hold over (``inherit_from``): if its
    lease then runs out, the history names the execution (with its metadata), not the
    enqueuing owner."""
    parked = locks.lock(name, owner="task-id", ttl=10, auto_renew=False, purpose="enqueued")
    assert parked.acquire()
    runner = locks.lock(
        name, owner="task-id:run", ttl=0.5, auto_renew=False, purpose="run", inherit_from="task-id"
    )
    assert runner.acquire(blocking=False)
    waiter = locks.lock(name, owner="patient")
    assert waiter.acquire(timeout=10)  # after the runner's lease ran out
    waiter.release()
    (event,) = locks.history(name)
    assert (event.event, event.holder, event.waiter) == ("expired", "task-id:run", "patient")
    assert event.holder_meta["purpose"] == "run"


def test_the_history_keeps_the_newest_events(name: str) -> None:
    for i in range(HISTORY_MAX + 3):
        holder = locks.lock(name, owner=f"holder {i}")
        assert holder.acquire()
        assert not locks.lock(name, owner=f"waiter {i}").acquire(timeout=0.05)
        holder.release()
    events = locks.history(name)
    assert len(events) == HISTORY_MAX
    assert events[0].holder == f"holder {HISTORY_MAX + 2}"
    assert events[-1].holder == "holder 3"
    assert all(a.at >= b.at for a, b in zip(events, events[1:], strict=False))


def test_events_keep_their_metadata_whatever_it_holds(name: str) -> None:
    """Newlines, quotes and other JSON escapes in owners and metadata come back as they were."""
    purpose = 'two\nlines, a "quote", a \\ and \u00e9'
    for i in range(3):
        holder = locks.lock(name, owner=f"holder\n{i}", purpose=purpose)
        assert holder.acquire()
        assert not locks.lock(name, owner=f"waiter {i}", purpose=purpose).acquire(timeout=0.05)
        holder.release()
    events = locks.history(name)
    assert [e.holder for e in events] == ["holder\n2", "holder\n1", "holder\n0"]
    assert {e.holder_meta["purpose"] for e in events} == {purpose}
    assert {e.waiter_meta["purpose"] for e in events} == {purpose}


def test_a_history_kept_as_a_json_list_is_read_after_the_newer_events(name: str) -> None:
    """Development checkouts before 2026-11-27 kept the history as one JSON list: it
    is read as older than every event recorded since (newest first, still at most
    HISTORY_MAX)."""
    older = [
        {"e": "timeout", "t": 1_700_000_000_000 - i, "o": f"old holder {i}", "w": f"w{i}"}
        for i in range(HISTORY_MAX)
    ]
    key = locks.backend().keyspace.keys(name).fence
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.hset(key, "hist", json.dumps(older))
    old_holders = [f"old holder {i}" for i in range(HISTORY_MAX)]
    assert [e.holder for e in locks.history(name)] == old_holders
    holder = locks.lock(name, owner="new holder")
    assert holder.acquire()
    assert not locks.lock(name, owner="new waiter").acquire(timeout=0.05)
    holder.release()
    events = locks.history(name)
    assert len(events) == HISTORY_MAX
    assert events[0].holder == "new holder"
    assert [e.holder for e in events[1:]] == old_holders[:-1]


def test_semaphores_and_read_write_locks_keep_a_history(name: str) -> None:
    first = locks.semaphore(name, 1, owner="first")
    assert first.acquire()
    got = threading.Event()

    def wait() -> None:
        second = locks.semaphore(name, 1, owner="second")
        assert second.acquire(timeout=10)
        got.set()
        second.release()

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: getattr(locks.get(name), "queue_length", 0) == 1)
    assert not locks.semaphore(name, 1, owner="impatient").acquire(timeout=0.2)
    first.release()
    thread.join(10)
    assert got.is_set()
    handoff, timeout = locks.history(name)
    assert (handoff.event, handoff.holder, handoff.waiter) == ("handoff", "first", "second")
    assert handoff.held is not None and handoff.waited is not None and handoff.waited > 0.15
    assert (timeout.event, timeout.waiter) == ("timeout", "impatient")

    rw = f"{name}:rw"
    stalled = locks.rw_lock(rw, owner="stalled writer", ttl=1, auto_renew=False, purpose="w")
    assert stalled.write().acquire()
    reader = locks.rw_lock(rw, owner="reader").read()
    assert reader.acquire(timeout=10)  # after the writer's lease ran out
    reader.release()
    events = locks.history(rw)
    assert [(e.event, e.holder) for e in events] == [("expired", "stalled writer")]
    assert events[0].held is not None and 0.9 < events[0].held < 3
    assert events[0].holder_meta["pid"] == os.getpid()
    assert events[0].holder_meta["purpose"] == "w"

    held = locks.semaphore(f"{name}:forced", 2, owner="stuck")
    assert held.acquire()
    assert locks.force_release(f"{name}:forced", owner="stuck")
    (forced,) = locks.history(f"{name}:forced")
    assert (forced.event, forced.holder) == ("forced", "stuck")


def test_a_holder_that_finds_its_hold_gone_records_the_loss(name: str) -> None:
    holder = locks.lock(name, owner="renewing holder", ttl=1)  # renewed every ~0.33 s
    assert holder.acquire()
    assert locks.force_release(name)  # behind its back
    wait_until(lambda: holder.lost, timeout=5)  # its next renewal finds it gone
    wait_until(lambda: [e.event for e in locks.history(name)] == ["lost", "forced"])
    lost, forced = locks.history(name)
    assert lost.holder == forced.holder == "renewing holder"
    groups, _ = locks.contention(60)
    (group,) = [g for g in groups if g.group == name]
    assert (group.losses, group.forced) == (1, 1)
