"""The Lua scripts of locks with several holders: semaphores and read-write locks.

A mutex keeps its one holder in the lock hash's own fields (:mod:`.scripts`);
these primitives keep one *record* per holder instead, each with its own lease.
Their scripts take five keys (see :mod:`django_redislock.engine.keys`):
``KEYS[1]`` lock hash, ``KEYS[2]`` fence hash, ``KEYS[3]`` waiter queue,
``KEYS[4]`` waiter entries, ``KEYS[5]`` the holders' leases (a sorted set).

Lock hash fields:

* ``type`` -- ``semaphore`` or ``rwlock`` (a mutex's hash has none: the scripts
  of either kind refuse a name in use as the other);
* ``limit`` -- a semaphore's limit, fixed while anybody holds it;
* ``writer`` -- the owner holding a read-write lock's write, if any;
* ``until`` -- when the hash expires (Redis clock, ms): the hash and the lease
  set expire with the longest lease, so ``until - PTTL`` is Redis's "now" for a
  reader of the hash (the admin shows each holder's remaining lease from it);
* one field per holder, named ``<mode>:<owner>`` with mode ``s`` (a permit),
  ``r`` (a read) or ``w`` (a write), holding the record
  ``count|fence|since|ttl|op|rel|expiry|meta`` (meta last: it may contain ``|``).

The lease set maps each holder field to the Redis time (ms) its lease runs out.
Every script drops expired holders first, by Redis's clock only (a client's
clock never decides expiry). Waiting is FIFO with hand-off as for a mutex; a
waiter entry is ``expiry|ttl|channel|nonce|mode|meta`` where mode is the hold
mode followed by the semaphore limit (``s3``) or ``0``. A release hands every
freed place to the queue's head in order: a semaphore admits waiters while
permits are free; a read-write lock admits a head writer when nobody holds it,
and every consecutive reader at the head when no writer does (phase-fair: a
reader arriving behind a queued writer waits for it).
"""

from __future__ import annotations

from .common import (
    CLOCK_FRAGMENT,
    ENQUEUE_FRAGMENT,
    ENTRY_LIFE_MS,
    HANDOFF_CLAIM_MS,
    HISTORY_FRAGMENT,
    LISTENING_FRAGMENT,
    LIVE_HEAD_FRAGMENT,
    SPLIT_FRAGMENT,
    Script,
    entry_fields_fragment,
)

# Holder records and leases (needs L, the lock hash, and Z, the lease set):
# Redis's clock, a record's fields, and moving a holder's lease end.
_HOLDERS = (
    CLOCK_FRAGMENT
    + SPLIT_FRAGMENT
    + r"""
local function rec(s) return split(s, 7) end
local function pack(r) return table.concat(r, '|', 1, 8) end

-- The hash and the lease set live at least until the longest lease ends; `until`
-- says when. Moved to twice the lease ahead, so that most grants and renewals
-- find it far enough already.
local function keep_until(exp)
  if exp > (tonumber(redis.call('HGET', L, 'until')) or 0) then
    local at = num(2 * exp - now_ms())
    redis.call('HSET', L, 'until', at)
    redis.call('PEXPIREAT', L, at)
    redis.call('PEXPIREAT', Z, at)
  end
end

-- Move the lease of holder *member* (its record *r*) to end at *exp* (Redis ms).
local function set_expiry(member, r, exp)
  r[7] = num(exp)
  redis.call('HSET', L, member, pack(r))
  redis.call('ZADD', Z, r[7], member)
  keep_until(exp)
end
"""
)

