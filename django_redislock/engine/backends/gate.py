"""A bound on the engine's commands in flight on one connection pool.

Every command the engine sends takes a connection of the client's pool for its
round trip, and redis-py's ``ConnectionPool`` raises ``Too many connections`` past
its ``max_connections`` (100 by default from redis-py 8, 2**31 before) instead of
waiting. A waiting acquire holds no connection (the wake-up hub's one pub/sub
connection serves every waiter of the process), but a thousand threads or tasks
that call at once -- their first attempts, or their fallback polls -- would each
take one. So the single-server backends pass each round trip through a gate of the
pool: at most :func:`size_for` of them at once, the others wait for one to end
(first come, first served for those that wait; a call that finds a free slot takes
it at once).

The size is read from the pool's public ``max_connections`` (redis-py's
``ConnectionPool`` and ``BlockingConnectionPool``, sync and asyncio, and their
subclasses, Sentinel's included): half of it, so the application's own commands on
the same pool (a cache's) and the hub's subscription find connections too, and at
most :data:`MOST_IN_FLIGHT`: more calls at once gain nothing on one Redis (it runs
one command at a time, and a Python process runs one thread at a time) but would
each open a connection. A pool that does not say gets :data:`MOST_IN_FLIGHT`.

The fast path is one list ``pop`` and one ``append`` (atomic in CPython), no lock;
only a call that finds every slot taken waits, on a condition (sync) or a future
(asyncio). A forked child gets every gate back whole: the parent's calls in flight
at the fork never end in the child.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from typing import Any

from ..identity import on_fork_in_child

#: The most round trips the engine has in flight on one pool at once.
MOST_IN_FLIGHT = 64

#: How long a waiting call sleeps before it looks at the slots again on its own (s):
#: a release wakes it first; this only bounds each wait.
_RECHECK = 30.0


def size_for(pool: Any) -> int:
    """How many round trips the engine may have in flight on *pool* at once."""
    most = getattr(pool, "max_connections", None)
    if not isinstance(most, int) or isinstance(most, bool) or most <= 0:
        return MOST_IN_FLIGHT
    return max(1, min(MOST_IN_FLIGHT, most // 2))


class Gate:
    """The slots of one pool for blocking calls (any thread).

    A call takes a slot with ``gate.slots.pop()`` (IndexError: none free, then
    :meth:`wait`) and gives it back with :meth:`leave`; :meth:`enter` does the first.
    """

    __slots__ = ("size", "slots", "waiting", "_cond", "__weakref__")

    def __init__(self, size: int) -> None:
        #: How many slots there are.
        self.size = size
        #: The free slots (their number is what counts).
        self.slots: list[None] = [None] * size
        #: How many calls wait for a slot.
        self.waiting = 0
        self._cond = threading.Condition(threading.Lock())

    def enter(self) -> None:
        """Take a slot, waiting for one if none is free."""
        try:
            self.slots.pop()
        except IndexError:
            self.wait()

    def wait(self) -> None:
        """Wait until a slot is free, and take it."""
        with self._cond:
            self.waiting += 1
            try:
                while True:
                    try:
                        self.slots.pop()
                        return
                    except IndexError:
                        self._cond.wait(_RECHECK)
            finally:
                self.waiting -= 1

    def leave(self) -> None:
        """Give a slot back (and wake a call waiting for one)."""
        self.slots.append(None)
        if self.waiting:
            self.wake()

    def wake(self) -> None:
        """Wake one call waiting for a slot (one was just given back)."""
        with self._cond:
            self._cond.notify()

    def refill(self) -> None:
        """Every slot free again, nobody waiting (a forked child: the parent's calls
        in flight never end here)."""
        self.slots = [None] * self.size
        self.waiting = 0
        self._cond = threading.Condition(threading.Lock())


class AsyncGate:
    """The slots of one ``redis.asyncio`` pool (one event loop, so no lock): a freed
    slot goes straight to the call that waited longest."""

    __slots__ = ("size", "slots", "_queue", "__weakref__")

    def __init__(self, size: int) -> None:
        #: How many slots there are.
        self.size = size
        #: The free slots; while a call waits, none is free.
        self.slots: list[None] = [None] * size
        self._queue: deque[asyncio.Future[None]] = deque()

    async def enter(self) -> None:
        """Take a slot, waiting for one if none is free."""
        if self.slots:
            self.slots.pop()
            return
        await self.wait()

    async def wait(self) -> None:
        """Wait until a slot is handed to this call (its caller found none free)."""
        future = asyncio.get_running_loop().create_future()
        self._queue.append(future)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.leave()  # handed a slot, but cancelled before it ran: pass it on
            else:
                future.cancel()
                try:
                    self._queue.remove(future)
                except ValueError:
                    pass
            raise

    def leave(self) -> None:
        """Give a slot back: to the call that waited longest, if one waits."""
        queue = self._queue
        while queue:
            future = queue.popleft()
            if not future.done():
                future.set_result(None)
                return
        self.slots.append(None)


_gates: weakref.WeakKeyDictionary[Any, Gate] = weakref.WeakKeyDictionary()
_agates: weakref.WeakKeyDictionary[Any, AsyncGate] = weakref.WeakKeyDictionary()
_gates_lock = threading.Lock()
#: Gates made for pools that cannot be weakly referenced (kept per backend only).
_unkeyed: weakref.WeakSet[Gate] = weakref.WeakSet()


def gate_for(client: Any) -> Gate:
    """The gate of *client*'s connection pool (one per pool, shared by every backend
    on it)."""
    pool = getattr(client, "connection_pool", None)
    with _gates_lock:
        try:
            gate = _gates.get(pool)
        except TypeError:  # a pool that cannot be weakly referenced
            gate = Gate(size_for(pool))
            _unkeyed.add(gate)
            return gate
        if gate is None:
            gate = _gates[pool] = Gate(size_for(pool))
        return gate


def agate_for(client: Any) -> AsyncGate:
    """The gate of the ``redis.asyncio`` *client*'s connection pool."""
    pool = getattr(client, "connection_pool", None)
    try:
        gate = _agates.get(pool)
    except TypeError:
        return AsyncGate(size_for(pool))
    if gate is None:
        gate = _agates[pool] = AsyncGate(size_for(pool))
    return gate


def _reset_after_fork() -> None:
    global _gates_lock
    _gates_lock = threading.Lock()
    for gate in [*_gates.values(), *_unkeyed]:
        gate.refill()


on_fork_in_child(_reset_after_fork)
