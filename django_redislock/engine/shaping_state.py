"""A guarded key's shaping as Redis has it now: the read behind ``shaping_state()``,
``locks.shaping(name)``, the admin and ``manage.py redislock show`` (pure: the call and
its reply's decoding; the I/O is the caller's).

The keys are those of :mod:`.lua.shaping`, under the lock name's hash tag. The
rate window need not be known: every admission leaves the log with an expiry of one
window, so the window is the time since the newest start plus the log's PTTL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..exceptions import ShapingUnsupported
from .calls import Call
from .lua.shaping import STATE

if TYPE_CHECKING:
    from .backends.base import AsyncBackend, Backend

__all__ = ["ShapingState", "decode_state", "shaping_key", "state_call"]


@dataclass(frozen=True)
class ShapingState:
    """A key's shaping as Redis has it now (for the admin, tests and operators)."""

    #: Starts in the rate window now.
    count: int
    #: Seconds left of the cooldown (0: none).
    cooldown_left: float
    #: Seconds until the oldest start leaves the window (0: the window is empty).
    window_frees_in: float
    #: Coalescing tasks: whether a call is pending (it runs when the running one ends).
    pending: bool = False
    #: Debounced tasks: seconds until the pending run is due (None: none pending).
    debounce_due_in: float | None = None
    #: The rate window in seconds, as the guard set it or as read from Redis (None:
    #: no start in the last window, so nothing to count).
    window: float | None = None

    @property
    def active(self) -> bool:
        """Whether anything shapes the key now (a start in the window, a cooldown, a
        pending or a debounced call)."""
        return bool(
            self.count or self.cooldown_left or self.pending or self.debounce_due_in is not None
        )


def shaping_key(backend: Backend | AsyncBackend, name: str, part: str) -> str:
    """The key ``<prefix>:<part>:{<name>}``: under the lock name's hash tag, so in the
    lock's Cluster slot."""
    keyspace = backend.keyspace
    tag = keyspace.keys(name).lock[len(keyspace.prefix) + 1 :]  # "{<name>}", escaped
    return f"{keyspace.prefix}:{part}:{tag}"


def state_call(backend: Backend | AsyncBackend, name: str, window_ms: int = 0) -> Call:
    """The read of *name*'s shaping; *window_ms* 0: the window as Redis's log says."""
    if backend.features.quorum:
        raise ShapingUnsupported(
            f"lock {name!r}: shaping (rate, cooldown, coalescing, debouncing) is kept on one "
            "Redis or a Cluster; on Redlock there is none to read"
        )
    keys = tuple(
        shaping_key(backend, name, part) for part in ("rate", "cooldown", "pending", "debounce")
    )
    return Call(STATE, keys, (window_ms,), "read the shaping", name)


def decode_state(reply: Any) -> ShapingState:
    """A STATE reply as a :class:`ShapingState`."""
    count, left, frees, pending, due_in, window = (int(v) for v in reply)
    return ShapingState(
        count,
        left / 1000,
        frees / 1000,
        bool(pending),
        None if due_in < 0 else due_in / 1000,
        window / 1000 if window > 0 else None,
    )
