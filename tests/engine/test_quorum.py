"""Redlock's majority decisions, without Redis (engine/quorum.py)."""

from __future__ import annotations

import pytest

from django_redislock.engine.calls import Call
from django_redislock.engine.info import LockInfo
from django_redislock.engine.lua.mutex import acquire_script
from django_redislock.engine.lua.quorum import rl_commit_script
from django_redislock.engine.quorum import (
    AcquireOutcome,
    QuorumNotReached,
    commit_call,
    decide_acquire,
    decide_commit,
    decide_count,
    decide_extend,
    decide_renewal,
    decide_snapshot,
    node_timeout_ms,
    quorum,
    validity_ms,
)

LOST = TimeoutError("no answer")


def test_quorum_sizes() -> None:
    assert [quorum(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


def test_node_timeout_and_validity() -> None:
    assert node_timeout_ms(30_000) == 100.0  # capped
    assert node_timeout_ms(5_000) == 50.0
    assert node_timeout_ms(1_000) == 20.0  # floor
    assert validity_ms(10_000, 30) == 10_000 - 30 - 102
    assert validity_ms(0, 30) == float("inf")


def test_a_majority_of_grants_is_held_with_the_largest_token() -> None:
    outcome = decide_acquire([7, 9, 8, LOST, -5], 30_000, 1.0)
    assert (outcome.reply, outcome.undo, outcome.error) == (9, False, None)


def test_reentries_keep_the_count() -> None:
    outcome = decide_acquire([[b"7", b"2"], [b"9", b"2"], [b"8", b"2"]], 30_000, 1.0)
    assert outcome.reply == [9, 2]


def test_a_split_vote_is_undone_and_backs_off_briefly() -> None:
    outcome = decide_acquire([7, 8, -1002, -1002, LOST], 30_000, 1.0, backoff=lambda a, b: 17)
    assert outcome.undo and outcome.reply == -2 - 17


def test_a_majority_holder_gives_its_shortest_lease_as_the_hint() -> None:
    outcome = decide_acquire([-2 - 900, -2 - 500, -2 - 700, -2 - 800, LOST], 30_000, 1.0)
    assert outcome.undo and outcome.reply == -2 - 500


def test_a_lock_in_transition_is_asked_again_soon() -> None:
    """A release that reached one master first: a waiter poked by it gets that grant
    and "held" from the rest; it asks again after a short backoff, not the lease."""
    outcome = decide_acquire(
        [5, -2 - 900, -2 - 500, -2 - 700, -2 - 800], 30_000, 1.0, backoff=lambda a, b: 9
    )
    assert outcome.undo and outcome.reply == -2 - 9


def test_a_grant_whose_validity_is_eaten_is_undone() -> None:
    outcome = decide_acquire([5, 6, 7], 1_000, 600.0)
    assert outcome.undo and not isinstance(outcome.reply, list) and outcome.reply <= -1


def test_too_few_answers_undo_then_raise() -> None:
    outcome = decide_acquire([5, LOST, LOST, None, 6], 30_000, 1.0, name="n")
    assert outcome.undo
    assert isinstance(outcome.error, QuorumNotReached)
    assert "only 2 of 5" in str(outcome.error)


def test_counts_renewals_and_extensions() -> None:
    assert decide_count([0, 0, 0, -1, LOST], "release") == 0
    assert decide_count([-1, -1, -1, 0, 0], "release") == -1
    with pytest.raises(QuorumNotReached):
        decide_count([0, LOST, LOST], "release")
    assert decide_renewal([1, 1, 1, 0, LOST]) == 1
    assert decide_renewal([1, 1, 0, 0, LOST]) == 0  # lost below a majority
    assert decide_extend([3000, 2990, 3010, -1, LOST]) == 2990
    assert decide_extend([-1, -1, -1, 3000, 3000]) == -1


def test_snapshots_merge_by_majority_owner() -> None:
    def snap(owner: str, token: int, ttl: float) -> LockInfo:
        return LockInfo(name="n", key="k", owner=owner, fencing_token=token, ttl=ttl)

    merged = decide_snapshot([snap("a", 5, 9.0), snap("a", 7, 8.0), snap("a", 6, 9.5), None], 5)
    assert merged is not None and merged.ttl == 8.0 and merged.fencing_token == 7
    assert decide_snapshot([snap("a", 5, 9.0), snap("b", 7, 8.0), None], 3) is None


def test_only_a_fresh_grant_is_committed() -> None:
    call = Call(acquire_script, (b"L", b"F", b"Q", b"E"), ("me", "n1", b"30000"), "acquire")
    commit = commit_call(call, 1795000000000123)
    assert commit is not None and commit.script is rl_commit_script
    assert tuple(commit.args) == ("me", "n1", 1795000000000123)
    assert commit_call(call, [7, 2]) is None  # a re-entry keeps its token
    assert commit_call(call, -5) is None


def test_a_commit_needs_a_majority() -> None:
    assert decide_commit(99, [1, 1, 1, 0, LOST]) == AcquireOutcome(99, False)
    outcome = decide_commit(99, [1, 1, 0, LOST, LOST], backoff=lambda a, b: 11)
    assert outcome.undo and outcome.reply == -2 - 11
