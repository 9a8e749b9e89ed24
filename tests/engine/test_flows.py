"""The acquire flow and the idempotent retry, driven step by step without Redis.

A flow is a generator of effects; :func:`drive` answers each effect from a
script of expected effects and replies, with a fake clock and a fixed jitter,
so every branch of the wait policy can be checked exactly. The last part runs
flows through the real drivers with a fake backend and a fake wake-up hub.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import pytest

from django_redislock.engine import driver, flows
from django_redislock.engine.calls import AmbiguousReply, Attempt, Call, NotReplicated
from django_redislock.engine.flows import HUB_READY, SUBSCRIBE, AcquireOp, Listen, Park, Run
from django_redislock.engine.lua.mutex import acquire_script, cancel_script, release_script
from django_redislock.exceptions import LockBackendError, LockError, LockNotReplicated

KEYS = (b"rl:{job}", b"rl:slot:{job}", b"rl:queue:{job}", b"rl:waiters:{job}")
OWNER = "proc:owner"
NONCE = "proc.2a"
NAME = "job"
CHANNEL = b"rl:wake:proc"
#: The channel as a hub names it once its subscription is confirmed (wake.queue_channel).
SURE_CHANNEL = b"!" + CHANNEL
TTL = b"30000"
META = b'{"host": "h"}'
RETENTION = b"86400000"
JITTER = 0.8
SLICE = flows.POLL_SLICE * JITTER  # the fallback poll when nothing else is shorter


# -- the scripted driver ----------------------------------------------------------------------


class FakeClock:
    """``AcquireOp.clock``: time stands still unless a step advances it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Step:
    """One expected effect and the flow's answer to it."""

    expect: Callable[[Any], None]
    reply: Any = None
    #: Thrown into the flow instead of sending *reply*.
    throw: BaseException | None = None
    #: Seconds the fake clock moves on before the answer (time spent in the effect).
    advance: float = 0.0


def drive(
    flow: Generator[Any, Any, Any], steps: list[Step], clock: FakeClock | None = None
) -> tuple[Any, list[Any]]:
    """Run *flow* through *steps*; return (its value, the effects it yielded).

    Fails if the flow yields an effect the script does not expect, yields more
    effects than scripted, or ends early. Exceptions the flow raises propagate.
    """
    effects: list[Any] = []
    value: Any = None
    error: BaseException | None = None
    for index, step in enumerate(steps):
        try:
            effect = flow.send(value) if error is None else flow.throw(error)
        except StopIteration as done:
            pytest.fail(f"flow returned {done.value!r} at step {index}, before the script ended")
        effects.append(effect)
        step.expect(effect)
        if step.advance:
            assert clock is not None, "a step advances the clock but no clock was given"
            clock.now += step.advance
        value, error = step.reply, step.throw
    try:
        effect = flow.send(value) if error is None else flow.throw(error)
    except StopIteration as done:
        return done.value, effects
    pytest.fail(f"flow yielded an unscripted effect {effect!r}")


def make_op(
    *,
    blocking: bool,
    timeout: float | None = None,
    clock: FakeClock | None = None,
    on_contended: Callable[[int], None] | None = None,
    jitter: float = JITTER,
) -> AcquireOp:
    return AcquireOp(
        KEYS, OWNER, NONCE, TTL, META, RETENTION, NAME,
        blocking=blocking,
        timeout=timeout,
        on_contended=on_contended,
        clock=clock or FakeClock(),
        jitter=lambda: jitter,
    )  # fmt: skip


# -- expectations ------------------------------------------------------------------------------


def acquire_run(channel: bytes) -> Callable[[Any], None]:
    """The effect must run the acquire script for this op, queueing on *channel*."""

    def check(effect: Any) -> None:
        assert type(effect) is Run, effect
        call = effect.call
        assert call.script is acquire_script
        assert tuple(call.keys) == KEYS
        owner, nonce, ttl, meta, wait_left, retention, chan, known = call.args
        assert (owner, nonce, ttl, meta, retention, chan, known) == (
            OWNER, NONCE, TTL, META, RETENTION, channel, b"",
        )  # fmt: skip
        # How long a queued waiter still waits (for operators): only when it queues.
        assert wait_left == b"" if not channel else (wait_left == b"" or wait_left.isdigit())
        assert call.action == "acquire the lock"
        assert call.name == NAME

    return check


def cancel_run(effect: Any) -> None:
    assert type(effect) is Run, effect
    assert effect.call.script is cancel_script
    assert tuple(effect.call.keys) == KEYS
    assert tuple(effect.call.args) == (OWNER, NONCE, RETENTION)
    assert effect.call.action == "cancel the wait"
    assert effect.call.name == NAME


def hub_ready(effect: Any) -> None:
    assert effect is HUB_READY, effect


def subscribe(effect: Any) -> None:
    assert effect is SUBSCRIBE, effect


def listen(effect: Any) -> None:
    assert effect == Listen(NONCE), effect
    assert type(effect) is Listen


def park(seconds: float) -> Callable[[Any], None]:
    def check(effect: Any) -> None:
        assert type(effect) is Park, effect
        assert effect.nonce == NONCE
        assert effect.seconds == pytest.approx(seconds, abs=1e-9)

    return check


def held_reply(pttl_ms: int) -> int:
    """The acquire script's integer reply for "held by someone else"."""
    return -2 - pttl_ms


def ambiguous(message: str = "x") -> AmbiguousReply:
    return AmbiguousReply(ConnectionError(message))


