"""Single-process behaviour of Lock: ownership, re-entrancy, leases, fencing, input checks."""

from __future__ import annotations

import math
import threading
import time

import pytest
import redis
from django.test import override_settings

from django_redislock import (
    Lock,
    LockError,
    LockLost,
    LockManager,
    LockNotAcquired,
    LockNotOwned,
    locks,
)


def test_acquire_release_stores_metadata_and_deletes_key(
    manager: LockManager, name: str, redis_client
) -> None:
    lock = manager.lock(name, ttl=10, purpose="nightly report", extra={"report": 42})
    assert lock.acquire(blocking=False)
    info = manager.get(name)
    assert info is not None
    assert info.owner == lock.owner
    assert info.hold_count == 1
    assert info.fencing_token == lock.fencing_token
    assert info.purpose == "nightly report"
    assert info.extra == {"report": 42}
    assert info.pid and info.host and info.thread == threading.current_thread().name
    assert info.acquired_at is not None
    assert 9 < info.ttl <= 10
    assert info.lease == 10
    lock.release()
    assert redis_client.exists(info.key) == 0
    assert manager.get(name) is None


def test_second_owner_is_refused_and_cannot_release(manager: LockManager, name: str) -> None:
    mine = manager.lock(name, owner="owner-a")
    theirs = manager.lock(name, owner="owner-b")
    assert mine.acquire(blocking=False)
    assert not theirs.acquire(blocking=False)
    with pytest.raises(LockNotOwned):
        theirs.release()
    with pytest.raises(LockNotOwned):
        theirs.extend(5)
    info = manager.get(name)
    assert info is not None and info.owner == "owner-a" and info.hold_count == 1
    mine.release()


def test_reentrant_per_owner_needs_matching_releases(
    manager: LockManager, name: str, redis_client
) -> None:
    lock = manager.lock(name)
    other_instance_same_thread = manager.lock(name)
    assert lock.acquire(blocking=False)
    assert other_instance_same_thread.acquire(blocking=False)
    assert lock.acquire(blocking=False)
    assert manager.get(name).hold_count == 3
    lock.release()
    other_instance_same_thread.release()
    assert lock.owned()
    lock.release()
    assert not lock.locked()
    with pytest.raises(LockNotOwned):
        lock.release()


def test_other_thread_is_another_owner(manager: LockManager, name: str) -> None:
    lock = manager.lock(name)
    assert lock.acquire(blocking=False)
    seen: dict[str, object] = {}

    def other() -> None:
        seen["acquired"] = lock.acquire(blocking=False)
        seen["owned"] = lock.owned()
        try:
            lock.release()
        except LockNotOwned:
            seen["release"] = "refused"

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    assert seen == {"acquired": False, "owned": False, "release": "refused"}
    assert lock.owned()
    lock.release()


def test_a_release_from_another_thread_names_the_thread_that_holds_the_lock(
    manager: LockManager, name: str
) -> None:
    """The refusal says the owner is the thread (not that the lease may have run out)."""
    lock = manager.lock(name, ttl=30)
    assert lock.acquire(blocking=False)
    errors: list[LockNotOwned] = []

    def other() -> None:
        for call in (lock.release, lambda: lock.extend(5)):
            try:
                call()
            except LockNotOwned as exc:
                errors.append(exc)

    thread = threading.Thread(target=other, name="releaser")
    thread.start()
    thread.join(10)
    assert [e.name for e in errors] == [name, name]
    released, extended = (str(e) for e in errors)
    assert released.startswith(f"cannot release lock {name!r}: this thread (owner ")
    assert f"held by another thread of this process (owner {lock.owner!r}, thread " in released
    assert repr(threading.current_thread().name) in released
    assert "release it there, or give the Lock objects one explicit owner=" in released
    assert "its lease" not in released
    assert extended.startswith(f"cannot extend lock {name!r}: this thread (owner ")
    lock.release()


