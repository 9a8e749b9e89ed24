"""The Lua scripts that shape runs of a guarded key: a per-key rate limit and a cooldown
(text only: :mod:`django_redislock.guards.shaping` builds the calls).

Both keys carry the lock name's hash tag (``<prefix>:rate:{<name>}``,
``<prefix>:cooldown:{<name>}``), so on Redis Cluster they live in the lock's slot
and one script touches one slot. Every time is Redis's clock (``TIME``): no
client clock decides whether a start is admitted.

* ``KEYS[1]``, the **rate** key, is a sorted set: one member per admitted start
  (the start's nonce), scored with its time in ms. It is a sliding log: a start
  at ``now`` is admitted when fewer than ``limit`` starts scored in
  ``(now - window, now]``, so *no* window of that length ever holds more than
  ``limit`` starts (a fixed window would allow twice the limit across a
  boundary). The set expires one window after its last start.
* ``KEYS[2]``, the **cooldown** key, is a string: the Redis time (ms) the
  cooldown ends, expiring then.
"""

from __future__ import annotations

from .common import CLOCK_FRAGMENT, Script

# KEYS[1]: rate set, KEYS[2]: cooldown key; KEYS[3] (optional): the guard's lock hash.
# ARGV[1]: limit (0: no rate limit), ARGV[2]: window (ms), ARGV[3]: this start's nonce;
# ARGV[4] (with KEYS[3]): the lock's owner.
# Returns {1, count} when the start is admitted (count: starts in the window, this
# one included; a repeated call with the same nonce is admitted again, uncounted),
# or {0, reason, wait_ms, count}: reason 'cooldown' or 'rate', wait_ms until a start
# could be admitted; with KEYS[3], {2} (nothing counted) when the owner does not hold
# the lock: sent in the round trip of the lock's acquire attempt, the start counts only
# if that attempt was granted.
_ADMIT = (
    r"""
local R, C = KEYS[1], KEYS[2]
local limit, window, nonce = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
if KEYS[3] and redis.call('HGET', KEYS[3], 'owner') ~= ARGV[4] then return {2} end
"""
    + CLOCK_FRAGMENT
    + r"""
if limit > 0 and redis.call('ZSCORE', R, nonce) then
  return {1, redis.call('ZCARD', R)}
end
local left = redis.call('PTTL', C)
if left > 0 then
  return {0, 'cooldown', left, 0}
end
if limit == 0 then
  return {1, 0}
end
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', R, '-inf', num(now - window))
local count = redis.call('ZCARD', R)
if count >= limit then
  local oldest = redis.call('ZRANGE', R, 0, 0, 'WITHSCORES')
  local wait = tonumber(oldest[2]) + window - now
  if wait < 1 then wait = 1 end
  return {0, 'rate', wait, count}
end
redis.call('ZADD', R, num(now), nonce)
redis.call('PEXPIRE', R, window)
return {1, count + 1}
"""
)
ADMIT = Script("SHAPE_ADMIT", _ADMIT)

# KEYS[1]: cooldown key.  ARGV[1]: the cooldown (ms).  Starts the cooldown now (a
# run ended); sent before the lock is released, so whoever acquires the lock next
# finds it. Returns the Redis time (ms) it ends.
_COOL = (
    r"""
local C = KEYS[1]
"""
    + CLOCK_FRAGMENT
    + r"""
local ends = now_ms() + tonumber(ARGV[1])
redis.call('SET', C, num(ends), 'PX', ARGV[1])
return ends
"""
)
COOL = Script("SHAPE_COOL", _COOL)

# KEYS[1]: rate set, KEYS[2]: cooldown key, KEYS[3]: pending hash, KEYS[4]: the
# debounce hash.  ARGV[1]: window (ms).
# Returns {starts in the window now, ms left of the cooldown (0: none), ms until
# the oldest start leaves the window (0: empty), 1 if a coalesced call is pending,
# ms until the debounced run is due (-1: none pending), the window (ms; 0: unknown)}:
# a key's state in numbers. ARGV[1] 0: the window is read from the log (each
# admission sets its expiry to one window: the time since the newest start plus the
# log's PTTL).
_STATE = (
    r"""
local R, C, P, D = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local window = tonumber(ARGV[1])
"""
    + CLOCK_FRAGMENT
    + r"""
local now = now_ms()
if window == 0 then
  local newest = redis.call('ZRANGE', R, -1, -1, 'WITHSCORES')
  local life = redis.call('PTTL', R)
  if newest[2] and life > 0 then window = life + now - tonumber(newest[2]) end
end
local count, frees = 0, 0
if window > 0 then
  local after = '(' .. num(now - window)
  count = redis.call('ZCOUNT', R, after, '+inf')
  local oldest = redis.call('ZRANGEBYSCORE', R, after, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if oldest[2] then frees = tonumber(oldest[2]) + window - now end
end
local left = redis.call('PTTL', C)
if left < 0 then left = 0 end
local pending = redis.call('HEXISTS', P, 'call')
local due = redis.call('HGET', D, 'due')
local due_in = -1
if due then due_in = math.max(0, tonumber(due) - now) end
return {count, left, frees, pending, due_in, window}
"""
)
STATE = Script("SHAPE_STATE", _STATE)

