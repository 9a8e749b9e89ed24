"""A lock's history: hand-offs, expiries waited through, timeouts and operator releases,
recorded by the scripts on slow paths only, capped, newest first. The expired holder
is a real child process, SIGKILLed while it holds the lock."""

from __future__ import annotations

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
from django_redislock.engine.lua.common import HISTORY_MAX
from tests.holding import wait_until

ROOT = Path(__file__).resolve().parent.parent


def _slot_fields(name: str) -> set[bytes]:
    key = locks.backend().keyspace.keys(name).slot
    return set(redis.Redis.from_url(settings.REDIS_URL).hkeys(key))


def _clear_slot(name: str) -> None:
    """Drop the slot hash *name*'s history is kept in (others' tests may share it)."""
    redis.Redis.from_url(settings.REDIS_URL).delete(locks.backend().keyspace.keys(name).slot)


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
    _clear_slot(name)
    for _ in range(3):
        with locks.lock(name):
            pass
    assert locks.history(name) == []
    assert not {b"hn", b"h0", b"h1"} & _slot_fields(name)


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


def test_names_of_one_slot_keep_their_own_events_in_its_ring(name: str) -> None:
    """The history is kept per hash slot (bounded in total, not per name): each name
    reads its own events, and the ring keeps the slot's newest HISTORY_MAX."""
    keyspace = locks.backend().keyspace
    slot = keyspace.keys(f"{name}:0").slot
    other = next(n for i in range(1, 200_000) if keyspace.keys(n := f"{name}:{i}").slot == slot)
    first = f"{name}:0"
    _clear_slot(first)
    for lock_name, count in ((first, 2), (other, 1)):
        for _ in range(count):
            holder = locks.lock(lock_name, owner=f"holder of {lock_name}")
            assert holder.acquire()
            assert not locks.lock(lock_name, owner="gives up").acquire(timeout=0.05)
            holder.release()
    assert [e.holder for e in locks.history(first)] == [f"holder of {first}"] * 2
    assert [e.holder for e in locks.history(other)] == [f"holder of {other}"]
    # The slot's ring: after HISTORY_MAX more events of *other*, *first*'s are gone.
    for _ in range(HISTORY_MAX):
        holder = locks.lock(other, owner=f"holder of {other}")
        assert holder.acquire()
        assert not locks.lock(other, owner="gives up").acquire(timeout=0.01)
        holder.release()
    assert locks.history(first) == []
    assert len(locks.history(other)) == HISTORY_MAX


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
