"""A guarded key's shaping in words and JSON (the admin's detail page, ``manage.py
redislock show``): the starts in the rate window, the cooldown, a pending coalesced
call, a debounced run's due time, from :meth:`LockManager.shaping
<django_redislock.LockManager.shaping>` and, while the key's lock is held, what its
guard records of its options (the lock metadata's ``shaping``).
"""

from __future__ import annotations

from typing import Any

from ..engine.shaping_state import ShapingState
from .snapshot import seconds_text

__all__ = ["shaping_as_dict", "shaping_lines"]


def _rate(options: dict[str, Any] | None) -> tuple[int, float] | None:
    rate = (options or {}).get("rate")
    if isinstance(rate, list) and len(rate) == 2:
        return int(rate[0]), float(rate[1])
    return None


def shaping_lines(state: ShapingState, options: dict[str, Any] | None = None) -> list[str]:
    """One sentence per thing that shapes the key now; *options*: the guard's recorded
    options (the held lock's ``meta["shaping"]``), which name the rate's limit. Empty
    when nothing does."""
    lines = []
    rate = _rate(options)
    if state.count or rate is not None:
        window = rate[1] if rate is not None else state.window
        of = f" of {rate[0]}" if rate is not None else ""
        last = rate[0] if rate is not None else state.count  # "3 of 5 starts", "1 start"
        starts = f"{state.count}{of} start{'' if last == 1 else 's'}"
        text = f"Rate: {starts} in the last {seconds_text(window or 0)}"
        if state.count and state.window_frees_in:
            text += f"; the oldest leaves the window in {seconds_text(state.window_frees_in)}"
        lines.append(text + ".")
    if state.cooldown_left:
        lines.append(
            f"Cooldown: no start for another {seconds_text(state.cooldown_left)} "
            "(the last run ended less than a cooldown ago)."
        )
    if state.pending:
        lines.append("Coalesced: one call is pending; it runs when the running one ends.")
    if state.debounce_due_in is not None:
        lines.append(
            f"Debounced: the last call runs in {seconds_text(state.debounce_due_in)} "
            "unless another call comes first."
        )
    return lines


def shaping_as_dict(state: ShapingState, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The same as JSON-ready numbers (seconds), with the guard's *options* if known."""
    rate = _rate(options)
    return {
        "starts_in_window": state.count,
        "window": rate[1] if rate is not None else state.window,
        "limit": rate[0] if rate is not None else None,
        "window_frees_in": state.window_frees_in,
        "cooldown_left": state.cooldown_left,
        "pending": state.pending,
        "debounce_due_in": state.debounce_due_in,
        "options": options,
    }
