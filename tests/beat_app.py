"""The Celery app of the beat tests (tests/test_beat.py): no Django, one periodic task.

``BEAT_TEST_REDIS`` is the test's redis-server URL without a database (with
``DJANGO_SETTINGS_MODULE`` set, Django is set up for django-celery-beat); the broker is
its database 1, and the task pushes the time it ran to ``beat:ticks`` in database 0
(and to ``beat:events``, which the test ``BLPOP``s: no polling). With
``BEAT_TEST_STARTS=PREFIX``, each beat records its start there (tests/starts.py: with
the earlier beats still running at that moment).
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery
from celery.signals import beat_init

from tests.starts import record_start

if os.environ.get("DJANGO_SETTINGS_MODULE"):  # django-celery-beat's DatabaseScheduler
    import django

    django.setup()

BASE = os.environ["BEAT_TEST_REDIS"]
INTERVAL = float(os.environ.get("BEAT_TEST_INTERVAL", "1.0"))

app = Celery("beat_tests")
app.conf.update(
    broker_url=f"{BASE}/1",
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    beat_schedule={"tick": {"task": "tests.beat_app.tick", "schedule": INTERVAL}},
    beat_max_loop_interval=1.0,
)

_results = redis.Redis.from_url(f"{BASE}/0")


@app.task(name="tests.beat_app.tick")
def tick() -> None:
    """Record that a tick arrived at the worker, and when."""
    now = repr(time.time())
    _results.rpush("beat:ticks", now)
    _results.rpush("beat:events", now)


@beat_init.connect
def _record_start(sender: object, **kwargs: object) -> None:
    """A beat's start, with the earlier beats still running then (``BEAT_TEST_STARTS``)."""
    prefix = os.environ.get("BEAT_TEST_STARTS")
    if prefix:
        record_start(_results, prefix)
