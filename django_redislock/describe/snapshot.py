"""A lock snapshot in words and in JSON: who holds it, whether each holder is alive,
who waits. One place for these texts, shared by the admin lock viewer, ``manage.py
redislock`` and the example project's ``/locks.json``.

Liveness comes from :class:`~django_redislock.engine.info.HolderInfo`:
``renewed_ago`` (seconds since the lease was last set to its full length, by
Redis's clock), ``renewing`` and ``overdue``. Waiting times compare Redis's clock
(when a wait began) with the snapshot's ``observed_at`` (this machine's clock).
Listings read the queue's length only: :func:`with_waiters` adds who waits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..engine.info import HolderInfo, LockInfo, WaiterInfo
from ..primitives.manager import LockManager

#: :attr:`Liveness.state` values.
RENEWED, OVERDUE, RUNS_OUT, NO_EXPIRY, UNKNOWN, HANDED = (
    "renewed",
    "overdue",
    "runs-out",
    "no-expiry",
    "unknown",
    "handed",
)


def seconds_text(seconds: float) -> str:
    """A duration for people: ``"0.4 s"``, ``"25 s"``, ``"3 min 5 s"``, ``"2 h 5 min"``,
    ``"3 d 4 h"`` (tenths below 10 s, then whole units)."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{math.floor(seconds * 10) / 10:.1f} s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def ago_text(age: timedelta | None) -> str:
    """``"42 s ago"``, ``"3 min 5 s ago"`` (see :func:`seconds_text`); "" when unknown."""
    return "" if age is None else f"{seconds_text(age.total_seconds())} ago"


@dataclass(frozen=True)
class Liveness:
    """Whether a holder (or the holders of a lock) keeps its lease renewed.

    ``state`` is :data:`RENEWED` (renewed on time), :data:`OVERDUE` (a renewing
    holder missed its renewals: stuck, dead or cut off from Redis),
    :data:`RUNS_OUT` (a lease meant to run out, ``auto_renew=False``),
    :data:`NO_EXPIRY` or :data:`UNKNOWN` (no lease recorded, e.g. another tool's key),
    :data:`HANDED` (a release handed it the lock that long ago, and it has not
    claimed it yet: see :attr:`~django_redislock.engine.info.HolderInfo.claiming`).
    ``renewed_ago`` is in seconds (None when there is no lease).
    """

    state: str
    renewed_ago: float | None

    @property
    def overdue(self) -> bool:
        """True when a holder missed its renewals."""
        return self.state == OVERDUE

    @property
    def text(self) -> str:
        """``"renewed 2.0 s ago"``, ``"not renewed for 25 s"`` (overdue), ``"not renewed
        (runs out)"``, ``"no expiry"``, ``"unknown"`` or ``"handed over 0.1 s ago,
        claiming"``."""
        ago = seconds_text(self.renewed_ago) if self.renewed_ago is not None else "?"
        return {
            RENEWED: f"renewed {ago} ago",
            HANDED: f"handed over {ago} ago, claiming",
            OVERDUE: f"not renewed for {ago}",
            RUNS_OUT: "not renewed (runs out)",
            NO_EXPIRY: "no expiry",
        }.get(self.state, "unknown")

    @property
    def loud_text(self) -> str:
        """:attr:`text`, with an overdue holder in capitals (``"NOT RENEWED for 25 s"``),
        for a terminal, where nothing else can make it stand out."""
        if self.overdue:
            return "NOT RENEWED" + self.text[len("not renewed") :]
        return self.text

    @property
    def title(self) -> str:
        """The exact figure, for a tooltip: ``"lease last set 2.413 s ago"``."""
        if self.renewed_ago is None:
            return ""
        return f"lease last set {self.renewed_ago:.3f} s ago"


def liveness(info: LockInfo | HolderInfo) -> Liveness:
    """The :class:`Liveness` of one holder, or of a lock (its worst holder: an
    overdue one if any, else the stalest)."""
    holders = info.holders if isinstance(info, LockInfo) else (info,)
    overdue = [h.renewed_ago or 0.0 for h in holders if h.overdue]
    if overdue:
        return Liveness(OVERDUE, max(overdue))
    claiming = [h.renewed_ago or 0.0 for h in holders if h.claiming]
    if claiming:
        return Liveness(HANDED, max(claiming))
    ago = info.renewed_ago
    if ago is None:
        no_expiry = info.ttl is not None and math.isinf(info.ttl)
        return Liveness(NO_EXPIRY if no_expiry else UNKNOWN, None)
    return Liveness(RENEWED if info.renewing else RUNS_OUT, ago)


def describe_task(info: LockInfo | HolderInfo | WaiterInfo) -> str:
    """The Celery task behind *info*, or "" when no task took it or waits."""
    if info.task_name or info.task_id:
        return f"task {info.task_name or '?'} [{info.task_id or '?'}]"
    return ""


def describe_process(info: LockInfo | HolderInfo | WaiterInfo) -> str:
    """Where *info*'s process runs: host, pid, thread (what is known of them)."""
    parts = []
    if info.host:
        parts.append(f"host {info.host}")
    if info.pid is not None:
        parts.append(f"pid {info.pid}")
    if info.thread:
        parts.append(f"thread {info.thread}")
    return ", ".join(parts)