# -- non-blocking ------------------------------------------------------------------------------


def test_non_blocking_grant() -> None:
    contended: list[int] = []
    op = make_op(blocking=False, on_contended=contended.append)
    result, _ = drive(flows.acquire(op), [Step(acquire_run(b""), reply=41)])
    assert result == Attempt(True, 41, 1)
    assert contended == []


def test_non_blocking_reentry_array_reply() -> None:
    op = make_op(blocking=False)
    result, _ = drive(flows.acquire(op), [Step(acquire_run(b""), reply=[b"41", 3])])
    assert result == Attempt(True, 41, 3)


@pytest.mark.parametrize("pttl", [2500, 0, -1], ids=["lease", "expiring-now", "no-expiry"])
def test_non_blocking_held_reports_pttl(pttl: int) -> None:
    contended: list[int] = []
    op = make_op(blocking=False, on_contended=contended.append)
    result, effects = drive(flows.acquire(op), [Step(acquire_run(b""), reply=held_reply(pttl))])
    assert result == Attempt(False, pttl, 0)
    assert contended == [pttl]
    assert len(effects) == 1  # no hub, no wait, no cancel


def test_non_blocking_held_without_callback() -> None:
    op = make_op(blocking=False)
    result, _ = drive(flows.acquire(op), [Step(acquire_run(b""), reply=held_reply(100))])
    assert result == Attempt(False, 100, 0)


# -- blocking ----------------------------------------------------------------------------------


def test_blocking_fresh_grant_does_not_listen() -> None:
    contended: list[int] = []
    op = make_op(blocking=True, timeout=5, on_contended=contended.append)
    result, effects = drive(
        flows.acquire(op),
        [Step(hub_ready, reply=(True, CHANNEL)), Step(acquire_run(CHANNEL), reply=7)],
    )
    assert result == Attempt(True, 7, 1)
    assert contended == []
    assert not any(type(e) in (Listen, Park) for e in effects)


def test_blocking_queued_then_handed_off() -> None:
    contended: list[int] = []
    op = make_op(blocking=True, timeout=None, on_contended=contended.append)
    result, _ = drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(True, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(20_000)),
            Step(listen, reply=True),
            Step(park(SLICE), reply=99),
        ],
    )
    assert result == Attempt(True, 99, 1, handed=True)
    assert contended == [20_000]


@pytest.mark.parametrize(
    ("ready", "subscribed"),
    [(False, False), (False, True), (True, False)],
    ids=["hub-not-ready", "subscribed-after-queueing", "subscription-lost"],
)
def test_hub_not_subscribed_when_queued_asks_again(ready: bool, subscribed: bool) -> None:
    """A hand-off published before the subscription was missed: subscribe, then ask again."""
    contended: list[int] = []
    op = make_op(blocking=True, timeout=None, on_contended=contended.append)
    result, effects = drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(ready, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(500)),
            Step(listen, reply=subscribed),
            Step(subscribe, reply=None),
            # asked again naming the channel as the confirmed subscription's
            Step(hub_ready, reply=(True, SURE_CHANNEL)),
            Step(acquire_run(SURE_CHANNEL), reply=[b"12", b"1"]),
        ],
    )
    assert result == Attempt(True, 12, 1, handed=True)
    assert contended == [500]  # told once, for the first answer
    acquire_calls = [e.call for e in effects if type(e) is Run]
    assert len(acquire_calls) == 2


def test_hub_not_ready_still_held_after_subscribing_waits() -> None:
    op = make_op(blocking=True, timeout=None)
    result, _ = drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(False, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(20_000)),
            Step(listen, reply=False),
            Step(subscribe, reply=None),
            Step(hub_ready, reply=(True, SURE_CHANNEL)),
            # the second answer's lease is the one the pause is bounded by
            Step(acquire_run(SURE_CHANNEL), reply=held_reply(300)),
            Step(park(0.301), reply=5),
        ],
    )
    assert result == Attempt(True, 5, 1, handed=True)


def test_park_timeout_polls_and_the_poll_grants() -> None:
    clock = FakeClock()
    op = make_op(blocking=True, timeout=None, clock=clock)
    result, _ = drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(True, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(10_000)),
            Step(listen, reply=True),
            Step(park(SLICE), reply=None, advance=SLICE),
            Step(acquire_run(CHANNEL), reply=held_reply(9_000)),
            Step(park(SLICE), reply=None, advance=SLICE),
            Step(acquire_run(CHANNEL), reply=314),
        ],
        clock,
    )
    assert result == Attempt(True, 314, 1, handed=True)


def test_poll_finds_the_missed_hand_off() -> None:
    """The grant message was lost: the poll (same nonce) answers {fence, count}."""
    op = make_op(blocking=True, timeout=None)
    result, _ = drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(True, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(10_000)),
            Step(listen, reply=True),
            Step(park(SLICE), reply=None),
            Step(acquire_run(CHANNEL), reply=[b"77", b"1"]),
        ],
    )
    assert result == Attempt(True, 77, 1, handed=True)


def test_deadline_passing_cancels_the_wait() -> None:
    clock = FakeClock()
    contended: list[int] = []
    op = make_op(blocking=True, timeout=1.0, clock=clock, on_contended=contended.append)
    result, _ = drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(True, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(60_000)),
            Step(listen, reply=True),
            Step(park(SLICE), reply=None, advance=SLICE),
            Step(acquire_run(CHANNEL), reply=held_reply(59_000)),
            # 0.2 s left: the pause stops at the deadline
            Step(park(1.0 - SLICE), reply=None, advance=1.0 - SLICE),
            # time is up: no last poll, straight to the cancel
            Step(cancel_run, reply=-1),
        ],
        clock,
    )
    assert result == Attempt(False, -1, 0)
    assert result.held is False
    assert contended == [60_000]