_BASE = (
    r"""
local L, F, Q, E, Z = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
"""
    + _HOLDERS
    + r"""


-- Whether *owner* may hold in *mode* now, queue aside.
local function admits(mode, owner, limit)
  if mode == 'w' then return redis.call('ZCARD', Z) == 0 end
  local w = redis.call('HGET', L, 'writer')
  if w and w ~= owner then return false end
  if mode == 's' then return redis.call('ZCARD', Z) < limit end
  return true
end

-- Record a new hold: a fresh fencing token (as a mutex's: the larger of the
-- last + 1 and Redis's clock in us), the record, its lease. Dated by Redis's
-- clock, not the (possibly skewed) client's.
local function grant(mode, limit, owner, nonce, ttl, meta, lease, retention)
  local fence = (tonumber(redis.call('HGET', F, 'fence')) or 0) + 1
  local t = now_us()
  if t > fence then fence = t end
  fence = num(fence)
  local since = num(math.floor(t / 1000))
  if redis.call('HSET', F, 'fence', fence) == 1 then redis.call('PEXPIRE', F, retention) end
  local exp = num(now_ms() + lease)
  local member = mode .. ':' .. owner
  local kind = 'rwlock'
  if mode == 's' then kind = 'semaphore' end
  local record = table.concat({'1', fence, since, ttl, nonce, '', exp, meta}, '|')
  if mode == 's' then
    redis.call('HSET', L, member, record, 'type', kind, 'limit', limit)
  elseif mode == 'w' then
    redis.call('HSET', L, member, record, 'type', kind, 'writer', owner)
  else
    redis.call('HSET', L, member, record, 'type', kind)
  end
  redis.call('ZADD', Z, exp, member)
  keep_until(tonumber(exp))
  return fence
end
"""
    # expiry|since|deadline|ttl|channel|nonce|<mode><limit>|meta
    #   -> {expiry, ttl, channel, nonce, <mode><limit>, meta}
    + entry_fields_fragment(5)
    + HISTORY_FRAGMENT
    + LISTENING_FRAGMENT
    + LIVE_HEAD_FRAGMENT
    + ENQUEUE_FRAGMENT
    + r"""
-- Drop the holders whose lease ran out (Redis's clock); while someone waits,
-- each goes into the history (a holder that crashed or stalled).
local function purge()
  local now = now_ms()
  local dead = redis.call('ZRANGEBYSCORE', Z, '-inf', now)
  if #dead == 0 then return end
  local gone = {}
  if redis.call('EXISTS', Q) == 1 then gone = redis.call('HMGET', L, unpack(dead)) end
  for _, m in ipairs(dead) do redis.call('HDEL', L, m) end
  redis.call('ZREMRANGEBYSCORE', Z, '-inf', now)
  local w = redis.call('HGET', L, 'writer')
  if w and not redis.call('ZSCORE', Z, 'w:' .. w) then redis.call('HDEL', L, 'writer') end
  for i, s in pairs(gone) do
    if s then
      local r = rec(s)
      record({e = 'expired', o = string.sub(dead[i], 3), h = now - tonumber(r[3]), m = r[8]})
    end
  end
end

-- The holder (field *member*, record *r*) whose leaving hands places on, as a
-- history entry's "held" part; set by a release, read by handoff().
local leaving = nil
local function left_by(member, r)
  leaving = {o = string.sub(member, 3), h = now_ms() - tonumber(r[3]), m = r[8]}
end

-- A release's caller's own wake-up channel (ARGV), when its process has waiters:
-- a grant to a waiter on it is not published but kept in *woken*, which the
-- release returns for the caller to deliver in-process (see scripts.RELEASE).
local here, woken = nil, {}

-- Remove the holder *member*, after which the queue may take its place.
local function drop(member)
  redis.call('HDEL', L, member)
  redis.call('ZREM', Z, member)
  if string.sub(member, 1, 2) == 'w:' then redis.call('HDEL', L, 'writer') end
end

-- An operator's release: the 'forced' events of the holders it dropped, each
-- recorded with the waiter handed its place (see handoff), the rest by settle.
local forced = {}

-- Grant every waiter at the head that may hold now, in order, and wake each.
-- A hand-off is leased for the claim window until its waiter claims it. When
-- the head is *me* (the caller of an acquire, with *my* nonce, ttl and meta),
-- it gets its full lease and no message; returns its token then. A waiter that
-- marked its channel (see scripts.handoff) and whose wake-up nobody receives
-- (its process died) is passed over: its grant is taken back at once.
local function handoff(retention, me, my)
  local mine
  while true do
    local w, e = live_head()
    if not w then return mine end
    local p = entry_fields(e)
    local mode, limit = string.sub(p[5], 1, 1), string.sub(p[5], 2)
    if not admits(mode, w, tonumber(limit)) then return mine end
    redis.call('LPOP', Q)
    redis.call('HDEL', E, w)
    local ttl = tonumber(p[2])
    if w == me then
      mine = grant(mode, limit, w, my[1], my[2], my[3], tonumber(my[2]), retention)
    else
      if ttl > CLAIM_MS then ttl = CLAIM_MS end
      local fence = grant(mode, limit, w, p[4], p[2], p[6], ttl, retention)
      local channel, sure = listening(p[3])
      local heard = true
      if channel == here then
        woken[#woken + 1] = p[4] .. ' ' .. fence
      else
        heard = redis.call('PUBLISH', channel, p[4] .. ' ' .. fence) > 0 or not sure
      end
      if not heard then
        drop(mode .. ':' .. w)
      elseif leaving then
        record(waited_by({e = 'handoff', o = leaving.o, h = leaving.h, m = leaving.m}, w, e))
      elseif #forced > 0 then
        record(waited_by(table.remove(forced, 1), w, e))
      end
    end
  end
end

-- When the first lease runs out, as the acquire scripts' "held" answer (-2 - ms).
local function wait_hint()
  local first = redis.call('ZRANGE', Z, 0, 0, 'WITHSCORES')
  if first[2] then
    local left = tonumber(first[2]) - now_ms()
    if left < 0 then left = 0 end
    return -2 - left
  end
  return -1
end

-- After holders left: hand their places on, and drop the keys once nobody holds.
local function settle(retention)
  handoff(retention, nil, nil)
  for _, entry in ipairs(forced) do record(entry) end
  if redis.call('ZCARD', Z) == 0 then redis.call('DEL', L, Z) end
end
"""
)

