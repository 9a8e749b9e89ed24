"""What a lock leaves in Redis once released: nothing of its own, and a bounded total.

The state that outlives a lease (the fencing counter, the last release's nonce, the
recent history) is kept per Redis Cluster hash slot, not per name: measured here with
``MEMORY USAGE`` and ``INFO memory`` on the suite's real redis-server.
"""

from __future__ import annotations

import redis

from django_redislock import locks
from tests.holding import wait_until


def _names_in_slots(prefix: str, slots: set[str], count: int) -> list[str]:
    """*count* new lock names whose slot hash is one of *slots*."""
    keyspace = locks.backend().keyspace
    found: list[str] = []
    for i in range(count * 20_000):
        name = f"{prefix}:{i}"
        if keyspace.keys(name).slot in slots:
            found.append(name)
            if len(found) == count:
                return found
    raise AssertionError("not enough names found in those slots")


def _used_by_data(client: redis.Redis) -> int:
    """Redis's ``used_memory`` without its clients' buffers (which vary with the test's
    own connections, by tens of kilobytes)."""
    memory = client.info("memory")
    return int(memory["used_memory"]) - int(memory.get("mem_clients_normal", 0))


def _lock_and_release(names: list[str]) -> None:
    for name in names:
        with locks.lock(name, auto_renew=False):
            pass


def test_a_released_name_leaves_no_key_of_its_own(redis_client: redis.Redis, name: str) -> None:
    names = [f"{name}:{i}" for i in range(300)]
    _lock_and_release(names)
    keyspace = locks.backend().keyspace
    left = {k.decode() for k in redis_client.scan_iter(count=1000)}
    assert all(n not in key for key in left for n in names), sorted(left)[:5]
    # What is left is one hash per slot used, whatever the number of names.
    assert left == {keyspace.keys(n).slot for n in names}


def test_the_memory_released_names_leave_is_bounded_in_total(
    redis_client: redis.Redis, name: str
) -> None:
    """Once the slots a site's names fall in have their hash, more distinct names cost
    no more memory: 2,000 new names in ~256 used slots leave what 256 names left."""
    keyspace = locks.backend().keyspace
    first = [f"{name}:first:{i}" for i in range(256)]
    slots = {keyspace.keys(n).slot for n in first}
    _lock_and_release(first)
    # (a first batch grows what Redis allocates once: its Lua heap, dict tables)
    _lock_and_release(_names_in_slots(f"{name}:warm", slots, 500))
    more = _names_in_slots(f"{name}:more", slots, 2000)

    def slot_bytes() -> int:
        return sum(int(redis_client.memory_usage(s, samples=0) or 0) for s in slots)

    keys_before, bytes_before = redis_client.dbsize(), slot_bytes()
    used_before = _used_by_data(redis_client)
    _lock_and_release(more)
    used_after = _used_by_data(redis_client)
    assert redis_client.dbsize() == keys_before == len(slots)
    # The slots' hashes hold one token and one nonce each, rewritten: a few bytes of
    # varying length, not a record per name.
    assert slot_bytes() - bytes_before <= 16 * len(slots)
    # A hash per name, as before this layout, took ~440 bytes each for a day; what moves
    # here is Redis's own (its tables and allocator: tens of kilobytes at times, once).
    assert used_after - used_before < 2000 * 50, used_after - used_before


def test_a_loss_recorded_in_a_slot_whose_hash_is_gone_leaves_it_a_retention(
    redis_client: redis.Redis, name: str
) -> None:
    """A holder's renewal that finds its hold gone writes a "lost" event; when the slot
    hash had gone meanwhile (its retention ran out, or an operator deleted it), the
    event's write must not create a hash that lives for ever."""
    holder = locks.lock(name, owner="renewing holder", ttl=1)  # renewed every ~0.33 s
    assert holder.acquire()
    keys = locks.backend().keyspace.keys(name)
    redis_client.delete(keys.lock, keys.slot)  # the hold and its slot's hash, both gone
    wait_until(lambda: holder.lost, timeout=5)  # its next renewal finds it gone
    wait_until(lambda: [e.event for e in locks.history(name)] == ["lost"], timeout=5)
    retention_ms = locks.backend().retention_ms
    assert 0 < redis_client.pttl(keys.slot) <= retention_ms