def test_deadline_already_passed_after_queueing() -> None:
    """Time ran out during the first acquire: no Park at all, straight to cancel."""
    clock = FakeClock()
    op = make_op(blocking=True, timeout=0.5, clock=clock)
    result, effects = drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(True, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(5_000), advance=0.5),
            Step(listen, reply=True),
            Step(cancel_run, reply=-1),
        ],
        clock,
    )
    assert result.held is False
    assert not any(type(e) is Park for e in effects)


def test_cancel_reveals_the_lock_was_handed_to_us() -> None:
    clock = FakeClock()
    op = make_op(blocking=True, timeout=0.5, clock=clock)
    result, _ = drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(True, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(5_000)),
            Step(listen, reply=True),
            Step(park(0.5), reply=None, advance=0.5),
            Step(cancel_run, reply=[b"88", b"1"]),
        ],
        clock,
    )
    assert result == Attempt(True, 88, 1, handed=True)


def test_cancel_after_the_deadline_retries_an_ambiguous_reply() -> None:
    clock = FakeClock()
    op = make_op(blocking=True, timeout=0.1, clock=clock)
    result, effects = drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(True, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(5_000), advance=0.2),
            Step(listen, reply=True),
            Step(cancel_run, throw=ambiguous()),
            Step(cancel_run, reply=[b"9", b"1"]),
        ],
        clock,
    )
    assert result == Attempt(True, 9, 1, handed=True)
    assert effects[-1].call is effects[-2].call


# -- the length of a pause ----------------------------------------------------------------------


def test_pause_never_past_the_holders_lease() -> None:
    op = make_op(blocking=True, timeout=None)
    drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(True, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(250)),
            Step(listen, reply=True),
            Step(park(0.251), reply=None),  # the lease (+1 ms), not the 0.8 s poll
            Step(acquire_run(CHANNEL), reply=held_reply(40)),
            Step(park(0.041), reply=None),
            Step(acquire_run(CHANNEL), reply=held_reply(5_000)),
            Step(park(SLICE), reply=3),
        ],
    )


def test_pause_never_past_the_deadline() -> None:
    clock = FakeClock()
    op = make_op(blocking=True, timeout=0.3, clock=clock)
    drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(True, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(5_000), advance=0.05),
            Step(listen, reply=True),
            Step(park(0.25), reply=None, advance=0.2),
            Step(acquire_run(CHANNEL), reply=held_reply(5_000)),
            Step(park(0.05), reply=4),
        ],
        clock,
    )


def test_pause_is_the_jittered_poll_slice_otherwise() -> None:
    for jitter in (0.75, 1.0):
        op = make_op(blocking=True, timeout=60, jitter=jitter)
        drive(
            flows.acquire(op),
            [
                Step(hub_ready, reply=(True, CHANNEL)),
                Step(acquire_run(CHANNEL), reply=held_reply(30_000)),
                Step(listen, reply=True),
                Step(park(flows.POLL_SLICE * jitter), reply=1),
            ],
        )


def test_lock_without_expiry_is_polled_at_the_slice() -> None:
    """pttl -1 (no expiry) must not bound the pause to -1 ms."""
    contended: list[int] = []
    op = make_op(blocking=True, timeout=None, on_contended=contended.append)
    drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(True, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(-1)),
            Step(listen, reply=True),
            Step(park(SLICE), reply=2),
        ],
    )
    assert contended == [-1]


@pytest.mark.parametrize(
    ("pttl", "deadline", "now", "jitter", "expected"),
    [
        (10_000, None, 0.0, 0.8, 0.8),  # the jittered slice
        (10_000, None, 0.0, 1.0, 1.0),
        (10_000, None, 0.0, 0.75, 0.75),
        (200, None, 0.0, 0.8, 0.201),  # the holder's lease, plus 1 ms
        (0, None, 0.0, 0.8, 0.001),
        (-1, None, 0.0, 0.8, 0.8),  # no expiry: the slice
        (-2, None, 0.0, 0.8, 0.8),  # the key vanished: the slice
        (10_000, 50.0, 49.9, 0.8, 0.1),  # the deadline
        (10_000, 50.0, 10.0, 0.8, 0.8),  # the deadline is far away
        (50, 50.0, 49.5, 0.8, 0.051),  # the lease before the deadline
        (900, 50.0, 49.7, 0.8, 0.3),  # the deadline before the lease
        (-1, 50.0, 49.95, 1.0, 0.05),
        (10_000, 50.0, 50.0, 0.8, None),  # deadline reached
        (10_000, 50.0, 51.0, 0.8, None),  # deadline passed
        (0, 50.0, 50.0, 0.8, None),
    ],
)
def test_next_pause(
    pttl: int, deadline: float | None, now: float, jitter: float, expected: float | None
) -> None:
    pause = flows.next_pause(pttl, deadline, now, jitter)
    if expected is None:
        assert pause is None
    else:
        assert pause == pytest.approx(expected, abs=1e-9)


def test_next_pause_follows_poll_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flows, "POLL_SLICE", 2.0)
    assert flows.next_pause(60_000, None, 0.0, 0.5) == pytest.approx(1.0)


