"""Tasks with a rate limit or a cooldown, on the Celery app of ``tests.celery_app``; the
worker of tests/test_shaping_celery.py runs ``-A tests.shaping_celery``.

Each body appends ``start <µs> <i>`` and ``end <µs> <i>`` (Redis's clock) to the
list ``rec:<tag>``: the recorder outside the guard. For the rate and cooldown tasks,
Celery's ``task_prerun`` signal (sent before the guarded ``run``) appends
``pre <µs> <i>`` first, so each start's admission lies between its last ``pre``
and its ``start``.

A worker started with ``REDISLOCK_TEST_SHAPING_FAULT`` runs a deliberately broken
guard (tests/shaping_faults.py), for the tests that check their checkers fail.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery.signals import task_prerun

from django_redislock import single_instance
from django_redislock.celery import SingleInstanceTask
from tests import shaping_faults
from tests.celery_app import app, probe

shaping_faults.install()  # a test's deliberately broken guard (none by default)

__all__ = [
    "app",
    "coalesced",
    "coalesced_late",
    "debounced",
    "debounced_two",
    "cooled",
    "cooled_skip",
    "limited_callable",
    "limited_raise",
    "limited_retry",
    "rated",
    "unique_rated",
]


def _now_us() -> int:
    s, us = probe.time()
    return int(s) * 1_000_000 + int(us)


#: The tasks whose executions record ``pre`` (their arguments are ``(tag, i)``).
_BRACKETED = {
    "tests.shaping_celery.rated",
    "tests.shaping_celery.cooled",
    "tests.shaping_celery.limited_retry",
    "tests.shaping_celery.unique_rated",
}


@task_prerun.connect
def _before_the_guard(sender: Any = None, args: Any = None, **_: Any) -> None:
    if getattr(sender, "name", None) in _BRACKETED and args:
        probe.rpush(f"rec:{args[0]}", f"pre {_now_us()} {args[1]}")


def _record(tag: str, i: int, pause: float) -> None:
    probe.rpush(f"rec:{tag}", f"start {_now_us()} {i}")
    time.sleep(pause)
    probe.rpush(f"rec:{tag}", f"end {_now_us()} {i}")


@app.task(bind=True)
@single_instance("rated:{tag}", rate=(3, 2.0), on_locked="wait", timeout=None)
def rated(self: Any, tag: str, i: int) -> int:
    """3 starts per 2 s per tag; refused starts are deferred (the default)."""
    _record(tag, i, 0.01)
    return i


@app.task(
    bind=True,
    base=SingleInstanceTask,
    lock_key="cooled:{tag}",
    lock_cooldown=1.0,
    on_locked="wait",
    lock_timeout=None,
)
def cooled(self: Any, tag: str, i: int) -> int:
    """Runs 0.1 s, then its key cools down for 1 s; refused starts are deferred."""
    _record(tag, i, 0.1)
    return i


@app.task(
    bind=True,
    base=SingleInstanceTask,
    lock_key="cooled:{tag}",
    lock_cooldown=30.0,
    on_limited="skip",
)
def cooled_skip(self: Any, tag: str, i: int) -> int:
    """A 30 s cooldown whose refused starts are skipped."""
    _record(tag, i, 0.0)
    return i


@app.task(
    bind=True, base=SingleInstanceTask, lock_key="lr:{tag}", lock_rate=(1, 60), on_limited="raise"
)
def limited_raise(self: Any, tag: str, i: int) -> int:
    """1 start per minute; a refused one fails with RunLimited."""
    _record(tag, i, 0.0)
    return i


def _refused_value(refusal: Any, tag: str, i: int) -> str:
    return f"refused {refusal.reason} {i}"


@app.task(
    bind=True,
    base=SingleInstanceTask,
    lock_key="lc:{tag}",
    lock_rate=(1, 60),
    on_limited=_refused_value,
)
def limited_callable(self: Any, tag: str, i: int) -> int:
    """1 start per minute; a refused one's result is on_limited's value."""
    _record(tag, i, 0.0)
    return i


@app.task(
    bind=True,
    base=SingleInstanceTask,
    lock_key="lt:{tag}",
    lock_rate=(1, 1.5),
    on_limited="retry",
    max_retries=5,
    on_locked="wait",
    lock_timeout=None,
)
def limited_retry(self: Any, tag: str, i: int) -> int:
    """1 start per 1.5 s; a refused one is retried (its retries are recorded)."""
    probe.rpush(f"retries:{tag}", f"{i} {self.request.retries}")
    _record(tag, i, 0.0)
    return i


@app.task(
    bind=True,
    base=SingleInstanceTask,
    lock_key="lu:{tag}",
    unique_on_enqueue=True,
    lock_rate=(1, 2.0),
)
def unique_rated(self: Any, tag: str, i: int) -> int:
    """One pending per key, 1 start per 2 s: a deferred execution keeps the key's hold."""
    _record(tag, i, 0.0)
    return i


def _gated(tag: str, n: int, task_id: str) -> int:
    """A coalescing run: runs 0 and 100+ wait for gate:<tag>:<n> (pid and task id
    recorded)."""
    probe.rpush(f"rec:{tag}", f"start {_now_us()} {n} {os.getpid()} {task_id}")
    holds = n == 0 or n >= 100  # these wait for gate:<tag>:<n>
    for _ in range(20 if holds else 0):  # bounded: 20 s (1 s reads, under the socket timeout)
        if probe.blpop([f"gate:{tag}:{n}"], timeout=1):
            break
    probe.rpush(f"rec:{tag}", f"end {_now_us()} {n} {os.getpid()} {task_id}")
    return n


@app.task(bind=True)
@single_instance("co:{tag}", ttl=10, coalesce=True)
def coalesced(self: Any, tag: str, n: int) -> int:
    """Coalescing runs per tag (a 10 s lease); runs 0 and 100+ wait for their gate."""
    return _gated(tag, n, self.request.id)


@app.task(bind=True, acks_late=True)
@single_instance("col:{tag}", ttl=5, coalesce=True)
def coalesced_late(self: Any, tag: str, n: int) -> int:
    """``coalesced`` with ``acks_late`` (a run whose worker dies is handed out again)
    and a 5 s lease."""
    return _gated(tag, n, self.request.id)


@app.task(bind=True)
@single_instance("db:{tag}", debounce=1.0)
def debounced(self: Any, tag: str, n: int) -> int:
    """Runs once the tag was quiet for 1 s, with the last call's n."""
    _record(tag, n, 0.0)
    return n


@app.task(bind=True)
@single_instance("db2:{tag}", debounce=2.0)
def debounced_two(self: Any, tag: str, n: int) -> int:
    """Runs once the tag was quiet for 2 s, with the last call's n."""
    _record(tag, n, 0.0)
    return n
