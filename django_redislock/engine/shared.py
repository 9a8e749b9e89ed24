"""The calls of a hold of a semaphore or read-write lock (pure).

A hold of a primitive with several holders differs from a mutex's
(:class:`~.mutex.Mutex`) only in its scripts (:mod:`.lua.shared`), its keys
(the five of ``LockKeys.shared``; a renewal takes the lock hash and the lease
set), and its *mode*: ``s`` (a permit of a semaphore of ``limit`` permits),
``r`` (a read) or ``w`` (a write). A :class:`Shared` says which, and makes those
calls; the flows, drivers, watchdog and ``Lock`` are the mutex's and ask their
hold's kind for each call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..exceptions import LimitMismatch, LockError, LockMismatch, LockUpgradeError
from .calls import Call, RunCompleted
from .keys import LockKeys
from .lua.shared import (
    acquire_shared_script,
    cancel_shared_script,
    extend_shared_script,
    release_shared_script,
    renew_shared_script,
)

#: What each mode is called where people read it (LockInfo, errors).
MODE_NAMES = {"s": "permit", "r": "read", "w": "write"}
#: The primitive each mode belongs to.
PRIMITIVES = {"s": "semaphore", "r": "rwlock", "w": "rwlock"}
_ARTICLES = {"mutex": "a mutex", "semaphore": "a semaphore", "rwlock": "a read-write lock"}
_OTHER_MODE = {"r": "w", "w": "r"}


def _counted_as(name: str, mode: str) -> str:
    """The name the client counts an owner's holds of *name* in *mode* under."""
    return f"{name}\0{mode}"


class Shared:
    """The mode of one kind of hold on a semaphore or read-write lock."""

    __slots__ = ("mode", "limit", "primitive", "mode_name", "_mode_arg", "_limit_arg")

    def __init__(self, mode: str, limit: int = 0) -> None:
        if mode not in MODE_NAMES:
            raise ValueError(f"unknown shared mode {mode!r}")
        self.mode = mode
        self.limit = limit
        self.primitive = PRIMITIVES[mode]
        #: ``HolderInfo.mode`` of such a hold.
        self.mode_name = MODE_NAMES[mode]
        self._mode_arg = mode.encode()
        self._limit_arg = str(limit).encode()

    def member(self, owner: str) -> str:
        """The holder field of *owner* in the lock hash (and in the lease set)."""
        return f"{self.mode}:{owner}"

    def keys(self, lock_keys: LockKeys) -> tuple[bytes, ...]:
        """The keys of every call of such a hold: all five."""
        return lock_keys.shared

    def known_name(self, name: str) -> str:
        """The name the client counts its owners' holds under (reads and writes apart)."""
        return _counted_as(name, self.mode)

    def known_names(self, name: str) -> tuple[str, ...]:
        """The counts an acquire carries: its own mode's (a hold the client does not
        know of is adopted, as a mutex's), then a read's or a write's other mode's.
        A hold in the other mode that the client counts as none (its release failed,
        which counts as done) is an orphan the script drops, instead of refusing a
        write as an upgrade or keeping an orphaned write under a read."""
        other = _OTHER_MODE.get(self.mode)
        own = self.known_name(name)
        return (own,) if other is None else (own, _counted_as(name, other))

    # -- calls -----------------------------------------------------------------

    def acquire_call(
        self, keys: Sequence[bytes], args: Sequence[Any], name: str, replicas: int,
        deadline: float | None,
    ) -> Call:  # fmt: skip
        """The acquire call; *args* are the mutex acquire's first eight arguments."""
        return Call(
            acquire_shared_script,
            keys,
            (*args, self._mode_arg, self._limit_arg),
            "acquire the lock",
            name,
            replicas,
            deadline,
        )

    def release_call(
        self, keys: Sequence[bytes], owner: str, nonce: str, retention: bytes, everything: bool,
        name: str, action: str = "release the lock", *, here: bytes | None = None,
    ) -> Call:  # fmt: skip
        """Release one hold of *owner* in this mode (every hold, with *everything*);
        *here*: as for :meth:`.Mutex.release_call` (the places handed to waiters on it
        come back as their wake-up messages)."""
        args: tuple[Any, ...] = (owner, nonce, retention, b"all" if everything else b"",
                                 self._mode_arg)  # fmt: skip
        if here:
            args += (here,)
        return Call(release_shared_script, keys, args, action, name)

    def cancel_call(
        self, keys: Sequence[bytes], owner: str, nonce: str, retention: bytes, name: str
    ) -> Call:
        """End the wait *nonce* of *owner* (or find it was granted meanwhile)."""
        args = (owner, nonce, retention, self._mode_arg)
        return Call(cancel_shared_script, keys, args, "cancel the wait", name)

    def renew_call(
        self, keys: Sequence[bytes], owner: str, ttl_ms: int, name: str, replicas: int,
        *, claim: bool = False,
    ) -> Call:  # fmt: skip
        """Renew (or, with *claim*, claim after a hand-off) *owner*'s lease to *ttl_ms*."""
        args = (self.member(owner), ttl_ms, b"1" if claim else b"")
        action = "claim the lock" if claim else "renew the lock"
        return Call(renew_shared_script, leases(keys), args, action, name, replicas)

    def extend_call(
        self, keys: Sequence[bytes], owner: str, ms: int, replace: bool, name: str, replicas: int
    ) -> Call:
        """Lengthen (or, with *replace*, set) *owner*'s lease."""
        args = (self.member(owner), ms, 1 if replace else 0)
        return Call(extend_shared_script, leases(keys), args, "extend the lock", name, replicas)

    # -- refusals --------------------------------------------------------------

    def refusal(self, reply: str | bytes, name: str) -> LockError:
        """The error of an acquire the script refused (see :func:`refusal`)."""
        return refusal(reply, name, self.primitive, self.limit)


def leases(keys: Sequence[bytes]) -> tuple[bytes, bytes]:
    """The keys of a renewal or extension (lock hash, lease set) among the five keys."""
    return (keys[0], keys[4])


def refusal(reply: str | bytes, name: str, asked: str, limit: int = 0) -> LockError:
    """The error for an acquire script's refusal *reply*: ``TYPE <primitive>`` (the
    name is in use as another primitive), ``LIMIT <n>`` (a semaphore's limit in use
    differs), ``UPGRADE`` (a write asked for while holding a read) or ``DONE`` (the
    run a mutex hold was asked for completed: see :class:`~.mutex.Mutex`)."""
    text = reply.decode() if isinstance(reply, bytes) else reply
    word, _, value = text.partition(" ")
    if word == "TYPE":
        return LockMismatch(
            f"lock {name!r} is in use as {_ARTICLES.get(value, value)}; it cannot be "
            f"used as {_ARTICLES[asked]} at the same time (pick another name)",
            name=name,
            existing=value,
        )
    if word == "LIMIT":
        existing = int(value)
        return LimitMismatch(
            f"semaphore {name!r} is in use with limit={existing}, not {limit}: every user "
            "of a semaphore must pass the same limit (it can change once nobody holds it)",
            name=name,
            limit=limit,
            existing=existing,
        )
    if word == "DONE":
        return RunCompleted(f"lock {name!r}: the run it was asked for completed already", name=name)
    if word == "UPGRADE":
        return LockUpgradeError(
            f"cannot take the write lock of {name!r} while holding its read lock: "
            "upgrading would wait for itself forever; release the read first (a writer "
            "may take reads, not the other way round)",
            name=name,
        )
    return LockError(f"lock {name!r}: unexpected reply {text!r}", name=name)
