"""The calls of a mutex hold (pure): its scripts (:mod:`.scripts`), its four keys,
and the options of its acquire and release (barging, taking a parent's holds over).

:class:`Mutex` and :class:`~.shared.Shared` answer the same questions -- which
keys, which call acquires, releases, cancels a wait, renews or claims, extends,
how a refusal reads -- so the acquire flow, the watchdog and ``Lock`` ask their
hold's :data:`Kind` and never which kind it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..exceptions import LockError
from .calls import Call
from .keys import LockKeys
from .lua.mutex import (
    acquire_script,
    cancel_script,
    claim_script,
    extend_script,
    release_script,
    renew_script,
    transfer_script,
)
from .shared import Shared, refusal


class Mutex:
    """A mutex hold: fair (FIFO hand-off) or barging, optionally taking over a
    parent owner's holds when it acquires, and optionally one run of a piece of work
    with a completion record (*completion*: the run's id; *completion_ms*: how long a
    record is kept). Such a hold's acquire is refused (:class:`~.calls.RunCompleted`)
    when the run's record exists, and its completing release writes the record, each
    in the lock's own script: a redelivered copy of a completed Celery task is told so
    by the acquire it makes anyway, atomically with the grant."""

    __slots__ = ("barge", "parent", "completion", "completion_ms", "_acquire_tail")

    primitive = "mutex"
    #: ``HolderInfo.mode`` of such a hold.
    mode_name = "exclusive"
    limit = 0

    def __init__(
        self, *, barge: bool = False, parent: str = "", completion: str = "",
        completion_ms: int = 0,
    ) -> None:  # fmt: skip
        #: Take a free lock even when others wait, and free (not hand over) on release.
        self.barge = barge
        #: An owner whose holds an acquire takes over ("": none).
        self.parent = parent
        #: The run whose completion record the calls read and write ("": none).
        self.completion = completion
        self.completion_ms = completion_ms
        tail: tuple[bytes | str, ...] = ()
        if parent:
            tail = (b"1" if barge else b"", parent)
        elif barge:
            tail = (b"1",)
        self._acquire_tail = tail

    def keys(self, lock_keys: LockKeys) -> tuple[bytes, ...]:
        """The keys of the acquire, release and cancel calls (the others take the first);
        a fifth, the completion record's, for a run with one. (A Lock asks once per key
        set and keeps them: see ``Lock._call_keys``.)"""
        if self.completion:
            return (*lock_keys.all, lock_keys.completion(self.completion).encode())
        return lock_keys.all

    def known_name(self, name: str) -> str:
        """The name the client counts its owners' holds under."""
        return name

    def known_names(self, name: str) -> tuple[str, ...]:
        """The counts an acquire carries (see :meth:`.shared.Shared.known_names`): its own."""
        return (name,)

    def acquire_call(
        self, keys: Sequence[bytes], args: tuple[Any, ...], name: str, replicas: int,
        deadline: float | None,
    ) -> Call:  # fmt: skip
        """The acquire call; *args* are the acquire's first eight arguments."""
        if self._acquire_tail:
            args += self._acquire_tail
        return Call(acquire_script, keys, args, "acquire the lock", name, replicas, deadline)

    def release_call(
        self, keys: Sequence[bytes], owner: str, nonce: str, retention: bytes, everything: bool,
        name: str, action: str = "release the lock", *, complete: bool = False,
        here: bytes | None = None,
    ) -> Call:  # fmt: skip
        """Release one hold of *owner* (every hold, with *everything*); with *complete*,
        write the run's completion record in the same script (also when the hold was
        lost: the run did complete). *here*: the caller's wake-up channel while it has
        waiters: a hand-off (or poke) to one of them comes back as the reply, the
        wake-up message, for the caller to deliver (see :func:`.wake.release_outcome`)."""
        args: tuple[Any, ...] = (owner, nonce, retention)
        if complete:
            if not self.completion:
                raise LockError(f"lock {name!r}: only a run's hold has a completion record")
            args += (b"all" if everything else b"", b"poke" if self.barge else b"",
                     self.completion_ms)  # fmt: skip
            if here:
                args += (here,)
        elif here:
            args += (b"all" if everything else b"", b"poke" if self.barge else b"", b"", here)
        elif self.barge:
            args += (b"all" if everything else b"", b"poke")
        elif everything:
            args += (b"all",)
        return Call(release_script, keys, args, action, name)

    def cancel_call(
        self, keys: Sequence[bytes], owner: str, nonce: str, retention: bytes, name: str
    ) -> Call:
        """End the wait *nonce* of *owner* (or find it was granted meanwhile)."""
        return Call(cancel_script, keys, (owner, nonce, retention), "cancel the wait", name)

    def renew_call(
        self, keys: Sequence[bytes], owner: str, ttl_ms: int, name: str, replicas: int,
        *, claim: bool = False,
    ) -> Call:  # fmt: skip
        """Renew *owner*'s lease to *ttl_ms*, or with *claim* take a handed-off lock for
        its whole lease (with *replicas*, a write that replicas acknowledge)."""
        if claim:
            args: tuple[Any, ...] = (owner, b"1") if replicas else (owner,)
            return Call(claim_script, keys[:1], args, "claim the lock", name, replicas)
        return Call(renew_script, keys[:1], (owner, ttl_ms), "renew the lock", name, replicas)

    def extend_call(
        self, keys: Sequence[bytes], owner: str, ms: int, replace: bool, name: str, replicas: int
    ) -> Call:
        """Lengthen (or, with *replace*, set) the lease of *owner*'s lock."""
        args = (owner, ms, 1 if replace else 0)
        return Call(extend_script, keys[:1], args, "extend the lock", name, replicas)

    def transfer_call(
        self, keys: Sequence[bytes], owner: str, new_owner: str, ms: int, name: str
    ) -> Call:
        """Hand every hold of *owner* to *new_owner*, with a lease of *ms* (0: unchanged)."""
        return Call(transfer_script, keys[:1], (owner, new_owner, ms), "hand the lock over", name)

    def refusal(self, reply: str | bytes, name: str) -> LockError:
        """The error of an acquire the script refused (the name is another primitive's)."""
        return refusal(reply, name, self.primitive)


#: The kind of a hold: what a Lock, its acquire flow and its renewals ask for calls.
Kind = Mutex | Shared

#: A fair mutex hold without a parent (the default).
FAIR = Mutex()
_BARGING = Mutex(barge=True)


def mutex_kind(*, barge: bool, parent: str, completion: str = "", completion_ms: int = 0) -> Mutex:
    """The kind of a mutex hold with these options (the two without a parent or a
    completion record are shared: a Lock is made per use, and a kind is immutable)."""
    if parent or completion:
        return Mutex(barge=barge, parent=parent, completion=completion, completion_ms=completion_ms)
    return _BARGING if barge else FAIR
