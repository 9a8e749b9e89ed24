"""The script that answers whether a leadership term is still the current one (text only).

A leadership is a mutex hold, and its term is that hold's fencing token, which the
lock hash ``P:{NAME}`` keeps in its ``fence`` field for as long as the hold lives
(a hand-off rewrites it for the new holder, a release or an expired lease deletes
the hash). So a term is current exactly when the hash exists and its ``fence`` is
that term: one ``HGET`` in one round trip, keyed by the lock hash, so it runs on the
lock's slot on Redis Cluster and names a key as serverless offerings require.
"""

from __future__ import annotations

from .scripts import Script

# KEYS[1]: the lock hash; ARGV[1]: a term (fencing token, decimal).
# 1 while the lock is held under that term, else 0.
IS_CURRENT = r"""
local f = redis.call('HGET', KEYS[1], 'fence')
if f and f == ARGV[1] then return 1 end
return 0
"""

is_current_script = Script("is_current", IS_CURRENT)
