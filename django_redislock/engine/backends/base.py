"""The backend interface, its capability flags, and redis-py error mapping."""

from __future__ import annotations

import asyncio
import re
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from redis.exceptions import ConnectionError, OutOfMemoryError, RedisError, TimeoutError

from ...exceptions import LockBackendError, ScriptingUnavailable
from ..awakeup import AsyncWakeHub
from ..calls import AmbiguousReply, Call, NotReplicated
from ..identity import on_fork_in_child
from ..info import LockInfo
from ..keys import KeySpace

if TYPE_CHECKING:
    from ..wakeup import WakeHub

#: How long ``WAIT`` waits for replica acknowledgements by default (ms).
DEFAULT_WAIT_TIMEOUT_MS = 500

#: redis-py errors after which a command may or may not have run.
AMBIGUOUS_ERRORS = (ConnectionError, TimeoutError)


@dataclass(frozen=True)
class BackendFeatures:
    """What a backend can do (like the ``features`` of Django's database backends)."""

    #: FIFO queue and direct hand-off inside the scripts.
    hands_off: bool = True
    #: Acquire needs a majority of several masters (Redlock).
    quorum: bool = False
    #: Fencing tokens of one name increase strictly across holders.
    monotonic_fencing: bool = True
    #: Kind of listing cursor: "int" (one SCAN) or "composite" (one per node).
    cursor: str = "int"


class Backend(Protocol):
    """A blocking backend."""

    features: BackendFeatures
    keyspace: KeySpace
    #: How long (ms, as bytes for the scripts) the per-name fence hash is kept.
    retention_arg: bytes

    def run(self, call: Call) -> Any:
        """Run *call*; raise AmbiguousReply or LockBackendError."""

    def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """Run *calls* in one round trip; each reply, or the LockBackendError it raised.

        Raises AmbiguousReply/LockBackendError when the whole batch failed.
        """

    def scan_page(self, pattern: str, cursor: str, count: int) -> tuple[str, list[str]]:
        """One step of a key scan: (next cursor, keys); cursor "0" starts and ends."""

    def load(self, keys: Sequence[str], *, waiters: bool = False) -> list[LockInfo]:
        """Snapshots of the locks at *keys* (those that exist), in one round trip, with
        their queue's length (and, with *waiters*, who waits: ``LockInfo.waiters``)."""

    def server_config(self, pattern: str) -> dict[str, str]:
        """The server's ``CONFIG GET pattern`` (raises LockBackendError where refused)."""

    def hub(self, key: bytes | str | None = None) -> WakeHub:
        """This process's wake-up hub for this backend; *key*: for waits on that lock
        key (a Cluster's hub for it listens on the key's own node)."""

    def connected_replicas(self) -> int:
        """How many replicas the primary reports connected (the fewest over its primaries
        for a backend with several; the system checks compare it with ``wait_replicas``)."""

    def scripting_refusals(self) -> list[ScriptingUnavailable | None]:
        """Whether the servers run scripts: one entry per server the locks are spread
        over (each Redlock master; one for a single Redis or a cluster), its refusal
        or None (for the system checks)."""


class AsyncBackend(Protocol):
    """An asyncio backend: the same operations as :class:`Backend`, awaitable."""

    features: BackendFeatures
    keyspace: KeySpace
    retention_arg: bytes

    async def run(self, call: Call) -> Any:
        """Run *call*; raise AmbiguousReply or LockBackendError."""

    async def scan_page(self, pattern: str, cursor: str, count: int) -> tuple[str, list[str]]:
        """One step of a key scan: (next cursor, keys)."""

    async def load(self, keys: Sequence[str], *, waiters: bool = False) -> list[LockInfo]:
        """Snapshots of the locks at *keys* (those that exist); see :meth:`Backend.load`."""

    def hub(self, key: bytes | str | None = None) -> AsyncWakeHub:
        """This event loop's wake-up hub for this backend (for waits on the lock *key*:
        see :meth:`Backend.hub`)."""

    def local_channel(self, key: bytes | str | None = None) -> bytes | None:
        """The channel of the hub for *key* while it has waiters (see
        :attr:`~..awakeup.AsyncWakeHub.local_channel`), else None; always None where a
        release does not hand the lock over in its own script (Redlock)."""

    async def aclose(self) -> None:
        """Close the connections (the hub's too)."""


