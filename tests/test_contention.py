"""The contention overview: which key templates (or names) cost most waiting, summed
from the locks' histories. Real contention between threads on the suite's Redis."""

from __future__ import annotations

import time
from collections.abc import Callable

from django_redislock import locks, single_instance
from django_redislock.engine.contention import NAMES_SHOWN
from tests.holding import contend


@single_instance("report:{n}", timeout=10)
def report(n: int, hold: float) -> None:
    """Holds its lock for *hold* seconds."""
    time.sleep(hold)  # (the work that makes the next call wait)


def _contend(n: int) -> None:
    """One hand-off of report:<n> between two calls."""
    contend(lambda hold: report(n, hold), f"report:{n}")


def contention_scenario(contend_on: Callable[[int], None]) -> None:
    """Two hand-offs on two names of one key template (*contend_on*), and a waiter that
    gives up on the plain lock "plain:x"."""
    contend_on(1)
    contend_on(2)
    holder = locks.lock("plain:x", owner="holder")
    assert holder.acquire()
    assert not locks.lock("plain:x", owner="impatient").acquire(timeout=0.1)
    holder.release()


def test_waits_are_summed_per_key_template_and_ranked() -> None:
    contention_scenario(_contend)

    groups, complete = locks.contention(60)
    assert complete
    assert [g.group for g in groups] == ["report:{n}", "plain:x"]
    reports, plain = groups
    assert (reports.locks, reports.waits, reports.timeouts) == (2, 2, 0)
    assert sorted(reports.names) == ["report:1", "report:2"]
    assert 0.4 < reports.waited < 5 and 0.15 < reports.longest_wait < 3
    assert (plain.locks, plain.waits, plain.timeouts, plain.names) == (1, 0, 1, ["plain:x"])


def test_only_the_window_counts_and_the_walk_can_be_bounded() -> None:
    _contend(3)
    time.sleep(0.05)  # (so the window below starts after the events)
    assert locks.contention(0.01) == ([], True)
    for n in range(4, 4 + NAMES_SHOWN):
        _contend(n)
    groups, complete = locks.contention(60, max_locks=2)
    assert not complete  # more names have a history than it was allowed to read
    (reports,) = groups
    assert reports.locks == 2
    groups, complete = locks.contention(60)
    assert complete and groups[0].locks == NAMES_SHOWN + 1
    assert len(groups[0].names) == NAMES_SHOWN
