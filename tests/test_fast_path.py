"""The fast paths of a mutex on a real Redis: what an uncontended acquire and release
cost in Redis commands, and that skipping the queue checks on them never skips a waiter.

A lock's scripts look at its waiter queue only while the fence hash and the lock hash
say someone may be queued ('q', set when a waiter queues, cleared once the queue is
gone; engine/scripts.py). Commands are counted with ``INFO commandstats`` (the calls
inside a script count, as the server runs them); a waiter that cannot act is a child
process stopped with SIGSTOP, a real fault.
"""

from __future__ import annotations

import sys
import time

import pytest
import redis

from django_redislock import locks
from tests.holding import queued, queued_waiter, wait_until
from tests.test_fair import stopped_waiter  # noqa: F401 (a fixture: a queued child, stopped)

#: An uncontended acquire and release: two EVALSHA, and inside them HMGET of the lock
#: hash and of the slot hash (its token and queue flag), TIME, HSET of both, PEXPIRE of
#: the lease (acquire); HMGET, DEL, HSET of the slot hash's release nonce (release).
UNCONTENDED_COMMANDS = 11


def _commands(redis_client: redis.Redis) -> dict[str, int]:
    stats = redis_client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(v["calls"])
        for name, v in stats.items()
        if "config" not in name and "info" not in name
    }


def _pair_commands(redis_client: redis.Redis, name: str) -> dict[str, int]:
    """The commands Redis ran for one acquire and release of *name*."""
    lock = locks.lock(name, ttl=10, auto_renew=False)
    redis_client.config_resetstat()
    with lock:
        pass
    return _commands(redis_client)


def test_an_uncontended_acquire_and_release_run_eleven_commands(
    name: str, redis_client: redis.Redis
) -> None:
    with locks.lock(name, ttl=10, auto_renew=False):  # the slot hash exists from here on
        pass
    counted = _pair_commands(redis_client, name)
    assert sum(counted.values()) == UNCONTENDED_COMMANDS, counted
    assert counted["evalsha"] == 2
    assert "exists" not in counted and "llen" not in counted  # no look at the queue


#: Python calls into django_redislock's own code for a warm ``with locks.lock(...)``
#: (a new Lock, auto-renewed: made, entered, left, collected): 73 on CPython 3.11.
#: 89 while the scripts went past redis-py's execute_command and pool on a connection
#: of our own keeping, packed by our own code (engine/backends/direct.py, kept.py,
#: wire.py, retired for redis-py's public API: issue 42); those 16 calls of ours did
#: the work of about a hundred of redis-py's, which this does not count
#: (benchmarks/bench_locks.py counts both: 139 calls in all then, 231 now, on redis-py
#: 8.1 with hiredis). A bound, not a
#: timing: a change that adds layers to every lock call shows here however noisy the
#: machine.
UNCONTENDED_OWN_CALLS = 73


def _own_calls(name: str) -> int:
    """Calls of django_redislock's functions made by one ``with locks.lock(name)``."""
    calls = 0

    def count(frame: object, event: str, _arg: object) -> None:
        nonlocal calls
        if event == "call" and "django_redislock" in frame.f_code.co_filename:  # type: ignore[attr-defined]
            calls += 1

    sys.setprofile(count)
    try:
        with locks.lock(name, ttl=30):
            pass
    finally:
        sys.setprofile(None)
    return calls


def test_an_uncontended_with_block_stays_within_its_python_calls(name: str) -> None:
    for _ in range(3):  # warm: scripts loaded, connection made, watchdog thread started
        with locks.lock(name, ttl=30):
            pass
    counted = min(_own_calls(name) for _ in range(3))
    assert counted <= UNCONTENDED_OWN_CALLS, counted


