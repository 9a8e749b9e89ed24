"""Waking asyncio waiters when a lock is handed to them.

The asyncio twin of :mod:`.wakeup`: one hub per (event loop, client), with its
own pub/sub channel, read by one reader task that resolves each waiter's
event by the wait's nonce. The reader starts with the first blocking acquire
and stops about a second after the last waiter left. What both hubs share --
the message format and the bounded buffer of early grants -- is in :mod:`.wake`.

A second ``subscribe`` confirmation means redis-py reconnected and
re-subscribed on its own (redis-py 8 does so silently after a Redis restart):
hand-offs published in the gap are lost, so every waiter is poked to ask Redis
again at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
from typing import Any

from ..exceptions import LockBackendError
from .identity import process_token
from .wake import EarlyGrants, WaitSlot, parse_grant, queue_channel

logger = logging.getLogger("django_redislock")

_SUBSCRIBE_TIMEOUT = 5.0
#: The reader task stops after this long without waiters.
IDLE_EXIT_SECONDS = 1.0
_hub_ids = itertools.count(1)


class AsyncWaiter(WaitSlot):
    """One waiting ``aacquire``: its event is set on a hand-off or a poke."""

    __slots__ = ()
    event: asyncio.Event

    def __init__(self) -> None:
        super().__init__(asyncio.Event())


class AsyncWakeHub:
    """The wake-up channel of one event loop for one ``redis.asyncio`` client."""

    def __init__(self, client: Any, channel_prefix: str, on_script_server: bool = False) -> None:
        self._client = client
        #: The channel hand-offs to this hub's waiters are published on.
        self.channel = f"{channel_prefix}{process_token()}:a{next(_hub_ids)}"
        self.channel_arg = self.channel.encode()
        #: What a wait queued while the subscription is confirmed names (see
        #: :func:`~.wake.queue_channel`).
        self.sure_arg = queue_channel(self.channel_arg, on_script_server)
        self._waiters: dict[str, AsyncWaiter] = {}
        #: The channel while waiters are registered, else None: a release sends it so
        #: that a hand-off (or poke) to a waiter of this hub comes back in its reply,
        #: to :meth:`deliver`, instead of through Redis's pub/sub and the reader task.
        self.local_channel: bytes | None = None
        self._early = EarlyGrants()
        self._reader: asyncio.Task[None] | None = None
        self._subscribed = False
        self._confirmed = asyncio.Event()
        self._confirmations = 0
        self._last_error: BaseException | None = None
        self._closed = False

    @property
    def ready(self) -> bool:
        """Whether Redis has confirmed the subscription on the current connection."""
        return self._subscribed

    def start(self) -> bool:
        """Start the reader task if it is not running; whether the hub is subscribed."""
        if self._reader is None or self._reader.done():
            if self._closed:
                raise LockBackendError("the lock wake-up hub is closed (its event loop closed)")
            self._subscribed = False
            self._confirmed.clear()
            self._reader = asyncio.get_running_loop().create_task(
                self._read(), name=f"redislock-wakeup {self.channel}"
            )
        return self._subscribed

    def register(self, nonce: str) -> AsyncWaiter:
        """Register the wait *nonce*; a grant (or poke) that arrived before is delivered at once."""
        waiter = AsyncWaiter()
        self._waiters[nonce] = waiter
        self.local_channel = self.channel_arg
        early = self._early.take(nonce)
        if early is not None:
            waiter.receive(early)
        return waiter

    def unregister(self, nonce: str) -> None:
        """Forget the wait *nonce* (it is over)."""
        self._waiters.pop(nonce, None)
        if not self._waiters:
            self.local_channel = None

    async def wait_ready(self, timeout: float = _SUBSCRIBE_TIMEOUT) -> None:
        """Wait until Redis confirmed the subscription, or raise LockBackendError."""
        self.start()
        if self._subscribed:
            return
        try:
            await asyncio.wait_for(self._confirmed.wait(), timeout)
        except asyncio.TimeoutError:
            reason = self._last_error or "timed out"
            raise LockBackendError(
                f"could not subscribe to the lock wake-up channel: {reason}"
            ) from None

    async def wait(self, waiter: AsyncWaiter, timeout: float) -> int | None:
        """Wait up to *timeout* seconds for a hand-off to *waiter*: its fence, or None.

        None also when the waiter was poked (look at the lock again).
        """
        if waiter.fence is None and not waiter.poked:
            self.start()
            try:
                await _wait_event(waiter.event, timeout)
            except asyncio.TimeoutError:
                pass
        waiter.poked = False
        waiter.event.clear()
        # Taken (see WakeHub.wait): a lapsed hand-off is not returned twice.
        fence, waiter.fence = waiter.fence, None
        return fence

    async def _read(self) -> None:
        pubsub: Any = None
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        try:
            while not self._closed:
                if self._waiters:
                    idle_since = loop.time()
                elif loop.time() - idle_since >= IDLE_EXIT_SECONDS:
                    return
                try:
                    if pubsub is None:
                        pubsub = self._client.pubsub()
                        await pubsub.subscribe(self.channel)
                    message = await pubsub.get_message(timeout=IDLE_EXIT_SECONDS / 2)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the waiters' fallback poll covers the gap
                    await self._connection_lost(pubsub, exc)
                    pubsub = None
                    await asyncio.sleep(0.05)
                    continue
                if message is not None:
                    self._handle(message)
        finally:
            self._subscribed = False
            self._confirmed.clear()
            if pubsub is not None:
                await _close_quietly(pubsub)

    def deliver(self, data: bytes | str) -> None:
        """Pass a wake-up message (``"<nonce> <fence>"``, or ``"<nonce>"`` for a poke)
        to the waiter it is for; one not registered yet gets it when it registers."""
        nonce, fence = parse_grant(data)
        waiter = self._waiters.get(nonce)
        if waiter is None:  # not registered yet (or gave up): keep it briefly
            self._early.put(nonce, fence)
        elif fence is None:
            waiter.poke()
        else:
            waiter.deliver(fence)

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "message":
            self.deliver(message["data"])
        elif kind == "subscribe":
            self._subscribed = True
            self._last_error = None
            self._confirmed.set()
            self._confirmations += 1
            if self._confirmations > 1:
                self.poke_all()

    def poke_all(self) -> None:
        """Wake every waiter to ask Redis again (wake-ups may have been lost)."""
        for waiter in list(self._waiters.values()):
            waiter.poke()

    async def _connection_lost(self, pubsub: Any, exc: BaseException) -> None:
        if self._subscribed or self._last_error is None:
            logger.warning("redislock wake-up subscription lost: %s", exc)
        self._subscribed = False
        self._confirmed.clear()
        self._last_error = exc
        if pubsub is not None:
            await _close_quietly(pubsub)

    async def aclose(self) -> None:
        """Stop the reader task."""
        self._closed = True
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            reader.cancel()
            try:
                await reader
            except (asyncio.CancelledError, Exception):
                pass


async def _close_quietly(pubsub: Any) -> None:
    try:
        await pubsub.aclose()
    except Exception:
        pass


if sys.version_info >= (3, 11):

    async def _wait_event(event: asyncio.Event, timeout: float) -> None:
        # asyncio.timeout wakes the waiting task itself: no extra task per wait.
        async with asyncio.timeout(timeout):
            await event.wait()

else:  # pragma: no cover - Python 3.10

    async def _wait_event(event: asyncio.Event, timeout: float) -> None:
        await asyncio.wait_for(event.wait(), timeout)
