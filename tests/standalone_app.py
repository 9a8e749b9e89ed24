"""A Celery app with no Django settings at all (like celery-once / celery-singleton users).

Its locks are configured from the app's own conf (``REDISLOCK_URL``,
``REDISLOCK_KEY_PREFIX``); the URLs come from the environment the test sets:
``STANDALONE_BROKER``, ``STANDALONE_BACKEND``, ``STANDALONE_LOCKS``. Used by
tests/test_standalone.py, both as the worker's app and by a client script.
"""

from __future__ import annotations

import os
import time

from celery import Celery

from django_redislock import single_instance
from django_redislock.celery import SingleInstanceTask

assert "DJANGO_SETTINGS_MODULE" not in os.environ, "this app must run without Django settings"

app = Celery(
    "standalone",
    broker=os.environ["STANDALONE_BROKER"],
    backend=os.environ["STANDALONE_BACKEND"],
)
app.conf.REDISLOCK_URL = os.environ["STANDALONE_LOCKS"]
app.conf.redislock_key_prefix = "standalone"  # Celery-style lowercase works too
app.conf.broker_connection_retry_on_startup = True


@app.task(base=SingleInstanceTask, lock_key="unique:{n}", unique_on_enqueue=True)
def unique(n: int, seconds: float) -> int:
    """Deduplicated at enqueue time, guarded at run time."""
    time.sleep(seconds)
    return n


@app.task
@single_instance("run:{n}")
def guarded(n: int, seconds: float) -> int:
    """Guarded at run time only."""
    time.sleep(seconds)
    return n