def test_once_the_queue_is_gone_the_fast_path_is_back(name: str, redis_client: redis.Redis) -> None:
    holder = locks.lock(name, ttl=10, auto_renew=False)
    assert holder.acquire(blocking=False)
    waiter, got = queued_waiter(redis_client, name, ttl=10, timeout=10, auto_renew=False)
    holder.release()  # slow path: handed to the waiter
    assert got.wait(10)
    waiter.join(10)
    with locks.lock(name, ttl=10, auto_renew=False):  # the queue is gone: cleared here
        pass
    # The slot's queue flag still says a queue of the slot may live (for the entries'
    # life, 4 s, after the last extension): the acquire asks EXISTS of its own, once.
    counted = _pair_commands(redis_client, name)
    assert sum(counted.values()) == UNCONTENDED_COMMANDS + 1, counted
    assert counted["exists"] == 1, counted
    # Once that life is over, no queue of the slot can live: the fast path is back.
    redis_client.hset(locks.backend().keyspace.keys(name).slot, "q", "1")  # (a past time)
    counted = _pair_commands(redis_client, name)
    assert sum(counted.values()) == UNCONTENDED_COMMANDS, counted


@pytest.mark.slow
def test_a_lock_whose_lease_ran_out_goes_to_the_queued_waiter_not_a_newcomer(
    name: str, redis_client: redis.Redis, request: pytest.FixtureRequest
) -> None:
    """The lock hash is gone with its lease, the queue is not: the newcomer's acquire
    of the free lock must find the waiter and hand the lock to it (FIFO)."""
    holder = locks.lock(name, ttl=10, auto_renew=False)
    assert holder.acquire(blocking=False)
    request.getfixturevalue("stopped_waiter")
    holder.extend(0.2, replace_ttl=True)  # the holder vanishes: its lease runs out
    wait_until(lambda: not redis_client.exists(holder.key), timeout=5)
    assert queued(redis_client, name) == 1  # its entry lives 4 s unrefreshed
    newcomer = locks.lock(name, ttl=10, auto_renew=False)
    assert not newcomer.acquire(blocking=False)
    info = locks.get(name)
    assert info is not None and info.owner not in (holder.owner, newcomer.owner)
    assert queued(redis_client, name) == 0


@pytest.mark.slow
def test_a_release_hands_on_to_a_waiter_that_queued_during_the_hold(
    name: str, redis_client: redis.Redis, request: pytest.FixtureRequest
) -> None:
    """The hold began on the fast path (no queue); a waiter queued meanwhile, and the
    release must see it (the lock hash's 'q') and hand the lock over."""
    holder = locks.lock(name, ttl=10, auto_renew=False)
    assert holder.acquire(blocking=False)
    request.getfixturevalue("stopped_waiter")
    started = time.monotonic()
    holder.release()
    info = locks.get(name)
    assert info is not None and info.owner != holder.owner  # handed, not freed
    assert time.monotonic() - started < 5


#: A release that hands the lock to a queued waiter: EVALSHA; HMGET of the lock hash
#: (with the holder's since and meta, for the history); the queue's head popped (the
#: look that the queue is not empty) and its entry read and dropped (LPOP, HGET,
#: HDEL), TIME; the last token and the history's number (one HMGET of the fence hash);
#: the grant (one HSET of the slot hash with the token, the event, its number and the
#: release's nonce, HSET of the lock hash, PEXPIRE of the claim window, HSET of the
#: holder on record in the waiter entries: 11 before the per-slot layout, which kept
#: it in the fence hash's HSET); PUBLISH of the grant.
HANDOFF_RELEASE_COMMANDS = 12


@pytest.mark.slow
def test_a_release_that_hands_the_lock_over_runs_twelve_commands(
    name: str, redis_client: redis.Redis, request: pytest.FixtureRequest
) -> None:
    with locks.lock(name, ttl=10, auto_renew=False):  # the scripts are loaded from here on
        pass
    holder = locks.lock(name, ttl=10, auto_renew=False)
    assert holder.acquire(blocking=False)
    request.getfixturevalue("stopped_waiter")  # queued, and stopped: it runs nothing now
    redis_client.config_resetstat()
    holder.release()
    counted = _commands(redis_client)
    assert sum(counted.values()) == HANDOFF_RELEASE_COMMANDS, counted
    assert (counted["evalsha"], counted["publish"], counted["pexpire"]) == (1, 1, 1)
    (event,) = locks.history(name)
    assert (event.event, event.holder) == ("handoff", holder.owner)
