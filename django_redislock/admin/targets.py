"""What an operator's action in the admin lock viewer acts on, and how it compares.

A :class:`Target` is carried in a form field from the page the operator looked
at to the action that runs after the confirmation page. It records what the
operator saw (owner and fencing token), so the action leaves alone a lock or a
holder that changed since:

* a mutex: its owner and token (neither for another tool's key);
* one holder of a semaphore or read-write lock: that holder's owner, token and
  mode (the detail page's per-holder buttons);
* a semaphore or read-write lock selected whole (a list row): every holder seen,
  each acted on with its own owner and token, so a holder that arrived since is
  left alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..engine.info import HolderInfo, LockInfo
from ..engine.shared import MODE_NAMES, PRIMITIVES
from ..engine.validate import validate_name

#: Most holders one whole-lock target may carry (a form field stays bounded).
MAX_HOLDERS = 1000
#: Holder modes a per-holder target may name.
MODES = tuple(MODE_NAMES.values())
#: How each primitive is named on the pages.
PRIMITIVE_LABELS = {"mutex": "mutex", "semaphore": "semaphore", "rwlock": "read-write lock"}
#: The primitive each holder mode belongs to.
PRIMITIVE_OF_MODE = {MODE_NAMES[code]: primitive for code, primitive in PRIMITIVES.items()}

#: What a whole-lock target records of each holder: owner, fencing token, mode.
Seen = tuple[str, int | None, str]


def _is_token(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


@dataclass(frozen=True)
class Target:
    """A lock, or one holder of one, that an operator selected, as they saw it."""

    name: str
    owner: str | None
    fence: int | None
    #: One holder of a semaphore or read-write lock: its mode (see :data:`MODES`);
    #: "" for a mutex or a whole lock.
    mode: str = ""
    #: A semaphore or read-write lock selected whole: every holder seen.
    holders: tuple[Seen, ...] = ()

    @property
    def shared(self) -> bool:
        """True for a semaphore or read-write lock (one holder of it, or all)."""
        return bool(self.mode or self.holders)

    @property
    def unowned(self) -> bool:
        """Seen with neither owner nor token (another tool's key): act only if still so."""
        return not self.shared and self.owner is None and self.fence is None

    def parts(self) -> list[Target]:
        """What the action runs on, one compare-and-act each: every holder seen of a
        whole semaphore or read-write lock, else this target itself."""
        if not self.holders:
            return [self]
        return [Target(self.name, owner, fence, mode) for owner, fence, mode in self.holders]

    @classmethod
    def from_info(cls, info: LockInfo) -> Target:
        """The target for the whole lock *info* describes."""
        if info.primitive == "mutex":
            return cls(info.name, info.owner, info.fencing_token)
        seen = tuple((h.owner or "", h.fencing_token, h.mode) for h in info.holders if _actable(h))[
            :MAX_HOLDERS
        ]
        return cls(info.name, None, None, holders=seen)

    @classmethod
    def from_holder(cls, info: LockInfo, holder: HolderInfo) -> Target:
        """The target for one holder of *info* (a mutex's one holder is the lock)."""
        if info.primitive == "mutex" or not _actable(holder):
            return cls.from_info(info)
        return cls(info.name, holder.owner, holder.fencing_token, holder.mode)

    def encode(self) -> str:
        """The value carried in a form field."""
        data: dict[str, Any] = {"n": self.name, "o": self.owner, "f": self.fence}
        if self.mode:
            data["m"] = self.mode
        if self.holders:
            data["h"] = [list(seen) for seen in self.holders]
        return json.dumps(data)

    @classmethod
    def decode(cls, value: str) -> Target | None:
        """Parse a form value from :meth:`encode`; None if it is malformed."""
        try:
            data = json.loads(value)
            name, owner, fence = data["n"], data["o"], data["f"]
            mode, raw_holders = data.get("m", ""), data.get("h", [])
            validate_name(name)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        if owner is not None and not isinstance(owner, str):
            return None
        if not _is_token(fence):
            return None
        if mode and (mode not in MODES or not (owner or fence is not None)):
            return None  # a holder with nothing to compare would act on every holder
        holders = _decode_holders(raw_holders)
        if holders is None or (holders and (mode or owner is not None or fence is not None)):
            return None
        return cls(name, owner, fence, mode, holders)

    def status(self, now: LockInfo | None) -> str:
        """Whether what this (single) target saw is still there in *now*: ``"held"``,
        ``"gone"`` (the lock is not held at all) or ``"changed"``."""
        if now is None:
            return "gone"
        if not self.shared:
            same = (
                now.primitive == "mutex"
                and now.owner == self.owner
                and now.fencing_token == self.fence
            )
            return "held" if same else "changed"
        return "held" if self.holder_in(now) is not None else "changed"

    def holder_in(self, info: LockInfo | None) -> HolderInfo | None:
        """The holder of *info* this (single) target names, if it is still there."""
        if info is None:
            return None
        if not self.shared:
            return info.holders[0] if self.status(info) == "held" and info.holders else None
        return next(
            (
                h
                for h in info.holders_matching(self.owner, self.fence)
                if not self.mode or h.mode == self.mode
            ),
            None,
        )

    @property
    def token_text(self) -> str:
        """The fencing token seen, for messages: ``"?"`` when none was."""
        return "?" if self.fence is None else str(self.fence)

    def label(self) -> str:
        """A short description for messages: the name, and the holder for one holder."""
        if not self.shared or self.holders:
            return self.name
        return (
            f"{self.name} ({self.mode} of owner {self.owner or '?'}, "
            f"fencing token {self.token_text})"
        )

    def subject(self) -> str:
        """What the audit log says was acted on: ``lock 'x'``, or for one holder
        ``the read of read-write lock 'x'``."""
        if not self.mode:
            return f"lock {self.name!r}"
        primitive = PRIMITIVE_LABELS[PRIMITIVE_OF_MODE[self.mode]]
        return f"the {self.mode} of {primitive} {self.name!r}"


def _actable(holder: HolderInfo) -> bool:
    """Whether *holder* has an owner or token to compare (an action never runs unchecked)."""
    return bool(holder.owner) or holder.fencing_token is not None


def _decode_holders(raw: Any) -> tuple[Seen, ...] | None:
    if not isinstance(raw, list) or len(raw) > MAX_HOLDERS:
        return None
    holders: list[Seen] = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 3:
            return None
        owner, fence, mode = item
        if not isinstance(owner, str) or not _is_token(fence) or mode not in MODES:
            return None
        if not owner and fence is None:
            return None
        holders.append((owner, fence, mode))
    return tuple(holders)


def describe_primitive(info: LockInfo) -> tuple[str, str]:
    """The primitive of *info* and how it is held: ``("semaphore", "2 of 3 permits")``,
    ``("read-write lock", "3 readers")``, ``("read-write lock", "write")``,
    ``("mutex", "")``."""
    label = PRIMITIVE_LABELS.get(info.primitive, info.primitive)
    holders = info.holders
    if info.primitive == "semaphore":
        taken = len(holders)
        if info.limit is None:
            return label, f"{taken} permit{'s' * (taken != 1)} taken"
        return label, f"{taken} of {info.limit} permit{'s' * (info.limit != 1)}"
    if info.primitive == "rwlock":
        readers = sum(1 for h in holders if h.mode == "read")
        reading = f"{readers} reader{'s' * (readers != 1)}"
        if info.writer is not None:
            return label, "write" + (f" + {reading}" if readers else "")
        return label, reading
    return label, ""
