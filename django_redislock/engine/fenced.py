"""Store-enforced fencing on Redis: the calls, the refusals and the reply decisions.

Written once for both drivers: :func:`check_call` / :func:`write_call` build the
:class:`~.calls.Call` (refusing what cannot work: Redlock, a key outside the lock's
Cluster slot, a token that is no token), :func:`check_outcome` / :func:`write_outcome`
read the script's reply, and :func:`run_write` / :func:`arun_write` send a write
without the flows' resend after a lost reply (the write may have been made; redis-py's
own ``Retry`` is the client's configuration).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from redis.crc import key_slot

from ..exceptions import FencingUnsupported, LockBackendError, StaleFencingToken
from .calls import AmbiguousReply, Call
from .lua.fenced import check_script, guarded_write_script
from .shared import refusal
from .validate import validate_name

if TYPE_CHECKING:
    from .backends.base import AsyncBackend, Backend

#: Why Redlock refuses (the message of :class:`FencingUnsupported`).
REDLOCK_REFUSAL = (
    "on Redlock every master keeps its own copy of the lock (and its own fencing "
    "counter), so no single script can see that the hold is current and act on it "
    "atomically; use a single Redis (with wait_replicas) or a Redis Cluster for "
    "store-enforced fencing, or fence in your database (fenced_update, docs/fencing.md)"
)


def validate_token(token: object) -> int:
    """*token* as a fencing token (a positive int), else TypeError / ValueError."""
    if token is None:
        raise TypeError(
            "fencing token is None: the lock is not held by this owner (held.fencing_token "
            "is None outside the hold); acquire it first"
        )
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"a fencing token is an int, not {type(token).__name__}")
    if token <= 0:
        raise ValueError(f"a fencing token is positive, got {token}")
    return token


def refuse_quorum(backend: Backend | AsyncBackend, name: str, what: str) -> None:
    """Raise :class:`FencingUnsupported` when *backend* is a Redlock quorum."""
    if backend.features.quorum:
        raise FencingUnsupported(f"lock {name!r}: {what} is not available: {REDLOCK_REFUSAL}")


def check_call(backend: Backend | AsyncBackend, name: str, token: int | None) -> Call:
    """The call that asks whether the lock *name* is held with *token* (read only)."""
    name = validate_name(name)
    token = validate_token(token)
    refuse_quorum(backend, name, "checking a hold against Redis")
    lock_key = backend.keyspace.keys(name).lock.encode()
    return Call(check_script, (lock_key,), (str(token),), "check the hold", name)


def check_outcome(reply: Any, name: str) -> tuple[bool, int | None]:
    """A CHECK reply: (current, the current holder's token when it is not; None: free).
    A name in use as a semaphore or read-write lock raises LockMismatch."""
    if isinstance(reply, (bytes, str)):
        raise refusal(reply, name, "mutex")
    if reply == 1:
        return True, None
    return False, int(reply[0]) if reply and reply[0] is not None else None


def checked(reply: Any, name: str, token: int) -> int:
    """*token* when a CHECK reply says the hold is current, else raise StaleFencingToken."""
    current, holder = check_outcome(reply, name)
    if not current:
        raise stale(name, token, holder, None)
    return token


def stale(name: str, token: int, current: int | None, target: str | None) -> StaleFencingToken:
    """The error of a refused *token* (*current*: the store's token, None: no holder)."""
    now = (
        "nobody holds it now (its lease ran out, or it was released)"
        if current is None
        else f"it is held with token {current} now"
    )
    what = f"write to {target!r} refused: " if target is not None else ""
    return StaleFencingToken(
        f"lock {name!r}: {what}the hold with fencing token {token} is no longer current: {now}",
        name=name,
        token=token,
        current=current,
        target=target,
    )


def hash_tag(backend: Backend | AsyncBackend, name: str) -> str:
    """The Redis Cluster hash tag of the lock *name* (``{account:1}``): a key containing it
    is in the lock's slot (its first ``{...}`` must be this tag)."""
    lock_key = backend.keyspace.keys(validate_name(name)).lock
    return lock_key[lock_key.index("{") :]


def is_cluster(backend: Backend | AsyncBackend) -> bool:
    """Whether *backend* spreads keys over a Redis Cluster's slots."""
    from .backends.cluster import AsyncClusterBackend, ClusterBackend

    return isinstance(backend, (ClusterBackend, AsyncClusterBackend))


class Write(NamedTuple):
    """One guarded command: its name, the keys it writes, its other arguments, and what
    turns its reply into the value returned."""

    command: str
    keys: tuple[str | bytes, ...]
    args: tuple[Any, ...]
    convert: Callable[[Any], Any] = lambda reply: reply


def write_call(backend: Backend | AsyncBackend, name: str, token: int | None, write: Write) -> Call:
    """The call that runs *write* only while the lock *name* is held with *token*."""
    name = validate_name(name)
    token = validate_token(token)
    refuse_quorum(backend, name, "a guarded write")
    if not isinstance(write.command, str) or not write.command.strip():
        raise ValueError("a guarded write needs a Redis command name, e.g. 'SET'")
    if not write.keys:
        raise ValueError(
            f"a guarded {write.command} names no key: the script must name every key it "
            "writes (a command's keys come first: execute('LPUSH', key, value, keys=1))"
        )
    for key in write.keys:
        if not isinstance(key, (str, bytes)) or not key:
            raise TypeError(f"a key is a non-empty str or bytes, not {key!r}")
    lock_key = backend.keyspace.keys(name).lock
    if is_cluster(backend):
        _refuse_other_slots(lock_key, write.keys, name)
    keys = (lock_key.encode(), *write.keys)
    args = (str(token), write.command, *write.args)
    return Call(
        guarded_write_script, keys, args, f"write {_target(write)} guarded by the lock", name
    )


def _refuse_other_slots(lock_key: str, keys: Sequence[str | bytes], name: str) -> None:
    slot = key_slot(lock_key.encode())
    tag = lock_key[lock_key.index("{") :]
    for key in keys:
        raw = key.encode() if isinstance(key, str) else key
        if key_slot(raw) != slot:
            raise ValueError(
                f"lock {name!r}: key {key!r} is in Redis Cluster slot {key_slot(raw)}, the "
                f"lock in slot {slot}: a guarded write runs in the lock's slot. Put the lock's "
                f"hash tag in the key, e.g. 'balance:{tag}' (held.guarded().hash_tag)"
            )


def _target(write: Write) -> str:
    keys = [k.decode("utf-8", "replace") if isinstance(k, bytes) else k for k in write.keys]
    return ", ".join(repr(k) for k in keys)


def write_outcome(reply: Any, call: Call, token: int, write: Write) -> Any:
    """The value of a guarded write's reply, or raise :class:`StaleFencingToken` (a
    name in use as a semaphore or read-write lock: LockMismatch)."""
    if isinstance(reply, (bytes, str)):
        raise refusal(reply, call.name or "", "mutex")
    if int(reply[0]) == 1:
        return write.convert(reply[1])
    current = int(reply[1]) if len(reply) > 1 and reply[1] is not None else None
    target = ", ".join(
        k.decode("utf-8", "replace") if isinstance(k, bytes) else k for k in write.keys
    )
    raise stale(call.name or "", token, current, target)


def _unknown(call: Call, exc: AmbiguousReply) -> LockBackendError:
    error = LockBackendError(
        f"Redis did not answer while trying to {call.action}: {exc.cause}; the write may "
        "or may not have been made (this package does not send a guarded write again: it "
        "may not be idempotent)",
        name=call.name,
    )
    error.__cause__ = exc.cause
    return error


def run_write(backend: Backend, call: Call) -> Any:
    """Send a guarded write once; a lost reply raises LockBackendError (outcome unknown)."""
    try:
        return backend.run(call)
    except AmbiguousReply as exc:
        raise _unknown(call, exc) from exc.cause


async def arun_write(backend: AsyncBackend, call: Call) -> Any:
    """:func:`run_write` for asyncio."""
    try:
        return await backend.run(call)
    except AmbiguousReply as exc:
        raise _unknown(call, exc) from exc.cause
