"""One connection per pool kept between the direct path's exchanges.

redis-py's pool costs about 7 µs of client CPU to lend a connection and take it
back (redis-py 8.1: its lock, its connection-count metrics hooks, its fork check,
a ``poll`` for stale data, the event dispatched on return): twice per lock's
acquire and release, as much as the rest of our layer's own work over the floor
(docs/benchmarks.md, "The hot path, ninth step"). So the direct path
(:mod:`.direct`) keeps the connection of its last exchange, one per pool, and
takes it again without going through the pool. The connection stays counted as
lent out by the pool the whole time.

What the pool checks when it lends a connection is checked on every connection an
exchange uses, kept or lent: one with data waiting, or closed by the server (a
restart, ``CLIENT KILL``, an idle timeout), is closed and connected afresh when the
command is sent. (redis-py 8's pool skips this check while its maintenance
notifications are on, ``"auto"`` by default.) The newest connection is the one
kept, also after a failed exchange: redis-py closed it, so the engine's retry
connects it afresh, where another connection might have been closed by a restart that an
asyncio connection has not seen yet (it sees a close only once its event loop has
read it). A forked child never uses its parent's kept connection (the keepers are
dropped at the fork, as redis-py's pool resets itself). With redis-py 8's
maintenance notifications, a kept connection the server's notice marked for
reconnection goes back to the pool (which closes it) instead of being used again.

Keeping a connection out of the pool must change nothing else for the pool's
other users, so only these pools keep one: redis-py's own ``ConnectionPool``
class, sync or asyncio (not ``BlockingConnectionPool``, a Sentinel pool or any
subclass), allowing at least :data:`LEAST_CONNECTIONS` connections (redis-py 8's
default; before it, 2**31), with no client-side cache and no credential provider
(its re-authentication runs when the pool takes a connection back). Every other
pool lends and takes back each time, as before.
"""

from __future__ import annotations

import weakref
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection
from redis.exceptions import RedisError

from ..identity import on_fork_in_child

#: The fewest connections a pool must allow for one to be kept out of it.
LEAST_CONNECTIONS = 100

#: The installed redis-py's (major, minor) version.
REDIS_PY_VERSION = tuple(map(int, redis.__version__.split(".")[:2]))
#: redis-py before 5.3 requires a command name in ``get_connection``; 5.3 and
#: later deprecate passing one (a DeprecationWarning).
_CHECKOUT_ARGS = ("EVALSHA",) if REDIS_PY_VERSION < (5, 3) else ()
#: The asyncio connection's stale-data check: ``can_read`` from redis-py 8 (where
#: the older name warns), ``can_read_destructive`` before.
_ASYNC_CAN_READ = (
    "can_read"
    if "can_read" in redis.asyncio.connection.AbstractConnection.__dict__
    else "can_read_destructive"
)
#: Whether connections say when redis-py marked them for reconnection (redis-py 8's
#: maintenance notifications: the server is about to move; the pool closes such a
#: connection when it takes it back).
_MARKS = hasattr(redis.connection.AbstractConnection, "should_reconnect")
_AMARKS = hasattr(redis.asyncio.connection.AbstractConnection, "should_reconnect")
#: What a stale-data check raises on a connection that is closed or broken.
_STALE_ERRORS = (RedisError, OSError)


def checkout(pool: Any) -> Any:
    """A connection lent by *pool* (sync or asyncio: then awaitable), asked for the
    way this redis-py wants."""
    return pool.get_connection(*_CHECKOUT_ARGS)


class Keeper:
    """The connection kept for one pool (at most one between exchanges)."""

    __slots__ = ("idle", "__weakref__")

    def __init__(self) -> None:
        #: The kept connection, if any: a list, whose ``pop`` and ``append`` are
        #: atomic, so two threads never take the same connection.
        self.idle: list[Any] = []


#: Each pool's keeper, or None where the pool lends every time (see the module's
#: docstring); weak, so a pool that is dropped takes its kept connection with it.
_KEEPERS: weakref.WeakKeyDictionary[Any, Keeper | None] = weakref.WeakKeyDictionary()