#: Waiter entry life and claim window: the same as a mutex's.
_BASE = _BASE.replace("CLAIM_MS", str(HANDOFF_CLAIM_MS))

# ARGV: owner, nonce, ttl_ms, meta, wait_left_ms ('' = no limit; see scripts.enqueue),
#       retention_ms, channel ('' = do not queue when held), known ('' or the
#       holds the client knows this owner has in this mode; for a read or a write,
#       then '|' and those in the other mode), mode (s / r / w), limit (0 for rw).
# Returns (see calls.decode_attempt): the fencing token (> 0) for a fresh
# grant, {fence, count} for a repeat or re-entry, -2 - ms until the first lease
# runs out when held; or a refusal: 'TYPE <primitive>', 'LIMIT <limit>', 'UPGRADE'.
ACQUIRE = (
    _BASE
    + r"""
local owner, nonce, ttl, meta = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local retention, channel, mode, limit = ARGV[6], ARGV[7], ARGV[9], ARGV[10]
local known, other = string.match(ARGV[8], '^([^|]*)|?(.*)$')
local kind = 'rwlock'
if mode == 's' then kind = 'semaphore' end
local h = redis.call('HMGET', L, 'type', 'limit', 'owner')
if h[3] then return 'TYPE mutex' end
if h[1] and h[1] ~= kind then return 'TYPE ' .. h[1] end
if mode == 's' and h[2] and h[2] ~= limit then return 'LIMIT ' .. h[2] end
purge()
-- A hold of the owner in the other mode that the client knows none of (its release
-- failed, which counts as done) is an orphan: it goes, as a mutex's hold the client
-- does not know of is adopted, instead of refusing a write as an upgrade or keeping
-- an orphaned write under a read.
if other == '0' then
  local theirs = 'r:' .. owner
  if mode == 'r' then theirs = 'w:' .. owner end
  local orphan = redis.call('HGET', L, theirs)
  if orphan then
    drop(theirs)
    left_by(theirs, rec(orphan))
  end
end
local member = mode .. ':' .. owner
local held = redis.call('HGET', L, member)
if held then
  local r = rec(held)
  if r[5] == nonce then return {r[2], r[1]} end
  local c
  if known ~= '' then c = tonumber(known) + 1 else c = tonumber(r[1]) + 1 end
  r[1], r[5] = tostring(c), nonce
  local exp = now_ms() + tonumber(ttl)
  if exp > tonumber(r[7]) then
    set_expiry(member, r, exp)
  else
    redis.call('HSET', L, member, pack(r))
  end
  return {r[2], c}
end
if mode == 'w' and redis.call('HEXISTS', L, 'r:' .. owner) == 1 then return 'UPGRADE' end
local lease, n = tonumber(ttl), tonumber(limit)
if admits(mode, owner, n) then
  -- A writer taking a read (a downgrade) never waits: the queue waits for it.
  local downgrade = mode == 'r' and h[1] and redis.call('HGET', L, 'writer') == owner
  if downgrade or redis.call('EXISTS', Q) == 0 then
    return tonumber(grant(mode, limit, owner, nonce, ttl, meta, lease, retention))
  end
end
local mine = handoff(retention, owner, {nonce, ttl, meta})
if mine then return tonumber(mine) end
if not live_head() and admits(mode, owner, n) then
  return tonumber(grant(mode, limit, owner, nonce, ttl, meta, lease, retention))
end
if channel ~= '' then
  local life = """
    + str(ENTRY_LIFE_MS)
    + r"""
  enqueue(owner, nonce, life, ttl .. '|' .. channel .. '|' .. nonce .. '|' .. mode .. limit
                             .. '|' .. meta, ARGV[5])
end
return wait_hint()
"""
)

