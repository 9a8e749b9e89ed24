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

from .scripts import _CLOCK, Script

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
    + _CLOCK
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
    + _CLOCK
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
    + _CLOCK
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

# -- coalescing (Celery tasks) ----------------------------------------------------
# The pending hash ``<prefix>:pending:{<name>}`` holds the latest coalesced call
# (``call``: its arguments as JSON) and ``sweeper``: the task id of the message that
# was deferred as a safety net, in case the running execution never hands the
# pending call on (it died). ``<prefix>:retired:{<name>}`` is a sorted set of sweeper
# ids whose pending call was handed on by someone else, scored with the time (ms) they
# were retired: when they come back, they drop. An id stays there (it is not taken
# out when its message comes back) for as long as a copy of that message can come
# back: a broker may hand a message out twice (``acks_late`` and a worker killed
# between a re-send and its ack; a countdown longer than the Redis transport's
# visibility timeout), and every copy must drop. Ids retired longer ago than that are
# trimmed at each retirement.

# KEYS[1]: the lock hash, KEYS[2]: pending hash, KEYS[3]: retired set.
# ARGV[1]: the call (JSON), ARGV[2]: this execution's task id ('' for a call that
# cannot be sent again: no sweeper), ARGV[3]: how long the slot lives (ms).
# Returns 0 when the lock is free (take it instead), 1 when the call is pending and
# this execution is its sweeper (it must come back; a sweeper that comes back leaves
# the later calls' arguments alone), 2 when it is pending and another execution is
# the sweeper, 3 when this execution is (a copy of) a retired sweeper (its call was
# handed on: drop it, and leave the later calls' arguments alone).
_PEND = r"""
local L, P, R = KEYS[1], KEYS[2], KEYS[3]
local me = ARGV[2]
if redis.call('EXISTS', L) == 0 then return 0 end
if me ~= '' and redis.call('ZSCORE', R, me) then return 3 end
local sweeper = redis.call('HGET', P, 'sweeper')
if me ~= '' and sweeper == me then return 1 end
redis.call('HSET', P, 'call', ARGV[1])
redis.call('PEXPIRE', P, ARGV[3])
if sweeper or me == '' then return 2 end
redis.call('HSET', P, 'sweeper', me)
return 1
"""
PEND = Script("SHAPE_PEND", _PEND)

# KEYS[1]: pending hash, KEYS[2]: retired set.  ARGV[1]: how long a retired id is
# remembered (ms).  Takes the pending call (the caller holds the lock and hands it
# on): returns its JSON, or false when none is pending. Its sweeper is retired.
_TAKE = (
    r"""
local P, R = KEYS[1], KEYS[2]
local keep = tonumber(ARGV[1])
local pending = redis.call('HMGET', P, 'call', 'sweeper')
if not pending[1] then return false end
redis.call('DEL', P)
if pending[2] then
"""
    + _CLOCK
    + r"""
  local now = now_ms()
  redis.call('ZREMRANGEBYSCORE', R, '-inf', num(now - keep))
  redis.call('ZADD', R, num(now), pending[2])
  redis.call('PEXPIRE', R, keep)
end
return pending[1]
"""
)
TAKE = Script("SHAPE_TAKE", _TAKE)

# KEYS[1]: pending hash, KEYS[2]: retired set.  ARGV[1]: this execution's task id.
# Asked by an execution that just took the lock: 'sweep' when it is the sweeper of
# the pending call (it hands the call on), 'drop' when it is (a copy of) a retired
# sweeper (its call was handed on already), 'run' otherwise (a call of its own).
_SWEEP = r"""
local P, R = KEYS[1], KEYS[2]
if redis.call('HGET', P, 'sweeper') == ARGV[1] then return 'sweep' end
if redis.call('ZSCORE', R, ARGV[1]) then return 'drop' end
return 'run'
"""
SWEEP = Script("SHAPE_SWEEP", _SWEEP)

# -- debouncing (Celery tasks) ----------------------------------------------------
# KEYS[1]: the debounce hash ``<prefix>:debounce:{<name>}``: ``call`` (the latest
# call's arguments, JSON), ``due`` (Redis time, ms, when the key has been quiet long
# enough), ``timer`` (the task id of the message that comes back at ``due``) and
# ``fire`` (the task id the due call was sent under).
# ARGV[1]: this call (JSON), ARGV[2]: this execution's task id ('' when it cannot
# be sent again), ARGV[3]: the quiet period (ms), ARGV[4]: a fresh task id (used if
# the call fires now), ARGV[5]: how long the hash outlives its due time (ms).
# Returns {'run'} (this execution is the due call), {'wait', ms} (the timer, back
# early: come back in ms), {'fire', call, id} (the timer: send call under id),
# {'timer', ms} (this call is pending and its message is the timer), or
# {'debounced'} (this call is pending; another message is the timer).
_DEBOUNCE = (
    r"""
local D = KEYS[1]
local call, me, quiet, fresh, keep = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local s = redis.call('HMGET', D, 'fire', 'timer', 'due', 'call')
if me ~= '' and s[1] == me then return {'run'} end
"""
    + _CLOCK
    + r"""
local now = now_ms()
if me ~= '' and s[2] == me then
  local due = tonumber(s[3])
  if now < due then return {'wait', due - now} end
  redis.call('HDEL', D, 'timer', 'due', 'call')
  redis.call('HSET', D, 'fire', fresh)
  redis.call('PEXPIRE', D, keep)
  return {'fire', s[4], fresh}
end
redis.call('HSET', D, 'call', call, 'due', num(now + quiet))
redis.call('PEXPIRE', D, quiet + tonumber(keep))
if s[2] or me == '' then return {'debounced'} end
redis.call('HSET', D, 'timer', me)
return {'timer', quiet}
"""
)
DEBOUNCE = Script("SHAPE_DEBOUNCE", _DEBOUNCE)
