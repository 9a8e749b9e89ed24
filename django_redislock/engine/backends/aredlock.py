"""Redlock on asyncio: the same as :mod:`.redlock`, with one task per master (the
rounds of a call are :meth:`.RedlockBase._rounds`, shared with the blocking backend)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError, RedisError, ResponseError

from ..awakeup import AsyncWakeHub
from ..calls import Call
from ..info import LockInfo
from ..quorum import Reply
from . import server
from .masters import async_master, checkout
from .redlock import (
    RedlockBase,
    WriteBehind,
    _command,
    next_position,
    scan_position,
)

#: Loop turns a scatter still gives replies once its node timeout has passed (a
#: reply read from the socket may take a turn or two to reach its task).
LATE_LOOKS = 3


class AsyncRedlockBackend(RedlockBase):
    """An asyncio Redlock backend over N ``redis.asyncio`` clients (one event loop)."""

    _hub: AsyncWakeHub | None = None
    _own_client = staticmethod(async_master)

    async def run(self, call: Call) -> Any:
        """:meth:`RedlockBackend.run`, awaitable."""
        held: list[tuple[int, Any]] = []  # (master, connection) whose reply did not come
        rounds = self._rounds(call)
        replies: list[Any] | None = None  # sent back into the rounds
        try:
            while True:
                step, replies = rounds.send(replies), None
                if isinstance(step, WriteBehind):
                    await self._let_go(held, step.call)
                    continue
                replies = await self.scatter(step.call, step.timeout, held if step.hold else None)
        except StopIteration as done:
            return done.value
        finally:
            await self._let_go(held)

    async def _let_go(self, held: list[tuple[int, Any]], behind: Call | None = None) -> None:
        """:meth:`RedlockBackend._let_go`, awaitable."""
        while held:
            i, conn = held.pop()
            try:
                if behind is not None:
                    command = conn.pack_command(*self._eval_command(behind))
                    await conn.send_packed_command(command, check_health=False)
            except (RedisError, OSError):
                pass
            finally:
                await conn.disconnect(nowait=True)
                await self.clients[i].connection_pool.release(conn)

    async def scatter(
        self, call: Call, timeout: float, held: list[tuple[int, Any]] | None = None
    ) -> list[Reply]:
        """:meth:`RedlockBackend.scatter` for one call, with one task per master."""
        replies: list[Reply] = [None] * len(self.clients)
        conns: dict[int, Any] = {}  # master -> its connection, once checked out
        sent: set[int] = set()  # masters whose call was written
        tasks = {
            asyncio.ensure_future(self._exchange(i, call, conns, sent)): i
            for i in range(len(self.clients))
            if not self._left_out(i)
        }
        deadline = time.monotonic() + timeout
        pending = set(tasks)
        late_looks = LATE_LOOKS
        extended = False
        loop_late = False  # the loop came back from a wait later than asked by half a timeout
        try:
            while pending:
                remaining = deadline - time.monotonic()
                if (
                    remaining <= 0
                    and not extended
                    and (loop_late or any(tasks[t] not in sent for t in pending))
                ):
                    # This loop, not the master, was late: a task had not even written
                    # its call (a connection still being made on a loaded machine), or
                    # the loop was not scheduled while the replies came (a starved
                    # process). One more node timeout from now; the validity check
                    # counts the whole round.
                    extended = True
                    deadline = time.monotonic() + timeout
                    continue
                if remaining <= 0:
                    # Past the deadline, a few loop turns without waiting: replies that
                    # came while the loop was not scheduled (a loaded machine) still
                    # count. (The validity check counts the whole round, so this is safe.)
                    if not late_looks:
                        break
                    late_looks -= 1
                    remaining = 0
                asked = time.monotonic() + remaining
                done, pending = await asyncio.wait(
                    pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                loop_late = loop_late or time.monotonic() - asked > timeout / 2
                for task in done:
                    exc = task.exception()
                    replies[tasks[task]] = exc if exc is not None else task.result()
        finally:
            for task in pending:
                task.cancel()
            if pending:  # cancelled reads end at once; then their connections are free
                await asyncio.wait(pending)
            for task, i in tasks.items():
                silent = task in pending
                self._answered(i, None if silent else replies[i])
                conn = conns.get(i)
                if conn is None:
                    continue
                if silent and held is not None and i in sent:
                    held.append((i, conn))
                    continue
                if silent:
                    await conn.disconnect(nowait=True)  # nobody may read its late reply
                await self.clients[i].connection_pool.release(conn)
        return replies

    async def _exchange(self, i: int, call: Call, conns: dict[int, Any], sent: set[int]) -> Any:
        """Send *call* to master *i* on a connection of its own (noted in *conns*, and
        in *sent* once written) and read the reply; an error reply is returned. A
        connection that failed is closed."""
        conn = conns[i] = await checkout(self.clients[i].connection_pool)
        try:
            await conn.send_packed_command(conn.pack_command(*_command(call)), check_health=False)
            sent.add(i)
            try:
                return await conn.read_response(disconnect_on_error=False)
            except NoScriptError:  # a master restarted empty: the script's text
                command = conn.pack_command(*self._eval_command(call))
                await conn.send_packed_command(command, check_health=False)
                return await conn.read_response(disconnect_on_error=False)
        except ResponseError as exc:
            return exc
        except (RedisError, OSError):
            await conn.disconnect(nowait=True)
            raise

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

    def hub(self, key: bytes | str | None = None) -> AsyncWakeHub:
        """The event loop's wake-up hub, subscribed on one master at a time."""
        if self._hub is None:
            self._hub = AsyncWakeHub(self._picker, self.keyspace.wake_prefix)
        return self._hub

    def local_channel(self, key: bytes | str | None = None) -> bytes | None:
        """None: a release on Redlock's masters pokes its waiters, it hands nothing over."""
        return None

    async def aclose(self) -> None:
        """Stop the hub and close the masters' connections."""
        if self._hub is not None:
            await self._hub.aclose()
        for client in self.clients:
            try:
                await client.aclose()
            except (RedisError, OSError, RuntimeError, asyncio.CancelledError):
                pass
