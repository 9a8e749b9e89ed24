"""The Lua scripts of store-enforced fencing (text only: the backends run them).

Both read the mutex's lock hash (``KEYS[1]``, field ``fence``: the current holder's
fencing token, see :mod:`.scripts`). A hold is *current* when that hash exists and
its ``fence`` is the caller's token: each grant writes a new, larger token, so a
token names one hold, whoever holds it. An expired lease has no hash (Redis deletes
the key before a script can read it), and a hand-off rewrites ``fence`` for the new
holder in the same script that grants it.
"""

from __future__ import annotations

from .common import Script

# KEYS[1]: the lock hash.  ARGV[1]: a fencing token.
# Returns 1 when the lock is held with that token; else {the current holder's
# token} ({} when nobody holds the lock); 'TYPE <primitive>' when the name is a
# semaphore's or read-write lock's (whose hash has no one current token).
CHECK = r"""
local h = redis.call('HMGET', KEYS[1], 'fence', 'type')
if h[2] then return 'TYPE ' .. h[2] end
if h[1] == ARGV[1] then return 1 end
return {h[1]}
"""

# KEYS[1]: the lock hash; KEYS[2..]: the keys the command writes (its first arguments).
# ARGV[1]: a fencing token; ARGV[2]: the command; ARGV[3..]: its arguments after the keys.
# Runs the command only while the lock is held with that token, in the same script,
# so no other holder can be granted in between.
# Returns {1, the command's reply} when it ran; {0, the current token} when it was
# refused ({0} when nobody holds the lock); 'TYPE <primitive>' as CHECK does.
GUARDED_WRITE = r"""
local h = redis.call('HMGET', KEYS[1], 'fence', 'type')
if h[2] then return 'TYPE ' .. h[2] end
if h[1] ~= ARGV[1] then return {0, h[1]} end
local args = {}
for i = 2, #KEYS do args[#args + 1] = KEYS[i] end
for i = 3, #ARGV do args[#args + 1] = ARGV[i] end
return {1, redis.call(ARGV[2], unpack(args))}
"""

check_script = Script("fence-check", CHECK)
guarded_write_script = Script("guarded-write", GUARDED_WRITE)