def test_default_jitter_is_within_bounds() -> None:
    op = AcquireOp(KEYS, OWNER, NONCE, TTL, META, RETENTION, NAME, blocking=True, timeout=None)
    values = [op.jitter() for _ in range(200)]
    assert all(0.75 <= v <= 1.0 for v in values)
    assert len(set(values)) > 1


# -- the idempotent retry ------------------------------------------------------------------------


def test_one_ambiguous_reply_retries_the_same_call() -> None:
    op = make_op(blocking=False)
    result, effects = drive(
        flows.acquire(op),
        [
            Step(acquire_run(b""), throw=ambiguous()),
            Step(acquire_run(b""), reply=[b"41", b"1"]),
        ],
    )
    assert result == Attempt(True, 41, 1)
    first, second = effects
    assert second.call is first.call  # same arguments, so the same nonce
    assert second.call.args[1] == NONCE


def test_ambiguous_reply_in_a_poll_is_retried_with_the_same_nonce() -> None:
    op = make_op(blocking=True, timeout=None)
    result, effects = drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(True, CHANNEL)),
            Step(acquire_run(CHANNEL), throw=ambiguous()),
            Step(acquire_run(CHANNEL), reply=held_reply(3_000)),
            Step(listen, reply=True),
            Step(park(SLICE), reply=None),
            Step(acquire_run(CHANNEL), throw=ambiguous()),
            Step(acquire_run(CHANNEL), reply=[b"6", b"1"]),
        ],
    )
    assert result == Attempt(True, 6, 1, handed=True)
    runs = [e for e in effects if type(e) is Run]
    assert runs[1].call is runs[0].call
    assert runs[3].call is runs[2].call
    assert {r.call.args[1] for r in runs} == {NONCE}


def test_two_ambiguous_replies_raise_lock_backend_error() -> None:
    op = make_op(blocking=False)
    cause = ConnectionError("connection reset")
    with pytest.raises(LockBackendError) as info:
        drive(
            flows.acquire(op),
            [
                Step(acquire_run(b""), throw=AmbiguousReply(ConnectionError("first"))),
                Step(acquire_run(b""), throw=AmbiguousReply(cause)),
            ],
        )
    error = info.value
    assert isinstance(error, LockError)
    assert error.__cause__ is cause
    assert error.name == NAME
    assert error.lock_name == NAME
    assert "acquire the lock" in str(error)
    assert "connection reset" in str(error)


def test_two_ambiguous_replies_while_waiting_raise() -> None:
    op = make_op(blocking=True, timeout=None)
    cause = TimeoutError("timed out")
    with pytest.raises(LockBackendError) as info:
        drive(
            flows.acquire(op),
            [
                Step(hub_ready, reply=(True, CHANNEL)),
                Step(acquire_run(CHANNEL), reply=held_reply(3_000)),
                Step(listen, reply=True),
                Step(park(SLICE), reply=None),
                Step(acquire_run(CHANNEL), throw=ambiguous()),
                Step(acquire_run(CHANNEL), throw=AmbiguousReply(cause)),
            ],
        )
    assert info.value.__cause__ is cause
    assert info.value.name == NAME


def test_other_exceptions_are_not_retried() -> None:
    op = make_op(blocking=False)
    with pytest.raises(LockBackendError, match="NOSCRIPT"):
        drive(
            flows.acquire(op),
            [Step(acquire_run(b""), throw=LockBackendError("NOSCRIPT", name=NAME))],
        )


# -- cancel and call_once ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (-1, Attempt(False, -1, 0)),
        ([b"15", b"2"], Attempt(True, 15, 2)),
        ([15, 1], Attempt(True, 15, 1)),
    ],
)
def test_cancel(reply: Any, expected: Attempt) -> None:
    op = make_op(blocking=True, timeout=1)
    result, effects = drive(flows.cancel(op), [Step(cancel_run, reply=reply)])
    assert result == expected
    assert len(effects) == 1


def test_cancel_retries_once_then_raises() -> None:
    op = make_op(blocking=True, timeout=1)
    result, effects = drive(
        flows.cancel(op),
        [Step(cancel_run, throw=ambiguous()), Step(cancel_run, reply=-1)],
    )
    assert result == Attempt(False, -1, 0)
    assert effects[1].call is effects[0].call
    cause = ConnectionError("gone")
    with pytest.raises(LockBackendError, match="cancel the wait") as info:
        drive(
            flows.cancel(op),
            [Step(cancel_run, throw=ambiguous()), Step(cancel_run, throw=AmbiguousReply(cause))],
        )
    assert info.value.__cause__ is cause


def _release_call(name: str | None = NAME) -> Call:
    return Call(release_script, KEYS, (OWNER, "rel.1", RETENTION), "release the lock", name)


def test_call_once_returns_the_raw_reply() -> None:
    call = _release_call()

    def is_call(effect: Any) -> None:
        assert effect == call and type(effect) is Run
        assert effect.call is call

    result, _ = drive(flows.call_once(call), [Step(is_call, reply=b"raw")])
    assert result == b"raw"
    result, effects = drive(
        flows.call_once(call), [Step(is_call, throw=ambiguous()), Step(is_call, reply=0)]
    )
    assert result == 0
    assert len(effects) == 2


