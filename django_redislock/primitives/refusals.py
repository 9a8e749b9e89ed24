"""What a refused release or extension says: who holds the lock now, in words.

A ``LockNotOwned`` names the caller (this thread, this asyncio task, an explicit owner)
and the holder as Redis has it (another thread or task of this process, a host and pid,
or nobody), so "its lease ran out" is not blamed for a lock taken from the wrong thread.
"""

from __future__ import annotations

from typing import Any

from ..engine.identity import process_token
from ..engine.info import HolderInfo
from ..exceptions import LockNotOwned

__all__ = ["UNREAD", "not_owned"]

#: A lock snapshot that was not read (who holds the lock is unknown).
UNREAD: Any = object()


def not_owned(name: str, action: str, owner: str, holder: Any) -> LockNotOwned:
    """The LockNotOwned of a release or extension by *owner* that Redis refused, naming
    who holds the lock: *holder* is its snapshot (None: nobody), or :data:`UNREAD`."""
    text = f"cannot {action} lock {name!r}: {owner_words(owner, 'this')} does not hold it"
    if holder is UNREAD:
        return LockNotOwned(
            f"{text} (its lease may have run out, or someone else released it)", name=name
        )
    if holder is None or not holder.holders:
        return LockNotOwned(
            f"{text}, and nobody holds it now (its lease ran out, or someone else released it)",
            name=name,
        )
    holders = holder.holders
    text += "; it is held by " + ", ".join(holder_words(h) for h in holders)
    if any(ours(h.owner) for h in holders):
        text += (
            ". A lock's owner is the thread (or asyncio task) that acquired it: release "
            "it there, or give the Lock objects one explicit owner="
        )
    return LockNotOwned(text, name=name)


def ours(owner: str | None) -> bool:
    """Whether *owner* is a token this process made (for a thread or an asyncio task)."""
    return owner is not None and owner.startswith(process_token() + ":")


def owner_words(owner: str, which: str) -> str:
    """*owner* in words: ``this thread``, ``another asyncio task of this process`` (with
    *which* = ``"another"``), or an explicit owner."""
    if not ours(owner):
        return f"owner {owner!r}"
    kind = owner[len(process_token()) + 1 :]
    what = "asyncio task" if kind.startswith("t") else "thread"
    if which == "this":
        return f"this {what} (owner {owner!r})"
    return f"another {what} of this process (owner {owner!r})"


def holder_words(holder: HolderInfo) -> str:
    """Who *holder* is, for :func:`_not_owned`."""
    if ours(holder.owner):
        thread = f", thread {holder.thread!r}" if holder.thread else ""
        return owner_words(holder.owner or "", "another")[:-1] + thread + ")"
    where = [
        f"task {holder.task_id}" if holder.task_id else "",
        f"host {holder.host}" if holder.host else "",
        f"pid {holder.pid}" if holder.pid is not None else "",
        f"thread {holder.thread!r}" if holder.thread else "",
    ]
    detail = ", ".join(w for w in where if w)
    return f"owner {holder.owner!r}" + (f" ({detail})" if detail else "")
