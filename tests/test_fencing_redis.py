"""Store-enforced fencing on Redis: ``held.check()`` / ``locks.is_current()`` and the
guarded writes of ``held.guarded()``, sync and asyncio, on one Redis, a Redis Cluster
(keys in the lock's slot) and Redlock (refused); and every misuse's named error."""

from __future__ import annotations

import asyncio

import pytest
import redis

from django_redislock import LockLost, LockManager, LockMismatch, LockNotOwned, locks
from django_redislock.engine.lua import fenced as fenced_scripts
from django_redislock.exceptions import FencingUnsupported, StaleFencingToken
from tests.redis_server import RedisServer
from tests.test_script_keys import Monitor, _assert_every_script_names_a_key, _package_scripts

# -- is the hold current? ---------------------------------------------------------


def test_check_returns_the_token_while_held_and_raises_once_taken_over(name: str) -> None:
    lock = locks.lock(name, ttl=30)
    with pytest.raises(LockLost), lock as held:  # leaving the block: the hold was lost
        token = held.fencing_token
        assert token is not None
        assert held.check() == token
        assert locks.is_current(name, token)
        assert not locks.is_current(name, token - 1)
        locks.force_release(name)  # as if its lease had run out
        with pytest.raises(StaleFencingToken) as refused:
            held.check()
        assert isinstance(refused.value, LockLost)
        assert refused.value.token == token and refused.value.current is None
        assert "nobody holds it now" in str(refused.value)
        assert not locks.is_current(name, token)
        other = locks.lock(name, owner="successor")
        assert other.acquire()
        with pytest.raises(StaleFencingToken) as refused:
            held.check()
        assert refused.value.current == other.fencing_token
        assert f"held with token {other.fencing_token} now" in str(refused.value)
        assert locks.is_current(name, other.fencing_token)
        other.release()
    assert lock.fencing_token is None  # the hold is gone once the block ended


def test_acheck_and_ais_current(name: str) -> None:
    async def main() -> None:
        async with locks.lock(name, ttl=30) as held:
            token = held.fencing_token
            assert await held.acheck() == token
            assert await locks.ais_current(name, token)
            await locks.aforce_release(name)
            with pytest.raises(StaleFencingToken):
                await held.acheck()
            assert not await locks.ais_current(name, token)
        await locks.source.abackend().aclose()

    with pytest.raises(LockLost):  # leaving the block: the hold was lost
        asyncio.run(main())


def test_a_re_entry_keeps_the_hold_current(name: str) -> None:
    lock = locks.lock(name, ttl=30)
    with lock, lock:
        assert lock.check() == lock.fencing_token
    with pytest.raises(LockNotOwned):
        lock.check()


def test_misuse_of_check_is_refused_with_a_named_error(name: str) -> None:
    with pytest.raises(LockNotOwned, match="not held by this owner"):
        locks.lock(name).check()
    with pytest.raises(LockNotOwned):
        locks.lock(name).guarded()
    with pytest.raises(TypeError, match="token is None"):
        locks.is_current(name, None)
    with pytest.raises(TypeError, match="is an int"):
        locks.is_current(name, True)
    with pytest.raises(TypeError, match="is an int"):
        locks.is_current(name, "17")
    with pytest.raises(ValueError, match="positive"):
        locks.is_current(name, 0)
    with pytest.raises(ValueError):
        locks.is_current("", 5)
    with locks.semaphore(name, limit=2) as permit:
        with pytest.raises(FencingUnsupported, match="for mutexes"):
            permit.check()
        with pytest.raises(FencingUnsupported, match="for mutexes"):
            permit.guarded()
        # A token checked against a name a semaphore uses: the name is refused, not "stale".
        with pytest.raises(LockMismatch, match="in use as a semaphore"):
            locks.is_current(name, 5)
        with pytest.raises(LockMismatch, match="in use as a semaphore"):
            locks.guarded(name, 5).set(f"{name}:k", "v")


# -- guarded writes ------------------------------------------------------------------


