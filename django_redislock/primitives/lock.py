"""The :class:`Lock`: one object for blocking code and for asyncio.

A lock is identified by its name; who holds it is an *owner token* (by default
the current thread's, or the current asyncio task's, see
:mod:`django_redislock.engine.identity`). One ``Lock`` object may be shared by
several threads and tasks: each is its own owner. Holding is re-entrant per
owner: a second acquire by the same owner increments a hold count, and the lock
is freed by the matching last release.

Every operation is a flow of :mod:`django_redislock.engine.flows`, run by the
blocking driver (``acquire()``, ``release()``, ...) or the asyncio driver
(``aacquire()``, ``arelease()``, ..., Django's ``a`` prefix). What this class
adds is the Django side: settings defaults, metadata, signals and the
``with`` / ``async with`` semantics.
"""

from __future__ import annotations

import asyncio
import logging
import math
from asyncio.events import _get_running_loop
from collections.abc import Coroutine
from functools import partial
from time import monotonic
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from .. import signals
from ..client.source import BackendSource, default_source
from ..conf import setting
from ..engine import deadlock, flows
from ..engine.calls import Attempt, Call, NotReplicated, Prior
from ..engine.driver import acquire_async, acquire_sync, call_async, call_sync, run_async
from ..engine.guarding import guard_owner
from ..engine.holds import Hold, HoldTable, known_holds
from ..engine.identity import current_owner, new_nonce
from ..engine.keys import LockKeys
from ..engine.lua.common import HANDOFF_CLAIM_MS
from ..engine.mutex import Kind, Mutex, mutex_kind
from ..engine.shared import Shared
from ..engine.validate import (
    json_dict,
    to_millis,
    validate_name,
    validate_owner,
    validate_replicas,
    validate_seconds,
    validate_wait,
)
from ..engine.wake import release_outcome
from ..engine.watchdog import watchdog
from ..exceptions import (
    LockBackendError,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    LockNotReplicated,
    about_lock,
)
from . import at_once, watch_load  # noqa: F401 (watch_load: the watchdog's ceiling, warnings)
from .event_loop import finish_in_background, refuse_in_event_loop
from .lease import UNSET, count_arg, lease_of
from .metadata import HolderMeta
from .refusals import UNREAD, not_owned

if TYPE_CHECKING:
    from django.dispatch import Signal

    from ..engine.backends.base import AsyncBackend, Backend
    from ..engine.info import HolderInfo, LockInfo
    from ..fencing import GuardedRedis

logger = logging.getLogger("django_redislock")


class HasSource(Protocol):
    """What a Lock needs from its manager: where its backends come from."""

    source: BackendSource