class BatchingAsyncBackend(AsyncBackend, Protocol):
    """An asyncio backend that also runs several calls in one round trip (one Redis, or
    one per node of a Cluster; not Redlock's)."""

    async def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """Run *calls* in one round trip; see :meth:`Backend.run_many`."""


class BackendState:
    """What every backend holds: its client, key layout, fence retention and WAIT timeout."""

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

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.client!r} prefix={self.keyspace.prefix!r}>"


class AsyncBackendState(BackendState):
    """What every asyncio backend holds besides: its event loop's wake-up hub, made
    on first use with :meth:`_subscriber`, and the clients :meth:`aclose` closes."""

    _hub: AsyncWakeHub | None = None
    #: Whether the hub's subscriber (see :meth:`_subscriber`) is on the server that
    #: runs the scripts (see :func:`~..wake.queue_channel`).
    _hub_on_script_server = True

    def _subscriber(self) -> Any:
        """What the hub calls ``pubsub()`` on: the client, unless a backend says otherwise."""
        return self.client

    def _closables(self) -> list[Any]:
        """The clients :meth:`aclose` closes."""
        return [self.client]

    def hub(self, key: bytes | str | None = None) -> AsyncWakeHub:
        """The running event loop's wake-up hub for this backend (whatever *key*)."""
        if self._hub is None:
            self._hub = AsyncWakeHub(
                self._subscriber(), self.keyspace.wake_prefix, self._hub_on_script_server
            )
        return self._hub

    def local_channel(self, key: bytes | str | None = None) -> bytes | None:
        """The hub's channel while it has waiters, else None (whatever *key*)."""
        hub = self._hub
        return None if hub is None else hub.local_channel

    async def aclose(self) -> None:
        """Stop the hub and close the connections."""
        if self._hub is not None:
            await self._hub.aclose()
        for client in self._closables():
            try:
                await client.aclose()
            except (RedisError, OSError, RuntimeError, asyncio.CancelledError):
                pass


#: The replies of a server that does not run the package's scripts: a scripting
#: command renamed away or denied by an ACL, or a Valkey without its Lua module.
_SCRIPTING_REFUSED = re.compile(
    r"(unknown command|no permissions to run the) [`'](eval|evalsha|eval_ro|evalsha_ro|script)"
    r"\b[^`']*[`']|could not find scripting engine",
    re.IGNORECASE,
)

#: What a server that refuses scripts needs (the message of ScriptingUnavailable).
SCRIPTING_FIX = (
    "django-redislock runs every lock operation as a Lua script (EVALSHA, SCRIPT LOAD, "
    "EVAL), so no lock works on this server. On Valkey 9.1 or later, load the Lua "
    "scripting module (loadmodule in valkey.conf, or the managed service's scripting "
    "option); where EVAL, EVALSHA or SCRIPT are renamed or denied by an ACL, allow them "
    "for the lock client's user"
)


def scripting_refused(exc: BaseException) -> bool:
    """Whether *exc* is a server's refusal to run scripts at all (not a script's error)."""
    return isinstance(exc, RedisError) and bool(_SCRIPTING_REFUSED.search(str(exc)))


#: What a server at ``maxmemory`` needs (the message of an out-of-memory refusal).
MEMORY_FIX = (
    "Redis has used its maxmemory and could not free any: with maxmemory-policy "
    "noeviction it frees none, and with a volatile-* policy (volatile-lru, "
    "volatile-lfu, volatile-ttl, volatile-random) only keys with an expiry can go, "
    "so a Redis full of keys without one (a cache written without a timeout, "
    "sessions, queues) refuses every write that needs memory. Raise maxmemory "
    "(CONFIG SET maxmemory, or the managed service's memory size), give those keys "
    "an expiry or delete them, or keep the locks on a Redis of their own with "
    "maxmemory-policy noeviction (system check W002). Releasing, cancelling a wait, "
    "renewing and force-releasing still work"
)


def out_of_memory(exc: BaseException) -> bool:
    """Whether *exc* is Redis refusing a write at ``maxmemory`` (Redis 7 answers
    ``OOM ...``, redis-py's OutOfMemoryError; Redis 6.2 reports a write refused inside
    a script as a script error naming ``-OOM command not allowed``)."""
    if isinstance(exc, OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RedisError) and (text.startswith("OOM") or "-OOM " in text)


