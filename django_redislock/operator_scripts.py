"""Lengthening somebody else's lease: the script behind ``LockManager.force_extend``.

An operator action (the admin's "extend lease"). Like
``LockManager.force_release`` it compares the owner and/or fencing token the
operator saw, in one Lua script, so a lock that changed hands in between is
left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from .keys import to_millis, validate_name, validate_seconds
from .scripts import Script, backend_error

if TYPE_CHECKING:
    from .manager import LockManager

# KEYS[1]: the lock hash.  ARGV: expected owner ('' = any), expected fence ('' = any), ms,
# unowned_only ('1': only a key with neither owner nor fence).
# Returns the new remaining lease in ms; 0 when there is no lock; -1 when owner or
# fence did not match; -2 when the lock has no expiry (nothing to extend).
FORCE_EXTEND = r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local ok, h = pcall(redis.call, 'HMGET', KEYS[1], 'owner', 'fence')
if not ok then h = {false, false} end
if ARGV[1] ~= '' and h[1] ~= ARGV[1] then return -1 end
if ARGV[2] ~= '' and h[2] ~= ARGV[2] then return -1 end
if ARGV[4] == '1' and (h[1] or h[2]) then return -1 end
local p = redis.call('PTTL', KEYS[1])
if p < 0 then return -2 end
local new = p + tonumber(ARGV[3])
redis.call('PEXPIRE', KEYS[1], new)
return new
"""

force_extend_script = Script(FORCE_EXTEND)


@dataclass(frozen=True)
class ExtendResult:
    """The outcome of :func:`force_extend`."""

    #: One of "extended", "gone", "changed" (owner/token differ), "no-expiry".
    status: str
    #: The new remaining lease in seconds when extended, else None.
    ttl: float | None = None

    @property
    def extended(self) -> bool:
        """True if the lease was lengthened."""
        return self.status == "extended"


def force_extend(
    manager: LockManager,
    name: str,
    seconds: float,
    *,
    owner: str | None = None,
    fencing_token: int | None = None,
    unowned_only: bool = False,
) -> ExtendResult:
    """Add *seconds* to the remaining lease of the lock *name*, whoever holds it.

    With *owner* and/or *fencing_token* the lease is extended only if the lock
    still has that owner / token; with *unowned_only*, only if it has neither.
    The lock's recorded lease (what the holder's watchdog renews to) is
    unchanged: the extra time runs down, then normal renewal resumes.
    """
    validate_name(name)
    ms = to_millis(validate_seconds(seconds, "seconds"), "seconds")
    backend = manager.backend()
    key = backend.keyspace.keys(name).lock
    args = [
        owner or "",
        "" if fencing_token is None else str(fencing_token),
        ms,
        "1" if unowned_only else "",
    ]
    try:
        result = int(force_extend_script(backend.client, [key], args))
    except RedisError as exc:
        raise backend_error(exc, "extend the lock", name) from exc
    if result > 0:
        return ExtendResult("extended", result / 1000.0)
    return ExtendResult({0: "gone", -1: "changed", -2: "no-expiry"}[result])
