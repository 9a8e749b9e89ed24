"""A shaped guard's one attempt and its start's admission share a round trip
(guards/shaping.py ``acquire_admitted``), on a real Redis reached through a real TCP
proxy that counts the request bursts a client sends (``counting_proxy``: a pipeline
arrives as one).

The admission is sent whether or not the attempt will be granted, so it counts the
start only when the attempt's owner holds the lock as it runs: a call that finds the
lock held by someone else counts nothing, and gives nothing back.

A run's end sends the cooldown's start (``COOL``) just before its release, in the
release's round trip (guards/shaping.py ``cooling``, primitives/at_once.py
``after_prior_sync``): a guarded call with a cooldown costs two round trips too.

A coalescing Celery task's execution asks its key's pending slot whether it is the
slot's sweeper (``SWEEP``, read-only) in its lock attempt's round trip
(celery/coalesce.py ``attempt_swept``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislock import LockManager, RunLimited, signals, single_instance
from django_redislock.guards.shaping import shaping_state
from tests.redis_server import RedisServer
from tests.tcp_proxy import TcpProxy


def test_a_rate_limited_call_costs_two_round_trips_admitted_or_refused(
    counted: LockManager, counting_proxy: TcpProxy, name: str
) -> None:
    @single_instance(name, rate="2/m", manager=counted)
    def work() -> str:
        return "ran"

    @single_instance(f"{name}:warm", rate="1000/m", manager=counted)
    def warm() -> None:
        pass

    warm()  # the connection is made and the scripts are loaded
    before = counting_proxy.requests
    assert work() == "ran"
    assert counting_proxy.requests - before == 2  # the attempt with the admission, the release
    before = counting_proxy.requests
    assert work() == "ran"
    assert counting_proxy.requests - before == 2
    before = counting_proxy.requests
    with pytest.raises(RunLimited):
        work()
    assert counting_proxy.requests - before == 2  # the attempt with the refusal, the give-back
    assert counted.get(name) is None
    assert shaping_state(work, name).count == 2


def test_a_call_that_finds_the_lock_held_counts_no_start(
    counted: LockManager, counting_proxy: TcpProxy, name: str
) -> None:
    ran: list[int] = []

    @single_instance(name, rate="5/m", manager=counted, on_locked="skip")
    def work(i: int) -> int:
        ran.append(i)
        return i

    assert work(1) == 1
    holder = counted.lock(name, owner="someone else", ttl=30)
    assert holder.acquire()
    refused: list[str] = []

    def on_refused(sender: Any, name: str, **_: Any) -> None:
        refused.append(name)

    signals.lock_not_acquired.connect(on_refused)
    try:
        for i in range(3):
            assert work(10 + i) is None  # skipped: the lock is held
    finally:
        signals.lock_not_acquired.disconnect(on_refused)
    assert ran == [1]
    assert refused == [name] * 3  # each one attempt's outcome, as a plain acquire tells it
    assert shaping_state(work, name).count == 1  # only the start that ran
    assert [info.owner for info in counted.get_many([name])] == ["someone else"]
    holder.release()
    assert work(2) == 2
    assert shaping_state(work, name).count == 2


def test_asyncio_the_same_in_two_round_trips(
    counted: LockManager, counting_proxy: TcpProxy, name: str
) -> None:
    @single_instance(name, rate="1/m", manager=counted)
    async def work() -> str:
        return "ran"

    @single_instance(f"{name}:warm", rate="1000/m", manager=counted)
    async def warm() -> None:
        pass

    async def main() -> None:
        try:
            await warm()
            before = counting_proxy.requests
            assert await work() == "ran"
            assert counting_proxy.requests - before == 2
            with pytest.raises(RunLimited):
                await work()
            assert await counted.aget(name) is None
        finally:
            await counted.source.abackend().aclose()

    asyncio.run(main())
    assert shaping_state(work, name).count == 1


def test_a_guard_that_waits_admits_after_its_wait(name: str) -> None:
    """``timeout`` > 0: the attempt may queue, so the admission follows the acquire (its
    own round trip), as before."""
    from django_redislock import locks

    @single_instance(name, rate="1/m", timeout=5)
    def work() -> str:
        return "ran"

    holder = locks.lock(name, owner="holder", ttl=30)
    assert holder.acquire()
    assert shaping_state(work, name).count == 0
    holder.release()
    assert work() == "ran"
    with pytest.raises(RunLimited):
        work()
    assert shaping_state(work, name).count == 1


def test_a_call_with_a_cooldown_costs_two_round_trips_and_finds_it_next_time(
    counted: LockManager, counting_proxy: TcpProxy, name: str
) -> None:
    @single_instance(name, cooldown=30, manager=counted)
    def work() -> str:
        return "ran"

    @single_instance(f"{name}:warm", cooldown=0.001, manager=counted)
    def warm() -> None:
        pass

    warm()  # the connection is made and the scripts are loaded
    before = counting_proxy.requests
    assert work() == "ran"
    assert counting_proxy.requests - before == 2  # the attempt and admission; COOL and release
    assert counted.get(name) is None
    assert shaping_state(work, name).cooldown_left > 29
    before = counting_proxy.requests
    with pytest.raises(RunLimited) as refused:
        work()
    assert refused.value.reason == "cooldown"
    assert counting_proxy.requests - before == 2  # the attempt with the refusal, the give-back
    assert counted.get(name) is None


def test_asyncio_a_cooldown_in_two_round_trips(
    counted: LockManager, counting_proxy: TcpProxy, name: str
) -> None:
    @single_instance(name, cooldown=30, manager=counted)
    async def work() -> str:
        return "ran"

    @single_instance(f"{name}:warm", cooldown=0.001, manager=counted)
    async def warm() -> None:
        pass

    async def main() -> None:
        try:
            await warm()
            before = counting_proxy.requests
            assert await work() == "ran"
            assert counting_proxy.requests - before == 2
            assert await counted.aget(name) is None
            with pytest.raises(RunLimited):
                await work()
        finally:
            await counted.source.abackend().aclose()

    asyncio.run(main())
    assert shaping_state(work, name).cooldown_left > 29


def test_a_cooldown_redis_refuses_is_logged_and_the_release_still_frees_the_lock(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A real fault: Redis fills up (``maxmemory``, ``noeviction``) while the run runs.
    ``COOL`` is refused (its one write takes memory) in the batch it shares with the
    release, whose first write frees memory: the run's outcome stands, the lock is free
    and the failed cooldown is logged."""
    server = RedisServer("--maxmemory-policy", "noeviction")
    try:
        manager = LockManager(url=f"{server.url}?socket_timeout=5")
        raw = redis.Redis.from_url(server.url)

        @single_instance(name, cooldown=30, manager=manager)
        def work() -> str:
            raw.config_set("maxmemory", 1)  # far below what is used: Redis is full
            return "ran"

        with caplog.at_level(logging.ERROR, logger="django_redislock"):
            assert work() == "ran"
        assert manager.get(name) is None
        assert "could not start the cooldown" in caplog.text
        raw.config_set("maxmemory", 0)
        assert shaping_state(work, name).cooldown_left == 0
        assert work() == "ran"  # no cooldown was started, so none refuses this start
    finally:
        server.stop()


