"""What every family of Lua scripts shares: the script object, the protocol's constants,
and the Lua fragments the primitives' scripts are built from (text only).

Fragments are plain Lua text, concatenated into each script where it needs them (each
function definition costs a script time on every run, so a script takes only what its
path uses). Each names what it needs from its script (``L``, ``F``, ``Q``, ``E``: the
lock hash, the slot hash, the waiter queue and the waiter entries). Also here: the
scripts that read or write only a slot's history (``HISTORY``, ``LOST``) and the
scripting probe.
"""

from __future__ import annotations

import hashlib

#: How long a waiter's queue entry lives without being refreshed (ms).
ENTRY_LIFE_MS = 4000
#: How long a lock handed to a waiter is leased until the waiter claims it (ms).
HANDOFF_CLAIM_MS = 2000
#: How many events a lock's history keeps (see ``record`` in the scripts).
HISTORY_MAX = 20
#: What a waiter puts before its wake-up channel in its queue entry when its
#: subscription is confirmed on the server that runs the scripts (see handoff).
WAKE_SURE = b"!"


class Script:
    """A Lua script and its SHA1, as sent with EVALSHA (the backends load it on NOSCRIPT)."""

    __slots__ = ("source", "sha", "name")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


# Redis's clock, read once per script (TIME), and integers as text for Redis.
#: ``now_us()``, ``now_ms()`` and ``num(x)``.
CLOCK_FRAGMENT = r"""
local clock
local function now_us()
  if not clock then clock = redis.call('TIME') end
  return tonumber(clock[1]) * 1000000 + tonumber(clock[2])
end
local function now_ms() return math.floor(now_us() / 1000) end
local function num(x) return string.format('%.0f', x) end
"""


# A record's or entry's first n '|'-separated fields, then the rest (meta, which may
# contain '|'); and the first live waiter of the queue. Shared with shared.py.
SPLIT_FRAGMENT = r"""
local function split(s, n)
  local out, start = {}, 1
  for i = 1, n do
    local j = string.find(s, '|', start, true)
    out[i] = string.sub(s, start, j - 1)
    start = j + 1
  end
  out[n + 1] = string.sub(s, start)
  return out
end
"""


# A waiter entry's channel, and whether the waiter marked it as subscribed on this
# very server (a leading WAKE_SURE), so that PUBLISH's count tells whether its
# process still listens (see handoff; not on a cluster, whose subscribers are on
# any node, nor while the waiter's subscription is not confirmed).
LISTENING_FRAGMENT = r"""
local function listening(channel)
  if string.byte(channel, 1) == SURE_BYTE then return string.sub(channel, 2), true end
  return channel, false
end
"""

LISTENING_FRAGMENT = LISTENING_FRAGMENT.replace("SURE_BYTE", str(WAKE_SURE[0]))

#: ``live_head()``: the first waiter whose entry has not expired (needs ``Q``, ``E``,
#: ``now_ms``).
LIVE_HEAD_FRAGMENT = r"""
-- The first waiter whose entry has not expired; dead entries are dropped.
local function live_head()
  while true do
    local w = redis.call('LINDEX', Q, 0)
    if not w then return nil end
    local e = redis.call('HGET', E, w)
    if e and tonumber(string.sub(e, 1, string.find(e, '|', 1, true) - 1)) >= now_ms() then
      return w, e
    end
    redis.call('LPOP', Q)
    if e then redis.call('HDEL', E, w) end
  end
end
"""


#: ``enqueue(owner, nonce, life, tail, wait_left)`` (needs ``Q``, ``E``, ``split``,
#: ``entry_fields``, ``now_ms``, ``num``).
ENQUEUE_FRAGMENT = r"""
-- Queue *owner* (or refresh its entry) for the wait *nonce*; *tail* is the entry
-- after its expiry, since and deadline (ttl|channel|nonce|...); *wait_left* is
-- how long the waiter still waits, in ms ('' = no limit). A waiter asking again
-- (woken, or at its fallback poll) keeps an entry of this wait with more than
-- half its life left and the same tail (its channel is marked once its subscription
-- is confirmed: see listening), and the keys live at least as long. "since" (when this
-- wait began) and the deadline are Redis's clock, for inspection only.
local function enqueue(owner, nonce, life, tail, wait_left)
  local now = now_ms()
  local since = now
  local old = redis.call('HGET', E, owner)
  if old then
    if entry_fields(old)[4] == nonce then
      local p = split(old, 2)
      if tonumber(p[1]) > now + life / 2 and string.sub(old, -#tail) == tail then
        return false
      end
      since = tonumber(p[2]) or now
    end
  end
  local deadline = ''
  if wait_left ~= nil and wait_left ~= '' then deadline = num(now + tonumber(wait_left)) end
  local head = num(now + life) .. '|' .. num(since) .. '|' .. deadline
  redis.call('HSET', E, owner, head .. '|' .. tail)
  if not old then redis.call('RPUSH', Q, owner) end
  redis.call('PEXPIRE', Q, life)
  redis.call('PEXPIRE', E, life)
  return true
end
"""


