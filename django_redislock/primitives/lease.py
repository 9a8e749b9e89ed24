"""A lock's lease as the scripts take it: milliseconds, and their bytes argument.

``lease_of`` reads a Lock's ``ttl`` / ``no_expiry`` options (the default from
``REDISLOCK_DEFAULT_TTL``, validated once per value); ``count_arg`` writes a hold count.
"""

from __future__ import annotations

from typing import Any

from ..conf import setting
from ..engine.validate import to_millis, validate_seconds

__all__ = ["UNSET", "count_arg", "default_lease", "lease_of"]

#: An option that was not passed.
UNSET: Any = object()


_lease_cache: dict[Any, tuple[int, bytes]] = {}
#: Validated ``ttl`` values (int and float only) and their leases: a Lock is made per use.
_ttl_cache: dict[float, tuple[int, bytes]] = {}
#: Small hold counts as script arguments.
_COUNTS = [str(i).encode() for i in range(8)]


def count_arg(count: int) -> bytes:
    """A hold count as a script argument."""
    return _COUNTS[count] if count < len(_COUNTS) else str(count).encode()


def default_lease() -> tuple[int, bytes]:
    """``REDISLOCK_DEFAULT_TTL`` in ms, and as the scripts' argument (validated once per value)."""
    value = setting("REDISLOCK_DEFAULT_TTL")
    try:
        return _lease_cache[value]
    except KeyError:
        ms = to_millis(value, "REDISLOCK_DEFAULT_TTL")
        if len(_lease_cache) < 64:
            _lease_cache[value] = (ms, str(ms).encode())
        return ms, str(ms).encode()


def lease_of(ttl: Any, no_expiry: bool) -> tuple[int, bytes]:
    """The lease of a Lock made with *ttl* (seconds, None, or :data:`UNSET`) and *no_expiry*,
    in ms (0: no expiry) and as the scripts' argument; ValueError says what to pass instead."""
    if ttl is UNSET and not no_expiry:
        return default_lease()
    if ttl is None or ttl is UNSET:
        if not no_expiry:
            raise ValueError(
                "ttl=None would make a lock that never expires; pass no_expiry=True "
                "if that is really what you want"
            )
        if ttl is UNSET:
            raise ValueError("no_expiry=True needs ttl=None")
        return 0, b"0"
    if no_expiry:
        raise ValueError("no_expiry=True needs ttl=None")
    if type(ttl) in (int, float) and ttl == 0:
        raise ValueError(
            "ttl must be a positive number of seconds, got 0 (redis-py's timeout=0 "
            "means no expiry; here that is ttl=None, no_expiry=True)"
        )
    exact = type(ttl) in (int, float)  # (not bool, Decimal, ...: validated every time)
    if exact:
        cached = _ttl_cache.get(ttl)
        if cached is not None:
            return cached
    ms = to_millis(validate_seconds(ttl, "ttl"), "ttl")
    lease = ms, str(ms).encode()
    if exact and len(_ttl_cache) < 64:
        _ttl_cache[ttl] = lease
    return lease
