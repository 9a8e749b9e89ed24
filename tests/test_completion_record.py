"""A run's completion record kept with its lock, on a real Redis (``Lock._with_completion``).

The Celery integration gives each ``acks_late`` execution's lock the task id as its run:
the lock's own acquire script refuses a run whose record exists (holding nothing, so a
broker's copy of a completed task is dropped atomically with what would have been its
grant), and the completing release writes the record in its own script. Before, each
was a round trip of its own (``EXISTS`` after the acquire, ``SET`` before the release).
Commands are counted with ``INFO commandstats``; the Redlock refusal runs on three real
masters.
"""

from __future__ import annotations

import pytest
import redis
from redis.crc import key_slot

from django_redislock import LockError, LockNotOwned, locks
from django_redislock.engine.calls import RunCompleted
from django_redislock.engine.keys import KeySpace
from django_redislock.primitives.manager import LockManager
from tests.holding import queued, queued_waiter
from tests.redis_server import RedisServer
from tests.test_fast_path import UNCONTENDED_COMMANDS, _commands

KEEP = 60.0


def _run_lock(name: str, owner: str, run: str = "task-1"):  # type: ignore[no-untyped-def]
    lock = locks.lock(name, owner=owner, ttl=10, auto_renew=False)
    lock._with_completion(run, KEEP)
    return lock


def _record(redis_client: redis.Redis, name: str, run: str = "task-1") -> int:
    """The record's remaining life in ms (-2: there is none)."""
    key = locks.backend().keyspace.keys(name).completion(run)
    return int(redis_client.pttl(key))


def test_a_completing_release_writes_the_record_and_a_copy_is_refused_holding_nothing(
    name: str, redis_client: redis.Redis
) -> None:
    first = _run_lock(name, "task-1:a")
    assert first.acquire(blocking=False)
    assert _record(redis_client, name) == -2  # nothing before the run completes
    assert first._release_completed() == 0
    assert 0 < _record(redis_client, name) <= KEEP * 1000
    copy = _run_lock(name, "task-1:b")
    with pytest.raises(RunCompleted, match="completed already"):
        copy.acquire(blocking=False)
    with pytest.raises(RunCompleted):
        copy.acquire(timeout=2)  # a wait is refused at its first ask, never queued
    assert locks.get(name) is None
    assert queued(redis_client, name) == 0
    # Another run of the same lock, and a plain lock, are not concerned.
    other = _run_lock(name, "task-2:a", run="task-2")
    assert other.acquire(blocking=False)
    other.release()
    with locks.lock(name, ttl=10):
        pass


def test_a_run_without_a_record_is_granted_and_a_plain_release_writes_none(
    name: str, redis_client: redis.Redis
) -> None:
    lock = _run_lock(name, "task-1:a")
    assert lock.acquire(blocking=False)
    lock.release_all()  # a retry or a stopped run: not a completion
    assert _record(redis_client, name) == -2
    again = _run_lock(name, "task-1:b")
    assert again.acquire(blocking=False)
    again.release()


def test_a_run_whose_hold_was_lost_still_records_its_completion(
    name: str, redis_client: redis.Redis
) -> None:
    lock = _run_lock(name, "task-1:a")
    assert lock.acquire(blocking=False)
    assert locks.force_release(name)
    with pytest.raises(LockNotOwned):
        lock._release_completed()
    assert _record(redis_client, name) > 0


def test_a_completing_release_that_hands_the_lock_over_writes_the_record(
    name: str, redis_client: redis.Redis
) -> None:
    lock = _run_lock(name, "task-1:a")
    assert lock.acquire(blocking=False)
    waiter, got = queued_waiter(redis_client, name, ttl=10, timeout=10)
    assert lock._release_completed() == 0
    assert got.wait(10), "the waiter was not handed the lock"
    waiter.join(10)
    assert _record(redis_client, name) > 0


def test_the_record_costs_one_command_inside_each_script_and_no_round_trip(
    name: str, redis_client: redis.Redis
) -> None:
    with locks.lock(name, ttl=10, auto_renew=False):  # the fence hash exists from here on
        pass
    lock = _run_lock(name, "task-1:a")
    redis_client.config_resetstat()
    assert lock.acquire(blocking=False)
    lock._release_completed()
    counted = _commands(redis_client)
    assert counted["evalsha"] == 2, counted  # the acquire and the release: two round trips
    assert counted["exists"] == 1 and counted["set"] == 1, counted  # inside them
    assert sum(counted.values()) == UNCONTENDED_COMMANDS + 2, counted


@pytest.mark.parametrize("lock_name", ["plain", "with}brace", "}leading", "{tagged}x", "a\\b"])
def test_the_record_is_in_the_lock_s_cluster_slot(lock_name: str) -> None:
    keys = KeySpace("redislock").keys(lock_name)
    assert key_slot(keys.completion("t-1").encode()) == key_slot(keys.lock.encode())


def test_only_a_mutex_on_one_redis_or_a_cluster_keeps_a_record(name: str) -> None:
    with pytest.raises(LockError, match="mutex"):
        locks.semaphore(name, 2, ttl=10)._with_completion("task-1", KEEP)
    with pytest.raises(ValueError):
        locks.lock(name, ttl=10)._with_completion("task-1", -1)
    with pytest.raises(LockError, match="completion record"):
        locks.lock(name, ttl=10)._release_completed()  # a lock that is no run's
    with pytest.raises(LockError, match="mutex"):
        locks.semaphore(name + ":s", 2, ttl=10)._release_completed()
    servers = [RedisServer() for _ in range(3)]
    try:
        redlock = LockManager(redlock_caches=[s.url for s in servers])
        with pytest.raises(LockError, match="not on Redlock"):
            redlock.lock(name, ttl=10)._with_completion("task-1", KEEP)
    finally:
        for server in servers:
            server.stop()