def test_a_refused_release_says_who_holds_the_lock_or_that_nobody_does(
    manager: LockManager, name: str
) -> None:
    mine = manager.lock(name, owner="owner-a")
    theirs = manager.lock(name, owner="owner-b")
    assert mine.acquire(blocking=False)
    with pytest.raises(LockNotOwned) as refused:
        theirs.release()
    assert str(refused.value).startswith(
        f"cannot release lock {name!r}: owner 'owner-b' does not hold it; it is held by "
        "owner 'owner-a' (host "
    )
    assert "explicit owner=" not in str(refused.value)
    mine.release()
    with pytest.raises(LockNotOwned) as refused:
        theirs.release()
    assert str(refused.value) == (
        f"cannot release lock {name!r}: owner 'owner-b' does not hold it, and nobody "
        "holds it now (its lease ran out, or someone else released it)"
    )


def test_context_manager_and_fencing_tokens_increase(
    manager: LockManager, name: str, redis_client
) -> None:
    tokens = []
    for _ in range(5):
        with manager.lock(name) as held:
            tokens.append(held.fencing_token)
    assert tokens == sorted(tokens) and len(set(tokens)) == 5
    # Even when the fence hash is gone (retention expired), tokens keep increasing.
    redis_client.delete(manager.backend().keyspace.keys(name).slot)
    with manager.lock(name) as held:
        assert held.fencing_token > tokens[-1]


def test_fence_memory_is_bounded_by_retention(
    manager: LockManager, name: str, redis_client
) -> None:
    with override_settings(REDISLOCK_FENCE_RETENTION=60):
        m = LockManager(manager.cache_alias)
        slot_key = m.backend().keyspace.keys(name).slot
        redis_client.delete(slot_key)  # (shared by its slot: another test may have made it)
        with m.lock(name):
            pass
        assert 0 < redis_client.pttl(slot_key) <= 60_000
        assert redis_client.exists(m.backend().keyspace.keys(name).lock) == 0


def test_context_manager_raises_when_not_acquired(manager: LockManager, name: str) -> None:
    holder = manager.lock(name, owner="someone-else")
    assert holder.acquire(blocking=False)
    with pytest.raises(LockNotAcquired) as caught:
        with manager.lock(name, blocking=False):
            pytest.fail("body must not run")
    assert caught.value.name == name
    with pytest.raises(LockNotAcquired):
        with manager.lock(name, timeout=0.05):
            pytest.fail("body must not run")
    holder.release()


def test_ttl_extend_reacquire(manager: LockManager, name: str) -> None:
    lock = manager.lock(name, ttl=10, auto_renew=False)
    assert lock.ttl() is None
    lock.acquire()
    assert 9 < lock.ttl() <= 10
    lock.extend(10)
    assert 19 < lock.ttl() <= 20
    lock.extend(5, replace_ttl=True)
    assert 4 < lock.ttl() <= 5
    lock.extend(0.5, replace_ttl=True)
    assert lock.reacquire()
    assert 9 < lock.ttl() <= 10
    lock.release()
    with pytest.raises(LockNotOwned):
        lock.extend(1)
    with pytest.raises(LockNotOwned):
        lock.reacquire()


def test_default_ttl_is_read_lazily_from_settings(manager: LockManager, name: str) -> None:
    with override_settings(REDISLOCK_DEFAULT_TTL=7):
        lock = manager.lock(name)
        lock.acquire()
        assert 6 < lock.ttl() <= 7
        lock.release()
    lock = manager.lock(name)
    lock.acquire()
    assert 29 < lock.ttl() <= 30
    lock.release()


