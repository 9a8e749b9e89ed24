""":class:`LockInfo`: a snapshot of one held lock, as the admin and CLI show it."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any


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


@dataclass(frozen=True)
class LockInfo:
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
    host: str | None = None
    pid: int | None = None
    thread: str | None = None
    purpose: str | None = None
    task_id: str | None = None
    task_name: str | None = None
    kind: str = "lock"
    extra: dict[str, Any] = field(default_factory=dict)
    #: Any further metadata fields, as stored.
    meta: dict[str, Any] = field(default_factory=dict)
    #: Whether fencing tokens of this lock strictly increase across holders (False
    #: on Redlock: each token comes from one master's counter and clock).
    fencing_monotonic: bool = True
    #: When this snapshot was taken (UTC).
    observed_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

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
    ) -> LockInfo:
        """Build a LockInfo from a lock hash (``HGETALL``) and its ``PTTL``.

        *fields* is None for a key that is not a hash (another tool's): it
        shows as kind ``"foreign"``. Fields that do not parse are left unknown;
        this never raises on what it finds in Redis.
        """
        data = {_text(k): v for k, v in (fields or {}).items()}
        meta: dict[str, Any] = {}
        raw_meta = _text(data.get("meta"))
        if raw_meta:
            try:
                loaded = json.loads(raw_meta)
            except (ValueError, RecursionError):
                loaded = None
            if isinstance(loaded, dict):
                meta = loaded
        since = _int(data.get("since"))
        lease_ms = _int(data.get("ttl"))
        extra = meta.get("extra")
        known = {"host", "pid", "thread", "purpose", "task_id", "task_name", "kind", "extra"}
        pid = meta.get("pid")
        return cls(
            name=name,
            key=key,
            owner=_text(data.get("owner")),
            hold_count=_int(data.get("count")),
            fencing_token=_int(data.get("fence")),
            acquired_at=_from_epoch_ms(since),
            ttl=None if pttl == -2 else (math.inf if pttl < 0 else pttl / 1000.0),
            lease=lease_ms / 1000.0 if lease_ms and 0 < lease_ms < 2**63 else None,
            host=_str_or_none(meta.get("host")),
            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
            thread=_str_or_none(meta.get("thread")),
            purpose=_str_or_none(meta.get("purpose")),
            task_id=_str_or_none(meta.get("task_id")),
            task_name=_str_or_none(meta.get("task_name")),
            kind="foreign" if fields is None else _str_or_none(meta.get("kind")) or "lock",
            extra=extra if isinstance(extra, dict) else {},
            meta={k: v for k, v in meta.items() if k not in known},
        )


def _from_epoch_ms(ms: int | None) -> datetime | None:
    if not ms:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
