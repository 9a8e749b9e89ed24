"""The Lua scripts behind every lock operation (text only: the backends run them).

Each operation that reads and then changes a lock is one script, so it is
atomic. Backends send them with EVALSHA and load them on ``NOSCRIPT``.

All scripts take the same four keys (see :mod:`django_redislock.engine.keys`):
``KEYS[1]`` lock hash, ``KEYS[2]`` the slot's hash (shared by every name in the
lock's Cluster hash slot), ``KEYS[3]`` waiter queue (list), ``KEYS[4]`` waiter
entries (hash).

Lock hash fields: ``owner``, ``count`` (re-entrant holds), ``fence`` (fencing
token), ``since`` (ms since the epoch, by Redis's clock), ``ttl`` (lease in ms,
0 = none), ``op`` (nonce of the last acquire, for idempotent retries), ``rel``
(nonce of the last partial release), ``meta`` (JSON written by the client),
``hand`` (while a hand-off is leased for its claim window only: that window in
ms; the new holder's claim or first renewal clears it).
The slot's hash holds ``fence`` (the last token given in the slot), ``rel`` (the
nonce of the slot's last full release) and the slot's recent history; it lives
``retention`` from its first write. Nothing a lock keeps outlives its lease and its
waiters: while someone waits, the waiter entries also hold ``~cur``, the holder on
record (``owner|since|meta``), so that a lease that runs out can be named.

Waiting is FIFO with direct hand-off: a release (or a cancelled wait, or an
acquire that finds the lock free while someone else is first in line) grants
the lock to the first live waiter in the same script and publishes the grant on
that waiter's process channel. A waiter entry is
``expiry_ms|since_ms|deadline_ms|ttl_ms|channel|nonce|meta`` (since and
deadline, by Redis's clock, are for operators: when the wait began, and when
the waiter gives up, empty for no limit); waiters refresh it while they wait,
and entries whose expiry passed (their process died) are skipped. A channel
starting with :data:`WAKE_SURE` says the waiter's process is subscribed to it on
this server: a hand-off whose wake-up nobody receives (that process died) passes
to the next waiter at once.
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

# Shared by every script that may grant the lock. On Redis 7 each redis.call
# costs microseconds of overhead and so does defining helper functions, so the
# fast paths are written first and the queue helpers (_QUEUE) are only defined
# on the slow paths that need them.
_KEYS = r"""
local L, F, Q, E = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
"""

# Defined after a script's fast path where that path grants nothing (a release):
# each function definition costs the script time on every run.
_GRANT_FUNCTION = (
    CLOCK_FRAGMENT
    + r"""

-- While someone waits, the waiter entries name the holder ('~cur': owner|since|meta),
-- so that a script that later finds its lease run out can say whose it was (see
-- expired); the field lives and dies with the entries (a new one gets their life).
local function note_holder(cur)
  if redis.call('HSET', E, '~cur', cur) == 1 and redis.call('PTTL', E) < 0 then
    redis.call('PEXPIRE', E, ENTRY_LIFE)
  end
end

-- The token a grant made now gets after the token *last* (see grant).
local function next_fence(last)
  local fence = (tonumber(last) or 0) + 1
  local t = now_us()
  if t > fence then fence = t end
  return num(fence)
end

