"""What the backends send to one Redis server, and how they read the answers.

Shared by the single-master backends and the cluster backend (which uses them on
each node's own connection): running a script with EVALSHA (loading it on
NOSCRIPT), a pipelined batch of scripts with an optional ``WAIT`` on the same
connection, snapshot reads (``HGETALL`` + ``PTTL``), SCAN cursors, ``CONFIG GET``
(``INFO memory`` where it is refused) and ``INFO replication``. Each function raises
redis-py's own errors; the backends map them (``base.call_error``,
``base.backend_error``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError, RedisError, ResponseError

from ...exceptions import ScriptingUnavailable
from ..calls import Call
from ..info import WAITERS_SHOWN, LockInfo, waiters_from_redis
from ..keys import KeySpace
from ..lua.common import PROBE_SCRIPT, Script
from .base import backend_error, batch_wait, detached, replicated_results


def evalsha(client: Any, call: Call) -> Any:
    """Run *call* with EVALSHA on *client*, loading its script once on NOSCRIPT.

    Through the client's ``execute_command``, as any command of the user's: its pool,
    retries, credential provider, instrumentation and maintenance notifications apply
    to every lock call."""
    script, keys = call.script, call.keys
    args = ("EVALSHA", script.sha, len(keys), *keys, *call.args)
    try:
        return client.execute_command(*args)
    except NoScriptError:
        client.execute_command(*_load(script))
        return client.execute_command(*args)


async def aevalsha(client: Any, call: Call) -> Any:
    """:func:`evalsha` on a ``redis.asyncio`` client."""
    script, keys = call.script, call.keys
    args = ("EVALSHA", script.sha, len(keys), *keys, *call.args)
    try:
        return await client.execute_command(*args)
    except NoScriptError:
        await client.execute_command(*_load(script))
        return await client.execute_command(*args)


def _load(script: Script) -> tuple[str, ...]:
    """The command that loads *script* (``SCRIPT LOAD``), sent the way its ``EVALSHA`` is."""
    return ("SCRIPT", "LOAD", script.source)


def _raise_first(replies: list[Any]) -> None:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


def _commands(calls: Sequence[Call], wait: int, wait_timeout_ms: int) -> list[tuple[Any, ...]]:
    """The commands of a batch of *calls*: each script by SHA (by its source when
    ``call.inline``: a resend after NOSCRIPT cannot run it after a later call), and
    ``WAIT`` when asked."""
    commands: list[tuple[Any, ...]] = [
        ("EVAL", call.script.source, len(call.keys), *call.keys, *call.args)
        if call.inline
        else ("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
        for call in calls
    ]
    if wait:
        commands.append(("WAIT", wait, wait_timeout_ms))
    return commands


def _split(results: list[Any], wait: int) -> tuple[list[Any], Any]:
    return (results[:-1], results[-1]) if wait else (results, None)


def pipelined(client: Any, calls: Sequence[Call], wait_timeout_ms: int) -> tuple[list[Any], Any]:
    """Run *calls* in one round trip on one connection of the plain client *client*.

    When any call asks for replicas, one ``WAIT <most asked> <wait_timeout_ms>``
    follows on the same connection (WAIT counts only that connection's writes).
    Scripts the server did not know are loaded and the batch is sent once more.
    Sent through the client's ``pipeline()`` (its instrumentation sees the batch).
    Returns each call's raw reply (an exception object for a failed one) and
    WAIT's reply (None without WAIT); raises RedisError if the round trip failed.
    """
    wait = batch_wait(calls)
    commands = _commands(calls, wait, wait_timeout_ms)
    for attempt in range(2):
        results = _pipeline(client, commands)
        missing = missing_scripts(calls, results)
        if not missing or attempt:
            break
        _raise_first(_pipeline(client, [_load(script) for script in missing]))
    return _split(results, wait)


async def apipelined(
    client: Any, calls: Sequence[Call], wait_timeout_ms: int
) -> tuple[list[Any], Any]:
    """:func:`pipelined` on a ``redis.asyncio`` client."""
    wait = batch_wait(calls)
    commands = _commands(calls, wait, wait_timeout_ms)
    for attempt in range(2):
        results = await _apipeline(client, commands)
        missing = missing_scripts(calls, results)
        if not missing or attempt:
            break
        _raise_first(await _apipeline(client, [_load(script) for script in missing]))
    return _split(results, wait)


def _pipeline(client: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return _detached_errors(pipe.execute(raise_on_error=False))


async def _apipeline(client: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return _detached_errors(await pipe.execute(raise_on_error=False))


def _detached_errors(replies: list[Any]) -> list[Any]:
    """*replies* with each error reply's traceback dropped (see ``base.detached``: the
    pipeline keeps them in a list its frame holds)."""
    for reply in replies:
        if isinstance(reply, BaseException):
            detached(reply)
    return replies


def batch_results(calls: Sequence[Call], results: list[Any], acks: Any) -> list[Any]:
    """The outcome of each call of a pipelined batch: its reply, a LockBackendError for
    a failed one, or a NotReplicated when WAIT (*acks*, None without) came short."""
    results = [
        backend_error(r, c.action, c.name) if isinstance(r, Exception) else r
        for c, r in zip(calls, results, strict=True)
    ]
    return replicated_results(calls, results, acks) if acks is not None else results


def missing_scripts(calls: Sequence[Call], results: list[Any]) -> list[Script]:
    """The scripts of *calls* the server did not know (NOSCRIPT), once each."""
    missing = {
        c.script.sha: c.script
        for c, r in zip(calls, results[: len(calls)], strict=True)
        if isinstance(r, NoScriptError)
    }
    return list(missing.values())


#: What a snapshot reads per lock, and how many replies that makes:
#: ``"plain"`` the hash and its PTTL (Redlock: its masters share no queue);
#: ``"length"`` also the queue's length (listings: one more command per lock);
#: ``"waiters"`` also the first queued owners, their entries and Redis's clock
#: (``get()``: who waits, in order).
READS = {"plain": 2, "length": 3, "waiters": 6}


def snapshot_commands(keyspace: KeySpace, key: Any, reads: str) -> list[tuple[Any, ...]]:
    """The commands that read one lock's snapshot (see :data:`READS`); the queue's
    keys share the lock's hash slot, so a cluster node answers them all."""
    commands: list[tuple[Any, ...]] = [("HGETALL", key), ("PTTL", key)]
    if reads == "plain":
        return commands
    name = keyspace.name_from_key(_key_text(key))
    keys = keyspace.keys(name) if name is not None else None
    queue_key = keys.queue if keys else key
    commands.append(("LLEN", queue_key))
    if reads == "waiters":
        waiters_key = keys.waiters if keys else key
        commands += [
            ("LRANGE", queue_key, 0, WAITERS_SHOWN - 1),
            ("HGETALL", waiters_key),
            ("TIME",),
        ]
    return commands


