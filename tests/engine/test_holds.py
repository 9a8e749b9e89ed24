"""HoldTable: the client's bookkeeping of one lock's holds, per owner (no Redis)."""

from __future__ import annotations

from collections.abc import Callable

from django_redislock.engine.holds import Hold, HoldTable


def nonces() -> tuple[Callable[[], str], list[str]]:
    """A nonce factory that records what it handed out."""
    made: list[str] = []

    def new() -> str:
        made.append(f"n{len(made) + 1}")
        return made[-1]

    return new, made


def test_empty_table() -> None:
    table = HoldTable()
    assert table.get("a") is None
    assert table.forget("a") is None
    assert table.mark_lost("a", "expired") is None
    assert table.released("a", False, 0) is None


def test_first_grant() -> None:
    table = HoldTable()
    hold, replaced = table.acquired("a", 10, 1)
    assert hold == Hold(fence=10, count=1)
    assert hold.watch is None and hold.lost_reason is None
    assert replaced is None
    assert table.get("a") is hold


def test_first_local_hold_of_a_shared_redis_hold() -> None:
    """Redis count 2 (another Lock object with the same owner holds it): still a new hold here."""
    table = HoldTable()
    hold, replaced = table.acquired("a", 10, 2)
    assert (hold.fence, hold.count, replaced) == (10, 1, None)


def test_reentry_counts_and_keeps_the_watch() -> None:
    table = HoldTable()
    first, _ = table.acquired("a", 10, 1)
    first.watch = "watch-entry"
    again, replaced = table.acquired("a", 10, 2)
    assert again is first
    assert replaced is None
    assert again.count == 2
    assert again.watch == "watch-entry"
    third, _ = table.acquired("a", 10, 3)
    assert third is first and third.count == 3


def test_owners_are_independent() -> None:
    table = HoldTable()
    a, _ = table.acquired("a", 10, 1)
    b, replaced = table.acquired("b", 11, 1)
    assert replaced is None
    assert table.get("a") is a and table.get("b") is b
    assert (a.fence, b.fence) == (10, 11)
    table.forget("a")
    assert table.get("b") is b


def test_redis_count_one_replaces_a_stale_local_hold() -> None:
    """Redis says this is a first hold: the local one (lease lost unnoticed) is stale."""
    table = HoldTable()
    stale, _ = table.acquired("a", 10, 1)
    table.acquired("a", 10, 2)
    stale.watch = "old-watch"
    fresh, replaced = table.acquired("a", 25, 1)
    assert replaced is stale
    assert replaced.watch == "old-watch"  # the caller stops this renewal
    assert fresh is not stale
    assert (fresh.fence, fresh.count, fresh.watch) == (25, 1, None)
    assert table.get("a") is fresh


def test_a_lost_hold_is_replaced_on_the_next_grant() -> None:
    table = HoldTable()
    lost, _ = table.acquired("a", 10, 1)
    assert table.mark_lost("a", "expired") is lost
    # Even a Redis count > 1 (held meanwhile through another Lock object) starts anew.
    fresh, replaced = table.acquired("a", 30, 2)
    assert replaced is lost
    assert fresh is not lost
    assert (fresh.fence, fresh.count, fresh.lost_reason) == (30, 1, None)


def test_release_nonce_is_reused_until_released() -> None:
    table = HoldTable()
    new, made = nonces()
    first = table.release_nonce("a", False, new)
    assert table.release_nonce("a", False, new) == first  # the outcome is not known yet
    assert made == [first]
    table.released("a", False, 0)
    second = table.release_nonce("a", False, new)
    assert second != first
    assert made == [first, second]


def test_release_nonce_is_pending_per_owner_and_kind() -> None:
    table = HoldTable()
    new, made = nonces()
    one = table.release_nonce("a", False, new)
    everything = table.release_nonce("a", True, new)
    other = table.release_nonce("b", False, new)
    assert len({one, everything, other}) == 3
    assert made == [one, everything, other]
    # A release_all's answer does not settle a pending single release, nor another owner's.
    table.released("a", True, 0)
    assert table.release_nonce("a", False, new) == one
    assert table.release_nonce("b", False, new) == other
    assert table.release_nonce("a", True, new) not in (one, everything, other)


def test_released_with_holds_left() -> None:
    table = HoldTable()
    table.acquired("a", 10, 1)
    hold, _ = table.acquired("a", 10, 2)
    assert table.released("a", False, 1) is None
    assert table.get("a") is hold
    assert hold.count == 1
    assert table.released("a", False, 0) is hold
    assert table.get("a") is None


def test_released_remaining_zero_forgets_every_local_hold() -> None:
    table = HoldTable()
    table.acquired("a", 10, 1)
    hold, _ = table.acquired("a", 10, 2)
    assert table.released("a", True, 0) is hold
    assert table.get("a") is None


def test_released_last_local_hold_while_redis_keeps_others() -> None:
    """Redis still counts holds of other Lock objects with this owner: this one's are done."""
    table = HoldTable()
    hold, _ = table.acquired("a", 10, 2)
    assert table.released("a", False, 1) is hold
    assert table.get("a") is None


def test_released_not_owned_forgets_the_hold() -> None:
    table = HoldTable()
    table.acquired("a", 10, 1)
    hold, _ = table.acquired("a", 10, 2)
    new, _ = nonces()
    table.release_nonce("a", False, new)
    assert table.released("a", False, -1) is hold
    assert hold.count == 2  # not counted down: Redis said it was not held at all
    assert table.get("a") is None


def test_released_without_a_local_hold_clears_the_pending_nonce() -> None:
    table = HoldTable()
    new, made = nonces()
    table.release_nonce("a", False, new)
    assert table.released("a", False, 0) is None
    table.release_nonce("a", False, new)
    assert len(made) == 2


def test_forget() -> None:
    table = HoldTable()
    hold, _ = table.acquired("a", 10, 1)
    assert table.forget("a") is hold
    assert table.get("a") is None
    assert table.forget("a") is None


def test_mark_lost_only_once() -> None:
    table = HoldTable()
    hold, _ = table.acquired("a", 10, 1)
    hold.watch = "watch-entry"
    assert table.mark_lost("a", "expired") is hold
    assert hold.lost_reason == "expired"
    assert hold.watch is None
    assert table.mark_lost("a", "taken over") is None  # not news
    assert hold.lost_reason == "expired"
    assert table.get("a") is hold  # kept, so the owner can be told on release


def test_re_entry_takes_the_fence_redis_reports() -> None:
    table = HoldTable()
    table.acquired("o", 10, 1)
    hold, replaced = table.acquired("o", 42, 3)  # the owner holds it anew, via another object
    assert replaced is None and hold.fence == 42 and hold.count == 2
