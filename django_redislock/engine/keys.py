"""The Redis key layout of a lock (pure).

One lock uses these keys, in one Redis Cluster hash slot so every script touches a
single slot:

* ``<prefix>:{<name>}`` -- a hash: the lock itself (owner, count, fence, ...).
* ``<prefix>:slot:{<tag>}`` -- a hash shared by every name in the lock's slot (its
  tag is :func:`.slots.slot_tag` of that slot): the last fencing token given there,
  the last full release's nonce and the slot's recent history; it lives
  ``REDISLOCK_FENCE_RETENTION`` seconds from its first write. Nothing of a lock's
  own outlives its lease.
* ``<prefix>:queue:{<name>}`` -- a list: waiting owners in arrival order.
* ``<prefix>:waiters:{<name>}`` -- a hash: each waiting owner's entry.
* ``<prefix>:holders:{<name>}`` -- a sorted set: each holder's lease expiry, for
  the primitives with several holders (semaphores, read-write locks).

Redis takes the hash tag from the first ``{`` up to the first ``}`` after it. A
name starting with ``}`` (or with the escape character) would give an empty tag,
so such names get a leading escape character in the key; the mapping stays
one-to-one and prefix searches apply the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .slots import key_slot, slot_tag

_ESCAPE = "\\"
#: How many names' keys a KeySpace remembers before starting over.
_KEY_CACHE_SIZE = 4096
_GLOB_SPECIAL = set("*?[]\\")


def _tag_part(name: str) -> str:
    if name.startswith(("}", _ESCAPE)):
        return _ESCAPE + name
    return name


def glob_escape(text: str) -> str:
    """Escape *text* so it matches itself literally in a Redis ``MATCH`` pattern."""
    return "".join(_ESCAPE + ch if ch in _GLOB_SPECIAL else ch for ch in text)


@dataclass(frozen=True)
class LockKeys:
    """The Redis key names used by one lock."""

    lock: str
    slot: str
    queue: str
    waiters: str
    holders: str

    @cached_property
    def all(self) -> tuple[bytes, bytes, bytes, bytes]:
        """The keys in the order the Lua scripts expect them, UTF-8 encoded once."""
        return (
            self.lock.encode(),
            self.slot.encode(),
            self.queue.encode(),
            self.waiters.encode(),
        )

    @cached_property
    def shared(self) -> tuple[bytes, bytes, bytes, bytes, bytes]:
        """The five keys of the scripts of semaphores and read-write locks (and of the
        operator's scripts, which serve every primitive)."""
        return (*self.all, self.holders.encode())

    def completion(self, run: str) -> str:
        """The key of the completion record of *run* (an id of one run of the work this
        lock guards: a Celery task id), under the lock's hash tag, so one script can
        read or write it with the lock (see :class:`~.mutex.Mutex`)."""
        prefix, tag = self.lock.split(":{", 1)  # a prefix has no "{"
        return f"{prefix}:task-done:{{{tag}:{run}"


class KeySpace:
    """Maps lock names to keys (and back) under one key prefix."""

    def __init__(self, prefix: str) -> None:
        if not isinstance(prefix, str) or not prefix:
            raise ValueError("REDISLOCK_KEY_PREFIX must be a non-empty string")
        if any(ch in prefix for ch in "{}|"):
            raise ValueError("REDISLOCK_KEY_PREFIX must not contain '{', '}' or '|'")
        self.prefix = prefix
        #: The start of every wake-up hub's pub/sub channel name (a process token
        #: follows); every blocking acquire asks for its hub by it.
        self.wake_prefix = f"{prefix}:wake:"
        self._lock_head = f"{prefix}:{{"
        self._cache: dict[str, LockKeys] = {}

    def keys(self, name: str) -> LockKeys:
        """Return the keys of the lock called *name* (which must be valid)."""
        keys = self._cache.get(name)
        if keys is None:
            if len(self._cache) >= _KEY_CACHE_SIZE:
                self._cache.clear()
            keys = self._cache[name] = self._make_keys(name)
        return keys

    def _make_keys(self, name: str) -> LockKeys:
        tag = "{" + _tag_part(name) + "}"
        p = self.prefix
        lock = f"{p}:{tag}"
        return LockKeys(
            lock=lock,
            slot=self.slot_key(key_slot(lock.encode())),
            queue=f"{p}:queue:{tag}",
            waiters=f"{p}:waiters:{tag}",
            holders=f"{p}:holders:{tag}",
        )

    def revoked(self, task_id: str) -> str:
        """The key of the record that the task *task_id* was revoked (a Celery task id:
        the enqueue-time dedupe no longer answers with it; see ``celery/revoke.py``)."""
        return f"{self.prefix}:task-revoked:{task_id}"

    def match_pattern(self, name_prefix: str = "") -> str:
        """A SCAN ``MATCH`` pattern for lock keys whose name starts with *name_prefix*."""
        head = _tag_part(name_prefix) if name_prefix else ""
        return glob_escape(self._lock_head + head) + "*"

    def slot_key(self, slot: int) -> str:
        """The key of the state kept for every lock name in hash slot *slot* (the fencing
        counter, the last release nonce, the recent history)."""
        return f"{self.prefix}:slot:{{{slot_tag(slot)}}}"

    def slot_pattern(self) -> str:
        """A SCAN ``MATCH`` pattern for every slot's state (where the history is kept)."""
        return glob_escape(f"{self.prefix}:slot:{{") + "*"

    def name_from_key(self, key: str) -> str | None:
        """Return the lock name stored at *key*, or None if *key* is not a lock key."""
        if not (key.startswith(self._lock_head) and key.endswith("}")):
            return None
        inner = key[len(self._lock_head) : -1]
        if inner.startswith(_ESCAPE):
            inner = inner[1:]
        return inner or None
