"""Parts of the watchdog's schedule (pure): a group of renewals on their way to one
backend, and the slack levels its heaps are kept by (see :mod:`.watchdog`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .watchdog import WatchEntry

#: The largest slack: how early any due renewal may join a batch sent anyway.
MAX_SLACK = 1.0


class Group:
    """Renewals on their way to one backend (a chunk of a batch), or due and waiting
    for its batch in flight: the earliest moment one of them counts as lost."""

    __slots__ = ("entries", "deadline", "_order")

    def __init__(self, entries: list[WatchEntry]) -> None:
        self.entries = entries
        self.deadline = min((e.lost_at for e in entries), default=float("inf"))
        self._order: list[WatchEntry] | None = None

    def add(self, entry: WatchEntry) -> None:
        """One more renewal waiting for the backend."""
        self.entries.append(entry)
        self._order = None
        self.deadline = min(self.deadline, entry.lost_at)

    def expired(self, now: float) -> list[WatchEntry]:
        """The entries that count as lost at *now* (a stuck batch: sorted once)."""
        order = self._order
        if order is None:
            order = self._order = sorted(self.entries, key=_lost_at, reverse=True)
        out = []
        while order and (not order[-1].active or order[-1].lost_at <= now):
            entry = order.pop()
            if entry.active:
                out.append(entry)
        self.deadline = order[-1].lost_at if order else float("inf")
        return out


def _lost_at(entry: WatchEntry) -> float:
    return entry.lost_at


def level_of(slack: float) -> float:
    """*slack* rounded down to a power of two of a second (0 below a millisecond): the
    heap an entry waits in. Every entry of a heap may join a batch that early, so a
    round pops only what it renews; a few heaps serve any mix of ttls."""
    if slack < 0.001:
        return 0.0
    return min(MAX_SLACK, 2.0 ** math.floor(math.log2(slack)))