def backend_error(exc: BaseException, action: str, name: str | None) -> LockBackendError:
    """Wrap a redis-py exception raised while doing *action* in a LockBackendError
    (:class:`ScriptingUnavailable` when the server refuses scripts; one that says
    what to change when Redis is out of memory)."""
    if scripting_refused(exc):
        err: LockBackendError = ScriptingUnavailable(
            f"Redis refused to run Lua scripts while trying to {action}: {exc}. {SCRIPTING_FIX}.",
            name=name,
        )
    elif out_of_memory(exc):
        err = LockBackendError(
            f"Redis is out of memory and refused to {action}: {exc} {MEMORY_FIX}.",
            name=name,
        )
    else:
        err = LockBackendError(f"Redis error while trying to {action}: {exc}", name=name)
    err.__cause__ = exc
    return err


def call_error(exc: RedisError, call: Call) -> Exception:
    """The exception a failed *call* raises: AmbiguousReply when it may have run."""
    if isinstance(exc, AMBIGUOUS_ERRORS):
        return AmbiguousReply(exc)
    return backend_error(exc, call.action, call.name)


def replicated(call: Call, reply: Any, acks: Any) -> Any:
    """The reply of *call* sent with ``WAIT`` after it: *reply* once enough replicas
    acknowledged (*acks*, WAIT's answer), else raise :class:`~..calls.NotReplicated`.

    A script error wins over the acknowledgement count (nothing was written).
    """
    if isinstance(reply, RedisError):
        raise call_error(reply, call) from reply
    if isinstance(acks, RedisError):
        raise call_error(acks, call) from acks
    if int(acks) < call.replicas:
        raise NotReplicated(reply, int(acks), call.replicas)
    return reply


def batch_wait(calls: Sequence[Call]) -> int:
    """How many replica acknowledgements a batch of *calls* waits for (the most any asks)."""
    return max((call.replicas for call in calls), default=0)


def replicated_results(calls: Sequence[Call], results: list[Any], acks: Any) -> list[Any]:
    """Each result of a batch sent with one ``WAIT`` after it; calls that asked for more
    acknowledgements than came get a :class:`~..calls.NotReplicated` instead."""
    count = -1 if isinstance(acks, Exception) else int(acks)
    return [
        NotReplicated(result, max(count, 0), call.replicas)
        if call.replicas > count and not isinstance(result, Exception)
        else result
        for call, result in zip(calls, results, strict=True)
    ]


_pools: weakref.WeakSet[Any] = weakref.WeakSet()


def make_fork_safe(client: Any) -> None:
    """Let a forked child use *client*'s connection pool even if a parent thread held it.

    redis-py resets a pool in a child on its first command, under the pool's
    locks. A lock some parent thread (the watchdog, a waiter) held at the
    moment of ``fork()`` stays held for ever in the child, and the child hangs
    on its first command. The child has only the forking thread, so its copies
    of these locks are replaced with fresh ones right after the fork.
    """
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        _pools.add(pool)


_RLOCK_TYPE = type(threading.RLock())


def _fresh_pool_locks() -> None:
    for pool in list(_pools):
        for attribute in ("_lock", "_fork_lock"):
            old = getattr(pool, attribute, None)
            if old is not None:
                # Not type(old)(): a plain Lock's type cannot be called before Python
                # 3.13 (redis-py 5.0 uses plain Locks here, later versions RLocks).
                fresh = threading.RLock() if isinstance(old, _RLOCK_TYPE) else threading.Lock()
                setattr(pool, attribute, fresh)


# First: the other hooks drop objects (the wake-up hubs' pub/sub) whose cleanup
# goes through these pools, and would hang on a lock held at fork time.
on_fork_in_child(_fresh_pool_locks, first=True)


def detached(exc: BaseException) -> BaseException:
    """*exc* kept as a reply, without the tracebacks of it and of the errors it was
    raised from (its ``__cause__``/``__context__``, say redis-py's ConnectionError's
    OSError). An error kept in a list of replies would otherwise hold, through its
    traceback, the frame that caught it, whose locals hold the list (a redis-py
    pipeline's, Redlock's scatter's) and whose caller is the call's frames: a cycle
    keeping them -- and the Lock in them, renewed by the watchdog -- alive until the
    cyclic garbage collector runs."""
    pending: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        error.__traceback__ = None
        pending += [error.__cause__, error.__context__]
    return exc