def test_a_shaped_task_execution_admits_in_its_attempt_and_cools_in_its_release(
    counted: LockManager, counting_proxy: TcpProxy, name: str
) -> None:
    """A Celery execution as the worker runs it (Celery's own tracer, not eager): a
    task with a cooldown is one round trip to take its lock with the start's admission,
    one to start the cooldown and release. A refused start (skipped) gives its hold
    back: two as well."""
    from celery import Celery
    from celery.app.trace import build_tracer

    from django_redislock.celery import is_skipped

    app = Celery("one-trip", set_as_current=False)
    app.conf.update(broker_url="memory://", result_backend=None, task_ignore_result=True)

    @app.task(name=f"cooled-{name}")
    @single_instance(name, cooldown=30, on_limited="skip", manager=counted)
    def cooled() -> str:
        return "ran"

    @app.task(name=f"warm-{name}")
    @single_instance(f"{name}:warm", cooldown=0.001, manager=counted)
    def warm() -> None:
        pass

    app.finalize()

    def execute(lazy: Any) -> Any:
        task = app.tasks[lazy.name]
        tracer = build_tracer(task.name, task, app=app, eager=False, propagate=True)
        task_id = f"{task.name}-{counting_proxy.requests}"
        return tracer(task_id, (), {}, {"id": task_id, "delivery_info": {}})

    execute(warm)  # the connection is made and the scripts are loaded
    before = counting_proxy.requests
    assert execute(cooled).retval == "ran"
    assert counting_proxy.requests - before == 2
    assert counted.get(name) is None
    assert shaping_state(cooled, name).cooldown_left > 29
    before = counting_proxy.requests
    assert is_skipped(execute(cooled).retval)
    assert counting_proxy.requests - before == 2
    assert counted.get(name) is None