#: How many recent full-release nonces a lock remembers (for a retried release).
RELEASES_KEPT = 16

# ARGV: owner, nonce, retention_ms, all ('all' or ''), mode[, here].
# Returns the owner's remaining hold count in that mode (0 = released), -1 when
# it holds none. The nonce makes a retried release count once. *here*, as for a
# mutex's release: the places it hands to waiters on that channel come back as
# their wake-up messages (a list) instead of 0, and a repeat answers '*'.
RELEASE = (
    _BASE
    + r"""
local owner, nonce, retention, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
here = ARGV[6]
local member = mode .. ':' .. owner
purge()
local held = redis.call('HGET', L, member)
if not held then
  local rels = redis.call('HGET', F, 'rels')
  if rels and string.find(' ' .. rels, ' ' .. nonce .. ' ', 1, true) then
    if here then return '*' end
    return 0
  end
  return -1
end
local r = rec(held)
if r[6] == nonce then return tonumber(r[1]) end
local c = tonumber(r[1]) - 1
if ARGV[4] == 'all' then c = 0 end
if c > 0 then
  r[1], r[6] = tostring(c), nonce
  redis.call('HSET', L, member, pack(r))
  return c
end
drop(member)
left_by(member, r)
local kept, n = {nonce}, 1
for old in string.gmatch(redis.call('HGET', F, 'rels') or '', '%S+') do
  if n >= KEPT then break end
  n = n + 1
  kept[n] = old
end
if redis.call('HSET', F, 'rels', table.concat(kept, ' ') .. ' ') == 1 then
  redis.call('PEXPIRE', F, retention)
end
settle(retention)
if #woken > 0 then return woken end
return 0
""".replace("KEPT", str(RELEASES_KEPT))
)

# The start of the renewal and extension scripts (KEYS: lock hash, lease set;
# ARGV[1]: the holder field): the holder's lease end, and Redis's "now".
_LEASE = (
    r"""
local L, Z, member = KEYS[1], KEYS[2], ARGV[1]
"""
    + _HOLDERS
    + r"""
local now = now_ms()
local score = tonumber(redis.call('ZSCORE', Z, member))
"""
)

