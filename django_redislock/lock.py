"""The synchronous :class:`Lock`.

A lock is identified by its name; who holds it is an *owner token* (by default
the current thread's, see :mod:`django_redislock.identity`). One ``Lock`` object
may be shared by several threads: each thread is its own owner. Holding is
re-entrant per owner: a second acquire by the same owner increments a hold
count, and the lock is freed by the matching last release.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from . import signals
from .conf import get_setting
from .exceptions import LockBackendError, LockError, LockLost, LockNotAcquired, LockNotOwned
from .identity import HOSTNAME, current_owner, new_nonce
from .keys import LockKeys, to_millis, validate_name, validate_seconds
from .renewal import WatchEntry, watchdog
from .scripts import (
    AMBIGUOUS_ERRORS,
    Script,
    acquire_script,
    backend_error,
    cancel_script,
    decode_attempt,
    extend_script,
    release_script,
)

if TYPE_CHECKING:
    from .backend import Backend
    from .manager import LockManager

logger = logging.getLogger("django_redislock")

_UNSET: Any = object()
#: Metadata JSON of locks without purpose/extra/meta, per (pid, thread name).
_plain_meta: dict[tuple[int, str], tuple[tuple[int, str], bytes]] = {}
MAX_OWNER_LENGTH = 256
#: Upper bound of one client-side wait between fallback polls (seconds).
POLL_SLICE = 1.0


def _decode(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class _Hold:
    """What this Lock object knows about one owner's hold."""

    fence: int
    count: int
    watch: WatchEntry | None = None
    lost_reason: str | None = None