def test_call_once_on_many_locks_raises_without_a_name() -> None:
    call = _release_call(name=None)

    def is_call(effect: Any) -> None:
        assert effect.call is call

    cause = ConnectionError("down")
    with pytest.raises(LockBackendError, match="release the lock: down") as info:
        drive(
            flows.call_once(call),
            [Step(is_call, throw=ambiguous()), Step(is_call, throw=AmbiguousReply(cause))],
        )
    assert info.value.name is None
    assert info.value.__cause__ is cause


def test_acquire_calls_carry_a_fresh_client_clock() -> None:
    op = make_op(blocking=True)
    assert op.call(CHANNEL).args[:4] == (OWNER, NONCE, TTL, META)
    assert op.call(b"").args[6] == b""
    assert op.cancel_call() == Call(
        cancel_script, KEYS, (OWNER, NONCE, RETENTION), "cancel the wait", NAME
    )


# -- the drivers ---------------------------------------------------------------------------------


class FakeWaiter(tuple):  # type: ignore[type-arg]
    """A registered wait: ``("waiter", nonce)``, with the ``fence`` slot real waiters
    have (the driver drops a hand-off delivered before each call it sends)."""

    fence: int | None = None


class FakeHub:
    """A wake-up hub: records registrations; ``wait`` answers from *fences*."""

    def __init__(self, *, ready: bool = True, fences: tuple[int | None, ...] = ()) -> None:
        self.ready = ready
        self.channel_arg = CHANNEL
        self.sure_arg = SURE_CHANNEL
        self.fences = list(fences)
        self.registered: list[str] = []
        self.unregistered: list[str] = []
        self.waits: list[tuple[Any, float]] = []
        self.subscriptions = 0

    def start(self) -> bool:
        return self.ready

    def register(self, nonce: str) -> Any:
        self.registered.append(nonce)
        return FakeWaiter(("waiter", nonce))

    def unregister(self, nonce: str) -> None:
        self.unregistered.append(nonce)

    def _wait(self, waiter: Any, seconds: float) -> int | None:
        assert waiter[1] in self.registered and waiter[1] not in self.unregistered
        self.waits.append((waiter, seconds))
        return self.fences.pop(0)

    def _wait_ready(self) -> None:
        self.subscriptions += 1
        self.ready = True

    wait = _wait
    wait_ready = _wait_ready