# ARGV: holder field, ttl_ms, write ('1': always rewrite the record, so that a
# WAIT after it covers the grant before it).  Renews (or claims, after a
# hand-off) a lease: never shortens it.
# Returns 1 when renewed, 0 when the holder's lease is gone.
RENEW = (
    _LEASE
    + r"""
if not score or score <= now then return 0 end
local exp = now + tonumber(ARGV[2])
if exp <= score and ARGV[3] ~= '1' then return 1 end
if exp < score then exp = score end
local s = redis.call('HGET', L, member)
if not s then return 0 end
set_expiry(member, rec(s), exp)
return 1
"""
)

# ARGV: holder field, ms, replace (0/1).
# Returns the new lease in ms, -1 when the holder's lease is gone.
EXTEND = (
    _LEASE
    + r"""
if not score or score <= now then return -1 end
local s = redis.call('HGET', L, member)
if not s then return -1 end
local new = tonumber(ARGV[2])
if ARGV[3] ~= '1' then new = score - now + new end
set_expiry(member, rec(s), now + new)
return new
"""
)

# ARGV: owner, nonce, retention_ms, mode.  A waiter gives up.
# Returns {fence, count} if this very wait was granted meanwhile, else -1.
CANCEL = (
    _BASE
    + r"""
local owner, nonce, retention, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local held = redis.call('HGET', L, mode .. ':' .. owner)
if held then
  local r = rec(held)
  if r[5] == nonce then return {r[2], r[1]} end
end
local e = redis.call('HGET', E, owner)
redis.call('LREM', Q, 0, owner)
redis.call('HDEL', E, owner)
if e and entry_fields(e)[4] == nonce then record(waited_by({e = 'timeout'}, owner, e)) end
purge()
settle(retention)
return -1
"""
)

# The operator's actions on a semaphore or read-write lock, as the shared paths
# of scripts.FORCE_RELEASE / FORCE_EXTEND (same ARGV): the holders matching the
# expected owner and fencing token ('' = any) are released or extended.
FORCE_RELEASE_PATH = (
    _BASE
    + r"""
local want_owner, want_fence, retention = ARGV[1], ARGV[2], ARGV[3]
if ARGV[4] == '1' then return -1 end
purge()
local members = redis.call('ZRANGE', Z, 0, -1)
if #members == 0 then return 0 end
local dropped = 0
for _, m in ipairs(members) do
  local s = redis.call('HGET', L, m)
  if s and (want_owner == '' or string.sub(m, 3) == want_owner)
       and (want_fence == '' or rec(s)[2] == want_fence) then
    drop(m)
    dropped = dropped + 1
    local r = rec(s)
    forced[#forced + 1] = {e = 'forced', o = string.sub(m, 3), h = now_ms() - tonumber(r[3]),
                           m = r[8]}
  end
end
if dropped == 0 then return -1 end
settle(retention)
return 1
"""
)

FORCE_EXTEND_PATH = (
    _BASE
    + r"""
local want_owner, want_fence, ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
if ARGV[4] == '1' then return -1 end
purge()
local members = redis.call('ZRANGE', Z, 0, -1, 'WITHSCORES')
if #members == 0 then return 0 end
local longest, now = -1, now_ms()
for i = 1, #members, 2 do
  local m, score = members[i], tonumber(members[i + 1])
  local s = redis.call('HGET', L, m)
  if s and (want_owner == '' or string.sub(m, 3) == want_owner) then
    local r = rec(s)
    if want_fence == '' or r[2] == want_fence then
      set_expiry(m, r, score + ms)
      if score + ms - now > longest then longest = score + ms - now end
    end
  end
end
return longest
"""
)

acquire_shared_script = Script("acquire_shared", ACQUIRE)
release_shared_script = Script("release_shared", RELEASE)
renew_shared_script = Script("renew_shared", RENEW)
extend_shared_script = Script("extend_shared", EXTEND)
cancel_shared_script = Script("cancel_shared", CANCEL)