def test_guarded_writes_land_while_the_hold_is_current(
    name: str, redis_client: redis.Redis
) -> None:
    k = f"{name}:k"
    with locks.lock(name, ttl=30) as held:
        g = held.guarded()
        assert g.set(f"{k}:s", "v") is True
        assert g.set(f"{k}:s", "w", nx=True) is False  # NX said no: a reply, not a refusal
        assert g.set(f"{k}:e", "v", ex=30) is True
        assert g.hset(f"{k}:h", {"a": 1, "b": "two"}) == 2
        assert g.incrby(f"{k}:n", 5) == 5
        assert g.incrby(f"{k}:n") == 6
        assert g.execute("LPUSH", f"{k}:l", "x", "y") == 2
        assert g.execute("RENAME", f"{k}:l", f"{k}:l2", keys=2) == b"OK"
        assert g.delete(f"{k}:s", f"{k}:missing") == 1
    assert redis_client.get(f"{k}:s") is None
    assert 0 < redis_client.pttl(f"{k}:e") <= 30_000
    assert redis_client.hgetall(f"{k}:h") == {b"a": b"1", b"b": b"two"}
    assert redis_client.get(f"{k}:n") == b"6"
    assert redis_client.lrange(f"{k}:l2", 0, -1) == [b"y", b"x"]


def test_a_stale_holder_writes_nothing(name: str, redis_client: redis.Redis) -> None:
    k = f"{name}:k"
    redis_client.set(f"{k}:s", "before")
    redis_client.set(f"{k}:d", "kept")
    lock = locks.lock(name, ttl=30)
    with pytest.raises(LockLost):
        with lock as held:
            g = held.guarded()
            locks.force_release(name)
            successor = locks.lock(name, owner="successor")
            assert successor.acquire()
            new = locks.guarded(name, successor.fencing_token)
            assert new.set(f"{k}:s", "successor")
            refusals = [
                lambda: g.set(f"{k}:s", "stale"),
                lambda: g.hset(f"{k}:h", {"a": "stale"}),
                lambda: g.incrby(f"{k}:n", 1),
                lambda: g.delete(f"{k}:d"),
                lambda: g.execute("LPUSH", f"{k}:l", "stale"),
            ]
            for write in refusals:
                with pytest.raises(StaleFencingToken) as refused:
                    write()
                assert refused.value.token == g.token
                assert refused.value.current == successor.fencing_token
                assert refused.value.target is not None and refused.value.target.startswith(k)
                assert "refused" in str(refused.value)
            successor.release()
    assert redis_client.get(f"{k}:s") == b"successor"
    assert redis_client.get(f"{k}:d") == b"kept"
    assert not redis_client.exists(f"{k}:h", f"{k}:n", f"{k}:l")


def test_async_guarded_writes(name: str, redis_client: redis.Redis) -> None:
    k = f"{name}:k"

    async def main() -> None:
        async with locks.lock(name, ttl=30) as held:
            g = held.guarded()
            assert await g.aset(f"{k}:s", "v")
            assert await g.ahset(f"{k}:h", {"a": "1"}) == 1
            assert await g.aincrby(f"{k}:n", 3) == 3
            assert await g.aexecute("SADD", f"{k}:set", "m") == 1
            assert await g.adelete(f"{k}:s") == 1
            await locks.aforce_release(name)
            for write in (
                lambda: g.aset(f"{k}:s", "stale"),
                lambda: g.ahset(f"{k}:h", {"a": "stale"}),
                lambda: g.aincrby(f"{k}:n", 1),
                lambda: g.adelete(f"{k}:h"),
                lambda: g.aexecute("SADD", f"{k}:set", "stale"),
            ):
                with pytest.raises(StaleFencingToken):
                    await write()
        await locks.source.abackend().aclose()

    with pytest.raises(LockLost):
        asyncio.run(main())
    assert redis_client.get(f"{k}:s") is None
    assert redis_client.hgetall(f"{k}:h") == {b"a": b"1"}
    assert redis_client.get(f"{k}:n") == b"3"
    assert redis_client.smembers(f"{k}:set") == {b"m"}


