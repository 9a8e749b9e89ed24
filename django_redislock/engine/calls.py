"""What a lock sends to Redis and how it reads the answers (pure).

A :class:`Call` names a script, its keys and arguments; the backends run it.
The decoders turn replies into values the flows and primitives decide on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..exceptions import LockError
from .lua.common import Script


class RunCompleted(LockError):
    """An acquire for one run of a piece of work was refused, holding nothing: that run
    completed already (its completion record exists; see :class:`~.mutex.Mutex`).

    Advanced, raised only to a hold made with a completion record: the Celery
    integration drops a broker's copy of a completed ``acks_late`` task on it.
    """


class AmbiguousReply(Exception):
    """The command may or may not have run (the connection dropped or timed out).

    Raised by a backend for state-changing calls; the flows retry once with the
    same nonce, which makes the scripts answer what really happened.
    """

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class NotReplicated(Exception):
    """The call ran, but fewer replicas than it asked for acknowledged its writes.

    Raised by a backend (for a :class:`Call` with ``replicas``) after the script
    ran and ``WAIT`` timed out; the flows decide what to undo. *reply* is the
    script's reply, *acks* how many replicas acknowledged, *required* how many
    were asked for.
    """

    def __init__(self, reply: Any, acks: int, required: int) -> None:
        super().__init__(f"{acks} of {required} replicas acknowledged the write")
        self.reply = reply
        self.acks = acks
        self.required = required


class Call(NamedTuple):
    """One script run: the script, its keys and arguments, and what it is for."""

    script: Script
    keys: Sequence[bytes | str]
    args: Sequence[Any]
    #: What the call does, for error messages ("acquire the lock").
    action: str
    #: The lock's name, for error messages (None for calls on many locks).
    name: str | None = None
    #: How many replicas must acknowledge the call's writes (``WAIT``) before it
    #: counts; 0: do not wait. A backend that got fewer raises :class:`NotReplicated`.
    replicas: int = 0
    #: When the caller stops waiting (``time.monotonic()``), or None: a backend that
    #: retries transient errors (a migrating slot, a failover) retries until then,
    #: else within its own bounded window.
    deadline: float | None = None
    #: Sent in a batch with its source (``EVAL``), so that it never fails with NOSCRIPT:
    #: a batch that did is sent again whole, after the calls behind it ran once, and
    #: a call that must run before them (a :class:`Prior`) would then run after them.
    inline: bool = False

    @property
    def call(self) -> Call:
        """The call itself: a Call is also the flows' "run this" effect (``flows.Run``)."""
        return self


class Prior(NamedTuple):
    """A call sent just before a release, in the release's round trip where the backend
    runs several calls in one (a cooldown's start before its run's release: whoever
    the lock goes to next finds the cooldown), else in a round trip of its own first."""

    call: Call
    #: Told the call's reply, or the LockBackendError it got (never raises: the release
    #: goes on whatever happened to it).
    settle: Callable[[Any], None]


class Attempt(NamedTuple):
    """The outcome of an acquire or a cancelled wait."""

    held: bool
    #: The fencing token when held; else the holder's remaining lease in ms (-1: no expiry).
    value: int
    #: The owner's hold count in Redis when held (0 otherwise).
    holds: int
    #: Granted after waiting in the queue: a hand-off is leased only for the
    #: claim window until the new holder claims it (renewal or CLAIM).
    handed: bool = False


def decode_attempt(reply: Any) -> Attempt:
    """Decode an ACQUIRE/CANCEL reply.

    The common replies are one integer, which is cheaper to parse than an array:
    a fresh grant is its fencing token (> 0), "held by someone else" is
    ``-2 - pttl`` (so ``pttl`` is -1 for a lock without expiry); a re-entry or a
    repeated acquire is ``{fence, count}``.
    """
    if isinstance(reply, int):
        if reply > 0:
            return Attempt(True, reply, 1)
        return Attempt(False, -2 - reply, 0)
    return Attempt(True, int(reply[0]), int(reply[1]))


@dataclass(frozen=True)
class ExtendResult:
    """The outcome of an operator's ``force_extend``."""

    #: One of "extended", "gone", "changed" (owner/token differ), "no-expiry".
    status: str
    #: The new remaining lease in seconds when extended, else None.
    ttl: float | None = None

    @property
    def extended(self) -> bool:
        """True if the lease was lengthened."""
        return self.status == "extended"

    @classmethod
    def from_reply(cls, reply: Any) -> ExtendResult:
        """Decode a FORCE_EXTEND reply (new lease in ms, or 0 / -1 / -2)."""
        value = int(reply)
        if value > 0:
            return cls("extended", value / 1000.0)
        return cls({0: "gone", -1: "changed", -2: "no-expiry"}[value])
