"""A lock's recent history: what the scripts record on their slow paths.

The scripts (``record`` in :mod:`.scripts`) keep the last
:data:`~.scripts.HISTORY_MAX` events of the locks of one Redis Cluster hash slot
in the slot's hash, one JSON object a field in a ring (a hand-off writes one small
field and reads nothing older), each naming its lock's key; ``HISTORY`` reads them
newest first, and a lock's history is the events with its key. So what is kept is
bounded by the number of slots (16,384 rings), not by the number of names, and a
name's events last as long as its slot's ring has room and its hash lives
(``REDISLOCK_FENCE_RETENTION`` from its first write). Only slow paths write one, so
taking and releasing a free lock costs nothing here:

* ``"handoff"``: a release handed the lock to the first waiter;
* ``"expired"``: a holder's lease ran out while someone waited (a crashed or
  stuck holder, or a waiter that was handed the lock and never claimed it);
* ``"timeout"``: a waiter gave up;
* ``"forced"``: an operator released the lock (admin, command,
  ``force_release``), naming the waiter it was handed to, if any;
* ``"lost"``: a holder's watchdog found, at a renewal, that its hold was gone
  (its lease ran out, or an operator released it), recorded by that process.

Redlock keeps no history (its masters share no queue).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .calls import Call
from .lua.common import HISTORY_MAX, HISTORY_SCRIPT

#: The events a history records, with what an operator reads for each.
EVENTS = {
    "handoff": "handed to the next waiter",
    "expired": "lease ran out while waited on",
    "timeout": "a waiter gave up",
    "forced": "released by an operator",
    "lost": "lost: its holder's renewal found it gone",
}


@dataclass(frozen=True)
class HistoryEvent:
    """One event of a lock's history (times by Redis's clock).

    ``holder`` held the lock for ``held`` seconds when it happened (for
    ``"expired"``: until its lease ran out); ``waiter`` had waited ``waited``
    seconds (the waiter handed the lock by a release or an operator, the one that
    gave up, or the one that waited through an expiry). ``holder_meta`` /
    ``waiter_meta`` are what their processes recorded (host, pid, thread, purpose,
    task_id, ...).
    """

    event: str
    at: datetime
    holder: str | None = None
    held: float | None = None
    waiter: str | None = None
    waited: float | None = None
    holder_meta: dict[str, Any] = field(default_factory=dict)
    waiter_meta: dict[str, Any] = field(default_factory=dict)

    @property
    def description(self) -> str:
        """What the event means, in words."""
        return EVENTS.get(self.event, self.event)


def history_call(slot_key: bytes, name: str) -> Call:
    """The call that reads the recent history of the slot whose hash is *slot_key* (for
    the lock *name*'s: keep its events with :func:`parse_history`'s *key*)."""
    return Call(HISTORY_SCRIPT, (slot_key,), (), "read the history", name)


def parse_history(raw: Any, key: str | None = None) -> list[HistoryEvent]:
    """The events of a history as ``HISTORY`` returns it, newest first; what does not
    parse is left out (this never raises on what it finds in Redis).

    *raw*: the ring's events (JSON objects, newest first). With *key* (a lock's key),
    only that lock's events.
    """
    return [event for k, event in _events(raw) if key is None or k == key]


def histories_by_key(raw: Any) -> dict[str, list[HistoryEvent]]:
    """The events of a slot's history as ``HISTORY`` returns it, by lock key (each list
    newest first)."""
    found: dict[str, list[HistoryEvent]] = {}
    for k, event in _events(raw):
        if k is not None:
            found.setdefault(k, []).append(event)
    return found


def _events(raw: Any) -> list[tuple[str | None, HistoryEvent]]:
    if not isinstance(raw, list):
        return []
    found = []
    for text in raw[:HISTORY_MAX]:
        item = _json(text)
        event = _event(item)
        if event is not None:
            found.append((_text(item.get("k")), event))
    return found


def _json(text: Any) -> Any:
    """*text* (bytes or str) decoded, or None where it is not JSON."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str) or not text:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _event(item: Any) -> HistoryEvent | None:
    if not isinstance(item, dict) or not isinstance(item.get("e"), str):
        return None
    at = _ms(item.get("t"))
    if at is None:
        return None
    return HistoryEvent(
        event=item["e"],
        at=datetime.fromtimestamp(at / 1000.0, tz=timezone.utc),
        holder=_text(item.get("o")),
        held=_seconds(item.get("h")),
        waiter=_text(item.get("w")),
        waited=_seconds(item.get("wt")),
        holder_meta=_meta(item.get("m")),
        waiter_meta=_meta(item.get("wm")),
    )


def _ms(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 < value < 2**53 else None


def _seconds(value: Any) -> float | None:
    ms = _ms(value) if value != 0 else 0.0
    return None if ms is None else max(0.0, ms / 1000.0)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _meta(value: Any) -> dict[str, Any]:
    if not isinstance(value, str) or not value:
        return {}
    loaded = _json(value)
    return loaded if isinstance(loaded, dict) else {}


@dataclass(frozen=True)
class Spread:
    """How a set of durations (seconds) is spread: count, median, 90th percentile, max."""

    count: int
    median: float
    p90: float
    longest: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        """The spread of *values*; None for none."""
        if not values:
            return None
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
        return cls(len(ordered), statistics.median(ordered), p90, ordered[-1])


def hold_spread(events: Sequence[HistoryEvent]) -> Spread | None:
    """How long holders held the lock, over the recorded hand-offs and expiries."""
    return Spread.of(
        [e.held for e in events if e.event in ("handoff", "expired") and e.held is not None]
    )


def wait_spread(events: Sequence[HistoryEvent]) -> Spread | None:
    """How long waiters waited, over every recorded event with a waiter."""
    return Spread.of([e.waited for e in events if e.waited is not None])
