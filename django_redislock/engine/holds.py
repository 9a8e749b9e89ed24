"""What one lock object knows about its owners' holds (pure bookkeeping).

Redis is the truth; this table is the client's view of it, per owner: the
fencing token and local hold count, the watchdog entry renewing it, why it was
lost, and the nonce of a release whose outcome is not known yet (retried with
the same nonce, so it cannot count twice).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .identity import on_fork_in_child


@dataclass(slots=True)
class Hold:
    """One owner's hold of one lock (slots: one is made per grant, on the hot path)."""

    fence: int
    count: int
    #: The watchdog entry renewing it (None when not renewed).
    watch: Any = None
    #: Why the hold was lost (None while it is believed held).
    lost_reason: str | None = None
    #: Its last release is on its way to Redis: a renewal that finds the lock
    #: gone meanwhile is that release, not a loss.
    releasing: bool = False
    #: When the grant that began it was made (``time.monotonic()``; 0: not recorded,
    #: the lock records it only for ``lock_acquired``'s receivers).
    since: float = 0.0


class HoldTable:
    """Holds by owner, and the pending release nonces."""

    __slots__ = ("_holds", "_pending")

    def __init__(self) -> None:
        self._holds: dict[str, Hold] = {}
        self._pending: dict[tuple[str, bool], str] = {}

    def get(self, owner: str) -> Hold | None:
        """The hold of *owner*, if it has one."""
        return self._holds.get(owner)

    def acquired(self, owner: str, fence: int, count: int) -> tuple[Hold, Hold | None]:
        """Record a grant with Redis's hold *count*: ``(hold, replaced)``.

        A first hold (Redis count 1, or no live local hold) starts a new
        :class:`Hold` -- *replaced* is then the previous one, whose renewal must
        stop; a re-entry adds to the existing hold and *replaced* is None with
        ``hold.watch`` kept. A new hold has ``watch`` None.
        """
        # A confirmed grant settles any release still pending for this owner:
        # its nonce must never answer for a later hold (it could hide a loss).
        self._pending.pop((owner, False), None)
        self._pending.pop((owner, True), None)
        hold = self._holds.get(owner)
        if hold is None or hold.lost_reason is not None or count == 1:
            new = self._holds[owner] = Hold(fence=fence, count=1)
            return new, hold
        hold.count += 1
        hold.fence = fence  # Redis is the truth (the same owner may hold it anew)
        return hold, None

    def release_nonce(self, owner: str, everything: bool, new_nonce: Callable[[], str]) -> str:
        """The nonce of the next release: a pending one's again, else a new one.

        Marks a hold whose last hold this release gives back as ``releasing``
        until :meth:`released` or :meth:`release_failed`.
        """
        hold = self._holds.get(owner)
        if hold is not None and (everything or hold.count <= 1):
            hold.releasing = True
        key = (owner, everything)
        nonce = self._pending.get(key)
        if nonce is None:
            nonce = self._pending[key] = new_nonce()
        return nonce

    def released(self, owner: str, everything: bool, remaining: int) -> Hold | None:
        """Record Redis's answer to a release; returns the hold now forgotten, if any.

        *remaining* is the hold count left in Redis (-1: the owner did not hold
        the lock, so the local hold is forgotten too).
        """
        self._pending.pop((owner, everything), None)
        hold = self._holds.get(owner)
        if hold is None:
            return None
        if remaining >= 0:
            hold.count -= 1
            if hold.count > 0 and remaining > 0:
                return None
        return self._holds.pop(owner)

    def release_failed(self, owner: str) -> None:
        """The release's outcome is unknown: the hold is kept for a retry."""
        hold = self._holds.get(owner)
        if hold is not None:
            hold.releasing = False

    def forget(self, owner: str) -> Hold | None:
        """Drop *owner*'s hold without telling Redis; returns it."""
        return self._holds.pop(owner, None)

    def mark_lost(self, owner: str, reason: str) -> Hold | None:
        """Record that *owner*'s hold was lost; returns it if this is news."""
        hold = self._holds.get(owner)
        if hold is None or hold.lost_reason is not None or hold.releasing:
            return None
        hold.lost_reason = reason
        hold.watch = None
        return hold


class KnownHolds:
    """How many holds each of this process's own owners has, per lock, across all Lock objects.

    Only for owners this process made up (a thread's, a task's): nobody else can
    hold as them, so this count is the truth the acquire script enforces -- a
    hold granted while its reply was lost (or whose release failed) is dropped at
    the owner's next acquire instead of keeping the lock held for good. Counts
    follow what Redis confirmed, and an unconfirmed release counts as done.
    """

    def __init__(self) -> None:
        # One owner is one thread or task, so each key has one writer at a time;
        # single dict operations need no lock of their own.
        self._counts: dict[tuple[str, str, str], int] = {}

    def get(self, key: tuple[str, str, str]) -> int:
        """The holds known for (key prefix, lock name, owner)."""
        return self._counts.get(key, 0)

    def set(self, key: tuple[str, str, str], count: int) -> None:
        """Record that (key prefix, lock name, owner) now has *count* holds."""
        if count > 0:
            self._counts[key] = count
        else:
            self._counts.pop(key, None)

    def reset(self) -> None:
        """Forget everything (a forked child's owners are new)."""
        self._counts = {}


#: The process's known holds (see KnownHolds).
known_holds = KnownHolds()


on_fork_in_child(known_holds.reset)
