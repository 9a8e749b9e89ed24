"""Fencing tokens with the per-slot counter: every new holder of a name gets a larger
token, across names of one slot, an expired lease and a restart from the append-only
file (a failover: tests/test_replicas.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from django_redislock import LockManager
from tests.restartable import RestartableRedis


@pytest.fixture
def server() -> Iterator[RestartableRedis]:
    """A redis-server whose every write is in its append-only file before it answers."""
    server = RestartableRedis(persistent=True)
    yield server
    server.close()


def _same_slot(manager: LockManager, name: str) -> str:
    keyspace = manager.backend().keyspace
    slot = keyspace.keys(name).slot
    return next(n for i in range(200_000) if keyspace.keys(n := f"{name}:{i}").slot == slot)


def test_names_of_one_slot_share_one_increasing_counter(manager: LockManager, name: str) -> None:
    other = _same_slot(manager, name)
    tokens: dict[str, list[int]] = {name: [], other: []}
    order: list[int] = []
    for i in range(10):
        lock_name = (name, other)[i % 2]
        with manager.lock(lock_name, auto_renew=False) as held:
            assert held.fencing_token is not None
            tokens[lock_name].append(held.fencing_token)
            order.append(held.fencing_token)
    assert order == sorted(order) and len(set(order)) == len(order)
    assert all(t == sorted(t) for t in tokens.values())


def test_a_token_after_an_expired_lease_is_larger(manager: LockManager, name: str) -> None:
    first = manager.lock(name, ttl=0.1, auto_renew=False)
    assert first.acquire()
    token = first.fencing_token
    deadline = time.monotonic() + 5
    while manager.get(name) is not None:
        assert time.monotonic() < deadline, "the lease never ran out"
        time.sleep(0.02)
    with manager.lock(name, auto_renew=False) as second:
        assert second.fencing_token is not None and token is not None
        assert second.fencing_token > token


def test_the_counter_survives_a_restart_from_the_append_only_file(
    server: RestartableRedis, name: str
) -> None:
    """The slot's counter is raised far past Redis's clock (as many grants, or a clock
    that stepped back, would leave it): after a SIGKILL and a restart from the AOF, the
    next token is still larger: it comes from the counter, not from the clock."""
    client = redis.Redis.from_url(server.url)
    manager = LockManager(client=client)
    with manager.lock(name, auto_renew=False) as held:
        assert held.fencing_token is not None
        ahead = held.fencing_token + 10**12
    client.hset(manager.backend().keyspace.keys(name).slot, "fence", str(ahead))
    server.restart()
    with manager.lock(name, auto_renew=False) as after:
        assert after.fencing_token is not None and after.fencing_token > ahead
