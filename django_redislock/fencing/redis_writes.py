"""Guarded Redis writes: a write that Redis makes only while a hold is current.

``held.guarded()`` (or ``locks.guarded(name, token)``) returns a :class:`GuardedRedis`.
Each of its writes is one script, one round trip: it reads the lock's hash and runs
the command only when the lock is still held with the hold's fencing token, so a
holder that was paused past its lease (GC, swap, ``SIGSTOP``) and resumes is refused
with :class:`~django_redislock.exceptions.StaleFencingToken`, and nothing is written.

The sync and asyncio methods share each command's :class:`~.engine.fenced.Write`
(its arguments and reply) and the call and reply decisions of
:mod:`django_redislock.engine.fenced`; they differ by ``await`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from django_redislock.engine.fenced import (
    Write,
    arun_write,
    hash_tag,
    run_write,
    validate_token,
    write_call,
    write_outcome,
)
from django_redislock.engine.validate import validate_name

if TYPE_CHECKING:
    from django_redislock.engine.backends.base import AsyncBackend, Backend

Key = str | bytes
Value = str | bytes | int | float


class Source(Protocol):
    """Where the backends come from (a manager's ``BackendSource``)."""

    def backend(self) -> Backend:
        """The blocking backend."""

    def abackend(self) -> AsyncBackend:
        """The running event loop's asyncio backend."""


def set_write(
    key: Key, value: Value, *, ex: float | None = None, nx: bool = False, xx: bool = False
) -> Write:
    """``SET key value [PX ms] [NX|XX]``: True when set (False: NX/XX said no)."""
    if nx and xx:
        raise ValueError("SET takes nx or xx, not both")
    args: list[Any] = [value]
    if ex is not None:
        if isinstance(ex, bool) or not isinstance(ex, (int, float)) or ex <= 0:
            raise ValueError(f"ex must be a positive number of seconds, got {ex!r}")
        args += ["PX", max(1, round(ex * 1000))]
    if nx:
        args.append("NX")
    if xx:
        args.append("XX")
    return Write("SET", (key,), tuple(args), lambda reply: reply is not None)


def hset_write(key: Key, mapping: Mapping[str | bytes, Value]) -> Write:
    """``HSET key field value ...``: how many fields were new."""
    if not mapping:
        raise ValueError("hset needs at least one field")
    args = tuple(part for field, value in mapping.items() for part in (field, value))
    return Write("HSET", (key,), args, int)


def incrby_write(key: Key, amount: int = 1) -> Write:
    """``INCRBY key amount``: the new value."""
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise TypeError(f"incrby takes an int amount, not {type(amount).__name__}")
    return Write("INCRBY", (key,), (amount,), int)


def delete_write(keys: tuple[Key, ...]) -> Write:
    """``DEL key ...``: how many keys existed."""
    return Write("DEL", keys, (), int)


def command_write(command: str, args: tuple[Any, ...], keys: int) -> Write:
    """Any command whose first *keys* arguments are its keys: Redis's reply, as it is."""
    if isinstance(keys, bool) or not isinstance(keys, int) or keys < 1:
        raise ValueError(
            f"keys must be how many of the first arguments are keys (at least 1), got {keys!r}"
        )
    if len(args) < keys:
        raise ValueError(f"{command} was given {len(args)} arguments, fewer than keys={keys}")
    return Write(command, tuple(args[:keys]), tuple(args[keys:]))


class GuardedRedis:
    """Writes to Redis made only while the lock *name* is held with *token*.

    Usually from ``held.guarded()``. Each write is atomic with its check and
    raises :class:`~django_redislock.exceptions.StaleFencingToken` (nothing
    written) when the hold is no longer current. On a Redis Cluster every key must
    be in the lock's slot: put :attr:`hash_tag` in it (``f"balance:{g.hash_tag}"``).
    Refused on Redlock (:class:`~django_redislock.exceptions.FencingUnsupported`).
    A reply lost on the network raises ``LockBackendError``: the write is not sent
    again (it may have been made).
    """

    def __init__(self, source: Source, name: str, token: int | None) -> None:
        self.name = validate_name(name)
        self.token = validate_token(token)
        self._source = source

    @property
    def hash_tag(self) -> str:
        """The lock's Redis Cluster hash tag: a key containing it is in the lock's slot."""
        return hash_tag(self._source.backend(), self.name)

    def _run(self, write: Write) -> Any:
        backend = self._source.backend()
        call = write_call(backend, self.name, self.token, write)
        return write_outcome(run_write(backend, call), call, self.token, write)

    async def _arun(self, write: Write) -> Any:
        backend = self._source.abackend()
        call = write_call(backend, self.name, self.token, write)
        return write_outcome(await arun_write(backend, call), call, self.token, write)

    def set(
        self, key: Key, value: Value, *, ex: float | None = None, nx: bool = False,
        xx: bool = False,
    ) -> bool:  # fmt: skip
        """``SET`` (with a lease of *ex* seconds, only if absent/present with *nx*/*xx*)."""
        return bool(self._run(set_write(key, value, ex=ex, nx=nx, xx=xx)))

    async def aset(
        self, key: Key, value: Value, *, ex: float | None = None, nx: bool = False,
        xx: bool = False,
    ) -> bool:  # fmt: skip
        """:meth:`set` for asyncio."""
        return bool(await self._arun(set_write(key, value, ex=ex, nx=nx, xx=xx)))

    def hset(self, key: Key, mapping: Mapping[str | bytes, Value]) -> int:
        """``HSET key field value ...``; how many fields were new."""
        return int(self._run(hset_write(key, mapping)))

    async def ahset(self, key: Key, mapping: Mapping[str | bytes, Value]) -> int:
        """:meth:`hset` for asyncio."""
        return int(await self._arun(hset_write(key, mapping)))

    def incrby(self, key: Key, amount: int = 1) -> int:
        """``INCRBY``; the new value."""
        return int(self._run(incrby_write(key, amount)))

    async def aincrby(self, key: Key, amount: int = 1) -> int:
        """:meth:`incrby` for asyncio."""
        return int(await self._arun(incrby_write(key, amount)))

    def delete(self, *keys: Key) -> int:
        """``DEL``; how many of *keys* existed."""
        return int(self._run(delete_write(keys)))

    async def adelete(self, *keys: Key) -> int:
        """:meth:`delete` for asyncio."""
        return int(await self._arun(delete_write(keys)))

    def execute(self, command: str, *args: Any, keys: int = 1) -> Any:
        """Run any Redis *command* guarded; its first *keys* arguments are its keys
        (``execute("LPUSH", "jobs:{q}", "a", "b")``, ``execute("RENAME", a, b, keys=2)``).
        Returns Redis's reply as the script got it."""
        return self._run(command_write(command, args, keys))

    async def aexecute(self, command: str, *args: Any, keys: int = 1) -> Any:
        """:meth:`execute` for asyncio."""
        return await self._arun(command_write(command, args, keys))

    def __repr__(self) -> str:
        return f"<GuardedRedis {self.name!r} token={self.token}>"
