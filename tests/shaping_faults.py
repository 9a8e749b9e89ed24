"""Deliberately broken shaping guards, for the shaping tests' recorders to catch.

The test helper processes (``tests/shaping_proc.py``, the Celery worker of
``tests/shaping_celery.py``) call :func:`install` at start-up: it reads
``REDISLOCK_TEST_SHAPING_FAULT`` (a comma-separated list of the names below) and
monkeypatches the shaping decision in *that* process only. Nothing in the package
reads the variable. Each invariant test of tests/test_shaping.py,
tests/test_shaping_celery.py and tests/test_shaping_workers.py has a twin that runs
its scenario against one of these faults and asserts that its checker fails: a
checker that passes on a broken guard proves nothing.
"""

from __future__ import annotations

import os
import random
from typing import Any

#: The environment variable naming the faults to install.
ENV = "REDISLOCK_TEST_SHAPING_FAULT"

#: Each fault, in words (what the broken guard does wrong).
FAULTS = {
    "rate-admits-all": "the rate limit admits every start",
    "rate-wastes-starts": "half the admitted starts are refused after they were counted",
    "cooldown-not-set": "a run's end starts no cooldown",
    "coalesce-runs-twice": "the pending call is handed on twice (two more runs)",
    "debounce-runs-every-call": "every call runs at once, none is postponed",
    "calls-numbered-at-start": (
        "a coalescing call's number is taken when a worker starts it, not when it was "
        "sent (its message's number is ignored)"
    ),
    "completion-recorded-at-start": (
        "a coalescing acks_late run is recorded as completed when it starts, so the "
        "broker's copy of a killed run is dropped"
    ),
}


def install() -> list[str]:
    """Install the faults named in :data:`ENV` in this process; returns their names."""
    names = [n for n in os.environ.get(ENV, "").split(",") if n]
    unknown = set(names) - set(FAULTS)
    if unknown:
        raise ValueError(f"{ENV}: unknown faults {sorted(unknown)}; known: {sorted(FAULTS)}")
    for fault in names:
        _INSTALL[fault]()
    return names


# Every function below is a DELIBERATE FAULT, installed only when a test asks for it.


def _replace_decision(make: Any) -> None:
    """Replace the reading of ADMIT's answer (functions, views and tasks, whether ADMIT
    had a round trip of its own or shared the lock attempt's) with *make(real)*."""
    from django_redislock.guards import shaping

    shaping.start_refusal = make(shaping.start_refusal)


def _rate_admits_all() -> None:
    def admits_all(real: Any) -> Any:
        return lambda reply, name: None  # deliberate fault: no start is ever refused

    _replace_decision(admits_all)


def _rate_wastes_starts() -> None:
    from django_redislock.guards.shaping import Refusal

    def wastes(real: Any) -> Any:
        def decide(reply: Any, name: str) -> Any:
            refusal = real(reply, name)
            if refusal is None and random.random() < 0.5:
                # deliberate fault: the start was counted in the window, then refused
                return Refusal("rate", 0.05, 0, name)
            return refusal

        return decide

    _replace_decision(wastes)


def _cooldown_not_set() -> None:
    from django_redislock.celery import task
    from django_redislock.guards import decorators

    def cooling(config: Any, lock: Any, **kwargs: Any) -> None:
        return None  # deliberate fault: the cooldown is never started

    decorators.cooling = cooling
    task.cooling = cooling


def _coalesce_runs_twice() -> None:
    from celery.utils import uuid

    from django_redislock.celery import coalesce, task

    real = coalesce.hand_on

    def hand_on(celery_task: Any, config: Any, lock: Any, name: str) -> bool:
        if not config.lock_manager().client.set(f"fault-doubled:{name}", 1, nx=True):
            return real(celery_task, config, lock, name)  # once per key: no endless chain
        send = celery_task.apply_async

        def twice(args: Any, kwargs: Any, **options: Any) -> Any:
            # deliberate fault: a 2nd run, numbered as a new call (no header carried on)
            send(args, kwargs, **{**options, "task_id": uuid(), "headers": {}})
            return send(args, kwargs, **options)

        celery_task.apply_async = twice
        try:
            return real(celery_task, config, lock, name)
        finally:
            del celery_task.apply_async

    task.hand_on = hand_on


def _debounce_runs_every_call() -> None:
    from django_redislock.celery import debounce, task

    def run_now(*args: Any, **kwargs: Any) -> Any:
        return debounce.RUN  # deliberate fault: no call is postponed

    task.debounce = run_now


def _completion_recorded_at_start() -> None:
    from django_redislock.celery import redelivery, task

    real = task.sweep

    def sweep(celery_task: Any, config: Any, lock: Any, name: str, *answer: Any) -> Any:
        if celery_task.acks_late and celery_task.request.id is not None:
            # deliberate fault: the run is marked completed before it ran
            redelivery.record_completion(config.lock_manager(), name, celery_task.request.id)
        return real(celery_task, config, lock, name, *answer)

    task.sweep = sweep


def _calls_numbered_at_start() -> None:
    from django_redislock.celery import coalesce, sequence

    def numbered_now(task: Any, backend: Any, name: str) -> int:
        return sequence.next_number(backend, name)  # deliberate fault: the order of starts

    coalesce.seq_of = numbered_now


_INSTALL = {
    "rate-admits-all": _rate_admits_all,
    "rate-wastes-starts": _rate_wastes_starts,
    "cooldown-not-set": _cooldown_not_set,
    "coalesce-runs-twice": _coalesce_runs_twice,
    "debounce-runs-every-call": _debounce_runs_every_call,
    "completion-recorded-at-start": _completion_recorded_at_start,
    "calls-numbered-at-start": _calls_numbered_at_start,
}