class Lock:
    """A distributed, re-entrant, leased lock on Redis.

    Usually created with :meth:`LockManager.lock` (``locks.lock(name, ...)``).

    :param name: the lock's name; any non-empty string up to 1024 characters.
    :param ttl: the lease in seconds (default ``REDISLOCK_DEFAULT_TTL``).
        ``None`` makes a lock without expiry and requires ``no_expiry=True``.
    :param timeout: how long ``acquire()`` / ``with`` wait by default (seconds;
        ``None`` = until acquired).
    :param blocking: whether ``acquire()`` / ``with`` wait at all by default.
    :param auto_renew: renew the lease in the background while held (default
        ``REDISLOCK_AUTO_RENEW``).
    :param owner: an explicit owner string (e.g. a Celery task id) instead of
        the current thread/task.
    :param purpose: a short human description, shown in the admin.
    :param extra: a JSON-serialisable dict of further metadata.
    :param meta: JSON-serialisable top-level metadata fields merged into the
        stored meta (e.g. ``task_id``, ``task_name``, ``kind`` for the admin);
        they never replace ``host``/``pid``/``thread``/``purpose``/``extra``.
    :param raise_on_lost: whether leaving a ``with`` block whose lock was lost
        raises :class:`LockLost` (default ``REDISLOCK_RAISE_ON_LOST``).
    """

    def __init__(
        self,
        name: str,
        *,
        manager: LockManager | None = None,
        ttl: float | None = _UNSET,
        timeout: float | None = None,
        blocking: bool = True,
        auto_renew: bool | None = None,
        owner: str | None = None,
        purpose: str | None = None,
        extra: dict[str, Any] | None = None,
        raise_on_lost: bool | None = None,
        no_expiry: bool = False,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.name = validate_name(name)
        if manager is None:
            from .manager import locks

            manager = locks
        self.manager: LockManager = manager
        if ttl is _UNSET:
            ttl = validate_seconds(get_setting("REDISLOCK_DEFAULT_TTL"), "REDISLOCK_DEFAULT_TTL")
        if ttl is None:
            if not no_expiry:
                raise ValueError(
                    "ttl=None would make a lock that never expires; pass no_expiry=True "
                    "if that is really what you want"
                )
            self.ttl_ms = 0
        else:
            if no_expiry:
                raise ValueError("no_expiry=True needs ttl=None")
            self.ttl_ms = to_millis(validate_seconds(ttl, "ttl"), "ttl")
        self._ttl_arg = str(self.ttl_ms).encode()
        self.timeout = None if timeout is None else validate_seconds(timeout, "timeout")
        self.blocking = bool(blocking)
        if auto_renew is None:
            auto_renew = bool(get_setting("REDISLOCK_AUTO_RENEW"))
        self.auto_renew = bool(auto_renew) and self.ttl_ms > 0
        self._owner = None if owner is None else _validate_owner(owner)
        if purpose is not None and not isinstance(purpose, str):
            raise TypeError(f"purpose must be a str, not {type(purpose).__name__}")
        self.purpose = purpose
        self.extra = _json_dict(extra, "extra")
        self.meta = _json_dict(meta, "meta")
        if raise_on_lost is None:
            raise_on_lost = bool(get_setting("REDISLOCK_RAISE_ON_LOST"))
        self.raise_on_lost = raise_on_lost
        self._holds: dict[str, _Hold] = {}
        self._pending_release: dict[tuple[str, bool], str] = {}
        self._keys_cache: tuple[Any, LockKeys] | None = None
        self._meta_cache: tuple[tuple[int, str], bytes] | None = None

    # -- identity and plumbing -------------------------------------------------

    @property
    def ttl_seconds(self) -> float | None:
        """The lease in seconds (None for a lock without expiry)."""
        return self.ttl_ms / 1000.0 if self.ttl_ms else None

    @property
    def owner(self) -> str:
        """The owner token acquiring/releasing on behalf of the caller right now."""
        return self._owner or current_owner()

    def _backend(self) -> tuple[Backend, LockKeys]:
        backend = self.manager.backend()
        cached = self._keys_cache
        if cached is None or cached[0] is not backend.keyspace:
            cached = self._keys_cache = (backend.keyspace, backend.keyspace.keys(self.name))
        return backend, cached[1]

    @property
    def key(self) -> str:
        """The Redis key of the lock's hash."""
        return self._backend()[1].lock

    def _meta(self) -> bytes:
        # Sent on every acquire, so serialised once per (process, thread name):
        # shared by all plain locks, and per Lock when it has its own metadata.
        ident = (os.getpid(), threading.current_thread().name)
        plain = self.purpose is None and not self.extra and not self.meta
        cached = _plain_meta.get(ident) if plain else self._meta_cache
        if cached is not None and (plain or cached[0] == ident):
            return cached[1]
        meta: dict[str, Any] = {"host": HOSTNAME, "pid": ident[0], "thread": ident[1]}
        if self.purpose is not None:
            meta["purpose"] = self.purpose
        if self.extra:
            meta["extra"] = self.extra
        if self.meta:
            for field, value in self.meta.items():
                meta.setdefault(field, value)
        text = json.dumps(meta, separators=(",", ":")).encode()
        if plain:
            if len(_plain_meta) >= 1024:
                _plain_meta.clear()
            _plain_meta[ident] = (ident, text)
        else:
            self._meta_cache = (ident, text)
        return text

    def _run(
        self, script: Script, backend: Backend, keys: LockKeys, args: Sequence[Any], action: str
    ) -> Any:
        """Run an idempotent script, retrying once when the reply was lost."""
        try:
            return script(backend.client, keys.all, args)
        except AMBIGUOUS_ERRORS:
            # The command may or may not have run. The scripts are idempotent for
            # the same nonce, so asking again tells us what actually happened.
            pass
        except RedisError as exc:
            raise backend_error(exc, action, self.name) from exc
        try:
            return script(backend.client, keys.all, args)
        except RedisError as exc:
            raise backend_error(exc, action, self.name) from exc

    # -- acquire ---------------------------------------------------------------

    def acquire(
        self,
        blocking: bool | None = None,
        timeout: float | None = _UNSET,
        *,
        blocking_timeout: float | None = _UNSET,
        token: str | None = None,
        sleep: float | None = None,
    ) -> bool:
        """Acquire the lock; return True when held, False when it was not acquired.

        :param blocking: wait for the lock (default: the lock's ``blocking``).
        :param timeout: how long to wait, in seconds (default: the lock's
            ``timeout``; ``None`` = until acquired). ``blocking_timeout`` is the
            redis-py spelling of the same argument.
        :param token: an explicit owner string to acquire as (it stays this
            Lock's owner afterwards), like redis-py's ``token``.
        :param sleep: accepted for redis-py compatibility and ignored: waiters
            are woken by the release, not by polling.
        """
        del sleep
        if token is not None:
            self._owner = _validate_owner(token)
        if blocking is None:
            blocking = self.blocking
        if timeout is _UNSET:
            timeout = blocking_timeout
        if timeout is _UNSET:
            timeout = self.timeout
        elif timeout is not None:
            if not blocking:
                raise ValueError("a timeout makes no sense with blocking=False")
            timeout = validate_seconds(timeout, "timeout")
        owner = self.owner
        backend, keys = self._backend()
        nonce = new_nonce()
        if not blocking:
            held, value, count = self._attempt(backend, keys, owner, nonce, b"")
            if held:
                self._acquired(backend, keys, owner, value, count)
                return True
            self._contended(owner, value)
            return False
        return self._acquire_blocking(backend, keys, owner, nonce, timeout)

    def _attempt(
        self, backend: Backend, keys: LockKeys, owner: str, nonce: str, channel: bytes
    ) -> tuple[bool, int, int]:
        """One acquire script call; with a *channel*, queue as a waiter if the lock is held."""
        args = (
            owner,
            nonce,
            self._ttl_arg,
            self._meta(),
            int(time.time() * 1000),
            backend.retention_arg,
            channel,
        )
        reply = self._run(acquire_script, backend, keys, args, "acquire the lock")
        return decode_attempt(reply)

    def _acquire_blocking(
        self, backend: Backend, keys: LockKeys, owner: str, nonce: str, timeout: float | None
    ) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        hub = backend.hub()
        listening = hub.ready
        held, value, count = self._attempt(backend, keys, owner, nonce, hub.channel_arg)
        if held:
            self._acquired(backend, keys, owner, value, count)
            return True
        self._contended(owner, value)
        # Queued. A hand-off published from now on reaches the hub, which keeps
        # it for us even if it arrives before this registration.
        waiter = hub.register(nonce)
        try:
            if not (listening and hub.ready):
                # The hub was not subscribed when we queued: a hand-off published
                # meanwhile was missed, so ask Redis once more after subscribing.
                hub.wait_ready()
                held, value, count = self._attempt(backend, keys, owner, nonce, hub.channel_arg)
            while not held:
                if waiter.fence is not None:
                    held, value, count = True, waiter.fence, 1
                    break
                now = time.monotonic()
                pause = POLL_SLICE * random.uniform(0.75, 1.0)
                if value >= 0:
                    # Never sleep past the holder's lease: a crashed holder frees it then.
                    pause = min(pause, value / 1000.0 + 0.001)
                if deadline is not None:
                    if now >= deadline:
                        reply = self._run(
                            cancel_script,
                            backend,
                            keys,
                            (owner, nonce, backend.retention_arg),
                            "cancel the wait",
                        )
                        held, value, count = decode_attempt(reply)
                        if not held:
                            return False
                        break
                    pause = min(pause, deadline - now)
                fence = hub.wait(waiter, pause)
                if fence is not None:
                    held, value, count = True, fence, 1
                    break
                held, value, count = self._attempt(backend, keys, owner, nonce, hub.channel_arg)
        finally:
            hub.unregister(nonce)
        self._acquired(backend, keys, owner, value, count)
        return True

    def _acquired(
        self, backend: Backend, keys: LockKeys, owner: str, fence: int, count: int
    ) -> None:
        hold = self._holds.get(owner)
        if hold is None or hold.lost_reason is not None or count == 1:
            if hold is not None and hold.watch is not None:
                watchdog.unwatch(hold.watch)
            hold = self._holds[owner] = _Hold(fence=fence, count=1)
            if self.auto_renew:
                hold.watch = watchdog.watch(self, owner, backend.client, keys.lock, self.ttl_ms)
        else:
            hold.count += 1
        # On the hot path: only build the signal call when somebody listens.
        if signals.lock_acquired.receivers:
            signals.lock_acquired.send(
                sender=Lock,
                lock=self,
                name=self.name,
                owner=owner,
                fencing_token=fence,
                hold_count=count,
            )

    def _contended(self, owner: str, pttl: int) -> None:
        if signals.lock_contended.receivers:
            signals.lock_contended.send(
                sender=Lock,
                lock=self,
                name=self.name,
                owner=owner,
                pttl=pttl / 1000.0 if pttl >= 0 else None,
            )

    # -- release, extend -------------------------------------------------------

    def release(self) -> int:
        """Release one hold; the lock is freed (and handed to the next waiter) on the last.

        Returns the hold count left in Redis (0 = the lock is now free). The
        count includes holds taken by other ``Lock`` objects with the same
        explicit owner (e.g. a Celery task's enqueue-time hold).

        Raises :class:`LockNotOwned` when the caller's owner does not hold the
        lock (nothing changes), :class:`LockBackendError` when Redis cannot
        confirm the release (the hold is kept, so the release can be retried).
        """
        return self._release(self.owner)

    def release_all(self) -> int:
        """Release every hold of the caller's owner at once, in one round trip.

        For an owner that holds the lock several times through different
        ``Lock`` objects (a Celery task's enqueue-time hold and its run-time
        re-entry): the lock is freed and handed on. Returns 0. Raises like
        :meth:`release`.
        """
        return self._release(self.owner, everything=True)

    def _release(self, owner: str, everything: bool = False) -> int:
        backend, keys = self._backend()
        # A release whose outcome is unknown (Redis unreachable) is retried with
        # the same nonce, so it cannot count twice.
        pending = (owner, everything)
        nonce = self._pending_release.get(pending) or new_nonce()
        self._pending_release[pending] = nonce
        args: tuple[Any, ...] = (owner, nonce, backend.retention_arg)
        if everything:
            args += (b"all",)
        remaining = int(self._run(release_script, backend, keys, args, "release the lock"))
        del self._pending_release[pending]
        hold = self._holds.get(owner)
        if remaining < 0:
            self._forget(owner)
            raise LockNotOwned(
                f"cannot release lock {self.name!r}: it is not held by this owner "
                "(its lease may have expired or it was released by someone else)",
                name=self.name,
            )
        if hold is not None:
            hold.count -= 1
            if hold.count <= 0 or remaining == 0:
                self._forget(owner)
        if signals.lock_released.receivers:
            signals.lock_released.send(
                sender=Lock, lock=self, name=self.name, owner=owner, hold_count=remaining
            )
        return remaining

    def _forget(self, owner: str) -> None:
        hold = self._holds.pop(owner, None)
        if hold is not None and hold.watch is not None:
            watchdog.unwatch(hold.watch)

    def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """Add *additional_time* seconds to the lease (or set it, with ``replace_ttl``).

        Raises :class:`LockNotOwned` when not held by the caller, and
        :class:`LockError` for a lock without expiry. Returns True.
        """
        ms = to_millis(validate_seconds(additional_time, "additional_time"), "additional_time")
        backend, keys = self._backend()
        result = int(
            self._run(
                extend_script,
                backend,
                keys,
                [self.owner, ms, 1 if replace_ttl else 0],
                "extend the lock",
            )
        )
        if result == -1:
            raise LockNotOwned(
                f"cannot extend lock {self.name!r}: it is not held by this owner", name=self.name
            )
        if result == -2:
            raise LockError(f"lock {self.name!r} has no expiry to extend", name=self.name)
        return True

    def reacquire(self) -> bool:
        """Reset the lease to the lock's full ``ttl`` (redis-py's ``reacquire``)."""
        if not self.ttl_ms:
            raise LockError(f"lock {self.name!r} has no ttl to reset", name=self.name)
        return self.extend(self.ttl_ms / 1000.0, replace_ttl=True)

    # -- inspection ------------------------------------------------------------

    def locked(self) -> bool:
        """Whether anybody holds the lock."""
        backend, keys = self._backend()
        try:
            return bool(backend.client.exists(keys.lock))
        except RedisError as exc:
            raise backend_error(exc, "check the lock", self.name) from exc

    def owned(self) -> bool:
        """Whether the caller's owner holds the lock right now (asks Redis)."""
        backend, keys = self._backend()
        try:
            return bool(_decode(backend.client.hget(keys.lock, "owner")) == self.owner)
        except RedisError as exc:
            raise backend_error(exc, "check the lock's owner", self.name) from exc

    def ttl(self) -> float | None:
        """Remaining lease in seconds; None when not held, ``math.inf`` when held without expiry."""
        backend, keys = self._backend()
        try:
            pttl = int(backend.client.pttl(keys.lock))
        except RedisError as exc:
            raise backend_error(exc, "read the lock's lease", self.name) from exc
        if pttl == -2:
            return None
        return math.inf if pttl == -1 else pttl / 1000.0

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the caller's current hold (None when not held by it)."""
        hold = self._holds.get(self.owner)
        return None if hold is None else hold.fence

    @property
    def lost(self) -> bool:
        """Whether the caller's hold was found lost by the watchdog."""
        hold = self._holds.get(self.owner)
        return hold is not None and hold.lost_reason is not None

    def _mark_lost(self, owner: str, reason: str) -> None:
        hold = self._holds.get(owner)
        if hold is None or hold.lost_reason is not None:
            return
        hold.lost_reason = reason
        hold.watch = None
        logger.error("redislock: lock %r lost: %s", self.name, reason)
        signals.lock_lost.send(sender=Lock, lock=self, name=self.name, owner=owner, reason=reason)

    # -- context manager -------------------------------------------------------

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise LockNotAcquired(
                f"could not acquire lock {self.name!r}"
                + (
                    ""
                    if self.timeout is None or not self.blocking
                    else f" within {self.timeout:g} s"
                ),
                name=self.name,
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        owner = self.owner
        hold = self._holds.get(owner)
        reason = hold.lost_reason if hold is not None else None
        try:
            self._release(owner)
        except LockBackendError:
            # The block is over: keep the hold so release() can be retried, but
            # stop renewing it, so that without a retry the lease runs out.
            if hold is not None and hold.watch is not None:
                watchdog.unwatch(hold.watch)
                hold.watch = None
            raise
        except LockNotOwned:
            reason = reason or "its lease expired or it was released by someone else"
            if hold is not None and hold.lost_reason is None:
                hold.lost_reason = reason
                signals.lock_lost.send(
                    sender=Lock, lock=self, name=self.name, owner=owner, reason=reason
                )
        if reason is not None:
            message = f"lock {self.name!r} was lost while held: {reason}"
            if self.raise_on_lost and exc_type is None:
                raise LockLost(message, name=self.name)
            logger.warning("redislock: %s", message)

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} ttl={self.ttl_seconds}>"


def _json_dict(value: object, what: str) -> dict[str, Any] | None:
    """Return *value* if it is None or a JSON-serialisable dict, else raise TypeError."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"{what} must be a dict, not {type(value).__name__}")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON-serialisable: {exc}") from None
    return value


def _validate_owner(owner: object) -> str:
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a str, not {type(owner).__name__}")
    if not owner or len(owner) > MAX_OWNER_LENGTH:
        raise ValueError(f"owner must be 1 to {MAX_OWNER_LENGTH} characters long")
    return owner