# -- the order of calls (coalescing and debouncing) --------------------------------
# ``<prefix>:order:{<name>}`` is a hash: ``next``, the last number given to a call of
# the key (when it is sent: django_redislock.celery.sequence), and, for coalescing,
# ``ran``/``ran_id``: the number of the newest call that has run or was handed on,
# and the task id that runs it. A call older than ``ran`` never runs or pends again.

# KEYS[1]: the order hash.  ARGV[1]: how long it is kept after the last call (ms).
# Returns the next number of a call of the key.
_NUMBER = r"""
local n = redis.call('HINCRBY', KEYS[1], 'next', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return n
"""
NUMBER = Script("SHAPE_NUMBER", _NUMBER)

# -- coalescing (Celery tasks) ----------------------------------------------------
# The pending hash ``<prefix>:pending:{<name>}`` holds the latest coalesced call
# (``call``: its arguments as JSON, ``seq``: its number), ``run``: the task id the
# pending run will have (given when the slot is made, so every call coalesced into it
# can name it), and ``sweeper``: the task id of the message that was deferred as a
# safety net, in case the running execution never hands the pending call on (it
# died). ``<prefix>:retired:{<name>}`` is a sorted set of sweeper ids whose pending
# call was handed on by someone else, scored with the time (ms) they were retired:
# when they come back, they drop. An id stays there for as long as a copy of that
# message can come back (a broker may hand a message out twice), and every copy must
# drop. Ids retired longer ago than that are trimmed at each retirement.
# Invariant: a pending call is newer than the order hash's ``ran``.

# KEYS[1]: the lock hash, KEYS[2]: pending hash, KEYS[3]: retired set, KEYS[4]: the
# order hash.  ARGV[1]: the call (JSON), ARGV[2]: this execution's task id ('' for a
# call that cannot be sent again: no sweeper), ARGV[3]: how long the slot lives (ms),
# ARGV[4]: the call's number, ARGV[5]: a fresh task id (the pending run's, if this
# call makes the slot).
# Returns {0} when the lock is free (take it instead); {1, run} when the call is
# pending and this execution is its sweeper (it must come back; a sweeper that comes
# back leaves the later calls' arguments alone); {2, run} when it is pending, or a
# newer call is, and another execution is the sweeper; {3} when this execution is (a
# copy of) a retired sweeper (its call was handed on: drop it); {4, ran_id} when the
# call is older than one that ran or was handed on already (drop it); {5} when it is
# a copy of the newest run, whose lock another execution holds (come back). *run*:
# the pending run's task id.
_PEND = r"""
local L, P, R, O = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local me, seq = ARGV[2], tonumber(ARGV[4])
if redis.call('EXISTS', L) == 0 then return {0} end
if me ~= '' and redis.call('ZSCORE', R, me) then return {3} end
local o = redis.call('HMGET', O, 'ran', 'ran_id')
local ran = tonumber(o[1]) or 0
if seq < ran or (seq == ran and o[2] ~= me) then return {4, o[2] or ''} end
if seq == ran then return {5} end
local p = redis.call('HMGET', P, 'sweeper', 'seq', 'run')
if me ~= '' and p[1] == me then return {1, p[3]} end
if p[2] and seq <= tonumber(p[2]) then return {2, p[3]} end
local run = p[3] or ARGV[5]
redis.call('HSET', P, 'call', ARGV[1], 'seq', seq, 'run', run)
redis.call('PEXPIRE', P, ARGV[3])
if p[1] or me == '' then return {2, run} end
redis.call('HSET', P, 'sweeper', me)
return {1, run}
"""
PEND = Script("SHAPE_PEND", _PEND)

# Retires the pending slot's sweeper *sweeper* (the slot was taken or superseded):
# Lua shared by TAKE and SWEEP (``keep``: how long a retired id is remembered, ms).
_RETIRE = (
    CLOCK_FRAGMENT
    + r"""
local function retire(R, sweeper, keep)
  if not sweeper then return end
  local now = now_ms()
  redis.call('ZREMRANGEBYSCORE', R, '-inf', num(now - keep))
  redis.call('ZADD', R, num(now), sweeper)
  redis.call('PEXPIRE', R, keep)
end
"""
)

# KEYS[1]: pending hash, KEYS[2]: retired set, KEYS[3]: the order hash.  ARGV[1]: how
# long a retired id is remembered (ms), ARGV[2]: how long the order hash is kept
# (ms).  Takes the pending call (the caller holds the lock and hands it on): returns
# {its JSON, the pending run's task id, its number}, or false when none is pending.
# Its sweeper is retired; the call is the key's newest run.
_TAKE = (
    _RETIRE
    + r"""
local P, R, O = KEYS[1], KEYS[2], KEYS[3]
local pending = redis.call('HMGET', P, 'call', 'sweeper', 'seq', 'run')
if not pending[1] then return false end
redis.call('DEL', P)
retire(R, pending[2], tonumber(ARGV[1]))
redis.call('HSET', O, 'ran', pending[3], 'ran_id', pending[4])
redis.call('PEXPIRE', O, ARGV[2])
return {pending[1], pending[4], pending[3]}
"""
)
TAKE = Script("SHAPE_TAKE", _TAKE)

