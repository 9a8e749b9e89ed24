"""Which locks hurt: the contention overview, summed from every lock's history.

Each lock keeps its recent slow-path events (see :mod:`.history`). The
overview walks the fence hashes that hold them, keeps the events of a recent
window, and sums them per *group*: the ``@single_instance`` key template (or
task) the lock came from, recorded in its holders' and waiters' metadata, or
else the lock's own name. Groups are ranked by the time spent waiting, then by
timeouts and expiries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from .history import HistoryEvent


@dataclass
class Contention:
    """What one group of locks cost its waiters over the window.

    ``waits`` counts waiters that got the lock after waiting (a hand-off, or an
    expiry they waited through); ``waited`` is the total and ``longest_wait``
    the longest wait of every recorded waiter (those that gave up too);
    ``timeouts`` the waiters that gave up, ``expiries`` the holders whose lease
    ran out while someone waited (crashed or stuck), ``forced`` the operator
    releases. ``names`` are the lock names seen (at most a few, for display).
    """

    group: str
    waits: int = 0
    waited: float = 0.0
    longest_wait: float = 0.0
    timeouts: int = 0
    expiries: int = 0
    forced: int = 0
    #: Holders that found their hold gone at a renewal (recorded by their process).
    losses: int = 0
    names: list[str] = field(default_factory=list)
    #: How many distinct lock names the group had events on.
    locks: int = 0

    @property
    def rank(self) -> tuple[float, int]:
        """The sort key: time spent waiting, then failures (timeouts, expiries, losses)."""
        return (self.waited, self.timeouts + self.expiries + self.losses)


#: How many lock names a group lists (its ``locks`` count is exact).
NAMES_SHOWN = 5


def group_of(name: str, event: HistoryEvent) -> str:
    """The group an event of the lock *name* counts in: a key template its waiter's
    or holder's process recorded, else the name itself."""
    for meta in (event.waiter_meta, event.holder_meta):
        template = meta.get("template")
        if isinstance(template, str) and template:
            return template
    return name


def overview(
    histories: Iterable[tuple[str, Sequence[HistoryEvent]]], since: datetime, limit: int = 20
) -> list[Contention]:
    """The *limit* groups that cost most since *since*, from (lock name, history) pairs."""
    groups: dict[str, Contention] = {}
    seen: dict[str, set[str]] = {}
    for name, events in histories:
        for event in events:
            if event.at < since:
                continue
            key = group_of(name, event)
            entry = groups.get(key)
            if entry is None:
                entry = groups[key] = Contention(key)
                seen[key] = set()
            _count(entry, event)
            if name not in seen[key]:
                seen[key].add(name)
                entry.locks += 1
                if len(entry.names) < NAMES_SHOWN:
                    entry.names.append(name)
    ranked = sorted(groups.values(), key=lambda c: c.rank, reverse=True)
    return ranked[:limit]


def _count(entry: Contention, event: HistoryEvent) -> None:
    if event.waited is not None:
        entry.waited += event.waited
        entry.longest_wait = max(entry.longest_wait, event.waited)
    if event.event in ("handoff", "expired") and event.waiter is not None:
        entry.waits += 1
    if event.event == "timeout":
        entry.timeouts += 1
    elif event.event == "expired":
        entry.expiries += 1
    elif event.event == "forced":
        entry.forced += 1
    elif event.event == "lost":
        entry.losses += 1
