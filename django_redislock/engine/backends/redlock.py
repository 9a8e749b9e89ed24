"""Redlock: one lock over N independent Redis masters (the blocking backend, and what
the asyncio one in :mod:`.aredlock` shares).

The backend receives the same :class:`~..calls.Call` objects as the one-server
backends and sends each to every master at once; :mod:`..quorum` decides what the
replies mean. Only the I/O is here:

* **Scatter/gather on one thread.** The call is written on one connection per
  master, then the replies are read as they arrive, until all came or the
  per-master timeout (a small share of the lease) ran out. A connection whose
  reply was not read is dropped, so nobody reads a stale reply later, and its
  master is left out of the next calls for a backoff (so a paused master costs
  one timeout per backoff, not one per call). The asyncio backend does the same
  with one task per master.
* **A refused acquire leaves nothing behind.** Its give-back goes to the masters
  that answered, and is written behind the acquire on the connection of each
  master that did not (a paused master runs what waits in its socket when it
  resumes: the acquire, then the give-back). :meth:`RedlockBase._rounds` decides
  the rounds of a call for both backends.
* **Connections that cannot hang on a dead master**: see :mod:`.masters`.
* **No queue.** Waiters are recorded per master and poked by the release; see
  :mod:`..lua.quorum`. Waiting is therefore not first come, first served.
"""

from __future__ import annotations

import dataclasses
import select
import time
from collections.abc import Generator, Sequence
from typing import Any, NamedTuple

import redis
from redis.exceptions import NoScriptError, RedisError, ResponseError

from ...exceptions import ScriptingUnavailable
from ..calls import Call
from ..info import LockInfo
from ..keys import KeySpace
from ..lua.mutex import (
    acquire_script,
    cancel_script,
)
from ..quorum import (
    commit_call,
    decide_commit,
    decide_snapshot,
    not_reached,
    plan,
    quorum,
    undo_call,
)
from ..wakeup import WakeHub, hub_for
from . import server
from .base import (
    DEFAULT_WAIT_TIMEOUT_MS,
    BackendFeatures,
    backend_error,
    detached,
    make_fork_safe,
)
from .cluster import NodePicker
from .masters import checkout, sync_master

#: A master that did not answer in time is left out of the next calls for this
#: long (s), doubling while it keeps failing, up to DOWN_BACKOFF_MAX: a paused
#: master never accepts the connections made to it, and a new one per call would
#: fill its listen queue, after which every connect waits its full timeout.
DOWN_BACKOFF = 0.5
DOWN_BACKOFF_MAX = 8.0
#: Per-master timeout of a renewal batch: a base plus this much per call (s).
BATCH_TIMEOUT = (0.2, 0.0001)


class Scatter(NamedTuple):
    """A round: send *call* to every master, answer with their replies (one each).

    With *hold*, the connection of a master whose reply did not come is kept (not
    read, not reused) until the call ends, for a :class:`WriteBehind`."""

    call: Call
    timeout: float
    hold: bool = False


class WriteBehind(NamedTuple):
    """Write *call* on each held connection, behind what it carried, and close it: a
    master that did not answer runs it after that when it answers again."""

    call: Call


Round = Scatter | WriteBehind


