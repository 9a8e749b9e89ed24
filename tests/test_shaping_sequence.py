"""A coalescing or debounced task's calls are numbered when they are sent
(django_redislock/celery/sequence.py): in the sender's process, per key, in the order
of the calls; a message sent on a call's behalf keeps its number; other tasks are left
alone. (Broker: kombu's in-memory transport; the numbers: the test Redis.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, current_app
from celery.signals import before_task_publish

from django_redislock import single_instance
from django_redislock.celery.sequence import HEADER


@pytest.fixture
def app() -> Iterator[Celery]:
    """A Celery app on the in-memory broker, current while the test runs."""
    restore = current_app.set_current  # the current app's own (bound through the proxy)
    app = Celery("numbering", broker="memory://", set_as_current=True)
    app.conf.update(task_ignore_result=True)
    try:
        yield app
    finally:
        restore()


@pytest.fixture
def sent() -> Iterator[list[tuple[str, Any]]]:
    """(task name, its call's number) of each message published while the test runs."""
    seen: list[tuple[str, Any]] = []

    def record(sender: Any = None, headers: Any = None, **_: Any) -> None:
        seen.append((sender, (headers or {}).get(HEADER)))

    before_task_publish.connect(record, weak=False)  # after the numbering's own receiver
    try:
        yield seen
    finally:
        before_task_publish.disconnect(record)


def test_calls_are_numbered_per_key_in_the_order_they_are_sent(
    app: Celery, sent: list[tuple[str, Any]]
) -> None:
    @app.task(name="numbered.coalesced")
    @single_instance("sq:{key}", coalesce=True)
    def coalesced(key: str, n: int) -> int:
        return n

    @app.task(name="numbered.debounced")
    @single_instance("sd:{key}", debounce=1)
    def debounced(key: str, n: int) -> int:
        return n

    @app.task(name="numbered.plain")
    @single_instance("sp:{key}")
    def plain(key: str) -> None:
        pass

    coalesced.delay("a", 1)
    coalesced.delay("a", 2)
    coalesced.delay("b", 1)
    app.send_task("numbered.coalesced", ("a", 3))  # by name, as beat does
    debounced.apply_async(("a", 1), countdown=5)
    plain.delay("a")
    coalesced.apply_async(("a", 9), headers={HEADER: 7})  # a re-send keeps its number
    assert sent == [
        ("numbered.coalesced", 1),
        ("numbered.coalesced", 2),
        ("numbered.coalesced", 1),
        ("numbered.coalesced", 3),
        ("numbered.debounced", 1),
        ("numbered.plain", None),
        ("numbered.coalesced", 7),
    ]