def test_no_expiry_needs_explicit_opt_in(manager: LockManager, name: str) -> None:
    with pytest.raises(ValueError, match="no_expiry=True"):
        manager.lock(name, ttl=None)
    with pytest.raises(ValueError):
        manager.lock(name, ttl=5, no_expiry=True)
    lock = manager.lock(name, ttl=None, no_expiry=True)
    lock.acquire()
    assert lock.ttl() == math.inf
    assert manager.get(name).ttl == math.inf
    with pytest.raises(LockError, match="no expiry"):
        lock.extend(5)
    with pytest.raises(LockError):
        lock.reacquire()
    lock.release()
    assert not lock.locked()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"name": ""}, ValueError, "empty"),
        ({"name": "x" * 1025}, ValueError, "1024"),
        ({"name": 42}, TypeError, "str"),
        ({"name": b"bytes"}, TypeError, "str"),
        ({"name": "\udcff"}, ValueError, "UTF-8"),
        ({"name": "n", "ttl": 0}, ValueError, "positive.*ttl=None, no_expiry=True"),
        ({"name": "n", "ttl": -1}, ValueError, "positive"),
        ({"name": "n", "ttl": float("nan")}, ValueError, "positive"),
        ({"name": "n", "ttl": "30"}, TypeError, "number"),
        ({"name": "n", "ttl": True}, TypeError, "number"),
        ({"name": "n", "ttl": 0.0001}, ValueError, "1 ms"),
        ({"name": "n", "timeout": -2}, ValueError, "positive"),
        ({"name": "n", "owner": ""}, ValueError, "owner"),
        ({"name": "n", "owner": 5}, TypeError, "owner"),
        ({"name": "n", "owner": b"\xff"}, ValueError, "UTF-8"),
        ({"name": "n", "extra": {"a": object()}}, TypeError, "JSON"),
        ({"name": "n", "extra": [1]}, TypeError, "dict"),
        ({"name": "n", "purpose": 3}, TypeError, "purpose"),
    ],
)
def test_invalid_input_is_refused_with_a_clear_message(kwargs, error, message) -> None:
    name = kwargs.pop("name")
    with pytest.raises(error, match=message):
        locks.lock(name, **kwargs)


def test_a_refused_timeout_says_that_0_and_none_are_accepted(name: str) -> None:
    # Issue 41, defect 7: timeout=-1 said "must be a positive number" though 0 is valid.
    accepted = "must be 0 (one attempt, no wait), a positive finite number of seconds, or None"
    refusals = [
        lambda: locks.lock(name, timeout=-1),
        lambda: locks.lock(name).acquire(timeout=-1),
        lambda: locks.lock(name).acquire(blocking_timeout=-1),
        lambda: locks.lock_many([name], timeout=-1),
        lambda: locks.election(name).campaign(timeout=-1),
    ]
    for refuse in refusals:
        with pytest.raises(ValueError) as raised:
            refuse()
        assert f"timeout {accepted} (wait with no limit), got -1" in str(raised.value)
        assert "must be a positive number" not in str(raised.value)
    with pytest.raises(ValueError, match=r"or None \(never look for a deadlock\), got 0"):
        locks.lock(name, deadlock_timeout=0)


def test_acquire_argument_checks(manager: LockManager, name: str) -> None:
    lock = manager.lock(name)
    with pytest.raises(ValueError, match="positive"):
        lock.acquire(blocking_timeout=-1)
    with pytest.raises(ValueError, match="positive"):
        lock.extend(-1)
    assert not lock.locked()


def test_zero_wait_means_one_attempt_as_in_redis_py(manager: LockManager, name: str) -> None:
    holder = manager.lock(name, owner="holder")
    assert holder.acquire()
    other = manager.lock(name)
    started = time.monotonic()
    assert other.acquire(timeout=0) is False
    assert other.acquire(blocking_timeout=0) is False
    assert manager.lock(name, timeout=0).acquire() is False
    assert time.monotonic() - started < 1.0, "a zero wait must not wait"
    holder.release()
    assert other.acquire(blocking_timeout=0) is True
    other.release()


def test_blocking_false_wins_over_a_wait_as_in_redis_py(
    manager: LockManager, name: str, redis_client: redis.Redis
) -> None:
    """``acquire(blocking=False, blocking_timeout=5)``: one attempt in both libraries
    (redis-py ignores the wait), run side by side on the same server."""
    theirs = redis_client.lock(f"redis-py:{name}", timeout=30)
    assert redis_client.lock(f"redis-py:{name}", timeout=30).acquire()
    holder = manager.lock(name, owner="holder")
    assert holder.acquire()
    ours = manager.lock(name)
    started = time.monotonic()
    assert theirs.acquire(blocking=False, blocking_timeout=5) is False
    assert ours.acquire(blocking=False, blocking_timeout=5) is False
    assert ours.acquire(blocking=False, timeout=5) is False
    assert manager.lock(name, timeout=5).acquire(blocking=False) is False
    assert time.monotonic() - started < 1.0, "blocking=False must not wait"
    holder.release()
    assert ours.acquire(blocking=False, blocking_timeout=5) is True
    ours.release()