def queue_snapshot_reads(pipe: Any, keyspace: KeySpace, keys: Sequence[Any], reads: str) -> None:
    """Queue the reads of each of *keys* on *pipe* (see :func:`snapshot_commands`)."""
    for key in keys:
        for command in snapshot_commands(keyspace, key, reads):
            pipe.execute_command(*command)


def snapshots(
    keyspace: KeySpace, keys: Sequence[Any], replies: list[Any], reads: str
) -> list[LockInfo]:
    """The locks among *keys* that exist, from the replies of :func:`queue_snapshot_reads`.

    A key that is not a hash (another tool's key) reads as no lock; any other
    error raises LockBackendError. A queue that cannot be read leaves the
    waiters unknown rather than failing the snapshot.
    """
    step = READS[reads]
    infos: list[LockInfo] = []
    for i, raw_key in enumerate(keys):
        fields, pttl = replies[step * i], replies[step * i + 1]
        if isinstance(pttl, Exception):
            raise backend_error(pttl, "read the locks", None)
        if isinstance(fields, ResponseError) and "WRONGTYPE" in str(fields):
            fields = None  # not a hash: another tool's key
        elif isinstance(fields, Exception):
            raise backend_error(fields, "read the locks", None)
        key = _key_text(raw_key)
        name = keyspace.name_from_key(key)
        if name is None or int(pttl) == -2:
            continue
        info = LockInfo.from_redis(name, key, _hash(fields), int(pttl))
        if info is not None and step > 2 and fields is not None:
            info = _with_queue(info, replies[step * i + 2 : step * i + step])
        if info is not None:
            infos.append(info)
    return infos


