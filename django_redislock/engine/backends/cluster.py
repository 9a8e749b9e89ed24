"""Redis Cluster: the sync and the asyncio backend.

Every key of one lock carries the hash tag ``{name}``, so each script touches
one slot and runs unchanged on a cluster. What differs from one Redis:

* **Routing.** A call goes through redis-py's ``RedisCluster`` (which follows
  ``MOVED``/``ASK``), except where one connection of the key's node is needed:
  a call with ``replicas`` is sent as ``EVALSHA …; WAIT n t`` pipelined on that
  node's own plain client (``RedisCluster`` would send ``WAIT`` to a default
  node and add up the replies of several), and the watchdog's renewal batches
  are one plain pipeline per node (``ClusterPipeline`` refuses ``EVALSHA`` and
  is about 15x slower).
* **Retries.** ``TRYAGAIN`` (a multi-key script while its slot migrates),
  ``CLUSTERDOWN`` (a failover), redis-py's "TTL exhausted" after many redirects
  and redirects that reach us are retried with a 10→100 ms backoff until the
  caller's deadline (``Call.deadline``: a blocking acquire's timeout), else for
  up to :attr:`retry_window` seconds (default 5: a failover with
  ``cluster-node-timeout 1000`` took 2.4–2.5 s here). The scripts' nonces make
  a repeat harmless. A lost connection or a timeout is an ``AmbiguousReply``,
  which the flows resend once with the same nonce.
* **Listing** walks the primaries one after another behind one opaque cursor
  ``"<slot>:<cursor>"``: the lowest slot of the primary being scanned (which
  survives a failover, unlike the node's address) and that node's SCAN cursor.
* **Wake-ups.** A ``PUBLISH`` inside a script reaches subscribers on every node,
  but one on another node only over the cluster bus, whose outgoing links Redis
  (7.0 at least) leaves without ``TCP_NODELAY``: there a wake-up waited up to
  ~40 ms (Nagle's algorithm meeting the receiving node's delayed ACK; p99 41 ms
  across nodes against 0.16 ms on one, with plain redis-py clients:
  ``benchmarks/diag_cluster_pubsub.py``). So a blocking wait listens on the
  lock's own node (:meth:`ClusterBackend.hub` with the key: one hub, with its own
  channel, per node this process waits on). A wait that names no lock uses the
  hub on one node at a time, chosen by :class:`NodePicker`, which moves to the
  next node when its subscription breaks.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    ConnectionError,
    MovedError,
    RedisClusterException,
    RedisError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)

from ...exceptions import LockBackendError, ScriptingUnavailable
from ..awakeup import AsyncWakeHub
from ..calls import AmbiguousReply, Call, NotReplicated
from ..identity import process_token
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

#: How long (seconds) a call keeps retrying while its slot moves or the cluster is down.
DEFAULT_RETRY_WINDOW = 5.0
_FIRST_PAUSE, _MAX_PAUSE = 0.01, 0.1
#: Errors about one slot: the call is rerun through RedisCluster, which follows redirects.
_SLOT_ERRORS = (AskError, TryAgainError)  # MovedError is an AskError
_RETRYABLE = (*_SLOT_ERRORS, ClusterDownError, SlotNotCoveredError)
#: What a cluster client raises (its own RedisClusterException is no RedisError).
_ERRORS = (RedisError, RedisClusterException)
#: After these, the client's slot map may be out of date (a resharding, a failover).
_STALE_MAP = (MovedError, ConnectionError, TimeoutError)
#: Lock keys whose node is remembered (see ``_Cluster._route``); all forgotten past it.
_ROUTES_KEPT = 4096


def _stale_cause(result: Any) -> bool:
    """Whether a batch result failed with an error after which the slot map may be stale."""
    return isinstance(result, LockBackendError) and isinstance(result.__cause__, _STALE_MAP)


def retryable(exc: BaseException) -> bool:
    """Whether *exc* means "the slot is moving or the cluster is failing over: retry"."""
    return isinstance(exc, _RETRYABLE) or (
        isinstance(exc, ClusterError) and "TTL exhausted" in str(exc)
    )


def retry_pauses(window: float, deadline: float | None = None) -> Iterator[float]:
    """Pauses of 10 ms doubling up to 100 ms, until *deadline* (``time.monotonic()``)
    or, without one, for as long as *window* seconds last."""
    if deadline is None:
        deadline = time.monotonic() + window
    pause = _FIRST_PAUSE
    while (remaining := deadline - time.monotonic()) > 0:
        yield min(pause, remaining)
        pause = min(pause * 2, _MAX_PAUSE)


def failure(exc: BaseException, call: Call) -> Exception:
    """What a failed *call* raises (redis-py's cluster errors are not all RedisErrors)."""
    if isinstance(exc, RedisError):
        return call_error(exc, call)
    return backend_error(exc, call.action, call.name)


def _to_rerun(results: Sequence[Any]) -> tuple[list[int], bool]:
    """The indices of a batch's results to run again one by one (their slot moved or is
    moving), and whether the slot map may be out of date (learn it before)."""
    redo = [i for i, r in enumerate(results) if isinstance(r, _SLOT_ERRORS)]
    return redo, any(isinstance(r, MovedError) or _stale_cause(r) for r in results)


def _failed(batch: Sequence[Call], exc: RedisError) -> list[Any]:
    """The outcomes of a node's batch that failed as a whole (each call may have run)."""
    return [backend_error(exc, c.action, c.name) for c in batch]


def _as_result(exc: Exception, call: Call) -> Exception:
    """A failure of *call* as one result of a batch: NotReplicated as it is, else a
    LockBackendError."""
    if isinstance(exc, AmbiguousReply):
        return backend_error(exc.cause, call.action, call.name)
    return exc


class NodePicker:
    """Gives the wake-up hub a pub/sub object on one cluster node at a time.

    The first node is chosen from the process token (so the processes of a
    deployment spread over the nodes, each always starting on the same one);
    every later call, which a hub makes after its subscription broke, takes
    the next node in name order, so a dead node is left behind.
    """

    def __init__(self, nodes: Callable[[], list[tuple[str, Any]]]) -> None:
        self._nodes = nodes
        self._turn = 0
        #: The name (``host:port``) of the node of the latest subscription.
        self.node_name: str | None = None

    def pubsub(self) -> Any:
        """A plain pub/sub object on the next node."""
        nodes = sorted(self._nodes(), key=lambda item: item[0])
        start = zlib.crc32(process_token().encode())
        self.node_name, client = nodes[(start + self._turn) % len(nodes)]
        self._turn += 1
        return client.pubsub()


class _Cluster(BackendState):
    """What both cluster backends hold and decide."""

    features = BackendFeatures(cursor="composite")

    def __init__(
        self,
        client: Any,
        keyspace: KeySpace,
        retention_ms: int,
        *,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
        retry_window: float = DEFAULT_RETRY_WINDOW,
    ) -> None:
        super().__init__(client, keyspace, retention_ms, wait_timeout_ms=wait_timeout_ms)
        #: How long (seconds) a call retries while its slot migrates or the cluster
        #: is down; cover your failover time (about 2.5 s with cluster-node-timeout 1000).
        self.retry_window = retry_window
        #: The per-node plain clients this backend made itself (asyncio only).
        self._clients: dict[str, Any] = {}
        #: The wake-up hub on each node, by its name (asyncio only; see ``hub``).
        self._node_hubs: dict[str, AsyncWakeHub] = {}
        #: Lock key -> (node, its plain client), for the slot map in ``_routed``.
        self._routes: dict[Any, tuple[Any, Any]] = {}
        self._routed: Any = None
        self._picker = NodePicker(
            lambda: [(n.name, self._node_client(n)) for n in self._known_nodes()]
        )

    def _node_client(self, node: Any) -> Any:
        raise NotImplementedError

    def _known_nodes(self) -> list[Any]:
        """Every node the client knows; its startup nodes before it learnt the cluster
        (an asyncio client learns it on its first command, maybe after the hub starts)."""
        nodes = self.client.get_nodes()
        return list(nodes or self.client.nodes_manager.startup_nodes.values())

    def _node_for(self, key: Any) -> Any:
        return self.client.get_node_from_key(key)

    def _route(self, key: Any) -> tuple[Any, Any]:
        """(node, its plain client) of the lock *key*, as the client last learnt the
        slots: remembered per key while the client's slot map is the same object (every
        refresh makes a new one; a call that meets MOVED refreshes it), so that a lock
        call does not hash its key and look up its node and client each time."""
        slots = self.client.nodes_manager.slots_cache
        if slots is not self._routed:
            self._routes.clear()
            self._routed = slots
        route = self._routes.get(key)
        if route is None:
            if len(self._routes) >= _ROUTES_KEPT:
                self._routes.clear()
            node = self._node_for(key)
            route = self._routes[key] = (node, self._node_client(node))
        return route

    def _by_node(self, keys: Sequence[Any]) -> list[tuple[Any, list[int]]]:
        """The primaries of *keys*, each with the indices of its keys."""
        groups: dict[str, tuple[Any, list[int]]] = {}
        for i, key in enumerate(keys):
            node = self._node_for(key)
            groups.setdefault(node.name, (node, []))[1].append(i)
        return list(groups.values())

    def _primaries(self) -> list[tuple[int, Any]]:
        """(lowest slot, node) of every primary that serves slots, in slot order."""
        first: dict[str, tuple[int, Any]] = {}
        for slot, nodes in sorted(self.client.nodes_manager.slots_cache.items()):
            if nodes and nodes[0].name not in first:
                first[nodes[0].name] = (slot, nodes[0])
        return sorted(first.values(), key=lambda item: item[0])

    def _scan_at(self, cursor: str) -> tuple[list[tuple[int, Any]], int, int]:
        """Where a listing cursor points: (primaries, index of the one to scan, its cursor).

        A cursor that cannot be read, or names a slot no primary starts at any
        more (a resharding), starts over at the first primary.
        """
        primaries = self._primaries()
        slot_text, _, node_cursor = cursor.partition(":")
        for index, (slot, _node) in enumerate(primaries):
            if slot_text == str(slot) and node_cursor:
                return primaries, index, server.scan_cursor(node_cursor)
        return primaries, 0, 0

    @staticmethod
    def _scan_cursor(primaries: list[tuple[int, Any]], index: int, node_cursor: int) -> str:
        """The listing cursor after one SCAN step on primary *index*."""
        if node_cursor:
            return f"{primaries[index][0]}:{node_cursor}"
        if index + 1 < len(primaries):
            return f"{primaries[index + 1][0]}:0"
        return "0"

    @staticmethod
    def _merge(
        size: int, groups: list[tuple[Any, list[int]]], answers: list[Any], step: int
    ) -> list[Any]:
        """The replies of each node's group (*step* per key: snapshots; 1: a batch's
        calls) back in key order."""
        replies: list[Any] = [None] * (step * size)
        for (_node, indices), node_replies in zip(groups, answers, strict=True):
            for n, i in enumerate(indices):
                replies[step * i : step * i + step] = node_replies[step * n : step * n + step]
        return replies

    def _settle_replicated(self, call: Call, results: list[Any], acks: Any) -> Any:
        """The reply of a call sent with WAIT on its node; a slot error is raised
        as it is, so that the caller retries."""
        reply = results[0]
        if isinstance(reply, Exception) and retryable(reply):
            raise reply
        return replicated(call, reply, acks)

    def _batch(self, calls: Sequence[Call], raw: list[Any], acks: Any) -> list[Any]:
        """One node's batch outcomes; slot errors stay raw (to rerun them)."""
        settled = server.batch_results(calls, raw, acks)
        return [
            r if isinstance(r, Exception) and retryable(r) else s
            for r, s in zip(raw, settled, strict=True)
        ]


class ClusterBackend(_Cluster):
    """A blocking backend on a ``redis.cluster.RedisCluster``."""

    def _node_client(self, node: Any) -> Any:
        """The node's own plain ``redis.Redis`` (one connection pool per node)."""
        client = self.client.get_redis_connection(node)
        make_fork_safe(client)
        return client

    def run(self, call: Call) -> Any:
        """Run *call* on the node of its keys, retrying until ``call.deadline`` (else
        within :attr:`retry_window`) while its slot moves or the cluster fails over;
        with ``call.replicas``, ``WAIT`` follows on the same connection of that node."""
        return self._run(call, retry_pauses(self.retry_window, call.deadline))

    def _run(self, call: Call, pauses: Iterator[float]) -> Any:
        routed = False
        while True:
            try:
                return self._run_once(call, routed)
            except _ERRORS as exc:
                routed = True
                pause = next(pauses, None) if retryable(exc) else None
                if isinstance(exc, _STALE_MAP):
                    self._refresh()
                if pause is None:
                    raise failure(exc, call) from exc
            time.sleep(pause)

    def _refresh(self) -> None:
        """Learn the slot map again (best effort: a failing cluster may not answer)."""
        try:
            self.client.nodes_manager.initialize()
        except _ERRORS:
            pass

    def _run_once(self, call: Call, routed: bool) -> Any:
        """One attempt: straight to the node of the call's slot (as the client last
        learnt it), or, *routed*, through RedisCluster, which follows redirects."""
        if routed and not call.replicas:
            return server.evalsha(self.client, call)
        node_client = self._route(call.keys[0])[1]
        if not call.replicas:
            return server.evalsha(node_client, call)
        results, acks = server.pipelined(node_client, [call], self.wait_timeout_ms)
        return self._settle_replicated(call, results, acks)

    def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """Run *calls* in one pipelined round trip per node (loading scripts on
        NOSCRIPT), each followed by one ``WAIT`` when any of its calls asks for
        replicas. Calls answered MOVED/ASK/TRYAGAIN are rerun one by one through
        :meth:`run` (within one retry window for the whole batch). A node that
        failed gives each of its calls a LockBackendError."""
        try:
            groups = self._by_node([call.keys[0] for call in calls])
        except _ERRORS as exc:
            raise backend_error(exc, calls[0].action, None) from exc
        answers = []
        for node, indices in groups:
            batch = [calls[i] for i in indices]
            try:
                raw, acks = server.pipelined(self._node_client(node), batch, self.wait_timeout_ms)
                answers.append(self._batch(batch, raw, acks))
            except RedisError as exc:  # the node failed (or failed over): each call did
                answers.append(_failed(batch, exc))
        return self._rerun(calls, self._merge(len(calls), groups, answers, 1))

    def _rerun(self, calls: Sequence[Call], results: list[Any]) -> list[Any]:
        redo, stale = _to_rerun(results)
        if stale:
            self._refresh()  # for the reruns, and for the next batch
        pauses = retry_pauses(self.retry_window)
        for i in redo:
            try:
                results[i] = self._run(calls[i], pauses)
            except (AmbiguousReply, LockBackendError, NotReplicated) as exc:
                results[i] = _as_result(exc, calls[i])
        return results

    def scan_page(self, pattern: str, cursor: str, count: int) -> tuple[str, list[str]]:
        """One SCAN step on one primary; the cursor moves on to the next primary when
        that one is done, and is "0" after the last."""
        try:
            primaries, index, start = self._scan_at(cursor)
        except _ERRORS as exc:
            raise backend_error(exc, "list the locks", None) from exc
        node_client = self._node_client(primaries[index][1])
        next_cursor, keys = server.scan(node_client, pattern, start, count)
        return self._scan_cursor(primaries, index, next_cursor), keys

    def load(self, keys: Sequence[str], *, waiters: bool = False) -> list[LockInfo]:
        """Snapshot the locks at *keys*: one pipelined round trip per node (once more
        after a resharding moved some of them)."""
        if not keys:
            return []
        reads = "waiters" if waiters else "length"
        for attempt in range(2):
            try:
                replies = self._read_snapshots(keys, reads)
            except _ERRORS as exc:
                raise backend_error(exc, "read the locks", None) from exc
            if attempt or not any(isinstance(r, Exception) and retryable(r) for r in replies):
                break
            self._refresh()
        return server.snapshots(self.keyspace, keys, replies, reads)

    def _read_snapshots(self, keys: Sequence[str], reads: str) -> list[Any]:
        groups = self._by_node(keys)
        answers = []
        for node, indices in groups:
            pipe = self._node_client(node).pipeline(transaction=False)
            server.queue_snapshot_reads(pipe, self.keyspace, [keys[i] for i in indices], reads)
            answers.append(pipe.execute(raise_on_error=False))
        return self._merge(len(keys), groups, answers, server.READS[reads])

    def server_config(self, pattern: str) -> dict[str, str]:
        """``CONFIG GET pattern`` of the first primary (in slot order); the primaries
        of a cluster are expected to share their configuration."""
        try:
            primaries = self._primaries()
        except _ERRORS as exc:
            raise backend_error(exc, "read the server's configuration", None) from exc
        return server.config(self._node_client(primaries[0][1]), pattern)

    def connected_replicas(self) -> int:
        """The fewest replicas any primary reports connected."""
        return min(
            server.connected_replicas(self._node_client(node)) for _, node in self._primaries()
        )

    def scripting_refusals(self) -> list[ScriptingUnavailable | None]:
        """Whether the cluster runs scripts, asked of the node that serves the probe's
        key (the nodes of a cluster are expected to share their configuration)."""
        return [server.scripting_refusal(self.client, self.keyspace)]

    def hub(self, key: bytes | str | None = None) -> WakeHub:
        """This process's wake-up hub for waits on the lock *key*: subscribed on the
        key's own node (as the client last learnt it), where the release's ``PUBLISH``
        runs, so the wake-up never crosses the cluster bus (on Redis 7.0 that link
        lacks ``TCP_NODELAY``: a message there can wait ~40 ms for a delayed ACK).
        Each node's hub has its own channel. Without *key*: the hub on one node at
        a time (see :class:`NodePicker`), for waits that name no lock."""
        if key is None:
            return hub_for(self._picker, self.keyspace.wake_prefix)
        node, client = self._route(key)
        return hub_for(client, f"{self.keyspace.wake_prefix}{node.name}:")

    @property
    def hub_node(self) -> str | None:
        """The node (``host:port``) the hub subscribed on last, if it did."""
        return self._picker.node_name


class AsyncClusterBackend(AsyncBackendState, _Cluster):
    """An asyncio backend on a ``redis.asyncio.cluster.RedisCluster`` (one event loop)."""

    def _node_client(self, node: Any) -> Any:
        """A plain ``redis.asyncio.Redis`` on *node* (made once per node; the asyncio
        cluster client has no per-node client of its own)."""
        import redis.asyncio

        client = self._clients.get(node.name)
        if client is None:
            pool = redis.asyncio.ConnectionPool(
                connection_class=node.connection_class, **node.connection_kwargs
            )
            client = self._clients[node.name] = redis.asyncio.Redis.from_pool(pool)
        return client

    async def _ready(self) -> None:
        """Learn the cluster's slots (once; later calls return at once)."""
        await self.client.initialize()

    async def run(self, call: Call) -> Any:
        """:meth:`ClusterBackend.run`, awaitable."""
        return await self._run(call, retry_pauses(self.retry_window, call.deadline))

    async def _run(self, call: Call, pauses: Iterator[float]) -> Any:
        routed = False
        while True:
            try:
                return await self._run_once(call, routed)
            except _ERRORS as exc:
                routed = True
                pause = next(pauses, None) if retryable(exc) else None
                if isinstance(exc, _STALE_MAP):
                    try:
                        await self.client.nodes_manager.initialize()
                    except _ERRORS:
                        pass  # a failing cluster may not answer: learn it next time
                if pause is None:
                    raise failure(exc, call) from exc
            await asyncio.sleep(pause)

    async def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """:meth:`ClusterBackend.run_many`, awaitable: the nodes' batches go at once."""
        try:
            await self._ready()
            groups = self._by_node([call.keys[0] for call in calls])
        except _ERRORS as exc:
            raise backend_error(exc, calls[0].action, None) from exc

        async def node_batch(node: Any, indices: list[int]) -> list[Any]:
            batch = [calls[i] for i in indices]
            try:
                client = self._node_client(node)
                raw, acks = await server.apipelined(client, batch, self.wait_timeout_ms)
            except RedisError as exc:  # the node failed (or failed over): each call did
                return _failed(batch, exc)
            return self._batch(batch, raw, acks)

        answers = await asyncio.gather(*(node_batch(node, i) for node, i in groups))
        results = self._merge(len(calls), groups, list(answers), 1)
        redo, stale = _to_rerun(results)
        if stale:
            try:
                await self.client.nodes_manager.initialize()
            except _ERRORS:
                pass  # a failing cluster may not answer: learn it next time
        pauses = retry_pauses(self.retry_window)
        for i in redo:
            try:
                results[i] = await self._run(calls[i], pauses)
            except (AmbiguousReply, LockBackendError, NotReplicated) as exc:
                results[i] = _as_result(exc, calls[i])
        return results

    async def _run_once(self, call: Call, routed: bool) -> Any:
        """:meth:`ClusterBackend._run_once`, awaitable."""
        if routed and not call.replicas:
            return await server.aevalsha(self.client, call)
        await self._ready()
        node_client = self._route(call.keys[0])[1]
        if not call.replicas:
            return await server.aevalsha(node_client, call)
        results, acks = await server.apipelined(node_client, [call], self.wait_timeout_ms)
        return self._settle_replicated(call, results, acks)

    async def scan_page(self, pattern: str, cursor: str, count: int) -> tuple[str, list[str]]:
        """:meth:`ClusterBackend.scan_page`, awaitable."""
        try:
            await self._ready()
            primaries, index, start = self._scan_at(cursor)
        except _ERRORS as exc:
            raise backend_error(exc, "list the locks", None) from exc
        node_client = self._node_client(primaries[index][1])
        next_cursor, keys = await server.ascan(node_client, pattern, start, count)
        return self._scan_cursor(primaries, index, next_cursor), keys

    async def load(self, keys: Sequence[str], *, waiters: bool = False) -> list[LockInfo]:
        """Snapshot the locks at *keys*: the nodes are read concurrently, one
        pipelined round trip each (once more after a resharding moved some)."""
        if not keys:
            return []
        reads = "waiters" if waiters else "length"
        for attempt in range(2):
            try:
                await self._ready()
                replies = await self._read_snapshots(keys, reads)
            except _ERRORS as exc:
                raise backend_error(exc, "read the locks", None) from exc
            if attempt or not any(isinstance(r, Exception) and retryable(r) for r in replies):
                break
            await self.client.nodes_manager.initialize()
        return server.snapshots(self.keyspace, keys, replies, reads)

    async def _read_snapshots(self, keys: Sequence[str], reads: str) -> list[Any]:
        groups = self._by_node(keys)

        async def read(node: Any, indices: list[int]) -> list[Any]:
            pipe = self._node_client(node).pipeline(transaction=False)
            server.queue_snapshot_reads(pipe, self.keyspace, [keys[i] for i in indices], reads)
            return list(await pipe.execute(raise_on_error=False))

        answers = await asyncio.gather(*(read(node, indices) for node, indices in groups))
        return self._merge(len(keys), groups, list(answers), server.READS[reads])

    #: The hub's node is any node, so a wake-up's count of receivers tells nothing.
    _hub_on_script_server = False

    def _key_node(self, key: bytes | str | None) -> Any:
        """The node of the lock *key* as the client knows it; None without a key or
        before the client learnt the slots (its first command)."""
        if key is None:
            return None
        try:
            return self._node_for(key)
        except (*_ERRORS, LookupError):
            return None

    def hub(self, key: bytes | str | None = None) -> AsyncWakeHub:
        """The event loop's wake-up hub for waits on the lock *key*: on its node, as
        :meth:`ClusterBackend.hub`; without a key (or before the client learnt the
        slots), the one on one node at a time."""
        node = self._key_node(key)
        if node is None:
            return super().hub()
        hub = self._node_hubs.get(node.name)
        if hub is None:
            prefix = f"{self.keyspace.wake_prefix}{node.name}:"
            hub = self._node_hubs[node.name] = AsyncWakeHub(self._node_client(node), prefix)
        return hub

    def local_channel(self, key: bytes | str | None = None) -> bytes | None:
        """The channel of the hub for *key* while it has waiters, else None."""
        node = self._key_node(key)
        hub = self._hub if node is None else self._node_hubs.get(node.name)
        return None if hub is None else hub.local_channel

    async def aclose(self) -> None:
        """Stop the hubs (each node's, then the default one) and close the connections."""
        hubs, self._node_hubs = list(self._node_hubs.values()), {}
        for hub in hubs:
            await hub.aclose()
        await super().aclose()

    def _subscriber(self) -> Any:
        """The hub subscribes on one node at a time (see :class:`NodePicker`)."""
        return self._picker

    def _closables(self) -> list[Any]:
        """The per-node clients, then the cluster client."""
        clients, self._clients = [*self._clients.values(), self.client], {}
        return clients
