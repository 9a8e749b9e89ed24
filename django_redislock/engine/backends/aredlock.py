"""Redlock on asyncio: the same as :mod:`.redlock`, with one task per master."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError, RedisError, ResponseError

from ..awakeup import AsyncWakeHub
from ..calls import Call
from ..info import LockInfo
from ..quorum import Reply, decide_commit, plan, undo_call
from . import server
from .masters import async_master
from .redlock import RedlockBase, next_position, scan_position

#: Loop turns a scatter still gives replies once its node timeout has passed (a
#: reply read from the socket may take a turn or two to reach its task).
LATE_LOOKS = 3


class AsyncRedlockBackend(RedlockBase):
    """An asyncio Redlock backend over N ``redis.asyncio`` clients (one event loop)."""

    _hub: AsyncWakeHub | None = None
    _own_client = staticmethod(async_master)

    async def run(self, call: Call) -> Any:
        """:meth:`RedlockBackend.run`, awaitable."""
        steps = plan(call)
        started = time.monotonic()
        replies = await self.scatter(steps.sent, steps.timeout)
        outcome = steps.combine(replies, (time.monotonic() - started) * 1000)
        if not self._returns_grant(call):
            return outcome
        commit = self._commit_for(call, outcome)
        if commit is not None:
            outcome = decide_commit(outcome.reply, await self.scatter(commit, steps.timeout))
        if outcome.undo:
            await self.scatter(undo_call(call, self.retention_arg), steps.timeout)
        return self._settled(outcome)

    async def scatter(self, call: Call, timeout: float) -> list[Reply]:
        """:meth:`RedlockBackend.scatter` for one call, with one task per master."""
        replies: list[Reply] = [None] * len(self.clients)
        tasks = {
            asyncio.ensure_future(_evalsha(client, call)): i
            for i, client in enumerate(self.clients)
            if not self._left_out(i)
        }
        deadline = time.monotonic() + timeout
        pending = set(tasks)
        late_looks = LATE_LOOKS
        try:
            while pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    # Past the deadline, a few loop turns without waiting: replies that
                    # came while the loop was not scheduled (a loaded machine) still
                    # count. (The validity check counts the whole round, so this is safe.)
                    if not late_looks:
                        break
                    late_looks -= 1
                    remaining = 0
                done, pending = await asyncio.wait(
                    pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    exc = task.exception()
                    replies[tasks[task]] = exc if exc is not None else task.result()
        finally:
            for task in pending:
                task.cancel()  # redis.asyncio drops a connection whose command was cancelled
            for task, i in tasks.items():
                self._answered(i, None if task in pending else replies[i])
        return replies

    async def scan_page(self, pattern: str, cursor: str, count: int) -> tuple[str, list[str]]:
        """:meth:`RedlockBackend.scan_page`, awaitable."""
        index, node_cursor = scan_position(cursor, len(self.clients))
        try:
            next_cursor, keys = await self.clients[index].scan(
                node_cursor, match=pattern, count=count
            )
        except RedisError:
            next_cursor, keys = 0, []
        kept = []
        for key in keys:
            earlier = False
            for client in self.clients[:index]:
                try:
                    if await client.exists(key):
                        earlier = True
                        break
                except RedisError:
                    continue
            if not earlier:
                kept.append(server.text(key))
        return next_position(index, int(next_cursor), len(self.clients)), kept

    async def load(self, keys: Sequence[str], *, waiters: bool = False) -> list[LockInfo]:
        """:meth:`RedlockBackend.load`, awaitable."""
        if not keys:
            return []

        async def one(client: Any) -> list[LockInfo] | Exception:
            pipe = client.pipeline(transaction=False)
            server.queue_snapshot_reads(pipe, self.keyspace, keys, "plain")
            try:
                return server.snapshots(
                    self.keyspace, keys, await pipe.execute(raise_on_error=False), "plain"
                )
            except Exception as exc:
                return exc

        per_master = list(await asyncio.gather(*(one(c) for c in self.clients)))
        return [self._snapshot(info) for info in self._merge(keys, per_master)]

    def hub(self) -> AsyncWakeHub:
        """The event loop's wake-up hub, subscribed on one master at a time."""
        if self._hub is None:
            self._hub = AsyncWakeHub(self._picker, self.keyspace.wake_prefix)
        return self._hub

    async def aclose(self) -> None:
        """Stop the hub and close the masters' connections."""
        if self._hub is not None:
            await self._hub.aclose()
        for client in self.clients:
            try:
                await client.aclose()
            except (RedisError, OSError, RuntimeError, asyncio.CancelledError):
                pass


async def _evalsha(client: Any, call: Call) -> Any:
    try:
        try:
            return await client.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
        except NoScriptError:
            await client.script_load(call.script.source)
            return await client.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
    except ResponseError as exc:
        return exc