def _key_text(key: Any) -> str:
    """A key as text; one that is not UTF-8 (another tool's) cannot be a lock key."""
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)


def _hash(reply: Any) -> Any:
    """An ``HGETALL`` reply as a dict (a raw command gives a flat list on RESP2)."""
    if isinstance(reply, list):
        return dict(zip(reply[::2], reply[1::2], strict=False))
    return reply


def _with_queue(info: LockInfo, replies: Sequence[Any]) -> LockInfo:
    """*info* with its queue's length, and with *replies* of ``"waiters"`` reads its waiters."""
    if any(isinstance(r, Exception) for r in replies):
        return info
    length = int(replies[0])
    if len(replies) == 1:
        return dataclasses.replace(info, queue_length=length)
    owners, entries, clock = replies[1:]
    try:
        now_ms = int(clock[0]) * 1000 + int(clock[1]) // 1000
    except (TypeError, ValueError, IndexError):
        now_ms = None
    waiters = waiters_from_redis(owners, _hash(entries) or {}, now_ms, info.primitive != "mutex")
    return dataclasses.replace(info, waiters=waiters, queue_length=length)


def scan_cursor(text: str) -> int:
    """A SCAN cursor from its text; one that is not an unsigned 64-bit number starts over."""
    try:
        value = int(text)
    except ValueError:
        return 0
    return value if 0 <= value < 2**64 else 0


def scan(client: Any, pattern: str, cursor: int, count: int) -> tuple[int, list[Any]]:
    """One SCAN step on *client* (raises LockBackendError)."""
    try:
        next_cursor, keys = client.scan(cursor, match=pattern, count=count)
    except RedisError as exc:
        raise backend_error(exc, "list the locks", None) from exc
    return int(next_cursor), list(keys)


async def ascan(client: Any, pattern: str, cursor: int, count: int) -> tuple[int, list[Any]]:
    """:func:`scan` on a ``redis.asyncio`` client."""
    try:
        next_cursor, keys = await client.scan(cursor, match=pattern, count=count)
    except RedisError as exc:
        raise backend_error(exc, "list the locks", None) from exc
    return int(next_cursor), list(keys)


def config(client: Any, pattern: str) -> dict[str, str]:
    """``CONFIG GET pattern`` of *client*'s server as text (raises LockBackendError).

    Where ``CONFIG`` is refused (ElastiCache renames it away; an ACL may deny it),
    the ``INFO memory`` fields that match *pattern*, named as ``CONFIG`` names them
    (``maxmemory_policy`` answers for ``maxmemory-policy``): the settings the
    system checks read are there, and ``INFO`` is allowed everywhere.
    """
    try:
        reply = client.config_get(pattern)
    except ResponseError as refused:
        try:
            info = client.info("memory")
        except RedisError:
            raise backend_error(refused, "read the server's configuration", None) from refused
        reply = {k.replace("_", "-"): v for k, v in info.items()}
        return {k: text(v) for k, v in reply.items() if fnmatch.fnmatchcase(k, pattern)}
    except RedisError as exc:
        raise backend_error(exc, "read the server's configuration", None) from exc
    return {text(k): text(v) for k, v in reply.items()}


def scripting_refusal(client: Any, keyspace: KeySpace) -> ScriptingUnavailable | None:
    """*client*'s server's refusal to run scripts, or None: runs a script that only
    answers 1 as every lock call runs one (EVALSHA, loaded on NOSCRIPT), on a key of
    the package's own (an ACL's key patterns allow it). Other errors give None: an
    unreachable server is another check's concern."""
    call = Call(PROBE_SCRIPT, (keyspace.keys("redislock:probe").lock,), (), "run a script")
    try:
        evalsha(client, call)
    except RedisError as exc:
        error = backend_error(exc, call.action, None)
        return error if isinstance(error, ScriptingUnavailable) else None
    return None


def connected_replicas(client: Any) -> int:
    """How many replicas *client*'s server reports connected (``INFO replication``)."""
    try:
        info = client.info("replication")
    except RedisError as exc:
        raise backend_error(exc, "read the replication state", None) from exc
    return int(info.get("connected_slaves", 0))


def text(value: Any) -> str:
    """*value* as text (redis-py answers bytes unless ``decode_responses``)."""
    return value.decode() if isinstance(value, bytes) else str(value)