def test_misuse_of_guarded_writes_is_refused_with_a_named_error(name: str) -> None:
    with locks.lock(name, ttl=30) as held:
        g = held.guarded()
        with pytest.raises(ValueError, match="names no key"):
            g.delete()
        with pytest.raises(ValueError, match="at least 1"):
            g.execute("PING", keys=0)
        with pytest.raises(ValueError, match="fewer than keys=2"):
            g.execute("RENAME", "a", keys=2)
        with pytest.raises(ValueError, match="command name"):
            g.execute("", "a")
        with pytest.raises(ValueError, match="nx or xx"):
            g.set("a", "b", nx=True, xx=True)
        with pytest.raises(ValueError, match="ex must be"):
            g.set("a", "b", ex=0)
        with pytest.raises(ValueError, match="at least one field"):
            g.hset("a", {})
        with pytest.raises(TypeError, match="int amount"):
            g.incrby("a", 1.5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="non-empty str or bytes"):
            g.execute("GET", 7)
    with pytest.raises(TypeError, match="token is None"):
        locks.guarded(name, None)


def test_a_command_error_is_a_backend_error_and_writes_nothing(
    name: str, redis_client: redis.Redis
) -> None:
    from django_redislock import LockBackendError

    redis_client.set(f"{name}:s", "text")
    with locks.lock(name, ttl=30) as held:
        with pytest.raises(LockBackendError, match="WRONGTYPE|not an integer"):
            held.guarded().incrby(f"{name}:s", 1)
    assert redis_client.get(f"{name}:s") == b"text"


# -- Redlock and the scripts' keys ----------------------------------------------------


def test_redlock_refuses_checks_and_guarded_writes(masters: list[RedisServer], name: str) -> None:
    m = LockManager(redlock_caches=[f"{s.url}?socket_timeout=5" for s in masters])
    with m.lock(name, ttl=30) as held:
        for call in (held.check, lambda: held.guarded().set("k", "v")):
            with pytest.raises(FencingUnsupported, match="every master keeps its own copy"):
                call()
        with pytest.raises(FencingUnsupported):
            m.is_current(name, held.fencing_token)


def test_every_fencing_script_names_its_keys(name: str) -> None:
    server = RedisServer()
    try:
        m = LockManager(url=f"{server.url}?socket_timeout=5")
        monitor = Monitor(server.url)
        with m.lock(name, ttl=30) as held:
            held.check()
            held.guarded().set(f"{name}:k", "v")
        sent = _assert_every_script_names_a_key(monitor.stop())
    finally:
        server.stop()
    expected = _package_scripts(fenced_scripts)
    assert set(expected) <= sent, "a fencing script was not sent"


# -- Redis Cluster ------------------------------------------------------------------------


@pytest.mark.slow
def test_on_a_cluster_guarded_writes_run_in_the_locks_slot(name: str) -> None:
    from redis.crc import key_slot

    from tests.redis_cluster import shared_cluster

    cluster = shared_cluster()
    m = LockManager(client=cluster.client())
    client = cluster.client()
    with pytest.raises(LockLost), m.lock(name, ttl=30) as held:
        g = held.guarded()
        assert g.hash_tag == "{" + name + "}"
        key = f"balance:{g.hash_tag}"
        assert key_slot(key.encode()) == key_slot(m.backend().keyspace.keys(name).lock.encode())
        assert held.check() == held.fencing_token
        assert g.incrby(key, 7) == 7
        assert g.hset(f"meta:{g.hash_tag}", {"by": "holder"}) == 1
        with pytest.raises(ValueError, match=r"is in Redis Cluster slot .*'balance:\{") as wrong:
            g.set("balance:elsewhere", "x")
        assert "hash tag" in str(wrong.value)
        with pytest.raises(ValueError, match="slot"):
            g.delete(key, "another-key")
        m.force_release(name)
        with pytest.raises(StaleFencingToken):
            g.incrby(key, 1)
        assert not m.is_current(name, held.fencing_token)

        async def stale_async() -> None:
            try:
                with pytest.raises(StaleFencingToken):
                    await g.aincrby(key, 1)
                assert not await m.ais_current(name, g.token)
            finally:
                await m.source.abackend().aclose()

        asyncio.run(stale_async())
    assert client.get(key) == b"7"
    assert client.get("balance:elsewhere") is None