class FakeAsyncHub(FakeHub):
    async def wait(self, waiter: Any, seconds: float) -> int | None:  # type: ignore[override]
        await asyncio.sleep(0)
        return self._wait(waiter, seconds)

    async def wait_ready(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        self._wait_ready()


class FakeBackend:
    """``run(call)`` answers from *replies* (an exception is raised)."""

    def __init__(self, replies: list[Any], hub: FakeHub | None = None) -> None:
        self.replies = list(replies)
        self.calls: list[Call] = []
        self._hub = hub
        self.hubs_asked = 0

    def _run(self, call: Call) -> Any:
        self.calls.append(call)
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    run = _run

    def hub(self, key: bytes | str | None = None) -> FakeHub:
        self.hubs_asked += 1
        assert self._hub is not None, "this flow should not need the hub"
        return self._hub


class FakeAsyncBackend(FakeBackend):
    async def run(self, call: Call) -> Any:  # type: ignore[override]
        await asyncio.sleep(0)
        return self._run(call)


def run_driver(mode: str, flow: Any, backend: FakeBackend) -> Any:
    if mode == "sync":
        return driver.run_sync(flow, backend)  # type: ignore[arg-type]
    return asyncio.run(driver.run_async(flow, backend))  # type: ignore[arg-type]


def fakes(
    mode: str, replies: list[Any], *, ready: bool = True, fences: tuple[int | None, ...] = ()
) -> tuple[FakeBackend, FakeHub]:
    hub = (FakeHub if mode == "sync" else FakeAsyncHub)(ready=ready, fences=fences)
    backend = (FakeBackend if mode == "sync" else FakeAsyncBackend)(replies, hub)
    return backend, hub


MODES = pytest.mark.parametrize("mode", ["sync", "async"])


@MODES
def test_driver_non_blocking_never_touches_the_hub(mode: str) -> None:
    backend, hub = fakes(mode, [held_reply(700)])
    contended: list[int] = []
    result = run_driver(
        mode, flows.acquire(make_op(blocking=False, on_contended=contended.append)), backend
    )
    assert result == Attempt(False, 700, 0)
    assert contended == [700]
    assert backend.hubs_asked == 0
    assert hub.registered == hub.unregistered == []


@MODES
def test_driver_queued_then_handed_off(mode: str) -> None:
    backend, hub = fakes(mode, [held_reply(400)], fences=(21,))
    result = run_driver(mode, flows.acquire(make_op(blocking=True, timeout=None)), backend)
    assert result == Attempt(True, 21, 1, handed=True)
    # queued on the hub's channel, marked: its subscription is confirmed
    assert backend.calls[0].args[6] == SURE_CHANNEL
    assert hub.registered == [NONCE]
    assert hub.waits == [(("waiter", NONCE), pytest.approx(0.401))]
    assert hub.unregistered == [NONCE]  # forgotten once the flow returned
    assert backend.hubs_asked == 1


@MODES
def test_driver_subscribes_when_the_hub_was_not_ready(mode: str) -> None:
    backend, hub = fakes(mode, [held_reply(400), 33], ready=False)
    result = run_driver(mode, flows.acquire(make_op(blocking=True, timeout=None)), backend)
    assert result == Attempt(True, 33, 1, handed=True)
    assert hub.subscriptions == 1
    assert len(backend.calls) == 2
    assert hub.unregistered == [NONCE]


@MODES
def test_driver_retries_an_ambiguous_reply_with_the_same_call(mode: str) -> None:
    backend, hub = fakes(mode, [ambiguous(), held_reply(400), 8], fences=(None,))
    result = run_driver(mode, flows.acquire(make_op(blocking=True, timeout=None)), backend)
    assert result == Attempt(True, 8, 1, handed=True)
    assert backend.calls[1] is backend.calls[0]
    assert hub.waits and hub.unregistered == [NONCE]


@MODES
def test_driver_unregisters_when_the_flow_raises(mode: str) -> None:
    cause = ConnectionError("reset")
    backend, hub = fakes(
        mode, [held_reply(400), ambiguous(), AmbiguousReply(cause)], fences=(None,)
    )
    with pytest.raises(LockBackendError) as info:
        run_driver(mode, flows.acquire(make_op(blocking=True, timeout=None)), backend)
    assert info.value.__cause__ is cause
    assert hub.registered == [NONCE]
    assert hub.unregistered == [NONCE]


@MODES
def test_driver_unregisters_when_the_backend_raises(mode: str) -> None:
    """A non-ambiguous error is not thrown into the flow: it ends the run, registrations too."""
    backend, hub = fakes(
        mode, [held_reply(400), LockBackendError("READONLY", name=NAME)], fences=(None,)
    )
    with pytest.raises(LockBackendError, match="READONLY"):
        run_driver(mode, flows.acquire(make_op(blocking=True, timeout=None)), backend)
    assert hub.unregistered == [NONCE]


# The drivers' shortcut (acquire_sync / acquire_async make the first call without a
# flow) must do exactly what running the whole flow does.
SHORTCUT_CASES = {
    "granted": (True, [7], {}),
    "re-entered": (True, [[b"41", 3]], {}),
    "granted-one-attempt": (False, [7], {}),
    "held-one-attempt": (False, [held_reply(700)], {}),
    "queued-then-handed-off": (True, [held_reply(400)], {"fences": (21,)}),
    "hub-not-ready": (True, [held_reply(400), 33], {"ready": False}),
    "ambiguous-then-granted": (True, [ambiguous(), 9], {}),
    "ambiguous-then-queued": (True, [ambiguous(), held_reply(400), 8], {"fences": (None,)}),
    "given-up": (False, [ambiguous(), ambiguous()], {}),
    "refused": (True, [b"TYPE semaphore"], {}),
    "backend-error": (True, [LockBackendError("READONLY", name=NAME)], {}),
}


def _acquire_outcome(mode: str, shortcut: bool, case: str) -> tuple[Any, ...]:
    blocking, replies, options = SHORTCUT_CASES[case]
    backend, hub = fakes(mode, replies, **options)
    contended: list[int] = []
    op = make_op(blocking=blocking, on_contended=contended.append)
    try:
        if not shortcut:
            result: Any = run_driver(mode, flows.acquire(op), backend)
        elif mode == "sync":
            result = driver.acquire_sync(op, backend)  # type: ignore[arg-type]
        else:
            result = asyncio.run(driver.acquire_async(op, backend))  # type: ignore[arg-type]
    except LockError as exc:
        result = (type(exc), str(exc), type(exc.__cause__))
    waits = [(waiter, round(seconds, 6)) for waiter, seconds in hub.waits]
    state = (hub.registered, hub.unregistered, waits, hub.subscriptions, contended)
    return result, backend.calls, backend.replies, state


@MODES
@pytest.mark.parametrize("case", list(SHORTCUT_CASES))
def test_the_drivers_acquire_shortcut_agrees_with_the_flow(mode: str, case: str) -> None:
    through_flow = _acquire_outcome(mode, False, case)
    shortcut = _acquire_outcome(mode, True, case)
    assert shortcut == through_flow
    assert through_flow[1], "the case made no call"


@MODES
def test_the_drivers_acquire_shortcut_leaves_replica_acknowledgements_to_the_flow(
    mode: str,
) -> None:
    """With wait_replicas, an unconfirmed grant is given back: the flow decides that,
    from the first call on (the shortcut would let NotReplicated escape)."""
    backend, hub = fakes(mode, [NotReplicated(7, 0, 1), 1, 12])
    op = make_op(blocking=False)
    op.replicas = 1
    with pytest.raises(LockNotReplicated):
        if mode == "sync":
            driver.acquire_sync(op, backend)  # type: ignore[arg-type]
        else:
            asyncio.run(driver.acquire_async(op, backend))  # type: ignore[arg-type]
    assert [call.script for call in backend.calls] == [acquire_script, release_script]


def _listening_flow(outcome: Any, log: list[str]) -> Generator[Any, Any, Any]:
    """Registers two waits, checks the driver's answers, then returns or raises *outcome*."""
    try:
        assert (yield HUB_READY) == (True, SURE_CHANNEL)
        assert (yield Listen("n1")) is True
        assert (yield Listen("n2")) is True
        assert (yield Park("n2", 0.5)) == 17
        assert (yield SUBSCRIBE) is None
        try:
            yield _release_call()
        except AmbiguousReply as exc:
            log.append(f"thrown:{exc.cause}")
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
    finally:
        log.append("closed")


@MODES
def test_driver_unregisters_every_nonce_on_return(mode: str) -> None:
    backend, hub = fakes(mode, [ambiguous("lost")], fences=(17,))
    log: list[str] = []
    assert run_driver(mode, _listening_flow("done", log), backend) == "done"
    assert hub.registered == ["n1", "n2"]
    assert sorted(hub.unregistered) == ["n1", "n2"]
    assert hub.waits == [(("waiter", "n2"), 0.5)]
    assert log == ["thrown:lost", "closed"]


@MODES
def test_driver_unregisters_every_nonce_on_raise(mode: str) -> None:
    backend, hub = fakes(mode, [ambiguous("lost")], fences=(17,))
    log: list[str] = []
    with pytest.raises(KeyError, match="boom"):
        run_driver(mode, _listening_flow(KeyError("boom"), log), backend)
    assert sorted(hub.unregistered) == ["n1", "n2"]
    assert log == ["thrown:lost", "closed"]


@MODES
def test_driver_rejects_an_unknown_effect(mode: str) -> None:
    def flow() -> Generator[Any, Any, Any]:
        yield Listen("n1")
        yield "not an effect"

    backend, hub = fakes(mode, [])
    with pytest.raises(TypeError, match="unknown effect"):
        run_driver(mode, flow(), backend)
    assert hub.unregistered == ["n1"]


def test_run_async_closes_the_flow_when_the_backend_raises() -> None:
    """A non-ambiguous error is not thrown into the flow, but the flow is still closed."""
    log: list[str] = []

    def flow() -> Generator[Any, Any, Any]:
        try:
            yield Listen("n1")
            yield _release_call()
        finally:
            log.append("closed")

    backend, hub = fakes("async", [LockBackendError("READONLY", name=NAME)])
    running = flow()
    with pytest.raises(LockBackendError, match="READONLY"):
        asyncio.run(driver.run_async(running, backend))  # type: ignore[arg-type]
    assert log == ["closed"]
    assert running.gi_frame is None  # finished, not left suspended
    assert hub.unregistered == ["n1"]


def _claim_run(effect: Any) -> None:
    assert type(effect) is Run, effect
    assert effect.call.script.name == "claim"
    assert tuple(effect.call.keys) == KEYS[:1] and tuple(effect.call.args) == (OWNER,)


def test_a_hand_off_is_claimed_inline_when_asked() -> None:
    op = make_op(blocking=True)
    op.claim_inline = True
    result, _ = drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(True, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(20_000)),
            Step(listen, reply=True),
            Step(park(SLICE), reply=99),
            Step(_claim_run, reply=1),
        ],
    )
    assert result == Attempt(True, 99, 1, handed=True)


