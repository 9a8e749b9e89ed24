"""One Redis master (plain or behind Sentinel): the sync and the asyncio backend.

Both share everything but the I/O: how replies of a snapshot load are read,
how a NOSCRIPT is answered, what a failed call raises (see :mod:`.server`, also
used by the cluster backend on each node).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from ...exceptions import ScriptingUnavailable
from ..calls import Call
from ..info import LockInfo
from ..keys import KeySpace
from ..wakeup import WakeHub, hub_for
from . import server
from .base import (
    DEFAULT_WAIT_TIMEOUT_MS,
    AsyncBackendState,
    BackendFeatures,
    BackendState,
    backend_error,
    call_error,
    make_fork_safe,
    replicated,
)
from .gate import agate_for, gate_for


class _Single(BackendState):
    """What both single-master backends hold."""

    features = BackendFeatures()


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
        #: Bounds this pool's round trips in flight (see :mod:`.gate`).
        self.gate = gate_for(client)

    def run(self, call: Call) -> Any:
        """Run *call* with EVALSHA (loading the script on NOSCRIPT); with
        ``call.replicas``, followed by ``WAIT`` on the same connection."""
        if call.replicas:
            return self._run_replicated(call)
        # The gate's enter() and leave(), written out: this is every lock call's path.
        gate = self.gate
        try:
            gate.slots.pop()
        except IndexError:
            gate.wait()
        try:
            return server.evalsha(self.client, call)
        except RedisError as exc:
            raise call_error(exc, call) from exc
        finally:
            gate.slots.append(None)
            if gate.waiting:
                gate.wake()

    def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """Run *calls* in one pipelined round trip (loading scripts once on NOSCRIPT),
        followed by one ``WAIT`` on the same connection when any asks for replicas."""
        if not calls:
            return []
        results, acks = self._pipelined(calls)
        return server.batch_results(calls, results, acks)

    def _run_replicated(self, call: Call) -> Any:
        results, acks = self._pipelined([call])
        return replicated(call, results[0], acks)

    def _pipelined(self, calls: Sequence[Call]) -> tuple[list[Any], Any]:
        self.gate.enter()
        try:
            return server.pipelined(self.client, calls, self.wait_timeout_ms)
        except RedisError as exc:
            raise call_error(exc, calls[0]) from exc
        finally:
            self.gate.leave()

    def scan_page(self, pattern: str, cursor: str, count: int) -> tuple[str, list[str]]:
        """One SCAN step; a cursor that is not a number starts over."""
        self.gate.enter()
        try:
            next_cursor, keys = server.scan(self.client, pattern, server.scan_cursor(cursor), count)
        finally:
            self.gate.leave()
        return str(next_cursor), keys

    def load(self, keys: Sequence[str], *, waiters: bool = False) -> list[LockInfo]:
        """Snapshot the locks at *keys* in one round trip (see ``server.READS``)."""
        if not keys:
            return []
        pipe = self.client.pipeline(transaction=False)
        reads = "waiters" if waiters else "length"
        server.queue_snapshot_reads(pipe, self.keyspace, keys, reads)
        self.gate.enter()
        try:
            replies = pipe.execute(raise_on_error=False)
        except RedisError as exc:
            raise backend_error(exc, "read the locks", None) from exc
        finally:
            self.gate.leave()
        return server.snapshots(self.keyspace, keys, replies, reads)

    def server_config(self, pattern: str) -> dict[str, str]:
        """``CONFIG GET pattern`` as text."""
        return server.config(self.client, pattern)

    def connected_replicas(self) -> int:
        """How many replicas the primary reports connected (``INFO replication``)."""
        return server.connected_replicas(self.client)

    def scripting_refusals(self) -> list[ScriptingUnavailable | None]:
        """The server's refusal to run scripts, or None (see ``server.scripting_refusal``)."""
        return [server.scripting_refusal(self.client, self.keyspace)]

    def hub(self, key: bytes | str | None = None) -> WakeHub:
        """This process's wake-up hub for the client's connection pool."""
        return hub_for(self.client, self.keyspace.wake_prefix, on_script_server=True)


class AsyncSingleBackend(AsyncBackendState, _Single):
    """An asyncio backend on one ``redis.asyncio`` client (bound to one event loop);
    its wake-up hub subscribes with that client."""

    def __init__(
        self,
        client: Any,
        keyspace: KeySpace,
        retention_ms: int,
        *,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
    ) -> None:
        super().__init__(client, keyspace, retention_ms, wait_timeout_ms=wait_timeout_ms)
        #: Bounds this pool's round trips in flight (see :mod:`.gate`).
        self.gate = agate_for(client)

    async def run(self, call: Call) -> Any:
        """Run *call* with EVALSHA (loading the script on NOSCRIPT); with
        ``call.replicas``, followed by ``WAIT`` on the same connection."""
        if call.replicas:
            return await self._run_replicated(call)
        gate = self.gate
        if gate.slots:
            gate.slots.pop()
        else:
            await gate.wait()
        try:
            return await server.aevalsha(self.client, call)
        except RedisError as exc:
            raise call_error(exc, call) from exc
        finally:
            gate.leave()

    async def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """:meth:`SingleBackend.run_many` on asyncio."""
        if not calls:
            return []
        results, acks = await self._pipelined(calls)
        return server.batch_results(calls, results, acks)

    async def _run_replicated(self, call: Call) -> Any:
        results, acks = await self._pipelined([call])
        return replicated(call, results[0], acks)

    async def _pipelined(self, calls: Sequence[Call]) -> tuple[list[Any], Any]:
        await self.gate.enter()
        try:
            return await server.apipelined(self.client, calls, self.wait_timeout_ms)
        except RedisError as exc:
            raise call_error(exc, calls[0]) from exc
        finally:
            self.gate.leave()

    async def scan_page(self, pattern: str, cursor: str, count: int) -> tuple[str, list[str]]:
        """One SCAN step; a cursor that is not a number starts over."""
        start = server.scan_cursor(cursor)
        await self.gate.enter()
        try:
            next_cursor, keys = await server.ascan(self.client, pattern, start, count)
        finally:
            self.gate.leave()
        return str(next_cursor), keys

    async def load(self, keys: Sequence[str], *, waiters: bool = False) -> list[LockInfo]:
        """Snapshot the locks at *keys* in one round trip (see ``server.READS``)."""
        if not keys:
            return []
        pipe = self.client.pipeline(transaction=False)
        reads = "waiters" if waiters else "length"
        server.queue_snapshot_reads(pipe, self.keyspace, keys, reads)
        await self.gate.enter()
        try:
            replies = await pipe.execute(raise_on_error=False)
        except RedisError as exc:
            raise backend_error(exc, "read the locks", None) from exc
        finally:
            self.gate.leave()
        return server.snapshots(self.keyspace, keys, replies, reads)
