"""A shaped guard's one attempt and its start's admission share a round trip
(guards/shaping.py ``acquire_admitted``), on a real Redis reached through a real TCP
proxy that counts the request bursts a client sends (``counting_proxy``: a pipeline
arrives as one).

The admission is sent whether or not the attempt will be granted, so it counts the
start only when the attempt's owner holds the lock as it runs: a call that finds the
lock held by someone else counts nothing, and gives nothing back.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from django_redislock import LockManager, RunLimited, signals, single_instance
from django_redislock.guards.shaping import shaping_state
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
