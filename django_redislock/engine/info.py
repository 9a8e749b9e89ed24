""":class:`LockInfo`: a snapshot of one held lock, as the admin and CLI show it.

A mutex has one holder, whose fields are the lock's own; a semaphore or
read-write lock has several (:class:`HolderInfo`, one per holder and mode),
read from their records in the lock hash (see :mod:`.lua.shared`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import Any

from .lua.common import HANDOFF_CLAIM_MS
from .shared import MODE_NAMES


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _int(value: Any) -> int | None:
    try:
        return int(_text(value) or "")
    except ValueError:
        return None


_META_FIELDS = {"host", "pid", "thread", "purpose", "task_id", "task_name", "kind", "extra"}


@dataclass(frozen=True, kw_only=True)
class _Party:
    """Who holds or waits for a lock, from the metadata its process stored
    (``meta``: any further metadata fields, as stored)."""

    host: str | None = None
    pid: int | None = None
    thread: str | None = None
    purpose: str | None = None
    task_id: str | None = None
    task_name: str | None = None
    kind: str = "lock"
    extra: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HolderInfo(_Party):
    """One holder of a lock: a mutex's owner, a semaphore's permit, a read or a write.

    ``mode`` is ``"exclusive"`` (a mutex), ``"permit"``, ``"read"`` or ``"write"``;
    ``ttl`` is its remaining lease in seconds by Redis's clock (``math.inf``: no
    expiry), ``lease`` the lease it asked for; ``claim_window``: handed the lock by
    a release and not yet claimed it, it is leased for that window only (seconds;
    None once claimed). The other fields are the :class:`LockInfo` fields of the
    same names.
    """

    owner: str | None
    mode: str = "exclusive"
    hold_count: int | None = None
    fencing_token: int | None = None
    acquired_at: datetime | None = None
    ttl: float | None = None
    lease: float | None = None
    claim_window: float | None = None

    @property
    def claiming(self) -> bool:
        """Whether the holder was just handed the lock and has not claimed it yet (its
        lease is the short claim window until then, not a renewal it missed)."""
        return self.claim_window is not None

    @property
    def _leased(self) -> float | None:
        """The lease Redis runs now: the claim window until claimed, else the lease."""
        return self.claim_window if self.claim_window is not None else self.lease

    @property
    def renewing(self) -> bool:
        """Whether the holder keeps its lease renewed. False for a lease meant to run
        out by itself (``auto_renew=False``, such as a queued task's enqueue-time hold)."""
        return self.meta.get("renews") is not False

    @property
    def renewed_ago(self) -> float | None:
        """Seconds since the lease was last set to its full length (granted, renewed
        or extended), by Redis's clock: ``lease - ttl`` (while :attr:`claiming`,
        since the hand-off: ``claim_window - ttl``). None without a lease."""
        leased = self._leased
        if leased is None or self.ttl is None or math.isinf(self.ttl):
            return None
        return max(0.0, leased - self.ttl)

    @property
    def overdue(self) -> bool:
        """Whether a renewing holder has missed its renewals (the watchdog renews every
        third of the lease): it is stuck or dead, or its process cannot reach Redis."""
        ago, leased = self.renewed_ago, self._leased
        return (
            self.renewing
            and ago is not None
            and leased is not None
            and ago > max(leased / 2, leased / 3 + OVERDUE_SLACK)
        )


@dataclass(frozen=True)
class WaiterInfo(_Party):
    """One waiter in a lock's queue, as Redis has it.

    ``mode`` is what it waits for (``"exclusive"``, ``"permit"``, ``"read"``,
    ``"write"``); ``waiting_since`` is when this wait began and ``deadline``
    when the waiter gives up (None: it waits without limit), both by Redis's
    clock; ``lease`` is the lease it asks for, in seconds. The other fields are
    the :class:`LockInfo` fields of the same names.
    """

    owner: str
    mode: str = "exclusive"
    waiting_since: datetime | None = None
    deadline: datetime | None = None
    lease: float | None = None


#: Seconds of delay a renewal may have before its holder counts as overdue.
OVERDUE_SLACK = 1.0


#: The fields a LockInfo shares with its holders (every HolderInfo field but ``mode``).
_HOLDER_FIELDS = tuple(f.name for f in fields(HolderInfo) if f.name != "mode")


@dataclass(frozen=True)
class LockInfo(_Party):
    """What Redis says about one held lock at one moment.

    Fields are None when the lock was written without that information (for
    example by another tool under the same prefix).
    """

    name: str
    key: str
    owner: str | None = None
    hold_count: int | None = None
    fencing_token: int | None = None
    acquired_at: datetime | None = None
    #: Remaining lease in seconds; ``math.inf`` for a lock without expiry.
    ttl: float | None = None
    #: The lease the holder asked for, in seconds (None: no expiry or unknown).
    lease: float | None = None
    #: Handed the lock by a release and not claimed yet: the claim window it is
    #: leased for until then, in seconds (see :attr:`HolderInfo.claiming`).
    claim_window: float | None = None
    #: Whether fencing tokens of this lock strictly increase across holders (False
    #: on Redlock: each token comes from one master's counter and clock).
    fencing_monotonic: bool = True
    #: When this snapshot was taken (UTC).
    observed_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    #: ``"mutex"``, ``"semaphore"`` or ``"rwlock"``.
    primitive: str = "mutex"
    #: A semaphore's limit (None for other primitives).
    limit: int | None = None
    #: The holders of a semaphore or read-write lock (see :attr:`holders`).
    shared_holders: tuple[HolderInfo, ...] = ()
    #: The live waiters, first in line first (at most :data:`WAITERS_SHOWN`; empty
    #: on Redlock, whose masters keep no common queue).
    waiters: tuple[WaiterInfo, ...] = ()
    #: How many entries the queue has (a waiter that died in the last few seconds
    #: may still count); None where unknown (Redlock).
    queue_length: int | None = None

    @property
    def holders(self) -> tuple[HolderInfo, ...]:
        """Every holder: a mutex's one owner (none for another tool's key), a
        semaphore's permits, a read-write lock's writer and readers.

        For a semaphore or read-write lock, the lock's own ``owner``,
        ``fencing_token``, ... are its writer's if it has one, else its earliest
        holder's, and ``ttl`` is the longest remaining lease.
        """
        if self.primitive != "mutex":
            return self.shared_holders
        if self.owner is None:
            return ()
        return (HolderInfo(mode="exclusive", **{f: getattr(self, f) for f in _HOLDER_FIELDS}),)

    def holders_matching(
        self, owner: str | None = None, fencing_token: int | None = None
    ) -> tuple[HolderInfo, ...]:
        """The holders an operator action with *owner* and/or *fencing_token* acts on
        (``force_release`` / ``force_extend``: None or "" = any)."""
        return tuple(
            h
            for h in self.holders
            if (not owner or h.owner == owner)
            and (fencing_token is None or h.fencing_token == fencing_token)
        )

    @property
    def renewed_ago(self) -> float | None:
        """Seconds since the stalest holder's lease was last renewed (see
        :attr:`HolderInfo.renewed_ago`); None when no holder has a lease."""
        agos = [h.renewed_ago for h in self.holders if h.renewed_ago is not None]
        return max(agos) if agos else None

    @property
    def renewing(self) -> bool:
        """Whether every holder keeps its lease renewed (see :attr:`HolderInfo.renewing`)."""
        holders = self.holders
        return bool(holders) and all(h.renewing for h in holders)

    @property
    def overdue(self) -> bool:
        """Whether a holder has missed its renewals (see :attr:`HolderInfo.overdue`)."""
        return any(h.overdue for h in self.holders)

    @property
    def claiming(self) -> bool:
        """Whether a holder was just handed the lock and has not claimed it yet (see
        :attr:`HolderInfo.claiming`)."""
        return any(h.claiming for h in self.holders)

    @property
    def readers(self) -> tuple[HolderInfo, ...]:
        """The holders of a read-write lock's read (empty for other primitives)."""
        return tuple(h for h in self.holders if h.mode == "read")

    @property
    def writer(self) -> HolderInfo | None:
        """The holder of a read-write lock's write, if any."""
        return next((h for h in self.holders if h.mode == "write"), None)

    @property
    def expires_at(self) -> datetime | None:
        """When the lease runs out if it is not renewed (None: never or unknown)."""
        if self.ttl is None or math.isinf(self.ttl):
            return None
        return self.observed_at + timedelta(seconds=self.ttl)

    @property
    def age(self) -> timedelta | None:
        """How long the current holder has held the lock."""
        if self.acquired_at is None:
            return None
        return self.observed_at - self.acquired_at

    @classmethod
    def from_redis(
        cls, name: str, key: str, fields: Mapping[Any, Any] | None, pttl: int
    ) -> LockInfo | None:
        """Build a LockInfo from a lock hash (``HGETALL``) and its ``PTTL`` (None for
        a semaphore or read-write lock whose every lease ran out).

        *fields* is None for a key that is not a hash (another tool's): it
        shows as kind ``"foreign"``. Fields that do not parse are left unknown;
        this never raises on what it finds in Redis.
        """
        data = {_text(k): v for k, v in (fields or {}).items()}
        ttl = None if pttl == -2 else (math.inf if pttl < 0 else pttl / 1000.0)
        primitive = _text(data.get("type"))
        if fields is not None and primitive in ("semaphore", "rwlock"):
            return cls._shared(name, key, data, primitive, pttl, ttl)
        holder = _holder(
            _text(data.get("owner")), "exclusive", _int(data.get("count")),
            _int(data.get("fence")), _int(data.get("since")), ttl, _int(data.get("ttl")),
            _text(data.get("meta")), foreign=fields is None,
            claim_ms=_int(data.get("hand")),
        )  # fmt: skip
        return cls(name=name, key=key, **_top_fields(holder))

    @classmethod
    def _shared(
        cls, name: str, key: str, data: dict[str | None, Any], primitive: str, pttl: int,
        ttl: float | None,
    ) -> LockInfo | None:  # fmt: skip
        """A semaphore's or read-write lock's snapshot, from its holder records (None
        when every lease ran out)."""
        until = _int(data.get("until"))
        # The hash expires at `until` (Redis ms): Redis's "now" is until - PTTL.
        now_ms = until - pttl if until is not None and pttl >= 0 else None
        holders: list[HolderInfo] = []
        for field_name, value in data.items():
            if not field_name or field_name[1:2] != ":" or field_name[0] not in MODE_NAMES:
                continue
            parts = (_text(value) or "").split("|", 7)
            if len(parts) != 8:
                continue
            expiry, since, lease_ms = _int(parts[6]), _int(parts[2]), _int(parts[3])
            left = None
            if expiry is not None and now_ms is not None:
                if expiry <= now_ms:
                    continue  # its lease ran out: the next script drops it
                left = (expiry - now_ms) / 1000.0
            holders.append(
                _holder(
                    field_name[2:],
                    MODE_NAMES[field_name[0]],
                    _int(parts[0]),
                    _int(parts[1]),
                    since,
                    left,
                    lease_ms,
                    parts[7],
                    claim_ms=_shared_claim_ms(since, expiry, lease_ms),
                )  # fmt: skip
            )
        holders.sort(key=lambda h: (h.mode != "write", h.fencing_token or 0))
        if not holders:
            return None
        first = holders[0]
        top = _top_fields(first)
        top["ttl"] = ttl
        limit = _int(data.get("limit")) if primitive == "semaphore" else None
        return cls(
            name=name, key=key, primitive=primitive, limit=limit,
            shared_holders=tuple(holders), **top,
        )  # fmt: skip


def _holder(
    owner: str | None, mode: str, count: int | None, fence: int | None, since: int | None,
    ttl: float | None, lease_ms: int | None, raw_meta: str | None, *, foreign: bool = False,
    claim_ms: int | None = None,
) -> HolderInfo:  # fmt: skip
    """A holder from its stored fields; fields that do not parse are left unknown."""
    return HolderInfo(
        owner=owner,
        mode=mode,
        hold_count=count,
        fencing_token=fence,
        acquired_at=_from_epoch_ms(since),
        ttl=ttl,
        lease=_lease(lease_ms),
        claim_window=_lease(claim_ms),
        **_identity(raw_meta, foreign=foreign),
    )


def _shared_claim_ms(since: int | None, expiry: int | None, lease_ms: int | None) -> int | None:
    """The claim window of a semaphore's or read-write lock's holder handed its place
    and not claimed yet, else None: a hand-off's lease ends exactly the claim window
    after its grant (by Redis's clock), where the holder asked for a longer one; its
    claim (a renewal) moves the end."""
    if since is None or expiry is None or lease_ms is None or lease_ms <= HANDOFF_CLAIM_MS:
        return None
    return HANDOFF_CLAIM_MS if expiry - since == HANDOFF_CLAIM_MS else None


def _identity(raw_meta: str | None, *, foreign: bool = False) -> dict[str, Any]:
    """Who a holder or waiter is, from its stored JSON metadata (what does not parse
    is left unknown): host, pid, thread, purpose, task, kind, extra and the rest."""
    meta: dict[str, Any] = {}
    if raw_meta:
        try:
            loaded = json.loads(raw_meta)
        except (ValueError, RecursionError):
            loaded = None
        if isinstance(loaded, dict):
            meta = loaded
    extra = meta.get("extra")
    pid = meta.get("pid")
    return {
        "host": _str_or_none(meta.get("host")),
        "pid": pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        "thread": _str_or_none(meta.get("thread")),
        "purpose": _str_or_none(meta.get("purpose")),
        "task_id": _str_or_none(meta.get("task_id")),
        "task_name": _str_or_none(meta.get("task_name")),
        "kind": "foreign" if foreign else _str_or_none(meta.get("kind")) or "lock",
        "extra": extra if isinstance(extra, dict) else {},
        "meta": {k: v for k, v in meta.items() if k not in _META_FIELDS},
    }


def _lease(lease_ms: int | None) -> float | None:
    return lease_ms / 1000.0 if lease_ms and 0 < lease_ms < 2**63 else None


#: At most this many waiters are listed per lock (the queue's length is exact).
WAITERS_SHOWN = 50


def waiters_from_redis(
    owners: Sequence[Any], entries: Mapping[Any, Any], now_ms: int | None, shared: bool
) -> tuple[WaiterInfo, ...]:
    """The live waiters of a queue: *owners* in queue order (``LRANGE``), their
    *entries* (``HGETALL`` of the waiters hash), Redis's clock in ms. Entries
    whose life ran out (a waiter that died) and entries that do not parse are
    left out; this never raises on what it finds in Redis.
    """
    by_owner = {_text(k): _text(v) for k, v in entries.items()}
    found: list[WaiterInfo] = []
    seen: set[str] = set()
    for raw_owner in owners:
        owner = _text(raw_owner)
        entry = by_owner.get(owner)
        if owner is None or entry is None or owner in seen:
            continue
        parts = entry.split("|", 7 if shared else 6)
        if len(parts) != (8 if shared else 7):
            continue
        expiry = _int(parts[0])
        if expiry is None or (now_ms is not None and expiry < now_ms):
            continue  # its process stopped refreshing it: the next script drops it
        seen.add(owner)
        mode = MODE_NAMES.get(parts[6][:1], "exclusive") if shared else "exclusive"
        found.append(
            WaiterInfo(
                owner=owner,
                mode=mode,
                waiting_since=_from_epoch_ms(_int(parts[1])),
                deadline=_from_epoch_ms(_int(parts[2])),
                lease=_lease(_int(parts[3])),
                **_identity(parts[-1]),
            )
        )
    return tuple(found)


def _top_fields(holder: HolderInfo) -> dict[str, Any]:
    """The LockInfo fields that repeat *holder*'s (the lock's own owner, token, ...)."""
    return {f: getattr(holder, f) for f in _HOLDER_FIELDS}


def _from_epoch_ms(ms: int | None) -> datetime | None:
    if not ms:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
