"""The observers' wait (``election.observe.watch``) as a flow, without Redis: scripted
replies and a fake clock, branch by branch (the drivers are tested with the lock's flows)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from django_redislock.election.observe import LEASE_SLACK, watch
from django_redislock.engine.calls import AmbiguousReply, Call
from django_redislock.engine.flows import HUB_READY, SUBSCRIBE, Listen, Park
from django_redislock.engine.keys import KeySpace
from django_redislock.exceptions import LockBackendError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _start(flow: Generator[Any, Any, bool]) -> Any:
    assert next(flow) == Listen("n1")
    assert flow.send(True) is SUBSCRIBE
    assert flow.send(None) is HUB_READY
    call = flow.send((True, b"P:wake:abc"))
    assert isinstance(call, Call) and call.script.name == "watch"
    assert call.keys == (b"P:{e}", b"P:watchers:{e}")
    assert call.args[0] == b"P:wake:abc n1"
    return call


def _flow(known: int | None, clock: Clock, timeout: float = 10.0) -> Generator[Any, Any, bool]:
    return watch(KeySpace("P"), "e", "n1", known, clock() + timeout, clock)


def _finish(flow: Generator[Any, Any, bool], reply: Any) -> bool:
    with pytest.raises(StopIteration) as done:
        flow.send(reply)
    return bool(done.value.value)


def test_a_changed_term_ends_the_wait_at_once() -> None:
    clock = Clock()
    flow = _flow(5, clock)
    _start(flow)
    assert _finish(flow, [b"7", 3000]) is True


def test_an_unchanged_term_parks_until_the_lease_would_run_out_then_looks_again() -> None:
    clock = Clock()
    flow = _flow(5, clock)
    _start(flow)
    park = flow.send([b"5", 2000])
    assert park == Park("n1", 2.0 + LEASE_SLACK)
    clock.now += 0.5  # poked early
    again = flow.send(None)
    assert isinstance(again, Call) and again.script.name == "watch"
    assert again.args[1] == b"10500"  # registered for what is left (+1 s)
    assert _finish(flow, [b"", -2]) is True  # the lease ran out: nobody leads


def test_nobody_leading_waits_for_the_whole_timeout_and_gives_up() -> None:
    clock = Clock()
    flow = _flow(None, clock, timeout=3)
    _start(flow)
    assert flow.send([b"", -2]) == Park("n1", 3.0)  # no lease to wake at
    clock.now += 3.0
    assert isinstance(flow.send(None), Call)  # one last look at the deadline
    assert _finish(flow, [b"", -2]) is False


def test_a_lost_reply_is_asked_again_then_raised() -> None:
    clock = Clock()
    flow = _flow(5, clock)
    call = _start(flow)
    assert flow.throw(AmbiguousReply(ConnectionError("cut"))) == call
    with pytest.raises(LockBackendError):
        flow.throw(AmbiguousReply(ConnectionError("cut again")))
