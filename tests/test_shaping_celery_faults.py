"""Each checker of the Celery shaping proofs fails on a deliberately broken guard.

One real worker (prefork, 2 processes) runs tests/shaping_celery.py's tasks with the
faults of tests/shaping_faults.py installed (``REDISLOCK_TEST_SHAPING_FAULT``): the
rate admits every start, a run's end starts no cooldown, the first pending call of a
key is handed on twice, every debounced call runs at once. Each test runs the same
scenario as its proof (tests/shaping_scenarios.py) to its end, and asserts that the
proof's checker fails on what the recorder holds.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import celery_app as ca
from tests import shaping_faults
from tests.shaping_scenarios import (
    check_cooled,
    check_debounced,
    check_one_more_run,
    check_rated,
    fifty_calls_during_a_run,
    flush_broker,
    nine_rated_calls,
    started,
    three_cooled_calls,
    twenty_calls_100_ms_apart,
)

pytestmark = [pytest.mark.celery, pytest.mark.slow]

FAULTS = "rate-admits-all,cooldown-not-set,coalesce-runs-twice,debounce-runs-every-call"


@pytest.fixture(scope="module")
def broken() -> Iterator[ca.Worker]:
    """A real worker whose guard is deliberately broken (see FAULTS)."""
    flush_broker()
    env = {shaping_faults.ENV: FAULTS}
    with started(ca.Worker(name="broken", app_module="tests.shaping_celery", env=env)) as (w,):
        yield w


def test_the_rate_checker_fails_when_every_start_is_admitted(broken: ca.Worker) -> None:
    with pytest.raises(AssertionError, match="4 starts within"):
        check_rated(*nine_rated_calls())


def test_the_cooldown_checker_fails_when_no_cooldown_is_set(broken: ca.Worker) -> None:
    with pytest.raises(AssertionError, match="cooled"):
        check_cooled(three_cooled_calls())


def test_the_coalesce_checker_fails_when_the_pending_call_runs_twice(broken: ca.Worker) -> None:
    _, found = fifty_calls_during_a_run([broken], sweeper_back=False)  # shorter
    with pytest.raises(AssertionError, match=r"\('start', '50'\), \('end', '50'\), \('start'"):
        check_one_more_run(found, "50")


def test_the_debounce_checker_fails_when_every_call_runs(broken: ca.Worker) -> None:
    _, found, last_sent, _ = twenty_calls_100_ms_apart()
    with pytest.raises(AssertionError, match=r"'start', \d+, 0\)"):
        check_debounced(found, last_sent)
