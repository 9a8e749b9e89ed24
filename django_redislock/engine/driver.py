"""Where a flow meets I/O: one driver that blocks, one for asyncio.

The two loops below are the only code that differs between the sync and the
async API. Each owns the wake-up registrations its flow made and drops them
when the flow ends, however it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import flows
from .calls import AmbiguousReply, Attempt, Call, NotReplicated
from .flows import HUB_READY, SENDS, SUBSCRIBE, AcquireOp, Flow, Listen, Park, give_up

if TYPE_CHECKING:
    from .awakeup import AsyncWaiter, AsyncWakeHub
    from .backends.base import AsyncBackend, Backend, BatchingAsyncBackend
    from .wakeup import Waiter, WakeHub


def call_sync(call: Call, backend: Backend) -> Any:
    """``run_sync(flows.call_once(call))`` without a generator, for the hot path: the
    same policy (:data:`~.flows.SENDS`, :func:`~.flows.give_up`), tested to agree."""
    for sent in range(1, SENDS + 1):
        try:
            return backend.run(call)
        except AmbiguousReply as exc:
            if sent == SENDS:
                raise give_up(call, exc) from exc.cause
    raise AssertionError("unreachable")  # pragma: no cover


async def call_async(call: Call, backend: AsyncBackend) -> Any:
    """:func:`call_sync` for asyncio."""
    swallowed = _swallowed_cancel_check()
    for sent in range(1, SENDS + 1):
        try:
            reply = await backend.run(call)
            if swallowed():
                raise asyncio.CancelledError()
            return reply
        except AmbiguousReply as exc:
            if sent == SENDS:
                raise give_up(call, exc) from exc.cause
    raise AssertionError("unreachable")  # pragma: no cover


def call_many_sync(calls: Sequence[Call], backend: Backend) -> list[Any]:
    """Run *calls* in one round trip (``backend.run_many``): each reply, or the
    LockBackendError it raised. A batch whose replies were lost is sent once more, as
    :func:`call_sync` does with one call (every call carries its nonce, so a repeat
    counts once); then it raises LockBackendError, named after the first call."""
    for sent in range(1, SENDS + 1):
        try:
            return backend.run_many(calls)
        except AmbiguousReply as exc:
            if sent == SENDS:
                raise give_up(calls[0], exc) from exc.cause
    raise AssertionError("unreachable")  # pragma: no cover


async def call_many_async(calls: Sequence[Call], backend: BatchingAsyncBackend) -> list[Any]:
    """:func:`call_many_sync` for asyncio."""
    swallowed = _swallowed_cancel_check()
    for sent in range(1, SENDS + 1):
        try:
            replies = await backend.run_many(calls)
            if swallowed():
                raise asyncio.CancelledError()
            return replies
        except AmbiguousReply as exc:
            if sent == SENDS:
                raise give_up(calls[0], exc) from exc.cause
    raise AssertionError("unreachable")  # pragma: no cover


def acquire_sync(op: AcquireOp, backend: Backend) -> Attempt:
    """``run_sync(flows.acquire(op), backend)``, with the first call made here: most
    acquires end with it (the lock was free), and then no flow is built at all.

    The same decisions as the flow's first step (it resumes with this outcome), except
    with replica acknowledgements, which the flow handles from the start.
    """
    if op.replicas:
        return run_sync(flows.acquire(op), backend, op.keys[0])  # type: ignore[no-any-return]
    key = op.keys[0]
    ready, channel = _hub_ready(backend.hub(key)) if op.blocking else (False, b"")
    attempt = op.decode(call_sync(flows.first_call(op, channel), backend))
    if attempt.held:
        return attempt
    return run_sync(flows.acquire(op, (ready, channel, attempt)), backend, key)  # type: ignore[no-any-return]


async def acquire_async(op: AcquireOp, backend: AsyncBackend) -> Attempt:
    """:func:`acquire_sync` for asyncio."""
    if op.replicas:
        return await run_async(flows.acquire(op), backend, op.keys[0])  # type: ignore[no-any-return]
    key = op.keys[0]
    ready, channel = _hub_ready(backend.hub(key)) if op.blocking else (False, b"")
    attempt = op.decode(await call_async(flows.first_call(op, channel), backend))
    if attempt.held:
        return attempt
    return await run_async(flows.acquire(op, (ready, channel, attempt)), backend, key)  # type: ignore[no-any-return]


def run_sync(flow: Flow, backend: Backend, key: bytes | None = None) -> Any:
    """Run *flow* to its end with blocking calls on *backend*; return its value.

    *key*: the lock key the flow waits on, if it does (the backend's hub for that
    key: on a Cluster, the one subscribed on the key's node)."""
    hub: WakeHub | None = None
    waits: dict[str, Waiter] = {}
    reply: Any = None
    error: AmbiguousReply | NotReplicated | None = None
    send, run = flow.send, backend.run
    try:
        while True:
            try:
                effect = send(reply) if error is None else flow.throw(error)
            except StopIteration as done:
                return done.value
            error = None
            try:
                if type(effect) is Call:
                    if waits:
                        _superseded(waits)
                    reply = run(effect)
                    continue
                hub = hub or backend.hub(key)
                if type(effect) is Park:
                    reply = hub.wait(waits[effect.nonce], effect.seconds)
                elif effect is SUBSCRIBE:
                    hub.wait_ready()
                    reply = None
                else:
                    reply = _hub_effect(hub, waits, effect)
            except (AmbiguousReply, NotReplicated) as exc:
                reply, error = None, exc
    finally:
        if hub is not None:
            for nonce in waits:
                hub.unregister(nonce)
        flow.close()


async def run_async(flow: Flow, backend: AsyncBackend, key: bytes | None = None) -> Any:
    """Run *flow* to its end on asyncio with *backend*; return its value (*key*: see
    :func:`run_sync`)."""
    hub: AsyncWakeHub | None = None
    waits: dict[str, AsyncWaiter] = {}
    reply: Any = None
    error: AmbiguousReply | NotReplicated | None = None
    swallowed = _swallowed_cancel_check()
    try:
        while True:
            if swallowed():
                raise asyncio.CancelledError()
            try:
                effect = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as done:
                return done.value
            error = None
            try:
                if type(effect) is Call:
                    if waits:
                        _superseded(waits)
                    reply = await backend.run(effect)
                    continue
                hub = hub or backend.hub(key)
                if type(effect) is Park:
                    reply = await hub.wait(waits[effect.nonce], effect.seconds)
                elif effect is SUBSCRIBE:
                    await hub.wait_ready()
                    reply = None
                else:
                    reply = _hub_effect(hub, waits, effect)
            except (AmbiguousReply, NotReplicated) as exc:
                reply, error = None, exc
    finally:
        if hub is not None:
            for nonce in waits:
                hub.unregister(nonce)
        flow.close()


def _superseded(waits: dict[str, Any]) -> None:
    """Drop the hand-offs delivered to *waits* so far: a call about to be sent answers
    for them. It runs after them, so it finds the lock this wait's (an acquire or a
    cancel answers so), or it finds their claim window over and the lock gone on:
    then the wake-up, read late (a reader thread starved among many), must not be
    trusted by the wait's next park."""
    for waiter in waits.values():
        waiter.fence = None


def _swallowed_cancel_check() -> Callable[[], bool]:
    """Whether the running task was cancelled since this call and the cancellation got lost.

    redis-py sends commands through ``asyncio.wait_for``, which before Python 3.12
    can return the inner result and drop a cancellation of the outer task (CPython
    gh-86296): the lock call would carry on as if nothing happened. The task still
    counts the request (``Task.cancelling()``, Python 3.11+), so the drivers raise
    ``CancelledError`` themselves and the usual cancellation handling runs.
    """
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    if cancelling is None:  # Python 3.10: nothing to consult
        return lambda: False
    before = cancelling()
    return lambda: bool(cancelling() > before)


def _hub_effect(hub: Any, waits: dict[str, Any], effect: Any) -> Any:
    """The effects that never block, the same for both hubs."""
    if type(effect) is Listen:
        waits[effect.nonce] = hub.register(effect.nonce)
        return hub.ready
    if effect is HUB_READY:
        return _hub_ready(hub)
    raise TypeError(f"unknown effect {effect!r}")  # pragma: no cover - a flow bug


def _hub_ready(hub: Any) -> tuple[bool, bytes]:
    """What :data:`~.flows.HUB_READY` answers: whether *hub* is subscribed, and the
    channel a wait queued now names (marked once the subscription is confirmed)."""
    ready = hub.start()
    return ready, hub.sure_arg if ready else hub.channel_arg
