"""The watchdog's schedule, without Redis: what is renewed when, and when a hold counts as lost."""

from __future__ import annotations

import time

from django_redislock.engine.watchdog import Watchdog, WatchEntry


class _Lock:
    def _mark_lost(self, owner: str, reason: str) -> None:  # pragma: no cover - not reached
        raise AssertionError("nothing is lost here")

    def _renewed(self, owner: str, error: BaseException | None, sent_at: float) -> None:
        pass


def _schedule(dog: Watchdog, lock: _Lock, claim_ms: int | None) -> tuple[float, WatchEntry]:
    entry = WatchEntry(lock, "owner", object(), (b"k",), 30_000, "n", claim_ms)  # type: ignore[arg-type]
    dog._add(entry)
    return time.monotonic(), entry


def test_a_short_hold_after_a_hand_off_costs_no_renewal() -> None:
    dog, lock = Watchdog(), _Lock()
    start, entry = _schedule(dog, lock, claim_ms=2_000)
    lost, batches = dog._take_work(start + 0.2)  # a typical short critical section
    assert not lost and not batches, "a claimed hand-off is not renewed at once"
    lost, batches = dog._take_work(start + 0.5)  # a third of the window, less the slack
    assert not lost and [e for es in batches.values() for e in es] == [entry]


def test_a_claimed_hand_off_counts_as_lost_before_the_claim_window_ends() -> None:
    dog, lock = Watchdog(), _Lock()
    start, entry = _schedule(dog, lock, claim_ms=2_000)
    entry.in_flight = True  # its claim hangs on the network
    assert entry.lost_at < start + 2.0
    lost, _ = dog._take_work(start + 1.99)
    assert lost == [entry]


def test_an_ordinary_hold_is_renewed_at_a_third_of_its_lease() -> None:
    dog, lock = Watchdog(), _Lock()
    start, entry = _schedule(dog, lock, claim_ms=None)
    assert dog._take_work(start + 8.0) == ([], {})
    lost, batches = dog._take_work(start + 9.5)  # within the one-second slack of 10 s
    assert [e for es in batches.values() for e in es] == [entry]


def test_a_failed_renewal_is_retried_after_its_pause_not_at_once() -> None:
    from django_redislock.exceptions import LockBackendError

    class Down:
        def run_many(self, calls: object) -> list[object]:
            raise LockBackendError("Redis is down")

    dog, lock = Watchdog(), _Lock()
    start, entry = _schedule(dog, lock, claim_ms=None)
    entry.backend = Down()  # type: ignore[assignment]
    entry.in_flight = True
    dog._renew_batch(id(entry.backend), [entry])
    now = time.monotonic()
    assert not entry.in_flight and entry.due > now
    assert dog._take_work(now) == ([], {}), "a failed renewal must not be retried at once"
    lost, batches = dog._take_work(entry.due)
    assert [e for es in batches.values() for e in es] == [entry]


def test_any_exception_in_a_renewal_is_survived_and_the_hold_kept_on_schedule() -> None:
    """Not only Redis errors: a bug or an unexpected client (a cluster client once
    raised a TypeError here) must not end the renewals of the process."""

    class Broken:
        def run_many(self, calls: object) -> list[object]:
            raise TypeError("not the client we expected")

    dog, lock = Watchdog(), _Lock()
    start, entry = _schedule(dog, lock, claim_ms=None)
    entry.backend = Broken()  # type: ignore[assignment]
    entry.in_flight = True
    dog._renew_batch(id(entry.backend), [entry])  # must not raise
    assert id(entry) in dog._entries and not entry.in_flight
    assert entry.due > start, "retried later; declared lost only at its lost_at"


def _many(dog: Watchdog, lock: _Lock, backend: object, count: int) -> list[WatchEntry]:
    entries = []
    for i in range(count):
        entry = WatchEntry(lock, f"o{i}", backend, (b"k",), 30_000, f"n{i}")  # type: ignore[arg-type]
        dog._add(entry)
        entries.append(entry)
    return entries


def test_a_round_takes_only_the_due_and_a_stuck_batch_is_lost_by_its_deadline() -> None:
    """Thousands held, one round renews those due (in chunks), leaves the rest alone,
    and a batch stuck on the network counts as lost at its holds' lost_at, not before."""
    from django_redislock.engine.watchdog import CHUNK

    dog, lock, backend = Watchdog(), _Lock(), object()
    start = time.monotonic()
    entries = _many(dog, lock, backend, 2 * CHUNK + 10)
    late = WatchEntry(lock, "late", backend, (b"k",), 90_000, "late")  # type: ignore[arg-type]
    dog._add(late)  # due at 30 s: not in the round at 10 s
    lost, batches = dog._take_work(start + 10.0)
    assert not lost and batches == {id(backend): entries}
    assert all(e.in_flight for e in entries) and not late.in_flight
    # The batch hangs: nothing is lost until the safety margin of its holds has passed.
    assert dog._take_work(start + 26.0) == ([], {})
    lost, batches = dog._take_work(max(e.lost_at for e in entries))
    assert sorted(lost, key=id) == sorted(entries, key=id) and not batches
    assert dog.watched() == 1


def test_renewals_due_while_their_backend_is_busy_wait_and_go_next() -> None:
    dog, lock, backend = Watchdog(), _Lock(), object()
    start = time.monotonic()
    first = _many(dog, lock, backend, 3)
    lost, batches = dog._take_work(start + 10.0)
    assert batches == {id(backend): first}
    second = _many(dog, lock, backend, 2)  # due at about 10 s after *their* start
    for entry in second:
        entry.due = start + 10.5
    lost, batches = dog._take_work(start + 10.5)
    assert not lost and not batches, "one batch per backend at a time"

    class Answering:
        def run_many(self, calls: list[object]) -> list[object]:
            return [1] * len(calls)

    for entry in first:
        entry.backend = Answering()  # type: ignore[assignment]
    dog._renew_batch(id(backend), first)
    assert all(not e.in_flight and e.due > start + 10.0 for e in first)
    lost, batches = dog._take_work(start + 10.6)
    # (the first three, renewed on the real clock, are due again at this test's 10.6 s)
    assert not lost and batches[id(backend)] == second