-- Make *owner* the holder, overwriting any previous holder's fields. The
-- fencing token is the larger of the last token + 1 and the Redis clock in
-- microseconds: tokens keep increasing when the fence hash is new (first use,
-- or its retention ran out) and across a failover to a replica that missed the
-- last grants, unless the clock went back.
-- With *overwrite*, the previous holder's hash is reused in place (a hand-off
-- from a release), so its partial-release nonce is cleared too. The grant is
-- dated by Redis's clock: a client with a wrong clock cannot misdate it.
-- *last*: the slot hash's 'fence' when the caller read it already (false: none;
-- the slot hash is then new, or older than its fence, and gets its expiry).
-- *queued*: waiters may be queued behind this grant, so the new holder's release
-- must look at the queue ('q', see mark_queued); a reused hash keeps its 'q'; and
-- the waiter entries name the new holder ('~cur', see note_holder).
-- *lease*: the lease to set instead of the ttl (a hand-off's claim window): the
-- hash's 'hand' says so until the new holder claims it (CLAIM, or a renewal), so
-- that a reader does not take the short lease for renewals that never came ('' or
-- none: not a hand-off's, or claimed).
-- *extra*: more slot hash fields and values to write with the token (the history
-- event and the release nonce of a hand-off), in the same HSET.
local function grant(owner, nonce, ttl, meta, retention, overwrite, last, queued, lease, extra)
  if last == nil then last = redis.call('HGET', F, 'fence') end
  local fence = next_fence(last)
  local since_ms = num(math.floor(now_us() / 1000))
  if extra then
    redis.call('HSET', F, 'fence', fence, unpack(extra))
  else
    redis.call('HSET', F, 'fence', fence)
  end
  if not last then redis.call('PEXPIRE', F, retention) end
  if queued then note_holder(owner .. '|' .. since_ms .. '|' .. meta) end
  -- The last pair clears a reused hash's partial-release nonce (harmless on a new
  -- hash), or marks a new one as queued behind.
  local k, v = 'rel', ''
  if queued and not overwrite then k, v = 'q', '1' end
  if lease or overwrite then
    -- 'hand' in the same write ('': a reused hash's claim, if any, is over).
    redis.call('HSET', L, 'owner', owner, 'count', '1', 'fence', fence, 'since', since_ms,
               'ttl', ttl, 'op', nonce, 'meta', meta, k, v, 'hand', lease or '')
  else
    redis.call('HSET', L, 'owner', owner, 'count', '1', 'fence', fence, 'since', since_ms,
               'ttl', ttl, 'op', nonce, 'meta', meta, k, v)
  end
  if lease then
    redis.call('PEXPIRE', L, lease)
  elseif tonumber(ttl) > 0 then
    redis.call('PEXPIRE', L, ttl)
  elseif overwrite then
    redis.call('PERSIST', L)
  end
  return fence
end
"""
)


_HISTORY_MUTEX = r"""
-- The current holder as a history entry's "held" part (from the lock hash; a
-- release's hand-off makes its own from what its head read).
local function held_by(entry)
  local r = redis.call('HMGET', L, 'owner', 'since', 'meta')
  local owner, since, meta = r[1], r[2], r[3]
  if owner then
    entry.o, entry.m = owner, meta or ''
    entry.h = now_ms() - (tonumber(since) or now_ms())
  end
  return entry
end

-- The lock was found free by a script serving waiter *w* (entry *e*): if a holder
-- is still on record ('~cur' of the waiter entries: owner|since|meta), its lease ran
-- out while *w* waited (*later*, *n*: see record).
local function expired(w, e, later, n)
  local cur = redis.call('HGET', E, '~cur')
  if cur and cur ~= '' then
    local c = split(cur, 1)
    local since, meta = c[2], ''
    local bar = string.find(since, '|', 1, true)
    if bar then since, meta = string.sub(since, 1, bar - 1), string.sub(since, bar + 1) end
    local held = now_ms() - (tonumber(since) or now_ms())
    record(waited_by({e = 'expired', o = c[1], h = held, m = meta}, w, e), later, n)
  end
end
"""


_QUEUE = (
    SPLIT_FRAGMENT
    # expiry|since|deadline|ttl|channel|nonce|meta -> {expiry, ttl, channel, nonce, meta}
    + entry_fields_fragment(4)
    + HISTORY_FRAGMENT
    + _HISTORY_MUTEX
    + LISTENING_FRAGMENT
    + LIVE_HEAD_FRAGMENT
    + ENQUEUE_FRAGMENT
    + r"""
-- Grant the lock to the first live waiter and wake it; false if there is none.
-- With *overwrite* a release hands it over (its holder is still in the hash; *held*:
-- the lock hash as the release head read it), and *rel* is its nonce; without, the
-- lock was free: if a holder is on record, its lease ran out. The history event
-- and *rel* are written with the new token. Waiters are popped as they are looked
-- at (the first write frees memory), dead ones dropped, so the head is read once;
-- *first*: the head, when the caller popped it already. The live entry is split
-- once, and Redis's clock read once: a hand-off is on the next holder's
-- critical path, so the history event is made of what is read already.
-- *here*: the caller's own wake-up channel, when its process has waiters: a grant
-- to a wait on it is not published but returned (the message) for the caller to
-- deliver in-process, without a trip through Redis's pub/sub.
-- *forced*: an operator's release made the lock free (its history event, which
-- then names the waiter it was handed to, or is recorded alone).
-- A waiter whose process is subscribed on this very server marks its channel
-- (see listening): its wake-up is published before the grant is written, and a
-- waiter that nobody receives it for (its process died) is passed over at once,
-- instead of costing the waiters behind it its claim window.
local function handoff(retention, overwrite, rel, held, first, here, forced)
  local now, w, e, p = now_ms(), first or redis.call('LPOP', Q), nil, nil
  -- The last token and the history's number, in one read (both written with the grant).
  local f, sent = nil, false
  while w do
    e = redis.call('HGET', E, w)
    if e then
      redis.call('HDEL', E, w)
      -- Only a live entry is split: a dead one may be in an older, shorter format.
      if tonumber(string.sub(e, 1, string.find(e, '|', 1, true) - 1)) >= now then
        p = split(e, 6)  -- expiry, since, deadline, ttl, channel, nonce, meta
        local sure
        p[5], sure = listening(p[5])
        if not sure or p[5] == here then break end
        f = f or redis.call('HMGET', F, 'fence', 'hn')
        if redis.call('PUBLISH', p[5], p[6] .. ' ' .. next_fence(f[1])) > 0 then
          sent = true
          break
        end
      end
    end
    w = redis.call('LPOP', Q)
  end
  if not w then return false end
  f = f or redis.call('HMGET', F, 'fence', 'hn')
  local n = (tonumber(f[2]) or 0) + 1
  local extra = {}
  if rel then extra[1], extra[2] = 'rel', rel end
  if overwrite then
    -- held_by and waited_by, from the release head's read and the split entry.
    record({e = 'handoff', o = held[1], m = held[6] or '', h = now - (tonumber(held[5]) or now),
            w = w, wt = now - (tonumber(p[2]) or now), wm = p[7]}, extra, n)
  elseif forced then
    record(waited_by(forced, w, e), extra, n)
  else
    expired(w, e, extra, n)
  end
  -- Leased only for the claim window until the waiter confirms (its watchdog's
  -- first renewal, or CLAIM): a waiter that died meanwhile costs that, not a lease.
  local ttl, lease = tonumber(p[4]), nil
  if ttl == 0 or ttl > CLAIM_MS then lease = CLAIM_MS end
  local fence = grant(w, p[6], p[4], p[7], retention, overwrite, f[1], true, lease, extra)
  if sent then return true end  -- published already, with this very token
  local message = p[6] .. ' ' .. fence
  if p[5] == here then return message end
  redis.call('PUBLISH', p[5], message)
  return true
end

-- The queue's flag: while waiters may be queued, the lock hash carries 'q', so its
-- release looks at the queue only then (a free lock's acquire looks for the queue
-- itself). It gets 'q' from here and from every grant that may leave waiters behind
-- it (see grant's *queued*). The first waiter behind a holder also names it in the
-- entries (see note_holder). *marked*: the lock hash's 'q' as the script read it.
-- The slot hash's 'q' says until when (Redis ms) a queue of some lock of the slot may
-- still live (a queue's every extension comes through here, see enqueue), so that an
-- acquire of a free lock asks whether its queue exists only while one of the slot may.
local function mark_queued(life, marked, retention)
  if not marked then
    redis.call('HSET', L, 'q', '1')
    local r = redis.call('HMGET', L, 'owner', 'since', 'meta')
    if r[1] then note_holder(r[1] .. '|' .. (r[2] or '') .. '|' .. (r[3] or '')) end
  end
  local till, q = now_ms() + life, redis.call('HGET', F, 'q')
  if not q or tonumber(q) < till then
    if redis.call('HSET', F, 'q', num(till)) == 1 and redis.call('PTTL', F) < 0 then
      redis.call('PEXPIRE', F, retention)
    end
  end
end
"""
)

_GRANT_FUNCTION = _GRANT_FUNCTION.replace("ENTRY_LIFE", str(ENTRY_LIFE_MS))
_GRANT = _KEYS + _GRANT_FUNCTION
_QUEUE = _QUEUE.replace("CLAIM_MS", str(HANDOFF_CLAIM_MS))

# ARGV: owner, nonce, ttl_ms (0 = no expiry), meta, wait_left_ms (how long a
#       queued waiter still waits, shown to operators; '' = no limit),
#       retention_ms, channel ('' = do not queue when held),
#       known ('' = unknown; else how many holds the client knows this owner
#       has: a re-entry then sets the count to known + 1), barge ('1': take a
#       free lock even when others wait, fair=False), parent ('' or absent; else
#       an owner whose holds this owner takes over: see Lock's inherit_from)
# KEYS[5] (optional): a run's completion record (see Mutex).
# Returns (see decode_attempt): the fencing token (> 0) for a fresh grant,
# {fence, count} when the caller already held it, -2 - pttl_ms (<= -1) when held,
# 'TYPE <primitive>' when the name is a semaphore's or read-write lock's,
# 'DONE' when the run's completion record exists.
# A hash with no owner field under our prefix is treated as free.
# The start of every acquire script (one Redis or a Redlock master): the owner's
# repeat (same nonce) or re-entry, answered {fence, count}.
_REENTER = r"""
local owner, nonce, ttl, meta = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local h = redis.call('HMGET', L, 'owner', 'op', 'fence', 'count', 'type', 'q')
if h[5] then return 'TYPE ' .. h[5] end
if h[1] == owner then
  if h[2] == nonce then
    return {h[3], h[4]}
  end
  local c
  if ARGV[8] and ARGV[8] ~= '' then
    -- The client knows every hold of this owner: holds it does not know of
    -- (granted while their replies were lost) are dropped, not counted.
    c = tonumber(ARGV[8]) + 1
    redis.call('HSET', L, 'count', c, 'op', nonce)
  else
    c = redis.call('HINCRBY', L, 'count', 1)
    redis.call('HSET', L, 'op', nonce)
  end
  local want = tonumber(ttl)
  if want > 0 then
    local p = redis.call('PTTL', L)
    if p >= 0 and p < want then redis.call('PEXPIRE', L, want) end
  end
  return {h[3], c}
end
"""

# After the re-entry and the free-lock grant of an acquire: take over the holds
# of the parent owner (ARGV[10]: a Celery task's enqueue-time hold, or the one an
# earlier execution kept for its retry), one more, now the caller's, with the
# caller's lease (the parked one may be far longer: it covered a queue or a
# countdown; a dead execution's lock must free within its own lease).
_TAKEOVER = r"""
if h[1] and h[1] == ARGV[10] then
  local c = redis.call('HINCRBY', L, 'count', 1)
  redis.call('HSET', L, 'owner', owner, 'op', nonce, 'meta', meta, 'ttl', ttl)
  redis.call('HDEL', L, 'hand')
  -- The history names the new holder if its lease runs out while someone waits
  -- (see note_holder; only where the entries are, so none is made without its life).
  if redis.call('HEXISTS', E, '~cur') == 1 then
    local since = redis.call('HGET', L, 'since') or ''
    redis.call('HSET', E, '~cur', owner .. '|' .. since .. '|' .. meta)
  end
  if tonumber(ttl) > 0 then
    redis.call('PEXPIRE', L, ttl)
  else
    redis.call('PERSIST', L)
  end
  return {h[3], c}
end
"""

# A run's hold (KEYS[5]: its completion record, see Mutex) is refused, holding
# nothing, once the run completed: the record is read in the same script as the
# grant, so a copy of a completed run never holds the lock in between.
_COMPLETED = r"""
if KEYS[5] and redis.call('EXISTS', KEYS[5]) == 1 then return 'DONE' end
"""

ACQUIRE = (
    _GRANT
    + _COMPLETED
    + _REENTER
    + r"""
local retention, barge = ARGV[6], ARGV[9] == '1'
-- A free lock, and nobody waits (no queue of the slot may live: see mark_queued; or
-- none of this lock) -- or barging (fair=False): whoever waits.
local f
if not h[1] then
  f = redis.call('HMGET', F, 'fence', 'q')
  if not f[2] or tonumber(f[2]) < now_ms() or redis.call('EXISTS', Q) == 0 then
    return tonumber(grant(owner, nonce, ttl, meta, retention, false, f[1]))
  end
  if barge then
    if redis.call('HDEL', E, owner) == 1 then redis.call('LREM', Q, 0, owner) end
    return tonumber(grant(owner, nonce, ttl, meta, retention, false, f[1], true))
  end
end
"""
    + _TAKEOVER
    + _QUEUE
    + r"""
local channel, life = ARGV[7], """
    + str(ENTRY_LIFE_MS)
    + r"""
if not h[1] then
  local head, e = live_head()
  if not head or head == owner then
    local extra = {}
    if head then
      redis.call('LPOP', Q)
      redis.call('HDEL', E, owner)
      expired(owner, e, extra)
    end
    -- Waiters left behind the caller keep the flag (and are told who holds it now);
    -- with none, the entries' holder on record goes.
    local queued = head and redis.call('EXISTS', Q) == 1
    if not queued then redis.call('HDEL', E, '~cur') end
    return tonumber(grant(owner, nonce, ttl, meta, retention, false, f[1], queued, nil, extra))
  end
  handoff(retention)
end
if channel ~= '' then
  local tail = ttl .. '|' .. channel .. '|' .. nonce .. '|' .. meta
  if enqueue(owner, nonce, life, tail, ARGV[5]) then mark_queued(life, h[6], retention) end
end
return -2 - redis.call('PTTL', L)
"""
)

# ARGV: owner, nonce, retention_ms[, "all"[, "poke"[, record_ms[, here]]]] ('' for
# an option not taken)
# KEYS[5] (a run's hold; with record_ms, written): the run's completion record,
# written by this release (a run that completed), after the path's first write (so
# a full Redis still takes it), and also when the hold was lost.
# here: the releasing process's wake-up channel, sent when that process has waiters
# of its own: a hand-off (or poke) to one of them is not published but returned.
# Returns the remaining hold count (0 = released), or -1 when not owned; released
# to a waiter on *here*, the wake-up message instead ("<nonce> <fence>", or
# "<nonce>" for a poke), and a repeat sent with *here* '*' (see the head).
# The nonce makes a retried release (after a lost reply) count once. With "all",
# every hold of the owner is released at once. With "poke" (fair=False) a freed
# lock is not handed to the first waiter: it is freed and that waiter is woken
# to try again, so the releasing process may take it straight back.
# The start of every release script (one Redis or a Redlock master): not owned, a
# repeat (same nonce), or a partial release; what follows frees the lock (c == 0).
_RELEASE_HEAD = r"""
local owner, nonce, retention, record_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[6]
if record_ms == '' then record_ms = nil end
local h = redis.call('HMGET', L, 'owner', 'rel', 'count', 'q', 'since', 'meta')
if h[1] ~= owner then
  if redis.call('HGET', F, 'rel') == nonce then
    -- A repeat of a release that went through. Sent with *here*, its first reply may
    -- have carried a wake-up for a waiter of the caller's, lost with it: '*' asks
    -- the caller to poke its waiters (each asks Redis again and finds its grant).
    if ARGV[7] then return '*' end
    return 0
  end
  -- The run completed though its hold was lost: its record is still written (a
  -- full Redis refuses it, the one write of this path: then the release says -1 all
  -- the same).
  if KEYS[5] and record_ms then pcall(redis.call, 'SET', KEYS[5], '1', 'PX', record_ms) end
  return -1
end
if h[2] == nonce then return tonumber(h[3]) end
-- The last full release in the slot: a repeat of it (its reply lost) finds its own
-- nonce there, unless another release in the slot came between (it then answers
-- not owned, -1: a false alarm, never a hidden loss). A new slot hash gets its life.
local function released(nonce, retention)
  if redis.call('HSET', F, 'rel', nonce) == 1 and redis.call('PTTL', F) < 0 then
    redis.call('PEXPIRE', F, retention)
  end
end
local c = tonumber(h[3]) - 1
if ARGV[4] == 'all' then c = 0 end
-- Each path's first write needs no memory (HDEL, DEL, LPOP): at maxmemory
-- Redis refuses a script's first memory-taking write only, so a release
-- still runs when Redis is full.
if c > 0 then
  redis.call('HDEL', L, 'rel')
  redis.call('HSET', L, 'count', c, 'rel', nonce)
  if KEYS[5] and record_ms then redis.call('SET', KEYS[5], '1', 'PX', record_ms) end
  return c
end
"""

RELEASE = (
    _KEYS
    + _RELEASE_HEAD
    + r"""
-- Nobody was queued while this hold lasted ('q' unset: see mark_queued), or
-- nobody is any more (the last waiter of a burst was handed the lock). A fair
-- release looks by popping the queue's head: the hand-off below starts from it.
local first
if h[4] then
  if ARGV[5] == 'poke' then
    first = redis.call('EXISTS', Q) == 1
  else
    first = redis.call('LPOP', Q)
  end
end
if not first then
  redis.call('DEL', L)
  released(nonce, retention)
  if h[4] then redis.call('HDEL', E, '~cur') end
  if record_ms then redis.call('SET', KEYS[5], '1', 'PX', record_ms) end
  return 0
end
"""
    + _GRANT_FUNCTION
    + _QUEUE
    + r"""
local here, handed, poked = ARGV[7], nil, nil
if ARGV[5] == 'poke' then
  redis.call('DEL', L)
  -- The first live waiter is poked; one known to have died (see handoff) is dropped.
  while true do
    local w, e = live_head()
    if not w then break end
    local p = entry_fields(e)
    local channel, sure = listening(p[3])
    if channel == here then
      poked = p[4]
      break
    end
    if redis.call('PUBLISH', channel, p[4]) > 0 or not sure then break end
    redis.call('LPOP', Q)
    redis.call('HDEL', E, w)
  end
else
  handed = handoff(retention, true, nonce, h, first, here)
  if handed then
    if record_ms then redis.call('SET', KEYS[5], '1', 'PX', record_ms) end
    if handed == true then return 0 end
    return handed
  end
  -- Nobody live was queued (the hand-off's look emptied the queue).
  redis.call('DEL', L)
end
-- Freed (poked or not): nobody holds it on record any more.
redis.call('HDEL', E, '~cur')
released(nonce, retention)
if record_ms then redis.call('SET', KEYS[5], '1', 'PX', record_ms) end
return poked or 0
"""
)

# ARGV: from owner, to owner, lease_ms (0: unchanged).  Hands every hold of
# *from* to *to*, with that lease (a Celery execution parking the hold it keeps
# for its retry under the task id, long enough to cover the countdown).
# Returns the hold count handed over, 0 when *from* does not hold the lock.
TRANSFER = r"""
local h = redis.call('HMGET', KEYS[1], 'owner', 'count')
if h[1] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'owner', ARGV[2])
if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return tonumber(h[2])
"""

# ARGV: owner, ms, replace (0/1)
# Returns the new lease in ms, -1 when not owned, -2 when the lock has no expiry.
EXTEND = r"""
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return -1 end
local p = redis.call('PTTL', KEYS[1])
if p < 0 then return -2 end
local new = tonumber(ARGV[2])
if ARGV[3] ~= '1' then new = p + new end
redis.call('PEXPIRE', KEYS[1], new)
redis.call('HDEL', KEYS[1], 'hand')  -- its holder set its lease: a hand-off is claimed
return new
"""

# ARGV: owner[, write ('1': always write, so that a WAIT after it covers the
# grant that came before it in the replication stream)].  A waiter that was
# handed the lock takes it for its whole lease (or for good, without expiry).
# Returns 1 when claimed, 0 when not the owner's.
CLAIM = r"""
local h = redis.call('HMGET', KEYS[1], 'owner', 'ttl', 'hand')
if h[1] ~= ARGV[1] then return 0 end
if ARGV[2] == '1' then redis.call('HSET', KEYS[1], 'owner', ARGV[1]) end
if h[3] and h[3] ~= '' then redis.call('HDEL', KEYS[1], 'hand') end
if h[2] == '0' then
  redis.call('PERSIST', KEYS[1])
else
  local p = redis.call('PTTL', KEYS[1])
  if p >= 0 and p < tonumber(h[2]) then redis.call('PEXPIRE', KEYS[1], h[2]) end
end
return 1
"""

# ARGV: owner, ttl_ms.  Watchdog renewal: never shortens a lease, and never
# gives a lock without expiry (an outer hold with ttl=None) one.
# Returns 1 when renewed (or already longer or without expiry), 0 when not owned.
RENEW = r"""
local h = redis.call('HMGET', KEYS[1], 'owner', 'hand')
if h[1] ~= ARGV[1] then return 0 end
local p = redis.call('PTTL', KEYS[1])
if p >= 0 and p < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
-- The first renewal of a hand-off claims it.
if h[2] and h[2] ~= '' then redis.call('HDEL', KEYS[1], 'hand') end
return 1
"""

# ARGV: owner, nonce, retention_ms.  A waiter gives up.
# Returns {fence, count} if the lock was handed to this very wait meanwhile, else -1.
CANCEL = (
    _GRANT
    + _QUEUE
    + r"""
local owner, nonce, retention = ARGV[1], ARGV[2], ARGV[3]
local h = redis.call('HMGET', L, 'owner', 'op', 'fence', 'count')
if h[1] == owner and h[2] == nonce then return {h[3], h[4]} end
local e = redis.call('HGET', E, owner)
redis.call('LREM', Q, 0, owner)
redis.call('HDEL', E, owner)
if e and entry_fields(e)[4] == nonce then record(waited_by(held_by({e = 'timeout'}), owner, e)) end
if redis.call('EXISTS', L) == 0 then handoff(retention) end
-- The last waiter gone: nobody needs the holder on record any more.
if redis.call('EXISTS', Q) == 0 then redis.call('HDEL', E, '~cur') end
return -1
"""
)

acquire_script = Script("acquire", ACQUIRE)
release_script = Script("release", RELEASE)
extend_script = Script("extend", EXTEND)
renew_script = Script("renew", RENEW)
claim_script = Script("claim", CLAIM)
cancel_script = Script("cancel", CANCEL)
transfer_script = Script("transfer", TRANSFER)
#: The Lua that grants a lock (token, hash fields, lease), and the start of an
#: acquire (a repeat or a re-entry), for other script families (Redlock) to build on.
GRANT_FRAGMENT = _GRANT
#: The queue's functions (``handoff``, ``mark_queued``, ``live_head``, the history's),
#: for the operator's mutex path.
QUEUE_FRAGMENT = _QUEUE
REENTER_FRAGMENT = _REENTER
TAKEOVER_FRAGMENT = _TAKEOVER
RELEASE_HEAD_FRAGMENT = _RELEASE_HEAD