class Lock:
    """A distributed, re-entrant, leased lock on Redis.

    Usually created with :meth:`LockManager.lock` (``locks.lock(name, ...)``).

    :param name: the lock's name; any non-empty string up to 1024 characters.
    :param ttl: the lease in seconds (default ``REDISLOCK_DEFAULT_TTL``).
        ``None`` makes a lock without expiry and requires ``no_expiry=True``.
    :param timeout: how long ``acquire()`` / ``with`` wait by default (seconds;
        ``None`` = until acquired, ``0`` = one attempt).
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
    :param wait_replicas: how many replicas must acknowledge a grant, hand-off,
        renewal or extension before it counts (default
        ``REDISLOCK_WAIT_REPLICAS``; 0 = do not wait). An unconfirmed grant is
        given back and retried while the timeout allows, then
        :class:`~django_redislock.exceptions.LockNotReplicated` is raised. See docs/topology.md.
    :param inherit_from: advanced: an owner whose holds an acquire takes over
        (they become this lock's owner's, plus one), as a Celery task's execution
        takes over the hold its task id took at enqueue time. Without an explicit
        ``owner``, inside a guarded task, view or function, a lock on the guard's
        own name is owned by the guard (see ``engine/guarding.py``).
    :param deadlock_timeout: seconds a blocking acquire waits before it looks for a
        cycle of waiters (each waiting for a lock the next holds): the cycle's youngest
        wait is refused with :class:`~django_redislock.exceptions.LockDeadlock`. None
        (default): never. Mutexes on one Redis or a Cluster; see docs/locks.md.
    :param lock_delay: seconds the lock stays taken after a holder that vanished without
        releasing counts itself lost, so its in-flight writes land before anyone else
        holds the lock (Redis keeps the key ``ttl + lock_delay``; the holder's watchdog
        still declares the loss by the ``ttl``). None (default): no delay. Mutexes with a
        ttl, on one Redis or a Cluster; see docs/locks.md.
    :param fair: ``True`` (default): a release hands the lock to the first
        waiter (FIFO). ``False``: a release frees it and wakes the first waiter,
        and whoever asks first gets it, the releasing process included
        (barging): more critical sections per second for many short ones, no
        order among waiters. See docs/locks.md.
    """

    #: The mode of a semaphore's or read-write lock's hold (None: a mutex).
    _shared: Shared | None = None
    #: The bounded name metrics label this lock's events with (``group``): set to
    #: the key template by ``@single_instance`` and Celery task locks; None: the
    #: ``REDISLOCK_METRICS_GROUPS`` rule applied to the name (see docs/metrics.md).
    metrics_group: str | None = None

    def __init__(
        self,
        name: str,
        *,
        manager: HasSource | None = None,
        ttl: float | None = UNSET,
        timeout: float | None = None,
        blocking: bool = True,
        auto_renew: bool | None = None,
        owner: str | bytes | None = None,
        purpose: str | None = None,
        extra: dict[str, Any] | None = None,
        raise_on_lost: bool | None = None,
        no_expiry: bool = False,
        meta: dict[str, Any] | None = None,
        wait_replicas: int | None = None,
        fair: bool = True,
        inherit_from: str | bytes | None = None,
        deadlock_timeout: float | None = None,
        lock_delay: float | None = None,
    ) -> None:
        self.name = validate_name(name)
        if deadlock_timeout is not None and self._shared is not None:
            raise ValueError("deadlock_timeout is for mutexes (locks.lock) only")
        #: How long a blocking acquire waits before it looks for a wait-for cycle
        #: (None: never; see engine/deadlock.py and docs/locks.md).
        self.deadlock_timeout = (
            None
            if deadlock_timeout is None
            else validate_seconds(deadlock_timeout, "deadlock_timeout", "never look for a deadlock")
        )
        if self._shared is not None and (no_expiry or ttl is None):
            raise ValueError(
                f"{type(self).__name__} {name!r}: ttl=None (no_expiry) is not supported here: "
                "every holder of a semaphore or read-write lock needs its own lease"
            )
        if not isinstance(fair, bool):
            raise TypeError(f"fair must be True or False, not {fair!r}")
        if not fair and self._shared is not None:
            raise ValueError("fair=False is for mutexes (locks.lock) only")
        #: Whether a release hands the lock to the first waiter (else: barging).
        self.fair = fair
        if inherit_from is not None and self._shared is not None:
            raise ValueError("inherit_from is for mutexes (locks.lock) only")
        #: What a hold of this lock is; it makes every call (see engine/mutex.py).
        self._kind: Kind = self._shared or mutex_kind(
            barge=not fair, parent="" if inherit_from is None else validate_owner(inherit_from)
        )
        self.manager = manager
        self._source = default_source if manager is None else manager.source
        self.ttl_ms, self._ttl_arg = lease_of(ttl, no_expiry)
        #: How long (ms) the lock stays taken after a holder that did not release it
        #: counts itself lost (its lease ran out): Redis keeps the key that much longer.
        self.lock_delay_ms = 0
        if lock_delay is not None:
            if self._shared is not None or not self.ttl_ms:
                raise ValueError("lock_delay is for mutexes (locks.lock) with a ttl only")
            self.lock_delay_ms = to_millis(validate_seconds(lock_delay, "lock_delay"), "lock_delay")
            self._ttl_arg = str(self.ttl_ms + self.lock_delay_ms).encode()
        self.timeout = None if timeout is None else validate_wait(timeout, "timeout")
        self.blocking = bool(blocking)
        if auto_renew is None:
            auto_renew = setting("REDISLOCK_AUTO_RENEW")
        self.auto_renew = bool(auto_renew) and self.ttl_ms > 0
        self._owner = None if owner is None else validate_owner(owner)
        if purpose is not None and not isinstance(purpose, str):
            raise TypeError(f"purpose must be a str, not {type(purpose).__name__}")
        self.purpose = purpose
        self.extra = None if extra is None else json_dict(extra, "extra")
        self.meta = None if meta is None else json_dict(meta, "meta")
        if raise_on_lost is None:
            raise_on_lost = setting("REDISLOCK_RAISE_ON_LOST")
        self.raise_on_lost = raise_on_lost
        if wait_replicas is None:
            self.wait_replicas = setting("REDISLOCK_WAIT_REPLICAS")
        else:
            self.wait_replicas = validate_replicas(wait_replicas, "wait_replicas")
        self._holds = HoldTable()
        #: (keyspace, the lock's keys in it, the keys of its kind's calls), made once.
        self._keys_cache: tuple[Any, LockKeys, tuple[bytes, ...]] | None = None
        #: The last (owner, KnownHolds key) asked for: one owner per Lock is the common case.
        self._known_cache: tuple[str, tuple[str, str, str]] | None = None
        self._meta_text = HolderMeta()

    # -- identity and plumbing -------------------------------------------------

    @property
    def ttl_seconds(self) -> float | None:
        """The lease in seconds (None for a lock without expiry)."""
        return self.ttl_ms / 1000.0 if self.ttl_ms else None

    @property
    def owner(self) -> str:
        """The owner token acquiring/releasing on behalf of the caller right now: the
        explicit ``owner``, else the guard's running on this name (a guarded task,
        view or function holding it), else the current thread's or asyncio task's."""
        return self._caller()[0]

    def _caller(self) -> tuple[str, bool]:
        """``(owner, made_up)`` of the caller: :attr:`owner`, and whether this process made
        it up for the calling thread or task (see :meth:`_made_up`), in one look."""
        if self._owner is not None:
            return self._owner, False
        guarded = guard_owner(self.name)
        if guarded is not None:
            return guarded, False
        return current_owner(), True

    def _call_keys(self, backend: Backend | AsyncBackend) -> tuple[bytes, ...]:
        """The keys of this lock's calls."""
        cached = self._keys_cache
        if cached is None or cached[0] is not backend.keyspace:
            cached = self._cache_keys(backend)
        return cached[2]

    def _keys(self, backend: Backend | AsyncBackend) -> LockKeys:
        cached = self._keys_cache
        if cached is None or cached[0] is not backend.keyspace:
            cached = self._cache_keys(backend)
        return cached[1]

    def _cache_keys(
        self, backend: Backend | AsyncBackend
    ) -> tuple[Any, LockKeys, tuple[bytes, ...]]:
        keyspace = backend.keyspace
        keys = keyspace.keys(self.name)
        cached = self._keys_cache = (keyspace, keys, self._kind.keys(keys))
        return cached

    @property
    def key(self) -> str:
        """The Redis key of the lock's hash."""
        return self._keys(self._source.backend()).lock

    def _meta(self) -> bytes:
        return self._meta_text.text(
            self.purpose, self.extra, self.meta, self.auto_renew, self.lock_delay_ms
        )

    # -- acquire ---------------------------------------------------------------

    def _wait_policy(
        self,
        blocking: bool | None,
        timeout: float | None,
        blocking_timeout: float | None,
        token: str | bytes | None,
    ) -> tuple[str, bool, bool, float | None]:
        """(owner, made_up, blocking, timeout) of one acquire call, from its arguments and
        defaults (*made_up*: see :meth:`_caller`)."""
        if token is not None:
            self._owner = validate_owner(token)
        if blocking is None:
            blocking = self.blocking
        if timeout is UNSET:
            timeout = blocking_timeout
        if timeout is UNSET:
            timeout = self.timeout
        else:
            timeout = validate_wait(timeout, "timeout")
        if timeout == 0 or not blocking:
            # One attempt, as in redis-py: a zero wait, or blocking=False, which wins
            # over a wait passed with it (redis-py ignores its blocking_timeout then).
            blocking, timeout = False, None
        owner, made_up = self._caller()
        return owner, made_up, bool(blocking), timeout

    def _acquire_op(
        self,
        backend: Backend | AsyncBackend,
        owner: str,
        made_up: bool,
        blocking: bool,
        timeout: float | None,
    ) -> flows.AcquireOp:
        on_contended = None
        if signals.lock_contended.receivers:
            name = self.name

            def on_contended(pttl: int) -> None:
                signals.lock_contended.send(
                    sender=Lock,
                    lock=self,
                    name=name,
                    owner=owner,
                    pttl=pttl / 1000.0 if pttl >= 0 else None,
                )

        keys = self._call_keys(backend)  # (fills the key cache _known_key reads)
        known = b""
        if made_up:
            # What the client knows of its holds, the kind's own first ("n", or a read's
            # or write's "n|m"): a hold in Redis beyond it is an orphan (see KnownHolds).
            prefix = backend.keyspace.prefix
            counted = self._kind.known_names(self.name)
            if len(counted) == 1:  # a mutex's, a permit's
                known = count_arg(known_holds.get((prefix, counted[0], owner)))
            else:
                known = b"|".join([count_arg(known_holds.get((prefix, n, owner))) for n in counted])
        if self.lock_delay_ms and backend.features.quorum:
            raise LockError(
                f"lock {self.name!r}: lock_delay needs one Redis or a Redis Cluster: Redlock "
                "computes a grant's validity from the lease, which the delay would lengthen",
                name=self.name,
            )
        nonce = new_nonce()
        watch = None
        if blocking and self.deadlock_timeout is not None:
            watch = deadlock.watch_for(backend, owner, self.name, nonce, self.deadlock_timeout)
        return flows.AcquireOp(
            keys,
            owner,
            nonce,
            self._ttl_arg,
            self._meta(),
            backend.retention_arg,
            self.name,
            known=known,
            blocking=blocking,
            timeout=timeout,
            claim_inline=not self.auto_renew,
            on_contended=on_contended,
            replicas=self.wait_replicas,
            kind=self._kind,
            deadlock=watch,
        )

    def acquire(
        self,
        blocking: bool | None = None,
        timeout: float | None = UNSET,
        *,
        blocking_timeout: float | None = UNSET,
        token: str | bytes | None = None,
        sleep: float | None = None,
    ) -> bool:
        """Acquire the lock; return True when held, False when it was not acquired.

        :param blocking: wait for the lock (default: the lock's ``blocking``);
            False: one attempt, whatever the *timeout* (as in redis-py).
        :param timeout: how long to wait, in seconds (default: the lock's
            ``timeout``; ``None`` = until acquired; ``0`` = one attempt).
            ``blocking_timeout`` is the redis-py spelling of the same argument.
        :param token: an explicit owner (str or bytes) to acquire as (it stays
            this Lock's owner afterwards), like redis-py's ``token``.
        :param sleep: accepted for redis-py compatibility and ignored: waiters
            are woken by the release, not by polling.

        A blocking acquire inside a running event loop raises
        :class:`~django_redislock.exceptions.BlockingCallInEventLoop`: use
        ``await aacquire()`` there.
        """
        del sleep
        owner, made_up, blocking, timeout = self._wait_policy(
            blocking, timeout, blocking_timeout, token
        )
        if blocking and _get_running_loop() is not None:
            refuse_in_event_loop(self.name, "acquire()", "aacquire()")
        backend = self._source.backend()
        op = self._acquire_op(backend, owner, made_up, blocking, timeout)
        started = _start_clock()
        try:
            attempt = acquire_sync(op, backend)
        except LockBackendError as error:
            self._backend_error(owner, "acquire", error)
            raise
        return self._settle_acquire(op, made_up, attempt, started, backend)

    def aacquire(
        self,
        blocking: bool | None = None,
        timeout: float | None = UNSET,
        *,
        blocking_timeout: float | None = UNSET,
        token: str | bytes | None = None,
        sleep: float | None = None,
    ) -> Coroutine[Any, Any, bool]:
        """Acquire the lock without blocking the event loop (``await lock.aacquire()``).

        The arguments are those of :meth:`acquire`. The owner is the asyncio task
        that *calls* ``aacquire()``, even when the coroutine then runs in another
        task (``asyncio.wait_for``/``gather``/``shield`` on Python < 3.12).
        Cancelled while the lock was being granted, it gives the lock back before
        the cancellation propagates.
        """
        del sleep
        owner, made_up, blocking, timeout = self._wait_policy(
            blocking, timeout, blocking_timeout, token
        )
        return self._aacquire(owner, made_up, blocking, timeout)

    async def _aacquire(
        self, owner: str, made_up: bool, blocking: bool, timeout: float | None
    ) -> bool:
        backend = self._source.abackend()
        op = self._acquire_op(backend, owner, made_up, blocking, timeout)
        started = _start_clock()
        try:
            attempt = await acquire_async(op, backend)
        except asyncio.CancelledError:
            await finish_in_background(self._undo_acquire(op, owner, backend))
            raise
        except LockBackendError as error:
            self._backend_error(owner, "acquire", error)
            raise
        return self._settle_acquire(op, made_up, attempt, started)

    async def _undo_acquire(self, op: flows.AcquireOp, owner: str, backend: AsyncBackend) -> None:
        """After a cancelled aacquire: leave the queue, and give back a grant that happened."""
        attempt = await run_async(flows.cancel(op), backend)
        if attempt.held:
            call = self._release_call(backend, owner, new_nonce(), False)
            await call_async(call, backend)

    def _settle_acquire(
        self, op: flows.AcquireOp, made_up: bool, attempt: Attempt, started: float,
        backend: Backend | None = None,
    ) -> bool:  # fmt: skip
        """Record the outcome of *op*; *started*: its ``_start_clock()`` (0: not timed);
        *backend*: the blocking backend when the caller has it (the watchdog's)."""
        owner = op.owner
        if not attempt.held:
            if signals.lock_not_acquired.receivers:
                waited = monotonic() - started if started else 0.0
                self._send(signals.lock_not_acquired, owner, waited=waited, blocking=op.blocking)
            return False
        if made_up:
            known_holds.set(self._known_key(owner), attempt.holds)
        hold, replaced = self._holds.acquired(owner, attempt.value, attempt.holds)
        if replaced is not None and replaced.watch is not None:
            watchdog.unwatch(replaced.watch)
        if hold.count == 1 and hold.watch is None and self.auto_renew:
            hold.watch = watchdog.watch(
                self,
                owner,
                backend or self._source.backend(),
                op.keys,
                self.ttl_ms,
                self.name,
                claim_ms=HANDOFF_CLAIM_MS if attempt.handed else None,
                replicas=self.wait_replicas,
                kind=self._kind,
                lease_ms=self.ttl_ms + self.lock_delay_ms,
            )
        # On the hot path: only build the signal call when somebody listens.
        if signals.lock_acquired.receivers:
            now = monotonic()
            if not hold.since:
                hold.since = now
            self._send(
                signals.lock_acquired,
                owner,
                fencing_token=attempt.value,
                hold_count=attempt.holds,
                waited=now - started if started else 0.0,
            )
        return True

    # -- release ---------------------------------------------------------------

    def release(self) -> int:
        """Release one hold; the lock is freed (and handed to the next waiter) on the last.

        Returns the hold count left in Redis (0 = the lock is now free). The
        count includes holds taken by other ``Lock`` objects with the same
        explicit owner (e.g. a Celery task's enqueue-time hold).

        Raises :class:`LockNotOwned` when the caller's owner does not hold the
        lock (nothing changes), :class:`LockBackendError` when Redis cannot
        confirm the release (the hold is kept, so the release can be retried).
        """
        return self._release(*self._caller(), False)

    def arelease(self) -> Coroutine[Any, Any, int]:
        """:meth:`release` for asyncio (the owner is the calling task).

        Cancelled in flight, the release is finished in the background with the
        same nonce, so it neither counts twice nor leaves the outcome unknown.
        """
        return self._arelease(*self._caller(), False)

    def release_all(self) -> int:
        """Release every hold of the caller's owner at once, in one round trip.

        For an owner that holds the lock several times through different
        ``Lock`` objects (a Celery task's enqueue-time hold and its run-time
        re-entry): the lock is freed and handed on. Returns 0. Raises like
        :meth:`release`.
        """
        return self._release(*self._caller(), True)

    def arelease_all(self) -> Coroutine[Any, Any, int]:
        """:meth:`release_all` for asyncio."""
        return self._arelease(*self._caller(), True)

    def _release_call(
        self, backend: Backend | AsyncBackend, owner: str, nonce: str, everything: bool,
        complete: bool = False, *, here: bytes | None = None,
    ) -> Call:  # fmt: skip
        """The release call; *here*: see :meth:`.Mutex.release_call`."""
        keys = self._call_keys(backend)
        kind = self._kind
        if complete:
            if not isinstance(kind, Mutex):
                raise LockError(f"{self.name!r}: only a mutex's hold can be a run's")
            return kind.release_call(
                keys, owner, nonce, backend.retention_arg, everything, self.name, complete=True
            )
        if here is not None:
            return kind.release_call(
                keys, owner, nonce, backend.retention_arg, everything, self.name, here=here
            )
        return kind.release_call(keys, owner, nonce, backend.retention_arg, everything, self.name)

    def _with_completion(self, run: str, keep: float) -> None:
        """Make this lock's holds those of one run (*run*: its id, a Celery task id) of
        the work it guards, with a completion record kept *keep* seconds: an acquire is
        refused with :class:`~django_redislock.engine.calls.RunCompleted` (holding
        nothing) once the record exists, and :meth:`_release_completed` writes it, each
        in the lock's own script (no round trip of its own).

        Advanced, for the Celery integration's ``acks_late`` executions. One Redis or a
        Cluster only (the record is kept under the lock's hash tag); refused on Redlock.
        """
        kind = self._kind
        if not isinstance(kind, Mutex):
            raise LockError(f"{self.name!r}: only a mutex's holds can be a run's")
        if self._source.backend().features.quorum:
            raise LockError(
                f"lock {self.name!r}: a run's completion record is kept with the lock on one "
                "Redis or a Cluster, not on Redlock's masters"
            )
        self._kind = mutex_kind(
            barge=kind.barge,
            parent=kind.parent,
            completion=validate_owner(run),
            completion_ms=to_millis(validate_seconds(keep, "keep"), "keep"),
        )
        self._keys_cache = None  # the calls' keys are the new kind's

    def _release_completed(self) -> int:
        """Release every hold of the caller's owner, writing the run's completion record
        (see :meth:`_with_completion`) in the same script, also when the hold was lost.
        Returns and raises like :meth:`release_all`."""
        return self._release(*self._caller(), True, complete=True)

    def _release(
        self, owner: str, made_up: bool, everything: bool, complete: bool = False,
        prior: Prior | None = None,
    ) -> int:  # fmt: skip
        """The one release path (*prior*: a call sent just before it, in its round trip)."""
        backend = self._source.backend()
        nonce = self._holds.release_nonce(owner, everything, new_nonce)
        call = self._release_call(backend, owner, nonce, everything, complete)
        try:
            if prior is None:
                remaining = int(call_sync(call, backend))
            else:
                remaining = int(at_once.after_prior_sync(prior, call, self, backend))
        except LockBackendError as error:
            self._release_unconfirmed(owner, made_up, everything, error)
            raise
        holder = self._peek() if remaining < 0 else UNREAD
        return self._settle_release(owner, made_up, everything, remaining, holder)

    async def _arelease(
        self, owner: str, made_up: bool, everything: bool, prior: Prior | None = None
    ) -> int:
        """:meth:`_release` for asyncio. Cancelled in flight, the release (and *prior*)
        is finished in the background with the same nonce."""
        backend = self._source.abackend()
        nonce = self._holds.release_nonce(owner, everything, new_nonce)
        # Waiters of this event loop's hub get a hand-off in the release's reply.
        key = self._call_keys(backend)[0]
        here = backend.local_channel(key) if prior is None else None
        call = self._release_call(backend, owner, nonce, everything, here=here)
        try:
            if prior is None:
                reply = await call_async(call, backend)
                # A hand-off to a waiter of this loop (see release_outcome), to the hub
                # for this key (on a Cluster, its node's).
                hub = partial(backend.hub, key)
                remaining = int(reply) if here is None else release_outcome(reply, hub)
            else:
                remaining = int(await at_once.after_prior_async(prior, call, self, backend))
        except asyncio.CancelledError:
            await finish_in_background(
                self._finish_release(call, backend, owner, made_up, everything, prior, here)
            )
            raise
        except LockBackendError as error:
            self._release_unconfirmed(owner, made_up, everything, error)
            raise
        holder = await self._apeek() if remaining < 0 else UNREAD
        return self._settle_release(owner, made_up, everything, remaining, holder)

    async def _finish_release(
        self, call: Call, backend: AsyncBackend, owner: str, made_up: bool, everything: bool,
        prior: Prior | None = None, here: bytes | None = None,
    ) -> None:  # fmt: skip
        if prior is None:
            reply = await call_async(call, backend)
            hub = partial(backend.hub, call.keys[0])
            remaining = int(reply) if here is None else release_outcome(reply, hub)
        else:
            remaining = int(await at_once.after_prior_async(prior, call, self, backend))
        try:
            self._settle_release(owner, made_up, everything, remaining)
        except LockNotOwned:
            pass

    def _known_key(self, owner: str) -> tuple[str, str, str]:
        """The KnownHolds key of *owner*'s holds of this lock (under the key prefix in use)."""
        cached, keys = self._known_cache, self._keys_cache
        if (
            cached is not None
            and cached[0] == owner
            and keys is not None
            and cached[1][0] == keys[0].prefix
        ):
            return cached[1]
        key = (self._known_prefix(), self._kind.known_name(self.name), owner)
        self._known_cache = (owner, key)
        return key

    def _known_prefix(self) -> str:
        cached = self._keys_cache
        keyspace = cached[0] if cached is not None else self._source.backend().keyspace
        return keyspace.prefix

    def _made_up(self, owner: str) -> bool:
        """Whether *owner* is one this process made up for a thread or task (neither an
        explicit owner nor a guard's, whose holds other Lock objects count)."""
        return self._owner is None and guard_owner(self.name) != owner

    def _release_unconfirmed(
        self, owner: str, made_up: bool, everything: bool, error: LockBackendError
    ) -> None:
        self._backend_error(owner, "release", error)
        self._holds.release_failed(owner)
        # The release may or may not have happened. It counts as done: should it
        # not have, the owner's next acquire drops the hold instead of counting
        # it, so the lock cannot stay held for good.
        if made_up:
            key = self._known_key(owner)
            known_holds.set(key, 0 if everything else known_holds.get(key) - 1)

    def _settle_release(
        self, owner: str, made_up: bool, everything: bool, remaining: int, holder: Any = UNREAD
    ) -> int:
        """What Redis's answer to a release means (*made_up*: see :meth:`_caller`;
        *holder*: the lock's snapshot, read after a refused release, for the error;
        :data:`UNREAD` if not read)."""
        if made_up:
            known_holds.set(self._known_key(owner), max(remaining, 0))
        forgotten = self._holds.released(owner, everything, remaining)
        if forgotten is not None and forgotten.watch is not None:
            watchdog.unwatch(forgotten.watch)
        if remaining < 0:
            raise not_owned(self.name, "release", owner, holder)
        if signals.lock_released.receivers:
            held = None
            if forgotten is not None and forgotten.since:
                held = monotonic() - forgotten.since
            self._send(signals.lock_released, owner, hold_count=remaining, held=held)
        return remaining

    def _send(self, signal: Signal, owner: str, **values: Any) -> None:
        """Send *signal* about *owner*'s hold of this lock (the caller checked that it
        has receivers: on the hot path, nothing is built for a signal nobody hears)."""
        signal.send(sender=Lock, lock=self, name=self.name, owner=owner, **values)

    def _backend_error(self, owner: str, operation: str, error: LockBackendError) -> None:
        """Tell ``lock_backend_error``'s receivers that *operation* failed on Redis."""
        if signals.lock_backend_error.receivers:
            self._send(signals.lock_backend_error, owner, operation=operation, error=error)

    def _renewed(self, owner: str, error: BaseException | None, sent_at: float) -> None:
        """The watchdog's news of a renewal of *owner*'s hold sent at *sent_at*; *error*: failed."""
        if signals.lock_renewed.receivers:
            self._send(signals.lock_renewed, owner, error=error, sent_at=sent_at)

    def _forget(self, owner: str) -> None:
        """Drop *owner*'s local hold without telling Redis (its lease runs out)."""
        hold = self._holds.forget(owner)
        if hold is not None and hold.watch is not None:
            watchdog.unwatch(hold.watch)

    def _transfer(self, new_owner: str, lease: float = 0.0) -> int:
        """Hand every hold of the caller's owner to *new_owner*, with a lease of
        *lease* seconds (0: unchanged; a mutex only, see ``engine/scripts.py``
        TRANSFER); returns the holds handed over (0: none).

        Advanced, for the Celery integration: an execution parks the hold it keeps
        for its retry under the task id, leased over the countdown, in one round
        trip. The local hold is forgotten.
        """
        kind = self._kind
        if not isinstance(kind, Mutex):
            raise LockError(f"{self.name!r}: only a mutex's holds can be handed over")
        backend = self._source.backend()
        owner = self.owner
        ms = to_millis(validate_seconds(lease, "lease"), "lease") if lease else 0
        keys = self._call_keys(backend)
        call = kind.transfer_call(keys, owner, validate_owner(new_owner), ms, self.name)
        handed = int(call_sync(call, backend))
        self._forget(owner)
        if self._made_up(owner):
            known_holds.set(self._known_key(owner), 0)
        return handed

    # -- extend ----------------------------------------------------------------

    def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """Add *additional_time* seconds to the lease (or set it, with ``replace_ttl``).

        Raises :class:`LockNotOwned` when not held by the caller, and
        :class:`LockError` for a lock without expiry. Returns True.
        """
        backend = self._source.backend()
        call = self._extend_call(backend, additional_time, replace_ttl)
        try:
            reply = call_sync(call, backend)
        except NotReplicated as exc:
            raise self._extension_not_replicated(exc) from None
        return self._settle_extend(reply, self._peek() if int(reply) == -1 else UNREAD)

    async def aextend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """:meth:`extend` for asyncio."""
        backend = self._source.abackend()
        call = self._extend_call(backend, additional_time, replace_ttl)
        try:
            reply = await call_async(call, backend)
        except NotReplicated as exc:
            raise self._extension_not_replicated(exc) from None
        holder = await self._apeek() if int(reply) == -1 else UNREAD
        return self._settle_extend(reply, holder)

    def _extension_not_replicated(self, exc: NotReplicated) -> LockError:
        """What an extension replicas did not confirm raises (after the usual checks)."""
        self._settle_extend(exc.reply)  # not owned / no expiry: those errors first
        return LockNotReplicated(
            f"the extension of lock {self.name!r} was acknowledged by {exc.acks} of the "
            f"{exc.required} replicas it waits for (wait_replicas): the primary has the "
            "longer lease, but a failover may lose it",
            name=self.name,
            acks=exc.acks,
            required=exc.required,
        )

    def _extend_call(
        self, backend: Backend | AsyncBackend, additional_time: float, replace_ttl: bool
    ) -> Call:
        ms = to_millis(validate_seconds(additional_time, "additional_time"), "additional_time")
        return self._kind.extend_call(
            self._call_keys(backend), self.owner, ms, replace_ttl, self.name, self.wait_replicas
        )

    def _settle_extend(self, reply: Any, holder: Any = UNREAD) -> bool:
        """What Redis's answer to an extension means (*holder*: as for a release)."""
        result = int(reply)
        if result == -1:
            raise not_owned(self.name, "extend", self.owner, holder)
        if result == -2:
            raise LockError(f"lock {self.name!r} has no expiry to extend", name=self.name)
        return True

    def reacquire(self) -> bool:
        """Reset the lease to the lock's full ``ttl`` (redis-py's ``reacquire``)."""
        return self.extend(self._full_lease(), replace_ttl=True)

    async def areacquire(self) -> bool:
        """:meth:`reacquire` for asyncio."""
        return await self.aextend(self._full_lease(), replace_ttl=True)

    def _full_lease(self) -> float:
        if not self.ttl_ms:
            raise LockError(f"lock {self.name!r} has no ttl to reset", name=self.name)
        return (self.ttl_ms + self.lock_delay_ms) / 1000.0

    # -- inspection ------------------------------------------------------------

    def info(self) -> LockInfo | None:
        """A snapshot of this lock in Redis (None when nobody holds it)."""
        backend = self._source.backend()
        try:
            infos = backend.load([self._keys(backend).lock])
        except LockBackendError as error:
            raise about_lock(error, self.name) from error.__cause__
        return infos[0] if infos else None

    async def ainfo(self) -> LockInfo | None:
        """:meth:`info` for asyncio."""
        backend = self._source.abackend()
        try:
            infos = await backend.load([self._keys(backend).lock])
        except LockBackendError as error:
            raise about_lock(error, self.name) from error.__cause__
        return infos[0] if infos else None

    def _peek(self) -> Any:
        """The lock's snapshot for an error message; :data:`UNREAD` if Redis fails."""
        try:
            return self.info()
        except LockBackendError:
            return UNREAD

    async def _apeek(self) -> Any:
        """:meth:`_peek` for asyncio."""
        try:
            return await self.ainfo()
        except LockBackendError:
            return UNREAD

    def locked(self) -> bool:
        """Whether anybody holds the lock."""
        return self.info() is not None

    async def alocked(self) -> bool:
        """:meth:`locked` for asyncio."""
        return await self.ainfo() is not None

    def owned(self) -> bool:
        """Whether the caller's owner holds the lock right now (asks Redis)."""
        return self._owned_by(self.info(), self.owner)

    def aowned(self) -> Coroutine[Any, Any, bool]:
        """:meth:`owned` for asyncio (the owner is the calling task)."""
        owner = self.owner

        async def owned() -> bool:
            return self._owned_by(await self.ainfo(), owner)

        return owned()

    def ttl(self) -> float | None:
        """Remaining lease in seconds; None when not held, ``math.inf`` when held without expiry.

        For a semaphore or read-write lock: the caller's own hold's (None when the
        caller does not hold it; ``locks.get(name).holders`` has everybody's).
        """
        return self._remaining(self.info(), self.owner)

    def attl(self) -> Coroutine[Any, Any, float | None]:
        """:meth:`ttl` for asyncio."""
        owner = self.owner

        async def ttl() -> float | None:
            return self._remaining(await self.ainfo(), owner)

        return ttl()

    def _remaining(self, info: LockInfo | None, owner: str) -> float | None:
        if info is None:
            return None
        if self._shared is not None:  # the caller's own hold's lease
            hold = self._hold_of(info, owner)
            if hold is None:
                return None
            ttl = hold.ttl
        else:
            ttl = info.ttl
        return math.inf if ttl is None else ttl

    def _owned_by(self, info: LockInfo | None, owner: str) -> bool:
        return info is not None and self._hold_of(info, owner) is not None

    def _hold_of(self, info: LockInfo, owner: str) -> HolderInfo | None:
        """*owner*'s hold among *info*'s holders, in this lock's mode."""
        mode = self._kind.mode_name
        return next((h for h in info.holders if h.owner == owner and h.mode == mode), None)

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
        if self._holds.mark_lost(owner, reason) is None:
            return
        logger.error("redislock: lock %r lost: %s", self.name, reason)
        signals.lock_lost.send(sender=Lock, lock=self, name=self.name, owner=owner, reason=reason)

    # -- store-enforced fencing (docs/fencing.md) ----------------------------------

    def check(self) -> int:
        """Ask Redis, in one round trip, whether the caller's hold is still current;
        return its fencing token, else raise
        :class:`~django_redislock.exceptions.StaleFencingToken` (a :class:`LockLost`)."""
        from ..fencing import current

        token = current.held_token(self.name, self._kind.primitive, self.fencing_token)
        return current.check(self._source.backend(), self.name, token)

    def acheck(self) -> Coroutine[Any, Any, int]:
        """:meth:`check` for asyncio (the hold is the calling task's)."""
        from ..fencing import current

        token = current.held_token(self.name, self._kind.primitive, self.fencing_token)

        async def check() -> int:
            return await current.acheck(self._source.abackend(), self.name, token)

        return check()

    def guarded(self) -> GuardedRedis:
        """Writes to Redis that are made only while the caller's hold is current (each
        atomic with its check, one round trip): ``held.guarded().incrby(key, 5)``. See
        :class:`~django_redislock.fencing.GuardedRedis`."""
        from ..fencing import GuardedRedis, current

        token = current.held_token(self.name, self._kind.primitive, self.fencing_token)
        return GuardedRedis(self._source, self.name, token)

    # -- context managers ------------------------------------------------------

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise self._not_acquired()
        return self

    async def __aenter__(self) -> Lock:
        if not await self.aacquire():
            raise self._not_acquired()
        return self

    def _not_acquired(self) -> LockNotAcquired:
        within = "" if not self.timeout or not self.blocking else f" within {self.timeout:g} s"
        return LockNotAcquired(f"could not acquire lock {self.name!r}{within}", name=self.name)

    def _leave(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None = None,
        tb: TracebackType | None = None,
        *,
        prior: Prior | None = None,
    ) -> None:
        """Leave the ``with`` block (this is ``__exit__``): release the hold; *prior*, a
        call sent just before the release, in its round trip (a guard's cooldown)."""
        owner, made_up = self._caller()
        hold = self._holds.get(owner)
        try:
            self._release(owner, made_up, False, False, prior)
        except (LockBackendError, LockNotOwned) as error:
            self._end_block(owner, hold, exc_type, error)
        else:
            self._end_block(owner, hold, exc_type, None)

    __exit__ = _leave

    async def _aleave(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None = None,
        tb: TracebackType | None = None,
        *,
        prior: Prior | None = None,
    ) -> None:
        """:meth:`_leave` for ``async with`` (this is ``__aexit__``)."""
        owner, made_up = self._caller()
        hold = self._holds.get(owner)
        try:
            await self._arelease(owner, made_up, False, prior)
        except (LockBackendError, LockNotOwned) as error:
            self._end_block(owner, hold, exc_type, error)
        else:
            self._end_block(owner, hold, exc_type, None)

    __aexit__ = _aleave

    def _end_block(
        self,
        owner: str,
        hold: Hold | None,
        exc_type: type[BaseException] | None,
        error: LockBackendError | LockNotOwned | None,
    ) -> None:
        """What leaving a ``with`` / ``async with`` block means, given how its release went."""
        reason = hold.lost_reason if hold is not None else None
        if error is None and reason is None:
            return  # the common end: released, never lost
        if isinstance(error, LockBackendError):
            self._stop_renewing(hold)
            if reason is None:
                raise error
            # Lost already (no renewal was confirmed in time): that is the news,
            # not that Redis is still unreachable.
            self._exit_lost(reason, exc_type, cause=error)
            return
        if isinstance(error, LockNotOwned):
            reason = self._lost_at_exit(owner, hold, reason)
        self._exit_lost(reason, exc_type)

    def _stop_renewing(self, hold: Hold | None) -> None:
        # The block is over: keep the hold so release() can be retried, but
        # stop renewing it, so that without a retry the lease runs out.
        if hold is not None and hold.watch is not None:
            watchdog.unwatch(hold.watch)
            hold.watch = None

    def _lost_at_exit(self, owner: str, hold: Hold | None, reason: str | None) -> str:
        reason = reason or "its lease expired or it was released by someone else"
        if hold is not None and hold.lost_reason is None:
            hold.lost_reason = reason
            signals.lock_lost.send(
                sender=Lock, lock=self, name=self.name, owner=owner, reason=reason
            )
        return reason

    def _exit_lost(
        self,
        reason: str | None,
        exc_type: type[BaseException] | None,
        cause: BaseException | None = None,
    ) -> None:
        if reason is not None:
            message = f"lock {self.name!r} was lost while held: {reason}"
            if self.raise_on_lost and exc_type is None:
                raise LockLost(message, name=self.name) from cause
            logger.warning("redislock: %s", message)

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} ttl={self.ttl_seconds}>"


def _start_clock() -> float:
    """The start of an acquire call, for the signals' ``waited`` (0: nobody listens)."""
    if signals.lock_acquired.receivers or signals.lock_not_acquired.receivers:
        return monotonic()
    return 0.0
