""":class:`LockManager`: where locks are made, listed and force-released.

``django_redislock.locks`` is the default manager (like ``django.core.cache.cache``):
it uses the ``REDISLOCK_*`` settings, read lazily, so ``override_settings`` in
tests takes effect on the next call. Every inspection and operator action has an
asyncio twin with Django's ``a`` prefix (``aget``, ``aactive``, ...).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from .. import signals
from ..client.source import BackendSource, BlockingBackend, default_source
from ..engine.backends.base import AsyncBackend, Backend
from ..engine.calls import Call, ExtendResult
from ..engine.contention import Contention, overview
from ..engine.driver import call_async, call_sync
from ..engine.history import HistoryEvent, histories_by_key, history_call, parse_history
from ..engine.info import LockInfo
from ..engine.lua.operator import force_extend_script, force_release_script
from ..engine.shaping_state import ShapingState, decode_state, state_call
from ..engine.validate import to_millis, validate_name, validate_seconds
from ..exceptions import LockBackendError, about_lock
from .lock import Lock
from .rwlock import ReadWriteLock
from .semaphore import Semaphore
from .transactions import AtomicLock

if TYPE_CHECKING:
    from ..election import Election
    from ..fencing import GuardedRedis
    from .lock_set import LockSet

__all__ = ["ExtendResult", "LockManager", "locks"]

logger = logging.getLogger("django_redislock")


class LockManager:
    """Creates :class:`Lock` objects and inspects the locks held in one Redis.

    :param cache_alias: the Django cache whose Redis client to use (default:
        ``REDISLOCK_URL`` if set, else ``REDISLOCK_CACHE``).
    :param url: a Redis URL to use instead of a cache alias.
    :param key_prefix: the key prefix (default ``REDISLOCK_KEY_PREFIX``).
    :param client: a ready blocking redis-py client to use as it is (advanced;
        takes precedence over *cache_alias* and *url*). Async calls then use a
        ``redis.asyncio`` client with the same connection settings.
    :param async_client: a ready ``redis.asyncio`` client for the async calls
        (advanced; it belongs to one event loop). Renewals, which run in a
        thread, use a blocking client with the same settings.

    :param redlock_caches: cache aliases or Redis URLs of independent masters:
        the locks are then Redlock quorum locks over them (see docs/redlock.md;
        the default manager does this when ``REDISLOCK_REDLOCK_CACHES`` is set).

    A client of the wrong kind for its argument raises TypeError.
    """

    def __init__(
        self,
        cache_alias: str | None = None,
        *,
        url: str | None = None,
        key_prefix: str | None = None,
        client: Any = None,
        async_client: Any = None,
        redlock_caches: Sequence[str] | None = None,
    ) -> None:
        explicit = (cache_alias, url, key_prefix, client, async_client, redlock_caches)
        if all(value is None for value in explicit):
            self.source = default_source
        else:
            self.source = BackendSource(
                cache_alias, url=url, key_prefix=key_prefix, client=client,
                async_client=async_client,
                redlock=redlock_caches,
            )  # fmt: skip
        self.cache_alias = cache_alias
        self.url = url
        self.key_prefix = key_prefix

    def backend(self) -> BlockingBackend:
        """The blocking backend: the resolved client and key layout (advanced)."""
        return self.source.backend()

    @property
    def client(self) -> Any:
        """The blocking redis-py client the locks use."""
        return self.backend().client

    def lock(self, name: str, **options: Any) -> Lock:
        """Return a :class:`Lock` called *name*; see :class:`Lock` for the options."""
        return Lock(name, manager=self, **options)

    def atomic(
        self,
        name: str,
        *,
        using: str | None = None,
        savepoint: bool = True,
        durable: bool = False,
        **options: Any,
    ) -> AtomicLock:
        """Hold the lock *name* over a database transaction, and release it only after
        the transaction has committed or rolled back, so the next holder reads what this
        one committed::

            with locks.atomic(f"report:{pk}", timeout=10) as held:
                ...                 # inside transaction.atomic(using=using)

        Entering acquires the lock (``LockNotAcquired`` as ``with lock:``, and no
        transaction is opened), then opens ``transaction.atomic(using, savepoint,
        durable)``. Inside an outer atomic block, the release waits for the outermost
        block of every database of this thread that is in one (see docs/locks.md); the
        watchdog renews the lease meanwhile. The *options* are :class:`Lock`'s.
        """
        lock = self.lock(name, **options)
        return AtomicLock(lock, using=using, savepoint=savepoint, durable=durable)

    def semaphore(self, name: str, limit: int, **options: Any) -> Semaphore:
        """Return a :class:`Semaphore` of *limit* permits called *name* (at most *limit*
        holders at once); the options are :class:`Lock`'s."""
        return Semaphore(name, limit, manager=self, **options)

    def rw_lock(self, name: str, **options: Any) -> ReadWriteLock:
        """Return a :class:`ReadWriteLock` called *name*: its ``read()`` may be held by
        many owners at once, its ``write()`` by one; the options are :class:`Lock`'s."""
        return ReadWriteLock(name, manager=self, **options)

    def election(self, name: str, **options: Any) -> Election:
        """Return an :class:`~django_redislock.election.Election` called *name* (one
        candidate); the options are ``Election``'s (``ttl``, ``purpose``, ``extra``)."""
        from ..election import Election

        return Election(name, manager=self, **options)

    # -- inspection ------------------------------------------------------------

    def get(self, name: str) -> LockInfo | None:
        """A snapshot of the lock called *name*, or None when nobody holds it."""
        try:
            infos = self.get_many([name])
        except LockBackendError as error:
            raise about_lock(error, name) from error.__cause__
        return infos[0] if infos else None

    async def aget(self, name: str) -> LockInfo | None:
        """:meth:`get` for asyncio."""
        try:
            infos = await self.aget_many([name])
        except LockBackendError as error:
            raise about_lock(error, name) from error.__cause__
        return infos[0] if infos else None

    def get_many(self, names: Sequence[str]) -> list[LockInfo]:
        """Snapshots of the locks called *names* that are held, in one round trip.

        Names nobody holds are left out; the order of *names* is kept.
        """
        backend = self.backend()
        return backend.load(_lock_keys(backend, names), waiters=True)

    async def aget_many(self, names: Sequence[str]) -> list[LockInfo]:
        """:meth:`get_many` for asyncio."""
        backend = self.source.abackend()
        return await backend.load(_lock_keys(backend, names), waiters=True)

    def scan_page(
        self,
        cursor: str = "0",
        *,
        pattern: str | None = None,
        count: int = 1000,
        waiters: bool = False,
    ) -> tuple[str, list[LockInfo]]:
        """One step of a walk over the held locks: ``(next cursor, snapshots)``.

        *cursor* is opaque: start with ``"0"``; the returned cursor is ``"0"``
        when the walk is complete (an unreadable cursor starts over). *pattern*
        is a SCAN MATCH pattern over lock keys (default: every lock under the
        prefix; see ``KeySpace.match_pattern``). A step may return no locks
        while the walk is not complete. Each snapshot has its queue's length;
        with *waiters*, also who waits (three more reads per lock).
        """
        backend = self.backend()
        pattern = pattern or backend.keyspace.match_pattern("")
        next_cursor, keys = backend.scan_page(pattern, cursor, count)
        return next_cursor, backend.load(keys, waiters=waiters)

    async def ascan_page(
        self,
        cursor: str = "0",
        *,
        pattern: str | None = None,
        count: int = 1000,
        waiters: bool = False,
    ) -> tuple[str, list[LockInfo]]:
        """:meth:`scan_page` for asyncio."""
        backend = self.source.abackend()
        pattern = pattern or backend.keyspace.match_pattern("")
        next_cursor, keys = await backend.scan_page(pattern, cursor, count)
        return next_cursor, await backend.load(keys, waiters=waiters)

    def active(
        self, prefix: str = "", *, batch_size: int = 500, waiters: bool = False
    ) -> Iterator[LockInfo]:
        """Iterate over the held locks whose name starts with *prefix*.

        Uses ``SCAN`` (never ``KEYS``); glob characters in *prefix* match
        themselves. Like SCAN, the listing is not a snapshot: a lock acquired or
        released meanwhile may or may not appear. The pattern matches lock keys
        only, so another tool's non-hash key under the prefix is listed too, as
        kind ``"foreign"``. With *waiters*, each snapshot lists who waits (see
        :meth:`scan_page`).
        """
        pattern = self.backend().keyspace.match_pattern(_prefix(prefix))
        cursor = "0"
        while True:
            cursor, infos = self.scan_page(
                cursor, pattern=pattern, count=batch_size, waiters=waiters
            )
            yield from infos
            if cursor == "0":
                return

    async def aactive(
        self, prefix: str = "", *, batch_size: int = 500, waiters: bool = False
    ) -> AsyncIterator[LockInfo]:
        """:meth:`active` for asyncio: ``async for info in locks.aactive("report:")``."""
        pattern = self.source.abackend().keyspace.match_pattern(_prefix(prefix))
        cursor = "0"
        while True:
            cursor, infos = await self.ascan_page(
                cursor, pattern=pattern, count=batch_size, waiters=waiters
            )
            for info in infos:
                yield info
            if cursor == "0":
                return

    def shaping(self, name: str) -> ShapingState:
        """How runs of the guarded key *name* are shaped right now (``@single_instance``'s
        ``rate``, ``cooldown``, ``coalesce``, ``debounce``): the starts in the rate window
        (whose length is read from Redis), the cooldown left, whether a coalesced call
        is pending, when a debounced run is due. One round trip, read-only; all zero for
        a key nothing shapes. Refused on Redlock (``ShapingUnsupported``)."""
        backend = self.backend()
        return decode_state(call_sync(state_call(backend, validate_name(name)), backend))

    async def ashaping(self, name: str) -> ShapingState:
        """:meth:`shaping` for asyncio."""
        backend = self.source.abackend()
        return decode_state(await call_async(state_call(backend, validate_name(name)), backend))

    def history(self, name: str) -> list[HistoryEvent]:
        """The recent events of the lock *name*, newest first: hand-offs, expiries
        someone waited through, waiters that gave up, operator releases (see
        :mod:`django_redislock.engine.history`). Empty on Redlock."""
        backend = self.backend()
        found = _history_call(backend, name)
        if found is None:
            return []
        call, key = found
        return parse_history(call_sync(call, backend), key)

    async def ahistory(self, name: str) -> list[HistoryEvent]:
        """:meth:`history` for asyncio."""
        backend = self.source.abackend()
        found = _history_call(backend, name)
        if found is None:
            return []
        call, key = found
        return parse_history(await call_async(call, backend), key)

    def contention(
        self, window: float = 3600.0, *, limit: int = 20, max_locks: int = 20_000
    ) -> tuple[list[Contention], bool]:
        """Which locks cost most waiting over the last *window* seconds: the *limit*
        worst groups (key templates, or lock names), from every lock's history
        (see :mod:`django_redislock.engine.contention`), and whether every history
        was read (False when more than *max_locks* names had one). Empty on
        Redlock, which records no history.
        """
        window = validate_seconds(window, "window")
        backend = self.backend()
        if backend.features.quorum:
            return [], True
        since = datetime.now(timezone.utc) - timedelta(seconds=window)
        # The histories are kept per hash slot (at most 16,384 rings), each event naming
        # its lock: every slot's ring is read, and the names counted.
        keyspace = backend.keyspace
        histories: dict[str, list[HistoryEvent]] = {}
        pattern, cursor, complete = keyspace.slot_pattern(), "0", True
        while True:
            cursor, keys = backend.scan_page(pattern, cursor, 1000)
            texts = [k.decode("utf-8", "replace") if isinstance(k, bytes) else k for k in keys]
            calls = [history_call(key.encode(), key) for key in texts]
            for reply in backend.run_many(calls):
                if isinstance(reply, Exception):
                    continue
                for key, events in histories_by_key(reply).items():
                    name = keyspace.name_from_key(key)
                    if name is None:
                        continue
                    if name not in histories and len(histories) >= max_locks:
                        complete = False
                        continue
                    histories.setdefault(name, []).extend(events)
            if cursor == "0":
                return overview(list(histories.items()), since, limit), complete

    # -- store-enforced fencing and several locks (docs/fencing.md, docs/locks.md) --

    def is_current(self, name: str, token: int | None) -> bool:
        """Whether the lock *name* is held with the fencing token *token* now (one round
        trip; a token handed to another process works as well as a hold's own)."""
        from ..fencing import current

        return current.is_current(self.backend(), name, token)

    async def ais_current(self, name: str, token: int | None) -> bool:
        """:meth:`is_current` for asyncio."""
        from ..fencing import current

        return await current.ais_current(self.source.abackend(), name, token)

    def guarded(self, name: str, token: int | None) -> GuardedRedis:
        """Writes to Redis made only while the lock *name* is held with *token* (see
        :class:`~django_redislock.fencing.GuardedRedis`); ``held.guarded()`` for a hold."""
        from ..fencing import GuardedRedis

        return GuardedRedis(self.source, name, token)

    def lock_many(self, names: Sequence[str], **options: Any) -> LockSet:
        """Several locks taken together, all or none, in one global order (no deadlock
        between callers): ``with locks.lock_many(["account:1", "account:2"], ttl=30,
        timeout=10) as held:``; free locks are taken in one round trip, and released
        in one. The *options* are :class:`Lock`'s; see
        :class:`~django_redislock.primitives.lock_set.LockSet`."""
        from .lock_set import LockSet

        return LockSet(names, self.lock, **options)

    # -- operator actions ------------------------------------------------------

    def force_release(
        self,
        name: str,
        *,
        owner: str | None = None,
        fencing_token: int | None = None,
        unowned_only: bool = False,
    ) -> bool:
        """Delete the lock *name* whoever holds it, and hand it to the next waiter.

        An operator action: it is logged at WARNING. With *owner* and/or
        *fencing_token*, the lock is released only if it still has that owner /
        token (so a lock that changed hands since it was looked at is left
        alone); with *unowned_only*, only if it still has neither (a key another
        tool wrote, as it was looked at). Returns True if a lock was released.
        """
        backend = self.backend()
        call = _force_release_call(backend, name, owner, fencing_token, unowned_only)
        before = self.get(name)
        reply = call_sync(call, backend)
        return _force_released(name, before, reply, owner, fencing_token)

    async def aforce_release(
        self,
        name: str,
        *,
        owner: str | None = None,
        fencing_token: int | None = None,
        unowned_only: bool = False,
    ) -> bool:
        """:meth:`force_release` for asyncio."""
        backend = self.source.abackend()
        call = _force_release_call(backend, name, owner, fencing_token, unowned_only)
        before = await self.aget(name)
        reply = await call_async(call, backend)
        return _force_released(name, before, reply, owner, fencing_token)

    def force_extend(
        self,
        name: str,
        seconds: float,
        *,
        owner: str | None = None,
        fencing_token: int | None = None,
        unowned_only: bool = False,
    ) -> ExtendResult:
        """Add *seconds* to the lease of the lock *name*, whoever holds it (operator action).

        With *owner* and/or *fencing_token* the lease is extended only if the
        lock still has that owner / token; with *unowned_only*, only if it has
        neither (see :meth:`force_release`). The lock's recorded lease (what its
        holder's watchdog renews to) is unchanged: the extra time runs down, then
        normal renewal resumes. See :class:`~django_redislock.engine.calls.ExtendResult`.
        """
        backend = self.backend()
        call = _force_extend_call(backend, name, seconds, owner, fencing_token, unowned_only)
        return _force_extended(name, seconds, call_sync(call, backend))

    async def aforce_extend(
        self,
        name: str,
        seconds: float,
        *,
        owner: str | None = None,
        fencing_token: int | None = None,
        unowned_only: bool = False,
    ) -> ExtendResult:
        """:meth:`force_extend` for asyncio."""
        backend = self.source.abackend()
        call = _force_extend_call(backend, name, seconds, owner, fencing_token, unowned_only)
        return _force_extended(name, seconds, await call_async(call, backend))

    def __repr__(self) -> str:
        return f"<LockManager cache={self.cache_alias!r} url={self.url!r}>"


