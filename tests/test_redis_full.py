"""A Redis whose memory is full of keys without an expiry (issue 42, item 8).

A server of the test's own with a small ``maxmemory``, filled with keys that have no
TTL: under ``noeviction`` nothing can be freed, and under ``volatile-lru`` only keys
with an expiry can be -- the locks' own. An acquire there either works or fails at
once with a LockBackendError that says what to change; it never hangs, never spins
(a handful of commands per attempt), and a release always runs.
"""

from __future__ import annotations

import time

import pytest
import redis

from django_redislock import LockManager
from django_redislock.exceptions import LockBackendError, LockNotOwned
from tests.redis_server import RedisServer

#: What the error must tell the operator (see base.MEMORY_FIX).
ADVICE = ("out of memory", "Raise maxmemory", "maxmemory-policy noeviction", "an expiry")


def _fill(raw: redis.Redis, room: int = 2 * 1024 * 1024) -> int:
    """Allow *room* bytes more than used now, then fill them with keys without an
    expiry until Redis refuses a write; the keys written."""
    used = int(raw.info("memory")["used_memory"])
    raw.config_set("maxmemory", used + room)
    pipe = raw.pipeline(transaction=False)
    written = 0
    for batch in range(10_000):
        for i in range(100):
            pipe.set(f"fill:{batch}:{i}", "x" * 1000)
        try:
            pipe.execute()
        except redis.exceptions.OutOfMemoryError:
            break
        written += 100
    else:
        raise AssertionError("Redis never filled up")
    # The batch's query buffer counted while it ran, and Redis's cron shrinks such
    # buffers within about 100 ms: fill what that frees, key by key (each as big as a
    # lock's keys), until a small write is refused after the buffers settled too.
    for _ in range(50):
        added = 0
        for _key in range(100_000):
            try:
                raw.set(f"fill:last:{written}", "x" * 100)
            except redis.exceptions.OutOfMemoryError:
                break
            written += 1
            added += 1
        if not added:
            return written
        time.sleep(0.3)
    raise AssertionError("Redis never filled up")


def _evalsha_calls(raw: redis.Redis) -> int:
    stats = raw.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def _assert_clear(error: LockBackendError) -> None:
    for words in ADVICE:
        assert words in str(error), str(error)


@pytest.fixture(params=["noeviction", "volatile-lru"])
def full(request: pytest.FixtureRequest) -> tuple[RedisServer, str]:
    server = RedisServer("--maxmemory-policy", request.param)
    yield server, request.param
    server.stop()


def test_an_acquire_on_a_full_redis_fails_at_once_and_says_what_to_change(
    full: tuple[RedisServer, str], name: str
) -> None:
    server, policy = full
    raw = redis.Redis.from_url(server.url)
    manager = LockManager(url=f"{server.url}?socket_timeout=5")
    held = manager.lock(f"{name}:held", auto_renew=False)
    assert held.acquire(blocking=False)  # taken before Redis filled up
    assert _fill(raw) > 0
    sent = _evalsha_calls(raw)
    attempts = 0
    for i in range(10):
        for kwargs in ({"blocking": False}, {"timeout": 2.0}):
            lock = manager.lock(f"{name}:{i}:{len(kwargs)}", auto_renew=False)
            attempts += 1
            started = time.monotonic()
            try:
                taken = lock.acquire(**kwargs)  # type: ignore[arg-type]
            except LockBackendError as exc:
                _assert_clear(exc)
            else:  # an eviction made room (volatile-lru): a lock taken must release
                assert taken
                try:
                    lock.release()
                except LockNotOwned:  # its own key evicted (volatile-lru): W002's warning
                    assert policy != "noeviction"
            assert time.monotonic() - started < 1.0, "the acquire waited on a full Redis"
    # No retries, no polling: an attempt is one script, or two with its release.
    assert _evalsha_calls(raw) - sent <= 2 * attempts + 2  # (+ a script loaded on NOSCRIPT)
    # A release always runs (under volatile-lru the key may have been evicted already).
    try:
        assert held.release() == 0
    except LockNotOwned:
        assert policy != "noeviction"
    assert manager.get(f"{name}:held") is None


def test_a_batch_refused_at_maxmemory_says_what_to_change(name: str) -> None:
    """``lock_many`` sends its attempts in one round trip: each refusal reads the same."""
    server = RedisServer("--maxmemory-policy", "noeviction")
    try:
        raw = redis.Redis.from_url(server.url)
        manager = LockManager(url=f"{server.url}?socket_timeout=5")
        _fill(raw)
        with pytest.raises(LockBackendError) as caught:
            with manager.lock_many([f"{name}:a", f"{name}:b"], timeout=0):
                pass
        _assert_clear(caught.value)
    finally:
        server.stop()