# KEYS[1]: pending hash, KEYS[2]: retired set, KEYS[3]: the order hash, KEYS[4]: the
# lock hash.  ARGV[1]: this execution's task id, ARGV[2]: its call's number, ARGV[3]:
# its owner of the lock, ARGV[4]: how long a retired id is remembered (ms), ARGV[5]:
# how long the order hash is kept (ms).
# Asked by an execution that just took the lock (in its attempt's round trip):
# {'again'} when that owner does not hold the lock (nothing changed); {'drop'} when it
# is (a copy of) a retired sweeper; {'stale', ran_id} when its call is older than one
# that ran or was handed on; {'sweep', run} when it is the pending call's sweeper, or
# a newer call (or its own) is pending: it hands that call on instead; else {'run'}:
# it runs its own call, now the key's newest run (a pending call older than it is
# dropped, its sweeper retired). The newest run itself (the pending run handed on,
# or a broker's copy of it) runs even while a newer call pends: that one runs next.
_SWEEP = (
    _RETIRE
    + r"""
local P, R, O, L = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local me, seq = ARGV[1], tonumber(ARGV[2])
if redis.call('HGET', L, 'owner') ~= ARGV[3] then return {'again'} end
if redis.call('ZSCORE', R, me) then return {'drop'} end
local o = redis.call('HMGET', O, 'ran', 'ran_id')
local ran = tonumber(o[1]) or 0
if seq < ran or (seq == ran and o[2] ~= me) then return {'stale', o[2] or ''} end
local p = redis.call('HMGET', P, 'sweeper', 'seq', 'run')
if seq > ran then
  if p[1] == me or (p[2] and tonumber(p[2]) >= seq) then return {'sweep', p[3]} end
  if p[2] then
    redis.call('DEL', P)
    retire(R, p[1], tonumber(ARGV[4]))
  end
  redis.call('HSET', O, 'ran', seq, 'ran_id', me)
  redis.call('PEXPIRE', O, ARGV[5])
end
return {'run'}
"""
)
SWEEP = Script("SHAPE_SWEEP", _SWEEP)

# -- debouncing (Celery tasks) ----------------------------------------------------
# KEYS[1]: the debounce hash ``<prefix>:debounce:{<name>}``: ``call`` (the latest
# call's arguments, JSON) and ``seq`` (its number), ``due`` (Redis time, ms, when the
# key has been quiet long enough), ``timer`` (the task id of the message that comes
# back at ``due``), ``run`` (the task id the due call will be sent under, given when
# the quiet period starts), ``fire`` (the task id the last due call was sent under)
# and ``fired`` (that call's number: a call no newer is a stale copy).
# ARGV[1]: this call (JSON), ARGV[2]: this execution's task id ('' when it cannot
# be sent again), ARGV[3]: the quiet period (ms), ARGV[4]: a fresh task id (the run's,
# if this call starts a quiet period), ARGV[5]: how long the hash outlives its due
# time (ms), ARGV[6]: this call's number.
# Returns {'run'} (this execution is the due call), {'wait', ms} (the timer, back
# early: come back in ms), {'fire', call, id, seq} (the timer: send call, numbered
# seq, under id), {'timer', ms, run} (this call is pending and its message is the
# timer), {'debounced', run} (this call is pending, or a newer one is; another
# message is the timer), or {'stale', fire} (this call is no newer than the one that
# fired last: a stale copy, it changes nothing). *run*: the due run's task id.
_DEBOUNCE = (
    r"""
local D = KEYS[1]
local call, me, quiet, fresh, keep = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local seq = tonumber(ARGV[6])
local s = redis.call('HMGET', D, 'fire', 'timer', 'due', 'call', 'seq', 'fired', 'run')
if me ~= '' and s[1] == me then return {'run'} end
"""
    + CLOCK_FRAGMENT
    + r"""
local now = now_ms()
if me ~= '' and s[2] == me then
  local due = tonumber(s[3])
  if now < due then return {'wait', due - now} end
  redis.call('HDEL', D, 'timer', 'due', 'call', 'seq', 'run')
  redis.call('HSET', D, 'fire', s[7], 'fired', s[5])
  redis.call('PEXPIRE', D, keep)
  return {'fire', s[4], s[7], s[5]}
end
if s[6] and seq <= tonumber(s[6]) then return {'stale', s[1]} end
if s[5] and seq <= tonumber(s[5]) then return {'debounced', s[7]} end
redis.call('HSET', D, 'call', call, 'seq', seq, 'due', num(now + quiet))
redis.call('PEXPIRE', D, quiet + tonumber(keep))
if s[2] or me == '' then return {'debounced', s[7] or ''} end
redis.call('HSET', D, 'timer', me, 'run', fresh)
return {'timer', quiet, fresh}
"""
)
DEBOUNCE = Script("SHAPE_DEBOUNCE", _DEBOUNCE)
