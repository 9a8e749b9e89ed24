"""One Redis master (plain or behind Sentinel): the sync and the asyncio backend.

Both share everything but the I/O: how replies of a snapshot load are read,
how a NOSCRIPT is answered, what a failed call raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError, RedisError, ResponseError

from ..awakeup import AsyncWakeHub
from ..calls import Call
from ..info import LockInfo
from ..keys import KeySpace
from ..scripts import Script
from ..wakeup import WakeHub, hub_for
from .base import (
    DEFAULT_WAIT_TIMEOUT_MS,
    BackendFeatures,
    backend_error,
    batch_wait,
    call_error,
    make_fork_safe,
    replicated,
    replicated_results,
)


class _Single:
    """What both single-master backends hold."""

    features = BackendFeatures()

    def __init__(
        self,
        client: Any,
        keyspace: KeySpace,
        retention_ms: int,
        *,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
    ) -> None:
        self.client = client
        self.keyspace = keyspace
        self.retention_ms = retention_ms
        self.retention_arg = str(retention_ms).encode()
        #: How long ``WAIT`` waits for the replicas a call asks for (ms).
        self.wait_timeout_ms = wait_timeout_ms

    def _infos(self, keys: Sequence[Any], replies: list[Any]) -> list[LockInfo]:
        infos: list[LockInfo] = []
        for i, raw_key in enumerate(keys):
            fields, pttl = replies[2 * i], replies[2 * i + 1]
            if isinstance(pttl, Exception):
                raise backend_error(pttl, "read the locks", None)
            if isinstance(fields, ResponseError) and "WRONGTYPE" in str(fields):
                fields = None  # not a hash: another tool's key
            elif isinstance(fields, Exception):
                raise backend_error(fields, "read the locks", None)
            key = raw_key.decode("utf-8", "replace") if isinstance(raw_key, bytes) else raw_key
            name = self.keyspace.name_from_key(key)
            if name is not None and int(pttl) != -2:
                infos.append(LockInfo.from_redis(name, key, fields, int(pttl)))
        return infos

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.client!r} prefix={self.keyspace.prefix!r}>"


class SingleBackend(_Single):
    """A blocking backend on one redis-py client."""

    def __init__(
        self,
        client: Any,
        keyspace: KeySpace,
        retention_ms: int,
        *,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
    ) -> None:
        super().__init__(client, keyspace, retention_ms, wait_timeout_ms=wait_timeout_ms)
        make_fork_safe(client)

    def run(self, call: Call) -> Any:
        """Run *call* with EVALSHA (loading the script on NOSCRIPT); with
        ``call.replicas``, followed by ``WAIT`` on the same connection."""
        if call.replicas:
            return self._run_replicated(call)
        client, script = self.client, call.script
        try:
            try:
                return client.evalsha(script.sha, len(call.keys), *call.keys, *call.args)
            except NoScriptError:
                client.script_load(script.source)
                return client.evalsha(script.sha, len(call.keys), *call.keys, *call.args)
        except RedisError as exc:
            raise call_error(exc, call) from exc

    def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """Run *calls* in one pipelined round trip (loading scripts once on NOSCRIPT),
        followed by one ``WAIT`` on the same connection when any asks for replicas."""
        if not calls:
            return []
        results, acks = self._pipelined(calls)
        results = [
            backend_error(r, c.action, c.name) if isinstance(r, Exception) else r
            for c, r in zip(calls, results, strict=True)
        ]
        return replicated_results(calls, results, acks) if acks is not None else results

    def _run_replicated(self, call: Call) -> Any:
        results, acks = self._pipelined([call])
        return replicated(call, results[0], acks)

    def _pipelined(self, calls: Sequence[Call]) -> tuple[list[Any], Any]:
        wait = batch_wait(calls)
        try:
            for attempt in range(2):
                pipe = self.client.pipeline(transaction=False)
                for call in calls:
                    pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
                if wait:
                    pipe.execute_command("WAIT", wait, self.wait_timeout_ms)
                results = pipe.execute(raise_on_error=False)
                missing = _missing_scripts(calls, results)
                if not missing or attempt:
                    break
                for script in missing:
                    self.client.script_load(script.source)
        except RedisError as exc:
            raise call_error(exc, calls[0]) from exc
        return (results[:-1], results[-1]) if wait else (results, None)

    def scan_page(self, pattern: str, cursor: str, count: int) -> tuple[str, list[str]]:
        """One SCAN step; a cursor that is not a number starts over."""
        start = _cursor(cursor)
        try:
            next_cursor, keys = self.client.scan(start, match=pattern, count=count)
        except RedisError as exc:
            raise backend_error(exc, "list the locks", None) from exc
        return str(int(next_cursor)), list(keys)

    def load(self, keys: Sequence[str]) -> list[LockInfo]:
        """Snapshot the locks at *keys* (HGETALL + PTTL each) in one round trip."""
        if not keys:
            return []
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
            pipe.pttl(key)
        try:
            replies = pipe.execute(raise_on_error=False)
        except RedisError as exc:
            raise backend_error(exc, "read the locks", None) from exc
        return self._infos(keys, replies)

    def server_config(self, pattern: str) -> dict[str, str]:
        """``CONFIG GET pattern`` as text."""
        try:
            reply = self.client.config_get(pattern)
        except RedisError as exc:
            raise backend_error(exc, "read the server's configuration", None) from exc
        return {_text(k): _text(v) for k, v in reply.items()}

    def connected_replicas(self) -> int:
        """How many replicas the primary reports connected (``INFO replication``)."""
        try:
            info = self.client.info("replication")
        except RedisError as exc:
            raise backend_error(exc, "read the replication state", None) from exc
        return int(info.get("connected_slaves", 0))

    def hub(self) -> WakeHub:
        """This process's wake-up hub for the client's connection pool."""
        return hub_for(self.client, self.keyspace.wake_prefix)


class AsyncSingleBackend(_Single):
    """An asyncio backend on one ``redis.asyncio`` client (bound to one event loop)."""

    def __init__(
        self,
        client: Any,
        keyspace: KeySpace,
        retention_ms: int,
        *,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
    ) -> None:
        super().__init__(client, keyspace, retention_ms, wait_timeout_ms=wait_timeout_ms)
        self._hub: AsyncWakeHub | None = None

    async def run(self, call: Call) -> Any:
        """Run *call* with EVALSHA (loading the script on NOSCRIPT); with
        ``call.replicas``, followed by ``WAIT`` on the same connection."""
        if call.replicas:
            return await self._run_replicated(call)
        client, script = self.client, call.script
        try:
            try:
                return await client.evalsha(script.sha, len(call.keys), *call.keys, *call.args)
            except NoScriptError:
                await client.script_load(script.source)
                return await client.evalsha(script.sha, len(call.keys), *call.keys, *call.args)
        except RedisError as exc:
            raise call_error(exc, call) from exc

    async def _run_replicated(self, call: Call) -> Any:
        try:
            for attempt in range(2):
                pipe = self.client.pipeline(transaction=False)
                pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
                pipe.execute_command("WAIT", call.replicas, self.wait_timeout_ms)
                reply, acks = await pipe.execute(raise_on_error=False)
                if attempt or not isinstance(reply, NoScriptError):
                    break
                await self.client.script_load(call.script.source)
        except RedisError as exc:
            raise call_error(exc, call) from exc
        return replicated(call, reply, acks)

    async def scan_page(self, pattern: str, cursor: str, count: int) -> tuple[str, list[str]]:
        """One SCAN step; a cursor that is not a number starts over."""
        start = _cursor(cursor)
        try:
            next_cursor, keys = await self.client.scan(start, match=pattern, count=count)
        except RedisError as exc:
            raise backend_error(exc, "list the locks", None) from exc
        return str(int(next_cursor)), list(keys)

    async def load(self, keys: Sequence[str]) -> list[LockInfo]:
        """Snapshot the locks at *keys* (HGETALL + PTTL each) in one round trip."""
        if not keys:
            return []
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
            pipe.pttl(key)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except RedisError as exc:
            raise backend_error(exc, "read the locks", None) from exc
        return self._infos(keys, replies)

    def hub(self) -> AsyncWakeHub:
        """The running event loop's wake-up hub for this client."""
        if self._hub is None:
            self._hub = AsyncWakeHub(self.client, self.keyspace.wake_prefix)
        return self._hub

    async def aclose(self) -> None:
        """Stop the hub and close the client's connections."""
        if self._hub is not None:
            await self._hub.aclose()
        try:
            await self.client.aclose()
        except (RedisError, OSError, RuntimeError, asyncio.CancelledError):
            pass


def _missing_scripts(calls: Sequence[Call], results: list[Any]) -> list[Script]:
    """The scripts of *calls* the server did not know (NOSCRIPT), once each."""
    missing = {
        c.script.sha: c.script
        for c, r in zip(calls, results[: len(calls)], strict=True)
        if isinstance(r, NoScriptError)
    }
    return list(missing.values())


def _cursor(text: str) -> int:
    """A SCAN cursor from its text; one that is not an unsigned 64-bit number starts over."""
    try:
        value = int(text)
    except ValueError:
        return 0
    return value if 0 <= value < 2**64 else 0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
