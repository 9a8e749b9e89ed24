"""Waking blocked waiters when a lock is handed to them.

A release grants the lock to the first waiter inside the release script and
publishes ``"<nonce> <fence>"`` on the waiter's *process channel*. Each process
runs at most one subscriber thread per Redis connection pool; it passes the
message to the waiting thread (or asyncio task) by the nonce of its wait.

Waiters wait on the client side (``threading.Event.wait``), so deadlines are
kept to the millisecond; Redis's own blocking-command timeouts are only as
precise as the server's cron (up to 100 ms late at the default ``hz 10``).
A lost message is covered by the waiter's bounded, jittered fallback poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .exceptions import LockBackendError
from .identity import on_fork_in_child, process_token

logger = logging.getLogger("django_redislock")

#: A subscriber thread with no waiter for this long exits.
IDLE_EXIT_SECONDS = 30.0
_SUBSCRIBE_TIMEOUT = 5.0
_EARLY_GRANTS_KEPT = 256


class Waiter:
    """One blocked acquire: an event set when the lock is handed to it."""

    __slots__ = ("event", "fence", "callback")

    def __init__(self, callback: Callable[[int], None] | None = None) -> None:
        self.event = threading.Event()
        self.fence: int | None = None
        self.callback = callback

    def deliver(self, fence: int) -> None:
        """Record the hand-off and wake the waiter."""
        self.fence = fence
        self.event.set()
        if self.callback is not None:
            self.callback(fence)

    def wait(self, timeout: float) -> bool:
        """Block up to *timeout* seconds; True if the lock was handed over."""
        return self.event.wait(timeout)


class WakeHub:
    """The subscriber thread of one process for one Redis connection pool."""

    def __init__(self, client: Any, channel_prefix: str) -> None:
        self._client = client
        self.channel = f"{channel_prefix}{process_token()}"
        self.channel_arg = self.channel.encode()
        self._waiters: dict[str, Waiter] = {}
        self._early: dict[str, int] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error: BaseException | None = None

    def register(self, nonce: str, callback: Callable[[int], None] | None = None) -> Waiter:
        """Register a waiter for the wait identified by *nonce* and make sure we listen.

        A hand-off that arrived before the registration (the waiter queued,
        then registered) is delivered at once.
        """
        waiter = Waiter(callback)
        with self._lock:
            early = self._early.pop(nonce, None)
            self._waiters[nonce] = waiter
            if self._thread is None:
                self._ready.clear()
                self._thread = threading.Thread(
                    target=self._run, name="redislock-wakeup", daemon=True
                )
                self._thread.start()
        if early is not None:
            waiter.deliver(early)
        return waiter

    def wait_ready(self, timeout: float = _SUBSCRIBE_TIMEOUT) -> None:
        """Block until the subscription is active, or raise LockBackendError."""
        if self._ready.is_set():
            return
        if not self._ready.wait(timeout):
            reason = self._last_error or "timed out"
            raise LockBackendError(f"could not subscribe to the lock wake-up channel: {reason}")

    def unregister(self, nonce: str) -> None:
        """Forget the waiter for *nonce* (its wait is over)."""
        with self._lock:
            self._waiters.pop(nonce, None)

    @property
    def ready(self) -> bool:
        """Whether the subscriber is currently subscribed."""
        return self._ready.is_set()

    def _dispatch(self, data: bytes | str) -> None:
        text = data.decode() if isinstance(data, bytes) else data
        nonce, _, fence = text.partition(" ")
        with self._lock:
            waiter = self._waiters.get(nonce)
            if waiter is None:
                # Its waiter has not registered yet (or already gave up): keep
                # the grant briefly; the oldest are dropped past a small bound.
                if len(self._early) >= _EARLY_GRANTS_KEPT:
                    del self._early[next(iter(self._early))]
                self._early[nonce] = int(fence)
                return
        waiter.deliver(int(fence))

    def _run(self) -> None:
        backoff = 0.05
        idle_since = time.monotonic()
        while True:
            pubsub = None
            try:
                pubsub = self._client.pubsub()
                pubsub.subscribe(self.channel)
                while True:
                    message = pubsub.get_message(timeout=1.0)
                    if message is not None:
                        kind = message["type"]
                        kind = kind.decode() if isinstance(kind, bytes) else kind
                        if kind == "subscribe":
                            self._ready.set()
                            backoff = 0.05
                        elif kind == "message":
                            self._dispatch(message["data"])
                    with self._lock:
                        if self._waiters:
                            idle_since = time.monotonic()
                        elif time.monotonic() - idle_since > IDLE_EXIT_SECONDS:
                            self._thread = None
                            self._ready.clear()
                            return
            except Exception as exc:  # reconnect on any failure; waiters poll meanwhile
                self._last_error = exc
                with self._lock:
                    self._ready.clear()
                    if not self._waiters:
                        # Nobody is waiting: stop instead of retrying; the next
                        # blocking acquire starts a fresh subscriber.
                        self._thread = None
                        return
                logger.warning("redislock wake-up subscriber lost its connection: %s", exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:
                        pass


_hubs: dict[tuple[int, str], WakeHub] = {}
_hubs_lock = threading.Lock()


def hub_for(client: Any, channel_prefix: str) -> WakeHub:
    """The process's wake-up hub for *client*'s connection pool and key prefix."""
    key = (id(getattr(client, "connection_pool", client)), channel_prefix)
    hub = _hubs.get(key)
    if hub is None:
        with _hubs_lock:
            hub = _hubs.get(key)
            if hub is None:
                hub = _hubs[key] = WakeHub(client, channel_prefix)
    return hub


def _reset_after_fork() -> None:
    global _hubs_lock
    _hubs.clear()
    _hubs_lock = threading.Lock()


on_fork_in_child(_reset_after_fork)
