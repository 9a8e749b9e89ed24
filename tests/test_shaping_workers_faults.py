"""The checker of the two-worker SIGKILL proof (tests/test_shaping_workers.py) fails
on a deliberately broken guard (tests/shaping_faults.py): a module of its own, so no
sound worker shares the broker with the broken pair."""

from __future__ import annotations

import pytest

from tests.brokers import needs_prompt_redelivery
from tests.shaping_scenarios import (
    check_killed_pending_run_ran_once_more,
    pending_run_killed,
    started,
    worker_pair,
)

pytestmark = [pytest.mark.celery, pytest.mark.slow]


@needs_prompt_redelivery
def test_the_killed_run_checker_fails_when_the_copy_is_dropped() -> None:
    """The same scenario, against a guard that records a run as completed when it
    starts (a deliberate fault): the broker's copy of the killed run is dropped."""
    with started(*worker_pair("completion-recorded-at-start")) as pair:
        found, killed = pending_run_killed(pair)
    with pytest.raises(AssertionError, match=r"\('start', '150'\)\]"):
        check_killed_pending_run_ran_once_more(found, killed)
