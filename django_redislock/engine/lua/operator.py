"""The operator's scripts: force-release and force-extend of any lock (text only).

One script per action serves every primitive: on a semaphore's or read-write
lock's hash (one with a ``type`` field, sent with all five keys) it acts on the
holders matching the expected owner and fencing token
(:mod:`.shared`); on a mutex's hash, or another tool's key, it runs the
mutex's path (below).
"""

from __future__ import annotations

from .common import Script
from .mutex import GRANT_FRAGMENT, QUEUE_FRAGMENT
from .shared import FORCE_EXTEND_PATH, FORCE_RELEASE_PATH

# ARGV: expected owner ('' = any), expected fence ('' = any), retention_ms,
#       unowned_only ('1': only a key with neither owner nor fence, another tool's).
# Returns 1 when deleted, 0 when there was no lock, -1 when it did not match.
# (The path for semaphores and read-write locks is added below.)
FORCE_RELEASE = (
    GRANT_FRAGMENT
    + QUEUE_FRAGMENT
    + r"""
local want_owner, want_fence, retention = ARGV[1], ARGV[2], ARGV[3]
if redis.call('EXISTS', L) == 0 then return 0 end
local ok, h = pcall(redis.call, 'HMGET', L, 'owner', 'fence')
if not ok then h = {false, false} end
if want_owner ~= '' and h[1] ~= want_owner then return -1 end
if want_fence ~= '' and h[2] ~= want_fence then return -1 end
if ARGV[4] == '1' and (h[1] or h[2]) then return -1 end
local entry = h[1] and held_by({e = 'forced'})
redis.call('DEL', L)
if entry then redis.call('HDEL', E, '~cur') end
-- The event names the waiter the lock was handed to, if any.
if not handoff(retention, false, nil, nil, nil, nil, entry) and entry then record(entry) end
return 1
"""
)


# KEYS[1]: the lock hash (the path for semaphores and read-write locks, added below,
# takes all five keys).  ARGV: expected owner ('' = any),
# expected fence ('' = any), ms, unowned_only ('1': only a key with neither
# owner nor fence).
# Returns the new remaining lease in ms (the longest, when several holders
# matched); 0 when there is no lock; -1 when owner or fence did not match; -2
# when the lock has no expiry (nothing to extend).
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

_DISPATCH = r"""
do
  local ok, kind = pcall(redis.call, 'HGET', KEYS[1], 'type')
  if ok and kind and #KEYS == 5 then return shared_path() end
end
"""


def _either(shared: str, mutex: str) -> str:
    return "local function shared_path()\n" + shared + "\nend\n" + _DISPATCH + mutex


force_release_script = Script("force_release", _either(FORCE_RELEASE_PATH, FORCE_RELEASE))
force_extend_script = Script("force_extend", _either(FORCE_EXTEND_PATH, FORCE_EXTEND))