def _forget_all() -> None:
    # The parent's connections are the parent's: the child's pools lend their own.
    _KEEPERS.clear()


on_fork_in_child(_forget_all)


def keeper(pool: Any) -> Keeper | None:
    """*pool*'s keeper, or None when *pool* lends a connection for every exchange."""
    try:
        return _KEEPERS[pool]
    except KeyError:
        pass
    except TypeError:  # a pool that cannot be weakly referenced or hashed
        return None
    found = Keeper() if eligible(pool) else None
    _KEEPERS[pool] = found
    return found


def eligible(pool: Any) -> bool:
    """Whether keeping one of *pool*'s connections out of it changes nothing else for
    its other users (see the module's docstring)."""
    if type(pool) not in (redis.ConnectionPool, redis.asyncio.ConnectionPool):
        return False
    kwargs = pool.connection_kwargs
    return (
        pool.max_connections >= LEAST_CONNECTIONS
        and getattr(pool, "cache", None) is None
        and kwargs.get("credential_provider") is None
        and not kwargs.get("cache_config")
    )


def borrow(pool: Any) -> tuple[Any, Keeper | None]:
    """A connection for one exchange (the kept one, else one the pool lends), and
    *pool*'s keeper to give it back to. Where a connection is kept, the one returned
    has passed the stale-data check."""
    kept = keeper(pool)
    if kept is None:
        return checkout(pool), None
    conn = None
    if kept.idle:
        try:
            conn = kept.idle.pop()
        except IndexError:  # another thread took it meanwhile
            pass
        else:
            if _MARKS and conn.should_reconnect():
                pool.release(conn)  # which closes it
                conn = None
    if conn is None:
        conn = checkout(pool)
    # The stale-data check: closed if data waits or the server closed it, and
    # connected afresh when the command is sent. (redis-py 8's pool lends without it
    # while its maintenance notifications are on, which by default they are.) One
    # closed already is left to the send, as its retry policy says: the check would
    # connect it outside that policy.
    if conn._sock is not None:
        try:
            stale = conn.can_read()
        except _STALE_ERRORS:
            stale = True
        except BaseException:
            pool.release(conn)
            raise
        if stale:
            conn.disconnect()
    return conn, kept


def give_back(pool: Any, kept: Keeper | None, conn: Any) -> None:
    """Keep *conn* after its exchange, or give it back to *pool* where nothing is kept.
    The newest stays kept and an older one goes back (two threads may have kept one
    at once): after a failed exchange, that is the connection redis-py closed, so the
    engine's retry connects it afresh, where an older one might have been closed by
    the server unseen (after a restart, an asyncio connection sees the close only
    once its event loop has read it)."""
    if kept is None:
        pool.release(conn)
        return
    kept.idle.append(conn)
    while len(kept.idle) > 1:
        try:
            pool.release(kept.idle.pop(0))
        except IndexError:
            break


async def aborrow(pool: Any) -> tuple[Any, Keeper | None]:
    """:func:`borrow` for a ``redis.asyncio`` pool (one event loop: no race)."""
    kept = keeper(pool)
    if kept is None:
        return await checkout(pool), None
    conn = kept.idle.pop() if kept.idle else None
    if conn is not None and _AMARKS and conn.should_reconnect():
        await pool.release(conn)
        conn = None
    if conn is None:
        conn = await checkout(pool)
    if conn.is_connected:
        try:
            stale = await getattr(conn, _ASYNC_CAN_READ)()
        except _STALE_ERRORS:
            stale = True
        except BaseException:
            await pool.release(conn)
            raise
        if stale:
            await conn.disconnect()
    return conn, kept


async def agive_back(pool: Any, kept: Keeper | None, conn: Any) -> None:
    """:func:`give_back` for a ``redis.asyncio`` pool (one event loop: no race)."""
    if kept is None:
        await pool.release(conn)
        return
    kept.idle.append(conn)
    if len(kept.idle) > 1:
        await pool.release(kept.idle.pop(0))
