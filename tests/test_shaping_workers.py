"""Coalescing on two real workers: two ``celery worker`` processes (prefork, two pool
processes each) on one broker, as on two hosts.

* 50 calls during one run give exactly one more run, with the 50th call's arguments,
  whichever worker takes each call and the pending run.
* The worker running the pending run is SIGKILLed, whole (main process and pool, as a
  crashed host): the pending run runs once more, on the other worker, after the dead
  run's lease; never beside it; with the last call's arguments. This needs
  ``acks_late`` (``coalesced_late``): without it Celery acknowledges a message when
  its run starts, and a run killed after that is not run again, a pending run as any
  other (docs/shaping.md). The broker hands the killed run's message out again after
  its visibility timeout (12 s here: longer than the sweepers' countdowns, so a
  message waiting for its countdown is not handed out twice).

What ran is read from the recorder the task bodies append to (tests/shaping_celery.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import celery_app as ca
from tests.brokers import needs_prompt_redelivery
from tests.shaping_scenarios import (
    WORKER_ENV,
    check_killed_pending_run_ran_once_more,
    check_one_more_run,
    fifty_calls_during_a_run,
    pending_run_killed,
    started,
    worker_pair,
)

pytestmark = [pytest.mark.celery, pytest.mark.slow]


@pytest.fixture(scope="module")
def _started() -> Iterator[list[ca.Worker]]:
    with started(*worker_pair()) as pair:
        yield pair


@pytest.fixture
def workers(_started: list[ca.Worker]) -> list[ca.Worker]:
    """Two real workers on one broker; one a test killed is replaced (under a new
    name: a new log)."""
    for i, w in enumerate(_started):
        if w.process.poll() is not None:
            _started[i] = ca.Worker(
                concurrency=2,
                name=f"shaping{i + 3}",
                app_module="tests.shaping_celery",
                env=WORKER_ENV,
            )
            _started[i].wait_ready()
    for w in _started:
        w.peers = _started
    return _started


def test_fifty_calls_on_two_workers_give_one_more_run_with_the_last_arguments(
    workers: list[ca.Worker],
) -> None:
    _, found = fifty_calls_during_a_run(workers)
    check_one_more_run(found, "50")
    # The calls were shared: both workers made calls pending.
    pending = "coalesced: its call is the pending one"
    pended = [w.log_text(full=True).count(pending) for w in workers]
    assert all(pended), pended


@needs_prompt_redelivery
def test_a_pending_run_whose_worker_is_killed_runs_once_more_on_the_other_worker(
    workers: list[ca.Worker],
) -> None:
    found, killed = pending_run_killed(workers)
    check_killed_pending_run_ran_once_more(found, killed)
