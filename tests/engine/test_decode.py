"""Reply decoding and the hand-off message (no Redis)."""

from __future__ import annotations

from typing import Any

import pytest

from django_redislock.engine import wake
from django_redislock.engine.calls import AmbiguousReply, Attempt, ExtendResult, decode_attempt
from django_redislock.engine.wake import EarlyGrants, parse_grant


@pytest.mark.parametrize("fence", [1, 42, 1_700_000_000_000_000, 2**62])
def test_decode_fresh_grant(fence: int) -> None:
    assert decode_attempt(fence) == Attempt(True, fence, 1)


@pytest.mark.parametrize(
    ("reply", "pttl"),
    [
        (-2 - 30_000, 30_000),
        (-2 - 1, 1),
        (-2, 0),
        (-1, -1),  # a lock without expiry
        (0, -2),  # the holder's key vanished between the script's reads
    ],
)
def test_decode_held_by_someone_else(reply: int, pttl: int) -> None:
    attempt = decode_attempt(reply)
    assert attempt == Attempt(False, pttl, 0)
    assert attempt.held is False


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ([b"42", 2], Attempt(True, 42, 2)),  # re-entry: HMGET fence, HINCRBY count
        ([b"42", b"1"], Attempt(True, 42, 1)),  # repeated acquire: both from HMGET
        (["42", "3"], Attempt(True, 42, 3)),  # decode_responses=True
        ((7, 5), Attempt(True, 7, 5)),
    ],
)
def test_decode_array(reply: Any, expected: Attempt) -> None:
    attempt = decode_attempt(reply)
    assert attempt == expected
    assert type(attempt.value) is int and type(attempt.holds) is int


def test_ambiguous_reply_keeps_its_cause() -> None:
    cause = ConnectionError("reset by peer")
    exc = AmbiguousReply(cause)
    assert exc.cause is cause
    assert str(exc) == "reset by peer"


@pytest.mark.parametrize(
    ("reply", "status", "ttl"),
    [
        (1500, "extended", 1.5),
        (b"2000", "extended", 2.0),
        ("1", "extended", 0.001),
        (0, "gone", None),
        (-1, "changed", None),
        (b"-1", "changed", None),
        (-2, "no-expiry", None),
    ],
)
def test_extend_result(reply: Any, status: str, ttl: float | None) -> None:
    result = ExtendResult.from_reply(reply)
    assert result.status == status
    assert result.ttl == ttl
    assert result.extended is (status == "extended")


@pytest.mark.parametrize("data", [b"proc.1f 12345", "proc.1f 12345"], ids=["bytes", "str"])
def test_parse_grant(data: bytes | str) -> None:
    nonce, fence = parse_grant(data)
    assert nonce == "proc.1f"
    assert fence == 12345
    assert type(fence) is int


def test_parse_grant_large_fence() -> None:
    assert parse_grant(b"a1b2c3.ff 1700000000000001") == ("a1b2c3.ff", 1_700_000_000_000_001)


def test_early_grants_take_removes() -> None:
    grants = EarlyGrants()
    assert grants.take("n1") is None
    grants.put("n1", 5)
    grants.put("n2", 6)
    assert grants.take("n1") == 5
    assert grants.take("n1") is None
    assert grants.take("n2") == 6


def test_early_grants_bound_drops_the_oldest() -> None:
    grants = EarlyGrants(kept=3)
    for i in range(1, 5):
        grants.put(f"n{i}", i)
    assert grants.take("n1") is None  # the oldest went
    assert [grants.take(f"n{i}") for i in (2, 3, 4)] == [2, 3, 4]


def test_early_grants_default_bound() -> None:
    grants = EarlyGrants()
    for i in range(wake.EARLY_GRANTS_KEPT + 2):
        grants.put(f"n{i}", i)
    assert grants.take("n0") is None
    assert grants.take("n1") is None
    assert grants.take("n2") == 2
    last = wake.EARLY_GRANTS_KEPT + 1
    assert grants.take(f"n{last}") == last


def test_early_grants_keep_at_least_one_and_re_put_moves_to_newest() -> None:
    tiny = EarlyGrants(kept=0)
    tiny.put("a", 1)
    assert tiny.take("a") == 1
    grants = EarlyGrants(kept=2)
    grants.put("a", 1)
    grants.put("b", 2)
    grants.put("b", 3)  # same wait again: replaces its own entry, drops nobody else's
    assert grants.take("a") == 1
    assert grants.take("b") == 3


@pytest.mark.parametrize("data", [b"proc.1f", "proc.1f"], ids=["bytes", "str"])
def test_a_message_without_fence_is_a_poke(data: bytes | str) -> None:
    assert parse_grant(data) == ("proc.1f", None)


def test_a_slots_history_is_read_from_its_ring_by_lock_key() -> None:
    from django_redislock.engine.history import histories_by_key, parse_history
    from django_redislock.engine.lua.common import HISTORY_MAX

    handoff = b'{"e":"handoff","t":1700000000000,"k":"rl:{a}","o":"a","h":1200,"w":"b","wt":300}'
    timeout = '{"e":"timeout","t":1699999999000,"k":"rl:{b}","o":"a","w":"c","wt":50}'
    forced = '{"e":"forced","t":1699999998000,"k":"rl:{a}","o":"d"}'
    ring = [handoff, timeout.encode(), forced.encode()]
    events = parse_history(ring)
    assert [e.event for e in events] == ["handoff", "timeout", "forced"]
    assert (events[0].holder, events[0].held, events[0].waiter, events[0].waited) == (
        "a", 1.2, "b", 0.3,
    )  # fmt: skip
    # A lock's history is its own events of its slot's ring, newest first.
    assert [e.event for e in parse_history(ring, "rl:{a}")] == ["handoff", "forced"]
    assert [e.event for e in parse_history(ring, "rl:{b}")] == ["timeout"]
    assert parse_history(ring, "rl:{c}") == []
    assert {k: [e.event for e in v] for k, v in histories_by_key(ring).items()} == {
        "rl:{a}": ["handoff", "forced"], "rl:{b}": ["timeout"],
    }  # fmt: skip
    # What does not parse (a missing ring field, junk, a non-list) is left out.
    assert [e.event for e in parse_history([None, b"junk", b"[1]", handoff, b"{}"])] == ["handoff"]
    assert [e.event for e in parse_history([b"junk", b"{}", b"[1, {}]"])] == []
    assert parse_history([]) == parse_history(b"[broken") == parse_history(None) == []
    many = parse_history([handoff] * (HISTORY_MAX + 1))
    assert len(many) == HISTORY_MAX