def _lock_keys(backend: Backend | AsyncBackend, names: Sequence[str]) -> list[str]:
    return [backend.keyspace.keys(validate_name(n)).lock for n in names]


def _history_call(backend: Backend | AsyncBackend, name: str) -> tuple[Call, str] | None:
    """The call that reads the history of *name*'s slot, and *name*'s lock key (whose
    events in it are *name*'s)."""
    if backend.features.quorum:  # Redlock records no history
        return None
    keys = backend.keyspace.keys(validate_name(name))
    return history_call(keys.slot.encode(), name), keys.lock


def _prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
    return prefix


def _force_release_call(
    backend: Backend | AsyncBackend,
    name: str,
    owner: str | None,
    fencing_token: int | None,
    unowned_only: bool,
) -> Call:
    keys = backend.keyspace.keys(validate_name(name)).shared
    args = (
        owner or "",
        "" if fencing_token is None else str(fencing_token),
        backend.retention_arg,
        "1" if unowned_only else "",
    )
    return Call(force_release_script, keys, args, "force-release the lock", name)


def _force_released(
    name: str, before: LockInfo | None, reply: Any, owner: str | None, fencing_token: int | None
) -> bool:
    released = int(reply) == 1
    if released:
        # The holders the script matched, as they were looked at just before.
        holders = before.holders_matching(owner, fencing_token) if before else ()
        logger.warning(
            "redislock: lock %r force-released (%s)",
            name,
            "; ".join(f"{h.mode} owner {h.owner}, fencing token {h.fencing_token}" for h in holders)
            or f"owner {owner or '?'}, fencing token {fencing_token or '?'}",
        )
    signals.force_released.send(sender=LockManager, name=name, info=before, released=released)
    return released


def _force_extend_call(
    backend: Backend | AsyncBackend,
    name: str,
    seconds: float,
    owner: str | None,
    fencing_token: int | None,
    unowned_only: bool,
) -> Call:
    keys = backend.keyspace.keys(validate_name(name)).shared
    ms = to_millis(validate_seconds(seconds, "seconds"), "seconds")
    args = (
        owner or "",
        "" if fencing_token is None else str(fencing_token),
        ms,
        "1" if unowned_only else "",
    )
    return Call(force_extend_script, keys, args, "extend the lock", name)


def _force_extended(name: str, seconds: float, reply: Any) -> ExtendResult:
    result = ExtendResult.from_reply(reply)
    if result.extended:
        logger.warning("redislock: lease of lock %r extended by %ss by an operator", name, seconds)
    return result


#: The default manager, configured by the ``REDISLOCK_*`` settings.
locks = LockManager()
