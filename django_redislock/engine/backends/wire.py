"""A batch of commands in the Redis protocol, packed for the direct path.

redis-py's Python packer (``Connection.pack_commands``) looks at every argument
through its encoder and rebuilds its buffer once per argument: about 8 µs for a
lock's ``EVALSHA`` of 15 arguments on redis-py 8.1, twice what the floor's
``SET`` costs to pack (docs/benchmarks.md, "The hot path, eighth step").
:func:`packed` writes the same bytes in one join: text arguments encoded with the
connection's own encoding and error handler, bytes as they are, anything else
through the connection's encoder (its rules for numbers, its error for a value
it refuses).

It does so only where redis-py would use that Python packer: a connection whose
class keeps redis-py's own ``pack_command`` and ``pack_commands``, and (sync) whose
command packer is redis-py's Python one. With hiredis's packer (as fast, and in C),
a ``command_packer`` of the user's, or a connection class that packs its own way,
the connection packs as it always did.

The commands are the direct path's own (``EVALSHA``, ``EVAL``, ``WAIT``): a command
name is one word, so nothing is split as redis-py splits ``"CONFIG GET"``; a large
argument is joined, not sent as a chunk of its own (a lock's arguments are small).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio.connection
import redis.connection

_SYNC_PACK = (
    redis.connection.AbstractConnection.__dict__["pack_command"],
    redis.connection.AbstractConnection.__dict__["pack_commands"],
)
_ASYNC_PACK = (
    redis.asyncio.connection.AbstractConnection.__dict__["pack_command"],
    redis.asyncio.connection.AbstractConnection.__dict__["pack_commands"],
)
_PYTHON_PACKER = redis.connection.PythonRespSerializer


def packed(conn: Any, commands: Sequence[tuple[Any, ...]]) -> Any:
    """*commands* as *conn* would write them (see the module's docstring), in what its
    ``send_packed_command`` takes: ``str`` arguments encoded with the connection's
    encoding and error handler, ``bytes`` as they are, others through its encoder."""
    cls = type(conn)
    own = (cls.pack_command, cls.pack_commands)
    if own != _ASYNC_PACK and (
        own != _SYNC_PACK or type(conn._command_packer) is not _PYTHON_PACKER
    ):
        # As redis-py would: a command alone as execute_command packs it, a batch as
        # a pipeline does (a sync connection's pack_commands skips its pack_command).
        if len(commands) == 1:
            return conn.pack_command(*commands[0])
        return conn.pack_commands(commands)
    encoder = conn.encoder
    encoding, errors, encode = encoder.encoding, encoder.encoding_errors, encoder.encode
    out: list[bytes] = []
    append = out.append
    for args in commands:
        append(b"*%d\r\n" % len(args))
        for arg in args:
            if type(arg) is str:
                arg = arg.encode(encoding, errors)
            elif type(arg) is not bytes:
                arg = encode(arg)  # numbers as their repr; a refusal for what Redis cannot take
            append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    # One buffer, in a list: what a sync and an asyncio connection both take.
    return [b"".join(out)]
