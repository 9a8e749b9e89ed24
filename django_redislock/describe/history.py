"""A lock's history and the contention overview in words and in JSON, for the admin
lock viewer and ``manage.py redislock history`` / ``contention``.

The events come from :mod:`django_redislock.engine.history` (what the scripts
record on slow paths) and the overview from
:mod:`django_redislock.engine.contention`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..engine.contention import Contention
from ..engine.history import HistoryEvent, Spread, hold_spread, wait_spread
from .snapshot import seconds_text


def _who(owner: str | None, meta: dict[str, Any]) -> str:
    """``task name[id]``, else ``host/pid/thread``, else the owner token."""
    task_id, task_name = meta.get("task_id"), meta.get("task_name")
    if task_id:
        return f"task {task_name or '?'}[{task_id}]"
    parts = [str(meta[k]) for k in ("host", "pid", "thread") if meta.get(k)]
    return "/".join(parts) or owner or "–"


@dataclass(frozen=True)
class HistoryLine:
    """One event of a lock's history as the pages and the command show it."""

    event: HistoryEvent

    @property
    def what(self) -> str:
        """What happened, in words."""
        return self.event.description

    @property
    def holder(self) -> str:
        """Who held the lock (task, or host/pid/thread, or owner token); "–" for none."""
        if self.event.holder is None:
            return "–"
        return _who(self.event.holder, self.event.holder_meta)

    @property
    def held(self) -> str:
        """How long it held the lock; "" when unknown."""
        return "" if self.event.held is None else seconds_text(self.event.held)

    @property
    def waiter(self) -> str:
        """Who waited; "–" for none."""
        if self.event.waiter is None:
            return "–"
        return _who(self.event.waiter, self.event.waiter_meta)

    @property
    def waited(self) -> str:
        """How long it waited; "" when unknown."""
        return "" if self.event.waited is None else seconds_text(self.event.waited)


def history_lines(events: Sequence[HistoryEvent]) -> list[HistoryLine]:
    """The events, newest first, as lines."""
    return [HistoryLine(event) for event in events]


def spread_text(spread: Spread | None) -> str:
    """``"median 1.2 s, 90% under 3.0 s, longest 4.1 s (12)"``; "" for none."""
    if spread is None:
        return ""
    return (
        f"median {seconds_text(spread.median)}, 90% under {seconds_text(spread.p90)}, "
        f"longest {seconds_text(spread.longest)} ({spread.count})"
    )


def spreads(events: Sequence[HistoryEvent]) -> dict[str, str]:
    """How long recent holds and waits took, in words (keys ``held`` and ``waited``)."""
    return {"held": spread_text(hold_spread(events)), "waited": spread_text(wait_spread(events))}


def event_as_dict(event: HistoryEvent) -> dict[str, Any]:
    """One event as JSON-friendly values (times in ISO 8601, durations in seconds)."""
    return {
        "at": event.at.isoformat(),
        "event": event.event,
        "holder": event.holder,
        "held": event.held,
        "holder_meta": event.holder_meta,
        "waiter": event.waiter,
        "waited": event.waited,
        "waiter_meta": event.waiter_meta,
    }


def contention_as_dict(entry: Contention) -> dict[str, Any]:
    """One group of the contention overview as JSON-friendly values."""
    return {
        "group": entry.group,
        "locks": entry.locks,
        "names": list(entry.names),
        "waits": entry.waits,
        "waited": round(entry.waited, 3),
        "longest_wait": round(entry.longest_wait, 3),
        "timeouts": entry.timeouts,
        "expiries": entry.expiries,
        "forced": entry.forced,
        "losses": entry.losses,
    }
