"""The operator's scripts: force-release and force-extend of any lock (text only).

One script per action serves every primitive: on a semaphore's or read-write
lock's hash (one with a ``type`` field, sent with all five keys) it acts on the
holders matching the expected owner and fencing token
(:mod:`.shared`); on a mutex's hash, or another tool's key, it runs the
mutex's path (:mod:`.scripts`).
"""

from __future__ import annotations

from .mutex import FORCE_EXTEND, FORCE_RELEASE, Script
from .shared import FORCE_EXTEND_PATH, FORCE_RELEASE_PATH

_DISPATCH = r"""
do
  local ok, kind = pcall(redis.call, 'HGET', KEYS[1], 'type')
  if ok and kind and #KEYS == 5 then return shared_path() end
end
"""


def _either(shared: str, mutex: str) -> str:
    return "local function shared_path()\n" + shared + "\nend\n" + _DISPATCH + mutex


force_release_script = Script("force_release", _either(FORCE_RELEASE_PATH, FORCE_RELEASE))
force_extend_script = Script("force_extend", _either(FORCE_EXTEND_PATH, FORCE_EXTEND))