def test_a_lock_that_waits_for_replicas_sends_the_cooldown_alone_first(name: str) -> None:
    """A release that waits for replicas is not batched (primitives/at_once.py): the
    cooldown's ``COOL`` goes in a round trip of its own, before the release, and both
    reach the replica."""
    from django_redislock.guards.shaping import cooling
    from django_redislock.primitives import at_once
    from tests.replication import ReplicatedPair

    pair = ReplicatedPair(through_proxy=False)
    # a loaded machine may take longer than the default 0.5 s to acknowledge
    slow = override_settings(REDISLOCK_WAIT_TIMEOUT=5)
    slow.enable()
    try:
        primary = LockManager(url=f"redis://127.0.0.1:{pair.primary.port}/0")

        @single_instance(name, cooldown=30, manager=primary)
        def work() -> None:
            pass

        lock = primary.lock(name, ttl=30, wait_replicas=1)
        assert at_once.batch_backend([lock], least=1) is None
        assert lock.acquire(blocking=False)
        told: list[Any] = []
        cool = cooling(work._redislock_config, lock)  # type: ignore[attr-defined]
        assert cool is not None
        lock._leave(None, prior=cool._replace(settle=told.append))
        assert len(told) == 1 and isinstance(told[0], int)  # COOL's answer: when it ends
        assert primary.get(name) is None
        assert shaping_state(work, name).cooldown_left > 29
        assert pair.replica_client.keys("redislock:cooldown:*")
    finally:
        slow.disable()
        pair.stop()


def test_a_coalescing_task_execution_asks_its_pending_slot_in_its_attempt(
    counted: LockManager, counting_proxy: TcpProxy, name: str, redis_client: redis.Redis
) -> None:
    """A Celery execution of a coalescing task as the worker runs it: taking the lock
    and asking the pending slot whether this execution is its sweeper (``SWEEP``) is
    one round trip; at its end, taking the pending call (none) and the release are two.
    With a pending call, the sweeper's execution hands it on in as many: the lock stays
    held, under a new task id, and the sweeper's copy is dropped (Ignore)."""
    from celery import Celery, states
    from celery.app.trace import build_tracer

    from django_redislock.engine.lua.mutex import TRANSFER

    app = Celery("one-trip-coalesce", set_as_current=False)
    app.conf.update(broker_url="memory://", result_backend=None, task_ignore_result=True)
    ran: list[int] = []

    @app.task(name=f"coalesced-{name}")
    @single_instance(name, coalesce=True, manager=counted)
    def coalesced(i: int) -> int:
        ran.append(i)
        return i

    @app.task(name=f"warm-{name}")
    @single_instance(f"{name}:warm", coalesce=True, manager=counted)
    def warm() -> None:
        pass

    app.finalize()

    def execute(lazy: Any, *args: Any, task_id: str | None = None, seq: int = 1) -> Any:
        """Run a message of *lazy* as a worker does; *seq*: its call's number (the
        header its sender wrote: django_redislock.celery.sequence)."""
        task = app.tasks[lazy.name]
        tracer = build_tracer(task.name, task, app=app, eager=False, propagate=True)
        task_id = task_id or f"{task.name}-{counting_proxy.requests}"
        request = {"id": task_id, "delivery_info": {}, "redislock_seq": seq}
        return tracer(task_id, args, {}, request)

    execute(warm)  # the connection is made and the scripts are loaded
    before = counting_proxy.requests
    assert execute(coalesced, 1).retval == 1
    assert counting_proxy.requests - before == 3  # attempt + SWEEP, TAKE, release
    assert counted.get(name) is None

    # A call that finds the key held pends and becomes the slot's sweeper. When the
    # holder ends without handing the call on (here an operator frees its hold, as
    # when its worker died), the sweeper's copy comes back, and the SWEEP its attempt
    # carried tells it that it is the sweeper: it hands the pending call on (a new
    # task id holds the lock) and does not run it itself.
    holder = counted.lock(name, owner="a dead worker's execution", ttl=30)
    assert holder.acquire()
    sweeper = f"sweeper-{name}"
    assert execute(coalesced, 2, task_id=sweeper, seq=2).info.state == states.IGNORED  # re-sent
    assert counted.force_release(name)
    redis_client.script_load(TRANSFER)  # (its first use would add NOSCRIPT and a load)
    before = counting_proxy.requests
    assert execute(coalesced, 2, task_id=sweeper, seq=2).info.state == states.IGNORED
    assert counting_proxy.requests - before == 3  # attempt + SWEEP, TAKE, the transfer
    assert ran == [1]  # the pending call was handed on, not run here
    info = counted.get(name)
    assert info is not None and info.owner not in (sweeper, "a dead worker's execution")
    assert counted.force_release(name)
