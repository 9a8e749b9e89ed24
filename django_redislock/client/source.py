"""Settings to backends: which Redis the locks use, resolved once and cached.

Like Django's cache handler turns ``CACHES`` into cache objects, a
:class:`BackendSource` turns the ``REDISLOCK_*`` settings (or an explicit
client) into engine backends: one blocking backend, and one asyncio backend per
event loop (redis.asyncio connections belong to the loop that made them; each
is closed with its loop). Both are forgotten when a ``REDISLOCK_*`` setting or
``CACHES`` changes, so ``override_settings`` works.

``default_source`` serves ``django_redislock.locks`` and every ``Lock`` made
without a manager.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from django.core.signals import setting_changed

from ..conf import get_setting, setting
from ..engine.backends.aredlock import AsyncRedlockBackend
from ..engine.backends.cluster import AsyncClusterBackend, ClusterBackend
from ..engine.backends.redlock import RedlockBackend
from ..engine.backends.single import AsyncSingleBackend, SingleBackend
from ..engine.keys import KeySpace
from ..engine.validate import to_millis
from .connection import (
    async_twin,
    is_async_client,
    is_cluster_client,
    provisional,
    redlock_clients,
    resolve_client,
    sync_twin,
    usable_client,
)

#: The blocking backends a source makes: one Redis (plain or Sentinel), a cluster,
#: or a Redlock over several masters.
BlockingBackend = SingleBackend | ClusterBackend | RedlockBackend
#: Their asyncio twins.
LoopBackend = AsyncSingleBackend | AsyncClusterBackend | AsyncRedlockBackend


class BackendSource:
    """Resolves the backends of one lock manager.

    :param cache_alias: the Django cache whose Redis client to use.
    :param url: a Redis URL to use instead of a cache alias.
    :param key_prefix: the key prefix (default ``REDISLOCK_KEY_PREFIX``).
    :param client: a ready blocking redis-py client.
    :param async_client: a ready ``redis.asyncio`` client (bound to its event loop).
    :param redlock: cache aliases or URLs of independent masters for a Redlock
        (default, when nothing else is given: ``REDISLOCK_REDLOCK_CACHES``).
    """

    def __init__(
        self,
        cache_alias: str | None = None,
        *,
        url: str | None = None,
        key_prefix: str | None = None,
        client: Any = None,
        async_client: Any = None,
        redlock: Sequence[str] | None = None,
    ) -> None:
        usable_client(client, "the client given as client=")
        usable_client(async_client, "the client given as async_client=")
        if client is not None and is_async_client(client):
            raise TypeError(
                "client= takes a blocking redis-py client, but this is a redis.asyncio "
                "client: pass it as async_client= instead"
            )
        if async_client is not None and not is_async_client(async_client):
            raise TypeError(
                "async_client= takes a redis.asyncio client, but this is a "
                f"{type(async_client).__name__}: pass a blocking client as client= instead"
            )
        self.cache_alias = cache_alias
        self.url = url
        self.key_prefix = key_prefix
        self._client = client
        self._async_client = async_client
        self._redlock = redlock
        self._backend: BlockingBackend | None = None
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopBackend]
        self._async = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        setting_changed.connect(self._on_setting_changed, weak=True)

    def _on_setting_changed(self, setting: str, **kwargs: Any) -> None:
        if setting.startswith("REDISLOCK_") or setting == "CACHES":
            self._backend = None
            self._async = weakref.WeakKeyDictionary()

    def _keyspace_and_retention(self) -> tuple[KeySpace, int]:
        retention = setting("REDISLOCK_FENCE_RETENTION")
        keyspace = KeySpace(self.key_prefix or setting("REDISLOCK_KEY_PREFIX"))
        return keyspace, to_millis(retention, "REDISLOCK_FENCE_RETENTION")

    def _backend_options(self) -> dict[str, Any]:
        """Keyword options every backend takes, from the settings."""
        wait = setting("REDISLOCK_WAIT_TIMEOUT")
        return {"wait_timeout_ms": to_millis(wait, "REDISLOCK_WAIT_TIMEOUT")}

    def backend(self) -> BlockingBackend:
        """The blocking backend (resolved on first use, then cached)."""
        backend = self._backend
        if backend is None:
            with self._lock:
                backend = self._backend
                masters = self._redlock_masters()
                if backend is None and masters:
                    backend = self._backend = RedlockBackend(
                        redlock_clients(masters),
                        *self._keyspace_and_retention(),
                        **self._backend_options(),
                        monotonic_fencing=setting("REDISLOCK_REDLOCK_MONOTONIC_FENCING"),
                    )
                if backend is None:
                    if self._client is not None:
                        client = self._client
                    elif self._async_client is not None:
                        client = sync_twin(self._async_client)
                    else:
                        client = resolve_client(self.cache_alias, self.url)
                    backend_class = ClusterBackend if is_cluster_client(client) else SingleBackend
                    backend = backend_class(
                        client, *self._keyspace_and_retention(), **self._backend_options()
                    )
                    if not provisional(client):  # else made again, and asked again, next call
                        self._backend = backend
        return backend

    def _redlock_masters(self) -> Sequence[str]:
        """The Redlock masters: given explicitly, else the setting when nothing else is."""
        if self._redlock is not None:
            return self._redlock
        explicit = (self.cache_alias, self.url, self._client, self._async_client)
        if any(value is not None for value in explicit):
            return ()
        return get_setting("REDISLOCK_REDLOCK_CACHES") or ()

    def abackend(self) -> LoopBackend:
        """The asyncio backend of the running event loop (made on first use in each loop)."""
        loop = asyncio.get_running_loop()
        backend = self._async.get(loop)
        if backend is None:
            keep = True
            if self._async_client is not None:
                backend = _async_class(self._async_client)(
                    self._async_client,
                    *self._keyspace_and_retention(),
                    **self._backend_options(),
                )
            elif isinstance(sync := self.backend(), RedlockBackend):
                backend = AsyncRedlockBackend(
                    sync.clients,
                    sync.keyspace,
                    sync.retention_ms,
                    wait_timeout_ms=sync.wait_timeout_ms,
                    monotonic_fencing=sync.features.monotonic_fencing,
                )
                _close_with_loop(loop, backend)
            else:
                # Made of a provisional client (the server was not reached): this call's only.
                keep = not provisional(sync.client)
                twin = async_twin(sync.client)
                backend = _async_class(twin)(
                    twin,
                    sync.keyspace,
                    sync.retention_ms,
                    wait_timeout_ms=sync.wait_timeout_ms,
                )
                if keep:
                    _close_with_loop(loop, backend)
            if keep:
                self._async[loop] = backend
        return backend


def _async_class(client: Any) -> type[LoopBackend]:
    """The asyncio backend class for *client*: the cluster one for a ``RedisCluster``."""
    return AsyncClusterBackend if is_cluster_client(client) else AsyncSingleBackend


def _close_with_loop(loop: asyncio.AbstractEventLoop, backend: LoopBackend) -> None:
    """Close *backend*'s connections when *loop* closes (they cannot outlive it)."""
    original = loop.close

    def close() -> None:
        if not loop.is_closed() and not loop.is_running():
            try:
                loop.run_until_complete(backend.aclose())
            except Exception:  # closing is best effort: the loop is going away
                pass
        original()

    loop.close = close  # type: ignore[method-assign]


#: The source of ``django_redislock.locks`` and of every Lock made without a manager.
default_source = BackendSource()