def entry_fields_fragment(fields: int) -> str:
    """Lua ``entry_fields(e)``: a queue entry ``expiry|since|deadline|<fields>...``
    with *fields* fields after the deadline (the last one, the metadata, may
    contain ``|``) as ``{expiry, <fields>}``: since and deadline are for
    inspection only, so the scripts never see them."""
    return f"""
local function entry_fields(e)
  local p = split(e, {fields + 2})
  table.remove(p, 2)
  table.remove(p, 2)
  return p
end
"""


#: ``record(entry)`` and ``waited_by(entry, w, e)``: a lock's history (needs ``L``, ``F``,
#: ``split``, ``entry_fields``, ``now_ms``).
HISTORY_FRAGMENT = r"""
-- The locks' recent history, written on slow paths only (a hand-off, an expiry
-- someone waited through, a waiter giving up, an operator's release): the last
-- HISTORY_MAX events of the slot's locks in the slot hash, a ring of fields h0, h1,
-- ... with 'hn' the number of the newest, each naming its lock's key ('k'; read by
-- HISTORY and engine/history.py). A hand-off writes
-- one, so an event is one small write: nothing older is read or rewritten; with
-- *later* (a list of fields and values), the write is left to the caller, which
-- makes it with its own; *n* (with *later*): the event's number, when the caller read
-- 'hn' with something else. Every path writes something that frees memory first, so
-- a full Redis does not refuse it.
local function record(entry, later, n)
  entry.t, entry.k = now_ms(), L
  if n then  -- the caller read 'hn' already: the new number goes with *later*
    later[#later + 1] = 'hn'
    later[#later + 1] = n
  else
    n = redis.call('HINCRBY', F, 'hn', 1)
  end
  local field, text = 'h' .. (n % HISTORY_MAX), cjson.encode(entry)
  if later then
    later[#later + 1] = field
    later[#later + 1] = text
  else
    redis.call('HSET', F, field, text)
  end
end

-- A waiter's entry as a history entry's "waited" part (its metadata is the
-- entry's last field, whatever the primitive).
local function waited_by(entry, w, e)
  entry.w = w
  entry.wt = now_ms() - (tonumber(split(e, 2)[2]) or now_ms())
  local f = entry_fields(e)
  entry.wm = f[#f]
  return entry
end
"""

HISTORY_FRAGMENT = HISTORY_FRAGMENT.replace("HISTORY_MAX", str(HISTORY_MAX))

# KEYS[1]: the slot hash; ARGV[1]: an owner whose renewal found its hold gone
# (its lease ran out, or an operator released it), ARGV[2]: the lock's key: a "lost"
# event in the history; ARGV[3]: the retention in ms, for a slot hash this event
# creates (its retention ran out while the hold was renewed elsewhere): like every
# other first write, it lives that long, not for ever.
LOST = (
    r"""
local F, L = KEYS[1], ARGV[2]
"""
    + CLOCK_FRAGMENT
    + SPLIT_FRAGMENT
    + HISTORY_FRAGMENT
    + r"""
local new = redis.call('EXISTS', F) == 0
record({e = 'lost', o = ARGV[1]})
if new then redis.call('PEXPIRE', F, ARGV[3]) end
return 1
"""
)

# KEYS[1]: the slot hash.  The slot's recorded events, newest first (JSON texts, each
# naming its lock's key: the reader keeps its lock's).
HISTORY = (
    r"""
local F = KEYS[1]
local n = tonumber(redis.call('HGET', F, 'hn')) or 0
local fields = {}
for i = 0, math.min(n, HISTORY_MAX) - 1 do fields[i + 1] = 'h' .. ((n - i) % HISTORY_MAX) end
if #fields == 0 then return {} end
return redis.call('HMGET', F, unpack(fields))
"""
).replace("HISTORY_MAX", str(HISTORY_MAX))

LOST_SCRIPT = Script("lost", LOST)
HISTORY_SCRIPT = Script("history", HISTORY)
#: Answers 1 and touches nothing: whether a server runs scripts (system check E006).
#: It names one key, like every script here (serverless clusters refuse scripts that
#: name none).
PROBE_SCRIPT = Script("probe", "-- KEYS[1]: any key (not read)\nreturn 1\n")
