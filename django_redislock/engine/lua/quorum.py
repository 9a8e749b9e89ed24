"""The Lua scripts of a Redlock master (text only: the Redlock backend runs them).

A Redlock master keeps the same lock and slot hashes as one Redis (so the
admin, ``LockInfo`` and the operator actions read them alike) but no FIFO
queue: each master's own queue would hand the lock to different waiters on
different masters, and nobody would reach a majority. Instead a master where
the lock is held remembers who waits (``KEYS[4]``, a hash ``nonce -> expiry_ms|channel``)
and the release that frees it *pokes* them: it publishes the bare nonce on each
waiter's hub channel, and the waiter asks every master again.

Keys as in :mod:`.scripts`: lock hash, slot hash, (queue, unused), waiters hash.
"""

from __future__ import annotations

from .common import ENTRY_LIFE_MS, Script
from .mutex import GRANT_FRAGMENT, REENTER_FRAGMENT, RELEASE_HEAD_FRAGMENT, TAKEOVER_FRAGMENT

# ARGV as ACQUIRE: owner, nonce, ttl_ms, meta, (wait left: unused), retention_ms, channel ('' =
# do not wait), known ('' = unknown holds), (barge: unused), parent owner.
# Returns as ACQUIRE: a fresh grant's token, {fence, count} for a re-entry, a
# take-over or a repeat, -2 - pttl when held.
RL_ACQUIRE = (
    GRANT_FRAGMENT
    + REENTER_FRAGMENT
    + r"""
if not h[1] then
  return tonumber(grant(owner, nonce, ttl, meta, ARGV[6]))
end
"""
    + TAKEOVER_FRAGMENT
    + r"""
if ARGV[7] ~= '' then
  local expiry = now_ms() + LIFE
  redis.call('HSET', E, nonce, string.format('%.0f', expiry) .. '|' .. ARGV[7])
  redis.call('PEXPIRE', E, LIFE)
end
return -2 - redis.call('PTTL', L)
""".replace("LIFE", str(ENTRY_LIFE_MS))
)

# ARGV: owner, nonce, retention_ms, 'all' or '', 'quiet' or ''.  As RELEASE: the
# holds left (0 = released), -1 when not owned; the nonce makes a repeat count
# once. At 0 the waiters recorded here are poked, unless 'quiet' (giving back a
# grant that did not reach a majority: nobody is waiting for that).
RL_RELEASE = (
    r"""
local L, F, E = KEYS[1], KEYS[2], KEYS[4]
"""
    + RELEASE_HEAD_FRAGMENT
    + r"""
redis.call('DEL', L)
released(nonce, retention)
if ARGV[5] ~= 'quiet' then
  local waiting = redis.call('HGETALL', E)
  if #waiting > 0 then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    for i = 1, #waiting, 2 do
      local entry = waiting[i + 1]
      local bar = string.find(entry, '|', 1, true)
      if tonumber(string.sub(entry, 1, bar - 1)) >= now then
        redis.call('PUBLISH', string.sub(entry, bar + 1), waiting[i])
      end
    end
    redis.call('DEL', E)
  end
end
return 0
"""
)

# ARGV: owner, nonce, retention_ms.  A waiter gives up: its record goes. As CANCEL:
# {fence, count} when this very acquire holds the lock here, else -1.
RL_CANCEL = r"""
redis.call('HDEL', KEYS[4], ARGV[2])
local h = redis.call('HMGET', KEYS[1], 'owner', 'op', 'fence', 'count')
if h[1] == ARGV[1] and h[2] == ARGV[2] then return {h[3], h[4]} end
return -1
"""

# ARGV: owner, nonce, token.  The second round of monotonic fencing: when this very
# acquire holds the lock here, raise the name's counter to at least *token* and make
# it the lock's token. Returns 1 when done, 0 when the lock is not this acquire's.
RL_COMMIT = r"""
local h = redis.call('HMGET', KEYS[1], 'owner', 'op')
if h[1] ~= ARGV[1] or h[2] ~= ARGV[2] then return 0 end
local c = tonumber(redis.call('HGET', KEYS[2], 'fence')) or 0
if tonumber(ARGV[3]) > c then redis.call('HSET', KEYS[2], 'fence', ARGV[3]) end
redis.call('HSET', KEYS[1], 'fence', ARGV[3])
return 1
"""

rl_acquire_script = Script("rl_acquire", RL_ACQUIRE)
rl_commit_script = Script("rl_commit", RL_COMMIT)
rl_release_script = Script("rl_release", RL_RELEASE)
rl_cancel_script = Script("rl_cancel", RL_CANCEL)