class RedlockBase:
    """What both Redlock backends hold."""

    def __init__(
        self,
        clients: Sequence[Any],
        keyspace: KeySpace,
        retention_ms: int,
        *,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
        monotonic_fencing: bool = False,
    ) -> None:
        if len(clients) < 1:
            raise ValueError("a Redlock needs at least one master")
        #: With monotonic fencing each fresh grant takes a second round (see
        #: :func:`..quorum.commit_call`); without it tokens are per master.
        self.features = BackendFeatures(
            hands_off=False, quorum=True, monotonic_fencing=monotonic_fencing, cursor="composite"
        )
        #: Each master's own client (see :mod:`.masters`).
        self.clients = [self._own_client(c) for c in clients]
        self._picker = NodePicker(lambda: [(str(i), c) for i, c in enumerate(self.clients)])
        self.keyspace = keyspace
        self.retention_ms = retention_ms
        self.retention_arg = str(retention_ms).encode()
        self.wait_timeout_ms = wait_timeout_ms

        self._down_until = [0.0] * len(self.clients)
        self._down_for = [0.0] * len(self.clients)

    @staticmethod
    def _own_client(client: Any) -> Any:
        raise NotImplementedError  # pragma: no cover

    @staticmethod
    def _returns_grant(call: Call) -> bool:
        """Whether *call* may have granted the lock (and so may need undoing)."""
        return call.script is acquire_script or call.script is cancel_script

    def _rounds(self, call: Call) -> Generator[Round, Any, Any]:
        """Every decision of *call* on the masters, as rounds the backend performs
        (:class:`Scatter`: the masters' replies are sent back in; :class:`WriteBehind`);
        returns the answer, or raises.

        A call that may grant holds the connections of the masters that did not
        answer: their write may land when they answer again (a paused master runs
        what waits in its socket). When the grant does not stand, the give-back goes
        to the masters that answered and is written behind the acquire on the held
        connections, so it runs after the acquire wherever the acquire runs."""
        steps = plan(call)
        grants = self._returns_grant(call)
        started = time.monotonic()
        replies = yield Scatter(steps.sent, steps.timeout, grants)
        outcome = steps.combine(replies, (time.monotonic() - started) * 1000)
        if not grants:
            return outcome
        commit = self._commit_for(call, outcome)
        if commit is not None:
            replies = yield Scatter(commit, steps.timeout, True)
            outcome = decide_commit(outcome.reply, replies)
        if outcome.undo:
            undo = undo_call(call, self.retention_arg)
            yield WriteBehind(undo)
            yield Scatter(undo, steps.timeout)
        return self._settled(outcome)

    @staticmethod
    def _eval_command(call: Call) -> tuple[Any, ...]:
        """*call* as ``EVAL`` with the script's text, which a master that does not
        know the script runs too (what is written behind on a held connection)."""
        return ("EVAL", call.script.source, len(call.keys), *call.keys, *call.args)

    def _commit_for(self, call: Call, outcome: Any) -> Call | None:
        """The commit round an acquire's outcome needs (monotonic fencing), if any."""
        if not self.features.monotonic_fencing or call.script is not acquire_script:
            return None
        if outcome.undo or outcome.error is not None:
            return None
        return commit_call(call, outcome.reply)

    def _snapshot(self, info: LockInfo) -> LockInfo:
        """A merged snapshot, marked when its token is not guaranteed to increase."""
        if self.features.monotonic_fencing:
            return info
        return dataclasses.replace(info, fencing_monotonic=False)

    @staticmethod
    def _settled(outcome: Any) -> Any:
        """The reply of a settled acquire/cancel outcome (raising its error, if any)."""
        if outcome.error is not None:
            raise outcome.error
        return outcome.reply

    @property
    def client(self) -> Any:
        """The first master's client (what ``LockManager.client`` shows)."""
        return self.clients[0]

    def _left_out(self, index: int) -> bool:
        """Whether master *index* is skipped for now (it recently did not answer)."""
        return self._down_until[index] > time.monotonic()

    def _answered(self, index: int, reply: Any) -> None:
        """Note whether master *index* answered (None: it did not answer in time)."""
        if reply is None or isinstance(reply, (OSError, redis.ConnectionError, redis.TimeoutError)):
            backoff = min(DOWN_BACKOFF_MAX, max(DOWN_BACKOFF, self._down_for[index] * 2))
            self._down_for[index] = backoff
            self._down_until[index] = time.monotonic() + backoff
        else:
            self._down_for[index] = self._down_until[index] = 0.0

    def _merge(
        self, keys: Sequence[str], per_master: list[list[LockInfo] | Exception]
    ) -> list[LockInfo]:
        masters = len(per_master)
        got = [m for m in per_master if not isinstance(m, Exception)]
        if len(got) < quorum(masters):
            raise not_reached("read the locks", len(got), masters, None)
        by_key = [{info.key: info for info in infos} for infos in got]
        merged = []
        for key in keys:
            snapshot = decide_snapshot([found.get(key) for found in by_key], masters)
            if snapshot is not None:
                merged.append(snapshot)
        return merged

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} masters={len(self.clients)} prefix={self.keyspace.prefix!r}>"
        )