def test_redis_py_timeout_0_means_no_expiry_here_ttl_0_is_refused(
    manager: LockManager, name: str, redis_client: redis.Redis
) -> None:
    """What docs/redis-py-migration.md says of ``timeout=0``."""
    theirs = redis_client.lock(f"redis-py:{name}", timeout=0)
    assert theirs.acquire(blocking=False)
    assert redis_client.pttl(f"redis-py:{name}") == -1  # no expiry in redis-py
    theirs.release()
    with pytest.raises(ValueError, match=r"ttl=None, no_expiry=True"):
        manager.lock(name, ttl=0)
    forever = manager.lock(name, ttl=None, no_expiry=True)
    assert forever.acquire(blocking=False)
    assert forever.ttl() == math.inf
    forever.release()


def test_bytes_token_and_redis_py_error_attributes(manager: LockManager, name: str) -> None:
    lock = manager.lock(name)
    assert lock.acquire(token=b"owner-bytes")
    assert lock.owner == "owner-bytes"
    assert manager.get(name).owner == "owner-bytes"
    with pytest.raises(LockNotAcquired) as caught:
        with manager.lock(name, blocking=False):
            pass
    assert caught.value.lock_name == caught.value.name == name
    lock.release()


def test_redis_py_style_arguments(manager: LockManager, name: str) -> None:
    lock = manager.lock(name)
    assert lock.acquire(blocking=True, blocking_timeout=1, token="my-token", sleep=0.1)
    assert manager.get(name).owner == "my-token"
    assert lock.owned()
    lock.release()


def test_any_characters_in_names_are_stored_and_listed(manager: LockManager, redis_client) -> None:
    names = [
        "}starts-with-brace",
        "\\backslash",
        "a*b?c[d]",
        "{tag}x",
        "ünïcode ✓",
        "sp ace",
        "new\nline",
    ]
    held = [manager.lock(n, owner="o") for n in names]
    for lock in held:
        assert lock.acquire(blocking=False)
    assert {info.name for info in manager.active()} == set(names)
    for n in names:
        assert manager.get(n).name == n
    assert [i.name for i in manager.active("a*b")] == ["a*b?c[d]"]
    assert [i.name for i in manager.active("}")] == ["}starts-with-brace"]
    assert [i.name for i in manager.active("\\")] == ["\\backslash"]
    for lock in held:
        lock.release()
    assert list(manager.active()) == []


def test_active_filters_by_literal_prefix_and_skips_companion_keys(manager: LockManager) -> None:
    for n in ["report:1", "report:2", "reportx", "other"]:
        manager.lock(n, owner="o").acquire()
    # A waiter leaves queue/waiter keys behind while it waits; those are not locks.
    assert not manager.lock("report:1", owner="waiter").acquire(timeout=0.05)
    assert sorted(i.name for i in manager.active("report:")) == ["report:1", "report:2"]
    assert len(list(manager.active())) == 4


def test_force_release_compares_owner_and_token(manager: LockManager, name: str) -> None:
    lock = manager.lock(name, owner="holder")
    lock.acquire()
    token = lock.fencing_token
    assert not manager.force_release(name, owner="somebody")
    assert not manager.force_release(name, fencing_token=token + 1)
    assert manager.get(name) is not None
    assert manager.force_release(name, owner="holder", fencing_token=token)
    assert manager.get(name) is None
    assert not manager.force_release(name)


def test_lost_lock_raises_on_exit_and_can_be_configured(manager: LockManager, name: str) -> None:
    with pytest.raises(LockLost):
        with manager.lock(name, auto_renew=False):
            manager.force_release(name)
    with manager.lock(name, raise_on_lost=False) as held:
        manager.force_release(name)
    assert not held.locked()
    # An exception from the body is never masked by the lost lock.
    with pytest.raises(KeyError):
        with manager.lock(name):
            manager.force_release(name)
            raise KeyError("body")


