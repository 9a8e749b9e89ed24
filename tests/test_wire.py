"""The direct path packs its commands itself, into the bytes redis-py would write.

engine/backends/wire.py packs a lock's commands in one join where redis-py's Python
packer would; a connection that packs another way (hiredis's packer, a
``command_packer`` or a connection class of the user's) keeps packing them. The bytes
are compared with redis-py's own packer's, for the encodings and argument kinds a
client can have; the connection classes are real subclasses in a real pool, used by
a lock on a real Redis.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection
from django.conf import settings
from redis.exceptions import DataError

from django_redislock import LockManager
from django_redislock.engine.backends import wire

_COMMANDS = [
    ("EVALSHA", "0" * 40, 4, "redislock:{caf\xe9}", "k2", "k3", "k4", "owner:1", "n.1"),
    ("EVALSHA", "1" * 40, 1, b"bytes \x00\xff", "", -7, 3.25, 10**20, "x" * 10_000),
    ("WAIT", 1, 250),
]


def _connections(encoding: str, errors: str) -> Iterator[Any]:
    """A sync and an asyncio connection with this encoding (never connected)."""
    yield redis.connection.Connection(encoding=encoding, encoding_errors=errors)
    yield redis.asyncio.connection.Connection(encoding=encoding, encoding_errors=errors)


def _redis_pys_bytes(conn: Any, commands: Any) -> bytes:
    return b"".join(bytes(chunk) for chunk in conn.pack_commands(commands))


def _packed_by_wire(conn: Any, commands: Any) -> tuple[bytes, bool]:
    """What wire.packed gives for *commands*, and whether it packed them itself (not
    through the connection's ``pack_command`` or ``pack_commands``)."""
    own = {conn.pack_command.__code__, conn.pack_commands.__code__}
    called = []

    def record(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code in own:
            called.append(1)

    sys.setprofile(record)
    try:
        chunks = wire.packed(conn, commands)
    finally:
        sys.setprofile(None)
    return b"".join(chunks), not called


def _python_packer(conn: Any) -> bool:
    """Whether redis-py packs in Python on *conn* (asyncio always; sync without hiredis)."""
    packer = getattr(conn, "_command_packer", None)
    return packer is None or type(packer) is redis.connection.PythonRespSerializer


@pytest.mark.parametrize(
    ("encoding", "errors"), [("utf-8", "strict"), ("latin-1", "strict"), ("ascii", "replace")]
)
def test_the_bytes_are_redis_pys_for_every_kind_of_argument(encoding: str, errors: str) -> None:
    for conn in _connections(encoding, errors):
        packed, by_wire = _packed_by_wire(conn, _COMMANDS)
        assert by_wire == _python_packer(conn), type(conn)  # hiredis's packer: its own
        assert packed == _redis_pys_bytes(conn, _COMMANDS), type(conn)


def _outcome(pack: Callable[..., Any], *args: Any) -> Any:
    """The bytes ``pack(*args)`` gives, or the type of what it raises."""
    try:
        return b"".join(pack(*args))
    except Exception as exc:  # noqa: BLE001 (compared, not handled)
        return type(exc)


@pytest.mark.parametrize("refused", [True, None, object(), "\u2603"])
def test_an_argument_redis_py_refuses_is_refused_alike(refused: Any) -> None:
    # (hiredis's packer encodes text as UTF-8 whatever the encoding: the snowman passes.)
    for conn in _connections("latin-1", "strict"):
        command = [("EVALSHA", "0" * 40, 0, refused)]
        expected = _outcome(conn.pack_commands, command)
        assert _outcome(wire.packed, conn, command) == expected, type(conn)
        if _python_packer(conn):
            assert expected in (DataError, UnicodeEncodeError)


def test_a_lock_named_and_described_in_any_script_round_trips(name: str) -> None:
    manager = LockManager(client=redis.Redis.from_url(settings.REDIS_URL))
    named = f"{name}:caf\xe9 \u2603 \U0001f512"
    meta = {"who": "Jos\xe9", "why": "\u2603 " + "x" * 8000}  # past redis-py's chunk size
    with manager.lock(named, ttl=10, auto_renew=False, meta=meta):
        info = manager.get(named)
        assert info is not None and info.name == named
        assert info.meta["who"] == meta["who"] and info.meta["why"] == meta["why"]
    assert manager.get(named) is None


class _CountingPacker(redis.connection.PythonRespSerializer):
    """A user's ``command_packer``: redis-py's, counting what it packs."""

    packed: list[Any] = []

    def pack(self, *args: Any) -> Any:
        type(self).packed.append(args[0])
        return super().pack(*args)


def _counting_packer() -> _CountingPacker:
    probe = redis.connection.Connection()
    return _CountingPacker(probe._buffer_cutoff, probe.encoder.encode)


class _OwnPackingConnection(redis.connection.Connection):
    """A connection class that packs its own way (here: redis-py's, counted)."""

    packed: list[Any] = []

    def pack_command(self, *args: Any) -> Any:
        type(self).packed.append(args[0])
        return super().pack_command(*args)


class _OwnPackingAsyncConnection(redis.asyncio.connection.Connection):
    """:class:`_OwnPackingConnection` for asyncio."""

    packed: list[Any] = []

    def pack_command(self, *args: Any) -> Any:
        type(self).packed.append(args[0])
        return super().pack_command(*args)


def _a_lock_cycle(client: redis.Redis, name: str) -> None:
    manager = LockManager(client=client)
    with manager.lock(name, ttl=10, auto_renew=False):
        assert manager.get(name) is not None
    assert manager.get(name) is None


def _count_packed(packed: list[Any], run: Callable[[], None]) -> list[Any]:
    packed.clear()
    run()
    return list(packed)


def test_a_command_packer_of_the_users_packs_the_lock_commands(name: str) -> None:
    pool = redis.ConnectionPool.from_url(settings.REDIS_URL, command_packer=_counting_packer())
    client = redis.Redis(connection_pool=pool)
    seen = _count_packed(_CountingPacker.packed, lambda: _a_lock_cycle(client, name))
    assert seen.count("EVALSHA") >= 2, seen  # acquire and release, packed by the user's
    client.close()


def test_a_connection_class_that_packs_its_own_way_packs_the_lock_commands(name: str) -> None:
    pool = redis.ConnectionPool.from_url(settings.REDIS_URL, connection_class=_OwnPackingConnection)
    client = redis.Redis(connection_pool=pool)
    seen = _count_packed(_OwnPackingConnection.packed, lambda: _a_lock_cycle(client, name))
    assert seen.count("EVALSHA") >= 2, seen
    client.close()


def test_an_asyncio_connection_class_that_packs_its_own_way_packs_the_lock_commands(
    name: str,
) -> None:
    async def cycle() -> None:
        pool = redis.asyncio.ConnectionPool.from_url(
            settings.REDIS_URL, connection_class=_OwnPackingAsyncConnection
        )
        client = redis.asyncio.Redis(connection_pool=pool)
        manager = LockManager(async_client=client)
        try:
            async with manager.lock(name, ttl=10, auto_renew=False):
                assert await manager.aget(name) is not None
            assert await manager.aget(name) is None
        finally:
            await client.aclose()

    seen = _count_packed(_OwnPackingAsyncConnection.packed, lambda: asyncio.run(cycle()))
    assert seen.count("EVALSHA") >= 2, seen


def test_with_hiredis_the_connection_packs_as_it_always_did() -> None:
    conn = redis.connection.Connection()
    if type(conn._command_packer) is redis.connection.PythonRespSerializer:
        pytest.skip("hiredis is not installed: redis-py packs in Python here")
    packed, by_wire = _packed_by_wire(conn, _COMMANDS[:1])
    assert not by_wire
    assert packed == _redis_pys_bytes(conn, _COMMANDS[:1])
