""":class:`LockManager`: where locks are made, listed and force-released.

``django_redislock.locks`` is the default manager (like ``django.core.cache.cache``):
it uses the ``REDISLOCK_*`` settings, read lazily, so ``override_settings`` in
tests takes effect on the next call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.signals import setting_changed
from redis.exceptions import RedisError, ResponseError

from . import signals
from .backend import Backend
from .conf import get_setting
from .connection import resolve_client
from .info import LockInfo
from .keys import KeySpace, to_millis, validate_name, validate_seconds
from .lock import Lock
from .scripts import backend_error, force_extend_script, force_release_script

logger = logging.getLogger("django_redislock")


@dataclass(frozen=True)
class ExtendResult:
    """The outcome of :meth:`LockManager.force_extend`."""

    #: One of "extended", "gone", "changed" (owner/token differ), "no-expiry".
    status: str
    #: The new remaining lease in seconds when extended, else None.
    ttl: float | None = None

    @property
    def extended(self) -> bool:
        """True if the lease was lengthened."""
        return self.status == "extended"


class LockManager:
    """Creates :class:`Lock` objects and inspects the locks held in one Redis.

    :param cache_alias: the Django cache whose Redis client to use (default:
        ``REDISLOCK_URL`` if set, else ``REDISLOCK_CACHE``).
    :param url: a Redis URL to use instead of a cache alias.
    :param key_prefix: the key prefix (default ``REDISLOCK_KEY_PREFIX``).
    :param client: a ready redis-py client to use as it is (advanced; takes
        precedence over *cache_alias* and *url*).
    """

    def __init__(
        self,
        cache_alias: str | None = None,
        *,
        url: str | None = None,
        key_prefix: str | None = None,
        client: Any = None,
    ) -> None:
        self.cache_alias = cache_alias
        self.url = url
        self.key_prefix = key_prefix
        self._explicit_client = client
        self._backend: Backend | None = None
        self._lock = threading.Lock()
        setting_changed.connect(self._on_setting_changed, weak=True)

    def _on_setting_changed(self, setting: str, **kwargs: Any) -> None:
        if setting.startswith("REDISLOCK_") or setting == "CACHES":
            self._backend = None

    def backend(self) -> Backend:
        """The resolved Redis client and key layout (resolved once, then cached)."""
        backend = self._backend
        if backend is None:
            with self._lock:
                backend = self._backend
                if backend is None:
                    retention = validate_seconds(
                        get_setting("REDISLOCK_FENCE_RETENTION"), "REDISLOCK_FENCE_RETENTION"
                    )
                    backend = self._backend = Backend(
                        client=self._explicit_client or resolve_client(self.cache_alias, self.url),
                        keyspace=KeySpace(self.key_prefix or get_setting("REDISLOCK_KEY_PREFIX")),
                        retention_ms=to_millis(retention, "REDISLOCK_FENCE_RETENTION"),
                    )
        return backend

    @property
    def client(self) -> Any:
        """The redis-py client the locks use."""
        return self.backend().client

    def lock(self, name: str, **options: Any) -> Lock:
        """Return a :class:`Lock` called *name*; see :class:`Lock` for the options."""
        return Lock(name, manager=self, **options)

    def get(self, name: str) -> LockInfo | None:
        """A snapshot of the lock called *name*, or None when nobody holds it."""
        validate_name(name)
        backend = self.backend()
        key = backend.keyspace.keys(name).lock
        try:
            infos = load_infos(backend.client, backend.keyspace, [key])
        except RedisError as exc:
            raise backend_error(exc, "read the lock", name) from exc
        return infos[0] if infos else None

    def get_many(self, names: Sequence[str]) -> list[LockInfo]:
        """Snapshots of the locks called *names* that are held, in one round trip.

        Names nobody holds are left out; the order of *names* is kept.
        """
        backend = self.backend()
        keyspace = backend.keyspace
        keys = [keyspace.keys(validate_name(n)).lock for n in names]
        try:
            return load_infos(backend.client, keyspace, keys)
        except RedisError as exc:
            raise backend_error(exc, "read the locks", None) from exc

    def scan_page(
        self, cursor: str = "0", *, pattern: str | None = None, count: int = 1000
    ) -> tuple[str, list[LockInfo]]:
        """One SCAN step over the held locks: ``(next cursor, snapshots)``.

        *cursor* is opaque: start with ``"0"``; the returned cursor is ``"0"``
        when the walk is complete. *pattern* is a SCAN MATCH pattern over lock
        keys (default: every lock under the prefix; see
        :meth:`KeySpace.match_pattern`). A step may return no locks while the
        walk is not complete.
        """
        backend = self.backend()
        keyspace = backend.keyspace
        if pattern is None:
            pattern = keyspace.match_pattern("")
        try:
            start = int(cursor)
        except ValueError:
            start = 0  # a cursor from another topology or a stale URL: start over
        try:
            next_cursor, keys = backend.client.scan(start, match=pattern, count=count)
            infos = load_infos(backend.client, keyspace, list(keys)) if keys else []
        except RedisError as exc:
            raise backend_error(exc, "list the locks", None) from exc
        return str(int(next_cursor)), infos

    def active(self, prefix: str = "", *, batch_size: int = 500) -> Iterator[LockInfo]:
        """Iterate over the held locks whose name starts with *prefix*.

        Uses ``SCAN`` (never ``KEYS``); glob characters in *prefix* match
        themselves. Like SCAN, the listing is not a snapshot: a lock acquired or
        released meanwhile may or may not appear.
        """
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        backend = self.backend()
        keyspace = backend.keyspace
        pattern = keyspace.match_pattern(prefix)
        client = backend.client
        try:
            keys: list[Any] = []
            # The pattern matches lock keys only (companion keys are named
            # "<prefix>:fence:{...}" etc.); no TYPE filter, so another tool's
            # non-hash key under the prefix is listed too, as kind "foreign".
            for key in client.scan_iter(match=pattern, count=batch_size):
                keys.append(key)
                if len(keys) >= batch_size:
                    yield from load_infos(client, keyspace, keys)
                    keys = []
            if keys:
                yield from load_infos(client, keyspace, keys)
        except RedisError as exc:
            raise backend_error(exc, "list the locks", None) from exc

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
        validate_name(name)
        backend = self.backend()
        keys = backend.keyspace.keys(name)
        before = self.get(name)
        try:
            result = int(
                force_release_script(
                    backend.client,
                    keys.all,
                    [
                        owner or "",
                        "" if fencing_token is None else str(fencing_token),
                        backend.retention_ms,
                        "1" if unowned_only else "",
                    ],
                )
            )
        except RedisError as exc:
            raise backend_error(exc, "force-release the lock", name) from exc
        released = result == 1
        if released:
            logger.warning(
                "redislock: lock %r force-released (owner %s, fencing token %s)",
                name,
                before.owner if before else "?",
                before.fencing_token if before else "?",
            )
        signals.force_released.send(sender=LockManager, name=name, info=before, released=released)
        return released

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
        normal renewal resumes. See :class:`ExtendResult`.
        """
        validate_name(name)
        ms = to_millis(validate_seconds(seconds, "seconds"), "seconds")
        backend = self.backend()
        args = [
            owner or "",
            "" if fencing_token is None else str(fencing_token),
            ms,
            "1" if unowned_only else "",
        ]
        try:
            reply = int(
                force_extend_script(backend.client, [backend.keyspace.keys(name).lock], args)
            )
        except RedisError as exc:
            raise backend_error(exc, "extend the lock", name) from exc
        if reply > 0:
            result = ExtendResult("extended", reply / 1000.0)
        else:
            result = ExtendResult({0: "gone", -1: "changed", -2: "no-expiry"}[reply])
        if result.extended:
            logger.warning(
                "redislock: lease of lock %r extended by %ss by an operator", name, seconds
            )
        return result

    def __repr__(self) -> str:
        return f"<LockManager cache={self.cache_alias!r} url={self.url!r}>"


def load_infos(client: Any, keyspace: KeySpace, keys: list[Any]) -> list[LockInfo]:
    """Snapshot the locks at *keys* in one pipelined round trip.

    Keys that are gone meanwhile, or are not lock keys, are skipped; a key
    another tool wrote under the prefix shows with what is known (kind
    ``"foreign"``). Redis errors other than a wrong key type are raised.
    """
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
        pipe.pttl(key)
    replies = pipe.execute(raise_on_error=False)
    infos: list[LockInfo] = []
    for i, raw_key in enumerate(keys):
        fields, pttl = replies[2 * i], replies[2 * i + 1]
        if isinstance(pttl, Exception):
            raise pttl
        if isinstance(fields, ResponseError) and "WRONGTYPE" in str(fields):
            fields = None  # not a hash: another tool's key
        elif isinstance(fields, Exception):
            raise fields
        key = raw_key.decode("utf-8", "replace") if isinstance(raw_key, bytes) else str(raw_key)
        name = keyspace.name_from_key(key)
        if name is not None and int(pttl) != -2:
            infos.append(LockInfo.from_redis(name, key, fields, int(pttl)))
    return infos


#: The default manager, configured by the ``REDISLOCK_*`` settings.
locks = LockManager()