class RedlockBackend(RedlockBase):
    """A blocking Redlock backend over N ``redis.Redis`` clients."""

    @staticmethod
    def _own_client(client: Any) -> Any:
        own = sync_master(client)
        make_fork_safe(own)
        return own

    def run(self, call: Call) -> Any:
        """Run *call* on every master and decide the answer from their replies."""
        held: list[tuple[int, Any]] = []  # (master, connection) whose reply did not come
        rounds = self._rounds(call)
        replies: list[Any] | None = None  # sent back into the rounds
        try:
            while True:
                step, replies = rounds.send(replies), None
                if isinstance(step, WriteBehind):
                    self._let_go(held, step.call)
                    continue
                every = [[step.call]] * len(self.clients)
                got = self.scatter_calls(every, step.timeout, held if step.hold else None)
                replies = [_first(r) for r in got]
        except StopIteration as done:
            return done.value
        finally:
            self._let_go(held)

    def _let_go(self, held: list[tuple[int, Any]], behind: Call | None = None) -> None:
        """Close the *held* connections; with *behind*, write it on each first (see
        :class:`WriteBehind`). A write that fails is left: that master is gone."""
        while held:
            i, conn = held.pop()
            try:
                if behind is not None:
                    command = conn.pack_command(*self._eval_command(behind))
                    conn.send_packed_command(command, check_health=False)
            except (RedisError, OSError):
                pass
            finally:
                conn.disconnect()
                self.clients[i].connection_pool.release(conn)

    def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """Renew a batch on every master at once; each result is 1 only when a majority
        renewed it (fewer: 0, the hold is lost)."""
        if not calls:
            return []
        timeout = BATCH_TIMEOUT[0] + BATCH_TIMEOUT[1] * len(calls)
        replies = self.scatter_calls([list(calls)] * len(self.clients), timeout)
        results = []
        for i, call in enumerate(calls):
            column = [r[i] if isinstance(r, list) else r for r in replies]
            results.append(plan(call).combine(column, 0.0))
        return results

    def scatter_calls(
        self,
        calls: list[list[Call]],
        timeout: float,
        held: list[tuple[int, Any]] | None = None,
    ) -> list[Any]:
        """:meth:`scatter` of script calls; a master that did not know a script (it
        restarted empty) loads it and answers again, alone."""
        made: dict[int, list[tuple[Any, ...]]] = {}  # masters sent the same calls share them
        commands = []
        for mine in calls:
            if id(mine) not in made:
                made[id(mine)] = [_command(c) for c in mine]
            commands.append(made[id(mine)])
        return self._reload_missing(calls, self.scatter(commands, timeout, held))

    def scatter(
        self,
        commands: list[list[tuple[Any, ...]]],
        timeout: float,
        held: list[tuple[int, Any]] | None = None,
    ) -> list[Any]:
        """Send each master its commands at once, then read until all answered or
        *timeout* passed.

        One entry per master: the list of its replies (an error reply as its
        exception), an exception when the master failed, None when it did not
        answer in time. The connection of a master that did not answer is closed,
        or with *held*, added to it (master, connection) for the caller to close.
        """
        n = len(self.clients)
        replies: list[Any] = [None] * n
        conns: list[Any] = [None] * n
        pending: dict[Any, int] = {}  # socket -> master
        packed: dict[int, Any] = {}  # the same commands are encoded once
        for i, client in enumerate(self.clients):
            if self._left_out(i):
                continue
            try:
                conn = conns[i] = checkout(client.connection_pool)
                data = packed.get(id(commands[i]))
                if data is None:
                    data = packed[id(commands[i])] = conn.pack_commands(commands[i])
                conn.send_packed_command(data, check_health=False)
                pending[conn._sock] = i
            except (RedisError, OSError) as exc:
                replies[i] = detached(exc)
        deadline = time.monotonic() + timeout
        try:
            while pending:
                # Past the deadline, one last look without waiting: replies that came
                # while this process was not scheduled (a loaded machine) still count.
                # (The validity check counts the whole round, so this is safe.)
                remaining = max(0.0, deadline - time.monotonic())
                readable, _, _ = select.select(list(pending), [], [], remaining)
                if not readable and remaining == 0:
                    break
                for sock in readable:
                    # A master that started answering is read to the end of its
                    # replies (the socket timeout bounds a reply cut off midway).
                    i = pending.pop(sock)
                    got: list[Any] = []
                    try:
                        while len(got) < len(commands[i]):
                            try:
                                got.append(conns[i].read_response())
                            except ResponseError as exc:
                                got.append(detached(exc))
                    except (RedisError, OSError) as exc:
                        replies[i] = detached(exc)
                        conns[i].disconnect()
                        continue
                    replies[i] = got
        finally:
            for i, conn in enumerate(conns):
                if conn is None:
                    continue
                silent = replies[i] is None
                self._answered(i, None if silent else replies[i])
                if silent and held is not None:
                    held.append((i, conn))
                    continue
                if silent:
                    conn.disconnect()  # its reply is still coming: nobody may read it
                self.clients[i].connection_pool.release(conn)
        return replies

    def _reload_missing(self, commands: list[list[Call]], replies: list[Any]) -> list[Any]:
        """A master that did not know a script (restarted empty) loads it and answers
        again, alone."""
        for i, got in enumerate(replies):
            if not isinstance(got, list) or not any(isinstance(r, NoScriptError) for r in got):
                continue
            client = self.clients[i]
            try:
                for script in {c.script.sha: c.script for c in commands[i]}.values():
                    client.script_load(script.source)
                pipe = client.pipeline(transaction=False)
                for call in commands[i]:
                    pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
                replies[i] = pipe.execute(raise_on_error=False)
            except RedisError as exc:
                replies[i] = exc
        return replies

    def scan_page(self, pattern: str, cursor: str, count: int) -> tuple[str, list[str]]:
        """One SCAN step over the masters one after another (cursor
        ``"<master>:<its cursor>"``); a key is listed by the first master that has it."""
        index, node_cursor = scan_position(cursor, len(self.clients))
        try:
            next_cursor, keys = server.scan(self.clients[index], pattern, node_cursor, count)
        except RedisError:
            next_cursor, keys = 0, []  # a master that is down: go on with the next
        keys = [k for k in keys if not self._listed_earlier(k, index)]
        return next_position(index, next_cursor, len(self.clients)), [server.text(k) for k in keys]

    def _listed_earlier(self, key: Any, index: int) -> bool:
        for earlier in self.clients[:index]:
            try:
                if earlier.exists(key):
                    return True
            except RedisError:
                continue
        return False

    def load(self, keys: Sequence[str], *, waiters: bool = False) -> list[LockInfo]:
        """The locks at *keys* as a majority of masters sees them (read from all at once)."""
        if not keys:
            return []
        reads = [c for key in keys for c in (("HGETALL", key), ("PTTL", key))]
        timeout = BATCH_TIMEOUT[0] + BATCH_TIMEOUT[1] * len(reads)
        replies = self.scatter([reads] * len(self.clients), timeout)
        per_master: list[list[LockInfo] | Exception] = []
        for got in replies:
            if not isinstance(got, list):
                per_master.append(got if isinstance(got, Exception) else TimeoutError())
                continue
            try:
                per_master.append(server.snapshots(self.keyspace, keys, _as_dicts(got), "plain"))
            except Exception as exc:  # a master whose data cannot be read counts as down
                per_master.append(exc)
        return [self._snapshot(info) for info in self._merge(keys, per_master)]

    def server_config(self, pattern: str) -> dict[str, str]:
        """``CONFIG GET`` of the first master that answers."""
        error: Exception | None = None
        for client in self.clients:
            try:
                return server.config(client, pattern)
            except RedisError as exc:
                error = exc
        raise backend_error(error or RuntimeError("no master"), "read the configuration", None)

    def connected_replicas(self) -> int:
        """The fewest replicas any master has (Redlock does not wait for replicas)."""
        return min(server.connected_replicas(c) for c in self.clients)

    def masters_info(self) -> list[dict[str, Any] | Exception]:
        """Each master's ``INFO server`` and ``INFO replication`` (its ``run_id``, its
        ``role``), or the error it answered with (for the system checks)."""
        out: list[dict[str, Any] | Exception] = []
        for client in self.clients:
            try:
                out.append({**client.info("server"), **client.info("replication")})
            except RedisError as exc:
                out.append(exc)
        return out

    def scripting_refusals(self) -> list[ScriptingUnavailable | None]:
        """Each master's refusal to run scripts, or None (for the system checks)."""
        return [server.scripting_refusal(client, self.keyspace) for client in self.clients]

    def hub(self, key: bytes | str | None = None) -> WakeHub:
        """The wake-up hub: subscribed on one master at a time, the next after a break."""
        return hub_for(self._picker, self.keyspace.wake_prefix)


def _as_dicts(replies: list[Any]) -> list[Any]:
    """Raw ``HGETALL`` replies (flat field/value lists) as the dicts redis-py makes."""
    return [dict(zip(r[::2], r[1::2], strict=True)) if isinstance(r, list) else r for r in replies]


def _command(call: Call) -> tuple[Any, ...]:
    return ("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)


def scan_position(cursor: str, masters: int) -> tuple[int, int]:
    """(master index, its SCAN cursor) from an opaque cursor; unreadable: the start."""
    head, _, tail = cursor.partition(":")
    try:
        index, node_cursor = int(head), int(tail or 0)
    except ValueError:
        return 0, 0
    if not 0 <= index < masters or not 0 <= node_cursor < 2**64:
        return 0, 0
    return index, node_cursor


def next_position(index: int, node_cursor: int, masters: int) -> str:
    if node_cursor:
        return f"{index}:{node_cursor}"
    if index + 1 < masters:
        return f"{index + 1}:0"
    return "0"


def _first(reply: Any) -> Any:
    """A master's first reply (its only one for a single call)."""
    return reply[0] if isinstance(reply, list) else reply