def test_public_api_is_small() -> None:
    import django_redislock

    assert set(django_redislock.__all__) >= {"locks", "Lock", "LockNotAcquired", "LockError"}
    assert all(hasattr(django_redislock, n) for n in django_redislock.__all__)
    assert isinstance(locks.lock("x"), Lock)


@pytest.mark.parametrize(
    "lock_name", ["plain", "}leading-brace", "\\leading-escape", "{a}b", "a}b{c", "x" * 1024, "ü"]
)
def test_all_keys_of_a_lock_share_one_cluster_slot(lock_name: str) -> None:
    from redis.crc import key_slot

    keys = locks.backend().keyspace.keys(lock_name)
    slots = {key_slot(k) for k in keys.all}
    assert len(slots) == 1, f"{lock_name!r} spreads over slots {slots}"
    assert locks.backend().keyspace.name_from_key(keys.lock) == lock_name


def test_foreign_keys_under_the_prefix_are_shown_and_releasable(
    manager: LockManager, redis_client
) -> None:
    key = manager.backend().keyspace.keys("foreign").lock
    redis_client.set(key, "written by another tool", px=60_000)
    info = manager.get("foreign")
    assert info is not None and info.kind == "foreign" and info.owner is None
    assert 0 < info.ttl <= 60
    assert manager.force_release("foreign")
    assert redis_client.exists(key) == 0


def test_force_extend_compares_owner(manager: LockManager, name: str) -> None:
    lock = manager.lock(name, owner="holder", ttl=10, auto_renew=False)
    lock.acquire()
    assert manager.force_extend(name, 5, owner="other").status == "changed"
    result = manager.force_extend(name, 20, owner="holder", fencing_token=lock.fencing_token)
    assert result.extended and 29 < result.ttl <= 30
    lock.release()
    assert manager.force_extend(name, 5).status == "gone"


def test_release_all_frees_every_hold_of_the_owner(manager: LockManager, name: str) -> None:
    enqueue_time = manager.lock(name, owner="task-1")
    run_time = manager.lock(name, owner="task-1")
    assert enqueue_time.acquire(blocking=False)
    assert run_time.acquire(blocking=False)
    assert manager.get(name).hold_count == 2
    assert run_time.release_all() == 0
    assert manager.get(name) is None
    with pytest.raises(LockNotOwned):
        run_time.release_all()


def test_scripts_are_reloaded_after_a_script_flush(
    manager: LockManager, name: str, redis_client
) -> None:
    with manager.lock(name):
        pass
    redis_client.script_flush()
    with manager.lock(name) as held:
        assert held.owned()
    assert not manager.lock(name).locked()


def test_asyncio_tasks_on_one_loop_are_different_owners() -> None:
    import asyncio

    from django_redislock.engine.identity import current_owner

    async def owner_of_task() -> str:
        return current_owner()

    async def main() -> tuple[str, str, str]:
        parent = current_owner()
        first, second = await asyncio.gather(owner_of_task(), owner_of_task())
        return parent, first, second

    parent, first, second = asyncio.run(main())
    assert len({parent, first, second, current_owner()}) == 4


def test_unparsable_fields_under_the_prefix_do_not_break_listing(
    manager: LockManager, redis_client
) -> None:
    key = manager.backend().keyspace.keys("weird").lock
    redis_client.hset(key, mapping={"since": "99999999999999999999", "count": "x", "meta": "{"})
    info = manager.get("weird")
    assert info is not None and info.acquired_at is None and info.hold_count is None
    assert [i.name for i in manager.active()] == ["weird"]


def test_unowned_only_leaves_a_lock_that_has_an_owner(
    manager: LockManager, name: str, redis_client
) -> None:
    key = manager.backend().keyspace.keys(name).lock
    redis_client.set(key, "another tool", px=60_000)
    assert manager.force_extend(name, 5, unowned_only=True).extended
    assert manager.force_release(name, unowned_only=True)
    holder = manager.lock(name, owner="one-of-ours")
    holder.acquire()
    assert manager.force_extend(name, 5, unowned_only=True).status == "changed"
    assert not manager.force_release(name, unowned_only=True)
    assert holder.owned()
    holder.release()
