"""The scripts that push an election's news to its observers (text only).

A term's own check is store-enforced fencing's CHECK (:mod:`.fenced`): a
leadership is a mutex hold and its term is that hold's fencing token.
"""

from __future__ import annotations

from .common import LISTENING_FRAGMENT, Script

# Observers of an election (processes that watch who leads without campaigning) are
# pushed the news: each wait registers "<channel> <nonce>" in the watchers hash
# ``P:watchers:{NAME}`` (same hash tag: same slot), and a new leader or a resign
# publishes a poke ("<nonce>", no token) to every live one, which the observer's
# wake-up hub delivers like a waiter's poke.

# KEYS[1]: the lock hash, KEYS[2]: the watchers hash; ARGV[1]: "<channel> <nonce>",
# ARGV[2]: how long the registration lives (ms). Returns {fence or '', PTTL of the lock}.
WATCH = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local life = tonumber(ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], string.format('%.0f', now + life))
if redis.call('PTTL', KEYS[2]) < life then redis.call('PEXPIRE', KEYS[2], life) end
local f = redis.call('HGET', KEYS[1], 'fence')
return {f or '', redis.call('PTTL', KEYS[1])}
"""

# KEYS[1]: the watchers hash. Pokes every live registration and forgets them all
# (an observer registers again for its next wait). Returns how many were poked. A
# registration names its channel as a queued wait does (see scripts.listening).
ANNOUNCE = (
    LISTENING_FRAGMENT
    + r"""
local all = redis.call('HGETALL', KEYS[1])
if #all == 0 then return 0 end
redis.call('DEL', KEYS[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = 0
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) > now then
    local at = string.find(all[i], ' ', 1, true)
    if at then
      redis.call('PUBLISH', (listening(string.sub(all[i], 1, at - 1))), string.sub(all[i], at + 1))
      n = n + 1
    end
  end
end
return n
"""
)

watch_script = Script("watch", WATCH)
announce_script = Script("announce", ANNOUNCE)