def describe_holder(info: LockInfo | HolderInfo | WaiterInfo | None) -> str:
    """A one-line description of who holds (or waits for) *info*: task, host, pid, thread."""
    if info is None:
        return "nobody"
    return ", ".join(p for p in (describe_task(info), describe_process(info)) if p) or (
        "unknown holder"
    )


def short_holder(info: LockInfo | HolderInfo | WaiterInfo) -> str:
    """A compact "who" for a terminal: ``task name[id]`` or ``host/pid/thread``."""
    if info.task_id:
        return f"task {info.task_name or '?'}[{info.task_id}]"
    parts = [p for p in (info.host, str(info.pid) if info.pid else None, info.thread) if p]
    return "/".join(parts) or (info.owner or "?")


@dataclass(frozen=True)
class WaiterLine:
    """One waiter as the pages and the command show it."""

    #: 1 for the first in line.
    position: int
    waiter: WaiterInfo
    #: Seconds it has waited so far (None: unknown).
    waited: float | None
    #: Seconds until it gives up (None: it waits without limit, or unknown).
    gives_up_in: float | None

    @property
    def who(self) -> str:
        """The waiting task and/or process (see :func:`describe_holder`)."""
        return describe_holder(self.waiter)

    @property
    def waited_text(self) -> str:
        """``"for 3.2 s"`` (``"?"`` when unknown)."""
        return "?" if self.waited is None else f"for {seconds_text(self.waited)}"

    @property
    def deadline_text(self) -> str:
        """``"in 4.1 s"``, or ``"no limit"`` for a waiter that waits as long as it takes."""
        if self.waiter.deadline is None:
            return "no limit"
        return f"in {seconds_text(self.gives_up_in or 0.0)}"


def queue_text(info: LockInfo) -> str:
    """How many wait: ``"3"``, or ``"50 listed of 64 in the queue"`` when the list is
    shorter (it is capped, or the queue still counts a waiter that just died);
    ``"0 (Redlock: no common queue)"``."""
    listed = len(info.waiters)
    if info.queue_length is None:
        return f"{listed} (Redlock: no common queue)"
    if info.queue_length != listed:
        return f"{listed} listed of {info.queue_length} in the queue"
    return str(listed)


def waiter_lines(info: LockInfo) -> list[WaiterLine]:
    """The live waiters of *info*, first in line first (see :attr:`LockInfo.waiters`)."""
    now = info.observed_at
    return [
        WaiterLine(
            position=position,
            waiter=waiter,
            waited=_seconds_between(waiter.waiting_since, now),
            gives_up_in=_seconds_between(now, waiter.deadline),
        )
        for position, waiter in enumerate(info.waiters, 1)
    ]


def _seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def _number(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) else round(value, 3)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _party(info: LockInfo | HolderInfo | WaiterInfo) -> dict[str, Any]:
    """Who holds or waits, as JSON-friendly values."""
    return {
        "host": info.host,
        "pid": info.pid,
        "thread": info.thread,
        "purpose": info.purpose,
        "task_id": info.task_id,
        "task_name": info.task_name,
        "kind": info.kind,
        "extra": info.extra,
    }


def _held(info: LockInfo | HolderInfo) -> dict[str, Any]:
    """The fields a lock and each of its holders share, liveness included."""
    return {
        "owner": info.owner,
        "hold_count": info.hold_count,
        "fencing_token": info.fencing_token,
        "acquired_at": _iso(info.acquired_at),
        "ttl": _number(info.ttl),
        "lease": info.lease,
        **_party(info),
        "renewed_ago": _number(info.renewed_ago),
        "renewing": info.renewing,
        "overdue": info.overdue,
        "claiming": info.claiming,
    }


def waiter_as_dict(line: WaiterLine) -> dict[str, Any]:
    """One waiter as JSON-friendly values (its position, 1 = first in line)."""
    waiter = line.waiter
    return {
        "position": line.position,
        "owner": waiter.owner,
        "mode": waiter.mode,
        "waiting_since": _iso(waiter.waiting_since),
        "waited": _number(line.waited),
        "deadline": _iso(waiter.deadline),
        "lease": waiter.lease,
        **_party(waiter),
    }


def with_waiters(manager: LockManager, infos: Sequence[LockInfo]) -> list[LockInfo]:
    """*infos* from a listing (``active()``, ``scan_page()``: their queues' lengths
    only), with the waiters of those that have any read again in one round trip
    (``get_many()``). A lock released meanwhile keeps its listed snapshot."""
    queued = [info.name for info in infos if info.queue_length and not info.waiters]
    again = {info.name: info for info in manager.get_many(queued)} if queued else {}
    return [again.get(info.name, info) for info in infos]


def lock_as_dict(info: LockInfo) -> dict[str, Any]:
    """Everything known about one lock as JSON-friendly values: its fields, each
    holder (``holders``, with ``mode``), liveness (``renewed_ago``, ``renewing``,
    ``overdue``, per lock and per holder), ``waiters`` in order and ``queue_length``."""
    return {
        "name": info.name,
        "key": info.key,
        "primitive": info.primitive,
        "limit": info.limit,
        **_held(info),
        "holders": [{"mode": h.mode, **_held(h)} for h in info.holders],
        "queue_length": info.queue_length,
        "waiters": [waiter_as_dict(line) for line in waiter_lines(info)],
    }
