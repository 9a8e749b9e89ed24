"""A script sent on one of the client's pooled connections, past its command wrapper.

A lock's acquire and release are one ``EVALSHA`` each, and redis-py's
``execute_command`` wraps every command in work a script does not need: its
metrics hooks (``redis.observability``, called even when switched off), a
per-command dispatch, a retry closure and a response-callback lookup: about 15
Python calls and 7 µs of client CPU per command on redis-py 8.1, more on asyncio
(docs/benchmarks.md, "The hot path, seventh step"). When nothing observes the
client's commands, :func:`send` does what that wrapper does for a script and no
more: a connection of the client's own pool (kept between exchanges where that
pool allows, :mod:`.kept`, with the pool's fork and stale-data checks; else lent
by the pool each time), the command written and its reply read under the
connection's retry policy, with the failure handling ``execute_command`` has in the
installed redis-py (disconnect, and before redis-py 6 retry only the errors listed
in ``retry_on_error``), the connection kept or given back. The command is packed by
:mod:`.wire` (the bytes redis-py's Python packer would write, in fewer steps).

Everything goes through ``execute_command`` when :func:`plain` says something may
observe or change the client's commands: its class is not redis-py's own or
overrides ``execute_command``, that method was wrapped on the class or the instance
(OpenTelemetry's, Sentry's and ddtrace's instrumentation patch the class), the client
is a single-connection one, ``EVALSHA`` has a response callback, or redis-py's own
metrics are switched on. A retried send after a lost reply counts once: every
script is idempotent per nonce, as it must be for ``execute_command``'s retries.

A batch of scripts goes the same way past the client's pipeline (:func:`send_many`,
as ``Pipeline.execute(raise_on_error=False)``: one write, every reply read, an
error reply kept in its place), unless :func:`plain_batch` says the pipeline is
observed too (a wrapper on ``Pipeline.execute``, an overridden ``pipeline()``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.client
import redis.client
from redis.exceptions import ResponseError

from django_redislock.engine.backends.kept import (
    REDIS_PY_VERSION,
    aborrow,
    agive_back,
    borrow,
    give_back,
)
from django_redislock.engine.backends.wire import packed

try:  # redis-py 7.2+: its own OpenTelemetry metrics
    from redis.observability.providers import get_observability_instance as _observability
except ImportError:  # pragma: no cover - older redis-py has none
    _observability = None  # type: ignore[assignment]

_PLAIN_SYNC = redis.Redis.__dict__["execute_command"]
_PLAIN_ASYNC = redis.asyncio.Redis.__dict__["execute_command"]
#: What a batch needs of the client to go past its pipeline, by the client's kind
#: (its ``execute_command``): redis-py's own ``pipeline()``, and its pipeline class
#: with that class's own ``execute`` (the method instrumentation wraps).
_PIPELINE: dict[Any, tuple[Any, Any, Any]] = {
    _PLAIN_SYNC: (
        redis.Redis.__dict__["pipeline"],
        redis.client.Pipeline,
        redis.client.Pipeline.__dict__["execute"],
    ),
    _PLAIN_ASYNC: (
        redis.asyncio.Redis.__dict__["pipeline"],
        redis.asyncio.client.Pipeline,
        redis.asyncio.client.Pipeline.__dict__["execute"],
    ),
}


#: Before redis-py 6, ``execute_command`` retried only the errors listed in the
#: connection's ``retry_on_error``; since, whatever its retry policy supports.
_RETRY_LISTED_ONLY = REDIS_PY_VERSION < (6, 0)


def plain(client: Any) -> bool:
    """Whether nothing observes *client*'s commands, so :func:`send` may skip
    ``execute_command`` (see the module's docstring); checked on every call, so
    instrumentation installed after the first lock call is honoured."""
    cls = type(client)
    if cls.execute_command is _PLAIN_SYNC:
        if client.connection is not None:
            return False
    elif cls.execute_command is not _PLAIN_ASYNC or client.single_connection_client:
        return False
    return (
        "execute_command" not in client.__dict__
        and "EVALSHA" not in client.response_callbacks
        and (_observability is None or _observability().get_provider_manager() is None)
    )


def plain_batch(client: Any) -> bool:
    """Whether nothing observes *client*'s pipelines either, so :func:`send_many` may
    skip them: :func:`plain`, and its ``pipeline()`` and its pipeline class's
    ``execute`` are redis-py's own (instrumentation wraps ``Pipeline.execute``)."""
    if not plain(client):
        return False
    method, pipeline, execute = _PIPELINE[type(client).execute_command]
    return (
        type(client).pipeline is method
        and pipeline.execute is execute
        and "pipeline" not in client.__dict__
    )


# An error reply is stored without its traceback and raised with no local left holding
# it: an exception kept in a local of a frame its traceback holds keeps every frame of
# the call alive -- and the Lock in them, renewed by the watchdog while it lives --
# until the cyclic garbage collector runs (a Lock dropped while held, after its first
# script met NOSCRIPT, was renewed on). The stored traceback only pointed into
# redis-py's parser.


def send(client: Any, args: tuple[Any, ...]) -> Any:
    """Send the command *args* on a connection of *client*'s pool and read its
    reply, retried as ``execute_command`` would; redis-py's errors propagate (an
    error reply raised, as there)."""
    (reply,) = send_many(client, (args,))
    if isinstance(reply, ResponseError):
        try:
            raise reply
        finally:
            del reply  # no cycle: see above send()
    return reply


def send_many(client: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Send *commands* in one write on a connection of *client*'s pool and read every
    reply, as a pipeline's ``execute(raise_on_error=False)`` does: an error reply is
    returned in its place; the batch is retried whole as the pipeline would."""
    pool = client.connection_pool
    conn, kept = borrow(pool)
    try:
        return conn.retry.call_with_retry(  # type: ignore[no-any-return]
            partial(_exchange_many, conn, commands), partial(_failed, conn)
        )
    finally:
        give_back(pool, kept, conn)


def _exchange_many(conn: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    conn.send_packed_command(packed(conn, commands))
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(conn.read_response())
        except ResponseError as exc:
            replies.append(exc.with_traceback(None))  # no cycle: see above send()
    return replies


def _failed(conn: Any, error: Exception) -> None:
    conn.disconnect()
    _raise_unless_retried(conn, error)


def _raise_unless_retried(conn: Any, error: Exception) -> None:
    if _RETRY_LISTED_ONLY and (
        conn.retry_on_error is None or not isinstance(error, tuple(conn.retry_on_error))
    ):
        raise error


async def asend(client: Any, args: tuple[Any, ...]) -> Any:
    """:func:`send` on a ``redis.asyncio`` client."""
    (reply,) = await asend_many(client, (args,))
    if isinstance(reply, ResponseError):
        try:
            raise reply
        finally:
            del reply  # no cycle: see above send()
    return reply


async def asend_many(client: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """:func:`send_many` on a ``redis.asyncio`` client."""
    pool = client.connection_pool
    conn, kept = await aborrow(pool)
    try:
        return await conn.retry.call_with_retry(  # type: ignore[no-any-return]
            partial(_aexchange_many, conn, commands), partial(_afailed, conn)
        )
    finally:
        await agive_back(pool, kept, conn)


async def _aexchange_many(conn: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    await conn.send_packed_command(packed(conn, commands))
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(await conn.read_response())
        except ResponseError as exc:
            replies.append(exc.with_traceback(None))  # no cycle: see above send()
    return replies


async def _afailed(conn: Any, error: Exception) -> None:
    await conn.disconnect()
    _raise_unless_retried(conn, error)
