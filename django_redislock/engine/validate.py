"""Argument checks shared by every primitive and the manager (pure)."""

from __future__ import annotations

import json
import math
from typing import Any

#: Longest lock name accepted, in characters.
MAX_NAME_LENGTH = 1024
#: Longest explicit owner accepted, in characters.
MAX_OWNER_LENGTH = 256


def validate_name(name: object) -> str:
    """Return *name* if it is a usable lock name, else raise TypeError/ValueError."""
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("lock name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"lock name is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}"
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"lock name cannot be encoded as UTF-8: {exc}") from None
    return name


#: Most replicas a lock may wait for (a sanity bound, far above real set-ups).
MAX_REPLICAS = 64


def validate_replicas(value: object, what: str) -> int:
    """Return *value* as a replica count (0 = do not wait), or raise TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int (replicas to wait for), not {type(value).__name__}")
    if not 0 <= value <= MAX_REPLICAS:
        raise ValueError(f"{what} must be between 0 (do not wait) and {MAX_REPLICAS}, not {value}")
    return value


def validate_seconds(value: object, what: str, none: str = "") -> float:
    """Return *value* as positive finite seconds, or raise TypeError/ValueError naming *what*;
    *none*: what None means where the caller also takes None (said in the messages)."""
    alternative = f" or None ({none})" if none else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{what} must be a number of seconds{alternative}, not {type(value).__name__}"
        )
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{what} must be a positive number of seconds{alternative}, got {value!r}")
    return seconds


def validate_wait(value: object, what: str) -> float | None:
    """A wait limit: None (no limit), 0 (one attempt, as in redis-py) or positive seconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{what} must be a number of seconds (0: one attempt) or None (no limit), "
            f"not {type(value).__name__}"
        )
    if value == 0:
        return 0.0
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(
            f"{what} must be 0 (one attempt, no wait), a positive finite number of seconds, "
            f"or None (wait with no limit), got {value!r}"
        )
    return float(value)


#: The longest lease or wait Redis can take, in ms (a signed 64-bit PEXPIRE).
MAX_MILLIS = 2**62


def to_millis(seconds: float, what: str) -> int:
    """Convert positive *seconds* to whole milliseconds (at least 1, at most MAX_MILLIS)."""
    ms = seconds * 1000
    if not ms < MAX_MILLIS:
        raise ValueError(f"{what} is too large: {seconds!r} s")
    ms = int(round(ms))
    if ms < 1:
        raise ValueError(f"{what} must be at least 1 ms, got {seconds!r} s")
    return ms


def validate_owner(owner: object) -> str:
    """Return *owner* as a str (bytes are decoded, as redis-py's ``token=`` allows)."""
    if isinstance(owner, bytes):
        try:
            owner = owner.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("owner bytes must be UTF-8") from None
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a str or bytes, not {type(owner).__name__}")
    if not owner or len(owner) > MAX_OWNER_LENGTH:
        raise ValueError(f"owner must be 1 to {MAX_OWNER_LENGTH} characters long")
    return owner


_JSON_SCALARS = (str, int, bool, type(None))


def json_dict(value: object, what: str) -> dict[str, Any] | None:
    """Return *value* if it is None or a JSON-serialisable dict, else raise TypeError."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"{what} must be a dict, not {type(value).__name__}")
    if all(type(k) is str and type(v) in _JSON_SCALARS for k, v in value.items()):
        return value  # the usual flat dict (a task's meta): nothing to serialise to know
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON-serialisable: {exc}") from None
    return value
