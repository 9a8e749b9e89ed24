"""The Lua scripts of deadlock detection (text only: the backends run them).

A waiter with a ``deadlock_timeout`` that has waited that long leaves a pointer,
``<prefix>:waitfor:{<owner>}`` = ``<nonce>|<lock name>``, and follows the chain of
holders and their pointers (:mod:`.deadlock`). Each script touches one slot: the
pointer's (the owner's hash tag) or the lock's.
"""

from __future__ import annotations

from .common import Script

# KEYS[1]: the owner's pointer.  ARGV: its value (nonce|name), its life in ms.
MARK = r"""
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS[1]: an owner's pointer.  Returns its value (nonce|name), or nil.
POINTER = r"""
return redis.call('GET', KEYS[1])
"""

# KEYS[1]: a mutex's lock hash; KEYS[2]: its waiter entries.  ARGV[1]: an owner.
# Returns {the lock's holder, the owner's waiter entry}: either is nil when there
# is none (an entry whose life ran out is none: that waiter is gone).
EDGE = r"""
local holder = redis.call('HGET', KEYS[1], 'owner')
local entry = redis.call('HGET', KEYS[2], ARGV[1])
if entry then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local expiry = tonumber(string.match(entry, '^(%d+)|'))
  if not expiry or expiry < now then entry = false end
end
return {holder or false, entry or false}
"""

mark_script = Script("deadlock-mark", MARK)
pointer_script = Script("deadlock-pointer", POINTER)
edge_script = Script("deadlock-edge", EDGE)
