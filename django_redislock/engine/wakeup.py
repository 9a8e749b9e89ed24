"""Waking blocked waiters when a lock is handed to them.

A release grants the lock to the first waiter inside the release script and
publishes ``"<nonce> <fence>"`` on the waiter's *process channel*. Each process
has one :class:`WakeHub` per Redis connection pool, holding one pub/sub
connection subscribed to that channel.

There is no background thread. The waiting threads read the subscription
themselves, one at a time (leader/follower): whichever waiter finds nobody
reading becomes the reader, passes every message it reads to the waiter it
belongs to (by the wait's nonce), and when its own wait ends it promotes another
waiter to take over. So the thread that was handed the lock is usually the one
that reads the message: no thread hop, no extra wake-up. Messages that arrive
while nobody reads wait in the socket.

Waits are timed on the client side, so deadlines are kept to the millisecond;
Redis's own blocking-command timeouts are only as precise as the server's cron
(up to 100 ms late at the default ``hz 10``). A lost message (a dropped
connection) is covered by the waiter's bounded, jittered fallback poll.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..exceptions import LockBackendError
from .identity import on_fork_in_child, process_token
from .wake import EarlyGrants, WaitSlot, parse_grant, queue_channel

logger = logging.getLogger("django_redislock")

_SUBSCRIBE_TIMEOUT = 5.0


class Flag:
    """A waiter's wake-up flag: set by any thread, taken by the waiting one.

    A C lock held while the flag is down: ``threading.Event`` is a Condition written
    in Python, and every queued acquire made one and set it, in about a dozen frames,
    where the waiter is usually its own reader and nobody waits on it."""

    __slots__ = ("_down",)

    def __init__(self) -> None:
        self._down = threading.Lock()
        self._down.acquire()

    def set(self) -> None:
        """Raise the flag (and wake the thread waiting for it, if one is)."""
        try:
            self._down.release()
        except RuntimeError:  # raised already
            pass

    def take(self, timeout: float) -> bool:
        """Wait up to *timeout* seconds for the flag; whether it was raised (it is
        down again then)."""
        return self._down.acquire(timeout=max(0.0, timeout))


class Waiter(WaitSlot):
    """One blocked acquire. Its flag is raised when the lock is handed to it, when
    it is asked to take over reading the subscription, or when it is poked."""

    __slots__ = ()
    event: Flag

    def __init__(self) -> None:
        super().__init__(Flag())


class WakeHub:
    """The wake-up channel of one process for one Redis connection pool."""

    def __init__(self, client: Any, channel_prefix: str, on_script_server: bool = False) -> None:
        self._client = client
        #: The channel hand-offs to this hub's waiters are published on.
        self.channel = f"{channel_prefix}{process_token()}"
        self.channel_arg = self.channel.encode()
        #: What a wait queued while the subscription is confirmed names (see
        #: :func:`~.wake.queue_channel`).
        self.sure_arg = queue_channel(self.channel_arg, on_script_server)
        self._waiters: dict[str, Waiter] = {}
        self._early = EarlyGrants()
        self._lock = threading.Lock()  # guards _waiters and _early
        self._reader = threading.Lock()  # held by the thread reading the subscription
        self._pubsub: Any = None  # used only by the reader
        self._subscribed = False
        self._confirmations = 0
        self._last_error: BaseException | None = None

    @property
    def ready(self) -> bool:
        """Whether Redis has confirmed the subscription on the current connection."""
        return self._subscribed

    def start(self) -> bool:
        """Whether the hub is subscribed (this hub subscribes when a waiter reads)."""
        return self._subscribed

    def register(self, nonce: str) -> Waiter:
        """Register the wait identified by *nonce*.

        A hand-off that arrived before the registration (the waiter queued,
        then registered) is delivered at once.
        """
        waiter = Waiter()
        with self._lock:
            early = self._early.take(nonce)
            self._waiters[nonce] = waiter
        if early is not None:
            waiter.receive(early)
        return waiter

    def unregister(self, nonce: str) -> None:
        """Forget the wait for *nonce* (it is over)."""
        with self._lock:
            self._waiters.pop(nonce, None)
        # It may have just been asked to take over reading: pass that on.
        self._promote()

    def wait_ready(self, timeout: float = _SUBSCRIBE_TIMEOUT) -> None:
        """Subscribe if needed and block until Redis confirmed it, or raise LockBackendError."""
        if self._subscribed:
            return
        deadline = time.monotonic() + timeout
        if self._reader.acquire(timeout=timeout):
            try:
                self._read(deadline, lambda: self._subscribed)
            finally:
                self._reader.release()
                self._promote()
        if not self._subscribed:
            reason = self._last_error or "timed out"
            raise LockBackendError(f"could not subscribe to the lock wake-up channel: {reason}")

    def wait(self, waiter: Waiter, timeout: float) -> int | None:
        """Block up to *timeout* seconds for a hand-off to *waiter*: its fence, or None.

        None also when the waiter was poked (look at the lock again).
        """
        deadline = time.monotonic() + timeout
        while waiter.fence is None and not waiter.poked:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if self._reader.acquire(blocking=False):
                try:
                    self._read(deadline, lambda: waiter.fence is not None or waiter.poked)
                finally:
                    self._reader.release()
                    self._promote()
            else:
                # Woken with the lock, to take over reading, or poked (the flag is
                # taken down as it is taken: a later wake-up raises it again).
                waiter.event.take(remaining)
        waiter.poked = False
        # Taken, not left in the slot: a claim that finds this hand-off lapsed queues
        # the wait again, and its next wait must not return the same dead hand-off.
        fence, waiter.fence = waiter.fence, None
        return fence

    def _promote(self) -> None:
        """If nobody reads, wake one waiter still waiting so it takes over."""
        if self._reader.locked():
            return
        with self._lock:
            for waiter in self._waiters.values():
                if waiter.fence is None:
                    waiter.event.set()
                    return

    def _dispatch(self, data: bytes | str) -> None:
        nonce, fence = parse_grant(data)
        with self._lock:
            waiter = self._waiters.get(nonce)
            if waiter is None:
                # Its waiter has not registered yet (or already gave up): keep
                # the grant (or poke) briefly.
                self._early.put(nonce, fence)
                return
        if fence is None:
            waiter.poke()
        else:
            waiter.deliver(fence)

    def _resubscribed(self) -> None:
        """A new subscription after an earlier one: hand-offs published in the gap
        were lost (redis-py 8 reconnects and re-subscribes silently), so every
        waiter asks Redis again now rather than at its fallback poll."""
        with self._lock:
            waiters = list(self._waiters.values())
        for waiter in waiters:
            waiter.poke()

    def _read(self, deadline: float, done: Any) -> None:
        """Read the subscription (holding ``_reader``) until ``done()`` or *deadline*."""
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                if self._pubsub is None:
                    self._pubsub = self._client.pubsub()
                    self._pubsub.subscribe(self.channel)
                message = self._pubsub.get_message(timeout=remaining)
            except Exception as exc:  # the waiters' fallback poll covers the gap
                self._connection_lost(exc)
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                continue
            if message is None:
                continue
            kind = message["type"]
            kind = kind.decode() if isinstance(kind, bytes) else kind
            if kind == "subscribe":
                self._subscribed = True
                self._last_error = None
                self._confirmations += 1
                if self._confirmations > 1:
                    self._resubscribed()
            elif kind == "message":
                self._dispatch(message["data"])

    def _connection_lost(self, exc: BaseException) -> None:
        if self._subscribed or self._last_error is None:
            logger.warning("redislock wake-up subscription lost: %s", exc)
        self._subscribed = False
        self._last_error = exc
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            try:
                pubsub.close()
            except Exception:
                pass


_hubs: dict[tuple[int, str], WakeHub] = {}
_hubs_lock = threading.Lock()


def hub_for(client: Any, channel_prefix: str, on_script_server: bool = False) -> WakeHub:
    """The process's wake-up hub for *client*'s connection pool and key prefix;
    *on_script_server*: it subscribes on the server that runs the lock scripts (not
    a cluster's or Redlock's node picker)."""
    key = (id(getattr(client, "connection_pool", client)), channel_prefix)
    hub = _hubs.get(key)
    if hub is None:
        with _hubs_lock:
            hub = _hubs.get(key)
            if hub is None:
                hub = _hubs[key] = WakeHub(client, channel_prefix, on_script_server)
    return hub


def _reset_after_fork() -> None:
    global _hubs_lock
    _hubs.clear()
    _hubs_lock = threading.Lock()


on_fork_in_child(_reset_after_fork)