def test_a_hand_off_whose_claim_window_ran_out_queues_again() -> None:
    op = make_op(blocking=True)
    op.claim_inline = True
    result, _ = drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(True, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(20_000)),
            Step(listen, reply=True),
            Step(park(SLICE), reply=99),
            Step(_claim_run, reply=0),  # somebody else has it now
            Step(acquire_run(CHANNEL), reply=held_reply(5_000)),
            Step(park(SLICE), reply=100),
            Step(_claim_run, reply=1),
        ],
    )
    assert result == Attempt(True, 100, 1, handed=True)


class _ScriptedBackend:
    """run() answers from a script of replies or AmbiguousReply errors."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = list(answers)
        self.calls: list[Any] = []

    def run(self, call: Any) -> Any:
        self.calls.append(call)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


class _ScriptedAsyncBackend(_ScriptedBackend):
    async def run(self, call: Any) -> Any:  # type: ignore[override]
        return super().run(call)


@pytest.mark.parametrize(
    "answers",
    [[b"ok"], [ambiguous(), b"ok"], [ambiguous(), ambiguous()], [ambiguous(), ambiguous(), b"x"]],
    ids=["first", "retried", "given-up", "given-up-early"],
)
def test_the_direct_single_call_paths_agree_with_the_flow(answers: list[Any]) -> None:
    call = _release_call()
    outcomes = []
    for way in ("flow", "sync", "async"):
        backend = _ScriptedAsyncBackend(answers) if way == "async" else _ScriptedBackend(answers)
        try:
            if way == "flow":
                value: Any = driver.run_sync(flows.call_once(call), backend)  # type: ignore[arg-type]
            elif way == "sync":
                value = driver.call_sync(call, backend)  # type: ignore[arg-type]
            else:
                value = asyncio.run(driver.call_async(call, backend))  # type: ignore[arg-type]
        except LockBackendError as exc:
            value = ("error", str(exc), exc.name, type(exc.__cause__))
        outcomes.append((value, len(backend.calls), {id(c) for c in backend.calls}))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][:2] == outcomes[2][:2]


def test_a_hand_off_found_after_a_long_pause_is_claimed_before_it_is_trusted() -> None:
    """The waiter was paused (no answer from Redis for longer than half the claim
    window): the hand-off may have expired meanwhile, so it is claimed first."""
    clock = FakeClock()
    op = make_op(blocking=True, clock=clock)  # auto-renewing: no inline claim normally
    result, _ = drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(True, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(20_000)),
            Step(listen, reply=True),
            Step(park(SLICE), reply=99, advance=5.0),  # woke up 5 s later
            Step(_claim_run, reply=0),  # gone: somebody else holds it now
            Step(acquire_run(CHANNEL), reply=held_reply(3_000)),
            Step(park(SLICE), reply=100),
        ],
        clock,
    )
    assert result == Attempt(True, 100, 1, handed=True)


def test_a_hand_off_found_by_asking_after_a_slow_subscription_is_claimed() -> None:
    """The hub subscribed 1.5 s after the first call queued the wait (a thousand
    threads took their turns): the lock the second call finds already handed to this
    wait was handed at any time since the first call was sent, so its claim window
    may be nearly over. It is claimed before it is trusted (issue 42: a holder that
    trusted it lost the lock before its release)."""
    clock = FakeClock()
    op = make_op(blocking=True, clock=clock)
    result, _ = drive(
        flows.acquire(op),
        [
            Step(hub_ready, reply=(False, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(20_000)),
            Step(listen, reply=False),
            Step(subscribe, reply=None, advance=1.5),
            Step(hub_ready, reply=(True, SURE_CHANNEL)),
            Step(acquire_run(SURE_CHANNEL), reply=[b"12", b"1"]),
            Step(_claim_run, reply=1),
        ],
        clock,
    )
    assert result == Attempt(True, 12, 1, handed=True)


def test_a_poll_that_finds_the_hand_off_dates_it_from_the_call_before() -> None:
    """A poll answered "yours" (the wake-up not read yet): the hand-off came after
    the previous call that found the lock held, sent 0.9 s + 0.3 s ago, so past half
    the claim window: claimed. The same poll 0.5 s after that call is trusted."""
    for before_poll, claimed in ((0.3, True), (-0.4, False)):
        clock = FakeClock()
        op = make_op(blocking=True, clock=clock)
        steps = [
            Step(hub_ready, reply=(True, CHANNEL)),
            Step(acquire_run(CHANNEL), reply=held_reply(20_000)),
            Step(listen, reply=True),
            Step(park(SLICE), reply=None, advance=SLICE + before_poll),
            Step(acquire_run(CHANNEL), reply=[b"77", b"1"]),
        ]
        if claimed:
            steps.append(Step(_claim_run, reply=1))
        result, _ = drive(flows.acquire(op), steps, clock)
        assert result == Attempt(True, 77, 1, handed=True)


# -- replica acknowledgements (Call.replicas, NotReplicated) ------------------------------------


def _replicated_op(*, blocking: bool, timeout: float | None, clock: FakeClock) -> AcquireOp:
    return AcquireOp(
        KEYS, OWNER, NONCE, TTL, META, RETENTION, NAME,
        blocking=blocking, timeout=timeout, clock=clock, jitter=lambda: 1.0, replicas=1,
    )  # fmt: skip


def test_an_unconfirmed_grant_is_given_back_and_reported() -> None:
    flow = flows.acquire(_replicated_op(blocking=False, timeout=None, clock=FakeClock()))
    call = next(flow)
    assert call.replicas == 1 and call.script is acquire_script
    undo = flow.throw(NotReplicated(1795000000000001, 0, 1))
    assert undo.script is release_script and tuple(undo.args[:2]) == (OWNER, NONCE)
    with pytest.raises(LockNotReplicated, match="0 of the 1 replicas") as caught:
        flow.send(1)
    assert (caught.value.acks, caught.value.required) == (0, 1)


def test_an_unconfirmed_reentry_is_kept() -> None:
    flow = flows.acquire(_replicated_op(blocking=False, timeout=None, clock=FakeClock()))
    next(flow)
    with pytest.raises(StopIteration) as done:
        flow.throw(NotReplicated([b"42", b"2"], 0, 1))
    assert done.value.value == Attempt(True, 42, 2)


def test_a_blocking_acquire_retries_an_unconfirmed_grant_until_it_is_confirmed() -> None:
    clock = FakeClock()
    flow = flows.acquire(_replicated_op(blocking=True, timeout=5.0, clock=clock))
    assert next(flow) is HUB_READY
    first = flow.send((True, b"chan"))
    assert first.script is acquire_script
    undo = flow.throw(NotReplicated(7, 0, 1))
    assert undo.script is release_script
    listen = flow.send(1)
    assert listen == Listen(NONCE)
    park = flow.send(True)
    assert isinstance(park, Park) and park.seconds == pytest.approx(0.201)  # ~0.2 s hint
    clock.now += park.seconds
    again = flow.send(None)
    assert again.script is acquire_script
    claim = flow.send(8)  # confirmed this time; granted after waiting, so it is claimed
    assert claim.script.name == "claim" and claim.replicas == 1
    assert tuple(claim.args) == (OWNER, b"1")  # a write, so that WAIT covers the grant
    with pytest.raises(StopIteration) as done:
        flow.send(1)
    assert done.value.value == Attempt(True, 8, 1, handed=True)


@MODES
def test_a_hand_off_delivered_before_a_call_is_dropped_when_it_is_sent(mode: str) -> None:
    """The call answers for it: a hand-off read before an acquire (or cancel) is sent
    is either found by that call (the lock is this wait's) or was over by then (its
    claim window ran out while the wake-up waited to be read): then the next park must
    not return it (issue 42: a thread among a thousand released a lock it had lost)."""
    seen: list[Any] = []

    def flow() -> Generator[Any, Any, Any]:
        yield Listen("n1")
        (waiter,) = hub_waiter
        waiter.fence = 41  # delivered while the thread did not run
        seen.append((yield _release_call()))
        seen.append(waiter.fence)

    backend, hub = fakes(mode, [b"ok"])
    original = hub.register
    hub_waiter: list[Any] = []

    def register(nonce: str) -> Any:
        hub_waiter.append(original(nonce))
        return hub_waiter[-1]

    hub.register = register  # type: ignore[method-assign]
    run_driver(mode, flow(), backend)
    assert seen == [b"ok", None]
