"""Canvases (group, chord, chain) of single-instance tasks on a real worker: they complete.

Inside a canvas, ``unique_on_enqueue`` does not dedupe at enqueue time (the
canvas waits for the very task ids it froze): every member is published, and
the worker's run-time check skips a duplicate, whose skip marker is a
successful result. Every wait here is bounded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import celery
import celery.exceptions
import pytest
from celery import chain, chord, group

from django_redislock import locks
from django_redislock.celery import is_skipped
from django_redislock.celery.task import _in_canvas
from tests import celery_app as ca
from tests.test_celery_worker import open_gate, wait_event, wait_until, worker

pytestmark = [pytest.mark.celery, pytest.mark.slow]

__all__ = ["worker"]  # the module-scoped real worker fixture, shared with the worker tests

CANVAS_WAIT = 15  # seconds a whole canvas may take at most


def skipped_by(result: Any, holder: str) -> bool:
    """Whether *result* is the skip marker of a run that found *holder* running or queued."""
    return is_skipped(result) and result["holder"] == holder


@contextmanager
def running(task: Any, n: int, tag: str, lock_name: str) -> Iterator[str]:
    """A call of *task* holding *lock_name* throughout the block (yields its id); it
    then finishes and frees the lock."""
    holder = task.delay(n, tag)
    assert wait_event(tag) == ["start", holder.id]
    yield holder.id
    open_gate(tag)
    assert holder.get(timeout=CANVAS_WAIT) == "done"
    assert locks.get(lock_name) is None


@pytest.mark.xfail(
    celery.VERSION[:2] == (5, 3),
    reason="Celery 5.3's Redis result consumer keeps one pending result per task id: the "
    "second AsyncResult of the first member (the dedupe's answer below) leaves the group's "
    "native get() waiting for ever",
    strict=True,
    raises=celery.exceptions.TimeoutError,
)
def test_group_of_identical_unique_calls_completes(worker: ca.Worker, name: str) -> None:
    g = group(ca.unique.si(31, name) for _ in range(3)).apply_async()
    first, *others = g.results
    assert len({r.id for r in g.results}) == 3  # all three published, none deduped away
    # The first member took the enqueue-time hold, so a standalone call still dedupes.
    assert ca.unique.delay(31, f"{name}-x").id == first.id
    assert wait_event(name) == ["start", first.id]
    # The other two ran while the first held the key: skipped, as done.
    wait_until(lambda: all(r.ready() for r in others), CANVAS_WAIT, "the duplicates' skips")
    open_gate(name)
    results = g.get(timeout=CANVAS_WAIT)
    assert results[0] == "done"
    assert all(skipped_by(r, first.id) for r in results[1:]), results
    assert wait_event(name) == ["end", first.id]
    assert ca.probe.llen(f"events:{name}") == 0  # no other run started
    assert locks.get("uniq:31") is None


def test_chord_with_a_unique_header_runs_its_callback(worker: ca.Worker, name: str) -> None:
    body = ca.gather.s(f"{name}-cb")
    result = chord(ca.unique.si(32, name) for _ in range(3))(body)
    header = result.parent.results
    assert wait_event(name) == ["start", header[0].id]
    wait_until(lambda: all(r.ready() for r in header[1:]), CANVAS_WAIT, "the duplicates' skips")
    open_gate(name)
    gathered = result.get(timeout=CANVAS_WAIT)
    assert wait_event(f"{name}-cb") == ["gathered", "3"]
    assert gathered[0] == "done"
    assert all(skipped_by(r, header[0].id) for r in gathered[1:]), gathered
    assert locks.get("uniq:32") is None


def test_chain_runs_on_after_a_duplicate_of_a_running_task(worker: ca.Worker, name: str) -> None:
    with running(ca.unique, 33, f"{name}-a", "uniq:33") as holder:
        # Head and last step duplicate the running task: both skip, the chain goes on.
        result = chain(
            ca.unique.si(33, f"{name}-b"),
            ca.after.s(f"{name}-c"),
            ca.unique.si(33, f"{name}-d"),
        ).apply_async()
        assert skipped_by(result.get(timeout=CANVAS_WAIT), holder)
        after = result.parent
        assert wait_event(f"{name}-c") == ["after", after.id]
        assert skipped_by(after.get(timeout=CANVAS_WAIT)["after"], holder)
        assert skipped_by(after.parent.get(timeout=CANVAS_WAIT), holder)
    assert ca.probe.llen(f"events:{name}-b") == 0 and ca.probe.llen(f"events:{name}-d") == 0


def test_callbacks_of_a_duplicate_run(worker: ca.Worker, name: str) -> None:
    with running(ca.unique, 35, f"{name}-a", "uniq:35") as holder:
        dup = ca.unique.apply_async((35, f"{name}-b"), link=ca.after.s(f"{name}-c"))
        assert dup.id != holder  # published: its callback waits for it
        assert skipped_by(dup.get(timeout=CANVAS_WAIT), holder)
        assert wait_event(f"{name}-c")[0] == "after"


def test_run_time_guard_completes_a_chord(worker: ca.Worker, name: str) -> None:
    with running(ca.hold, 34, f"{name}-a", "acct:34") as holder:
        header = (ca.hold.si(34, f"{name}-b") for _ in range(3))
        gathered = chord(header)(ca.gather.s(f"{name}-cb")).get(timeout=CANVAS_WAIT)
        assert wait_event(f"{name}-cb") == ["gathered", "3"]
        assert len(gathered) == 3 and all(skipped_by(r, holder) for r in gathered), gathered
    assert ca.probe.llen(f"events:{name}-b") == 0


@pytest.mark.parametrize(
    "options",
    [
        {"group_id": "g", "group_index": 0},  # a group member
        {"group_id": "g", "group_index": 1, "chord": {"task": "cb"}},  # a chord's header
        {"chain": [{"task": "next"}]},  # a chain's head or middle step
        {"chain": []},  # a chain's last step, sent by the worker
        {"link": [{"task": "cb"}]},
        {"link_error": {"task": "eb"}},
        {"parent_id": "p", "root_id": "r"},  # a callback, sent by the worker
        {"replaced_task_nesting": 1},  # Task.replace()
    ],
)
def test_what_counts_as_a_canvas(options: dict[str, Any]) -> None:
    assert _in_canvas(options)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"countdown": 5, "queue": "q", "expires": 60, "priority": 3},
        {"chord": None, "link": None, "link_error": [], "group_id": None},  # unset
    ],
)
def test_a_plain_call_is_no_canvas(options: dict[str, Any]) -> None:
    assert not _in_canvas(options)
