"""Deadlock detection for waits nested by hand (pure decisions, I/O as flow effects).

A blocking mutex acquire with a ``deadlock_timeout`` carries a :class:`DeadlockWatch`.
Once it has waited that long, and again at most every :data:`RECHECK` seconds while it
waits, the acquire flow runs :meth:`DeadlockWatch.refused`, a sub-flow of read-only
calls (so the sync and asyncio drivers run it alike):

1. It leaves a pointer ``<prefix>:waitfor:{<owner>}`` = ``<nonce>|<name>``: this
   owner waits for *name*, in the acquire *nonce* (it lives a few seconds and is
   refreshed at every look, so it only ever points at a live wait).
2. It walks the wait-for chain: the lock it waits for, that lock's holder, the
   holder's pointer, the lock the holder waits for, ... Each wait is confirmed by
   the waiter's entry in that lock's queue (same nonce, entry still alive); a chain
   that ends, or loops without this owner, is no deadlock of this wait's.
3. A cycle back to this owner is walked a second time; it counts only if the second
   walk finds the very same waits (owners, locks, nonces) and holders. An owner made
   by the package (a thread, an asyncio task) cannot release or take a lock while it
   waits, so every wait of the cycle spans the time between the two walks, and so
   does every holding: the cycle existed, all at once, in between. Busy queues
   without a cycle give no false positive.
4. The cycle's youngest wait (the one that began last by Redis's clock, the
   largest owner on a tie) is refused: every waiter of the cycle picks the same
   one, and the youngest, which closed the cycle, finds it within its own
   ``deadlock_timeout``. The flow cancels that wait (nothing of it is held) and
   raises :class:`~django_redislock.exceptions.LockDeadlock`.

Owners shared by several threads or processes (an explicit ``owner=``) may release
while one of them waits; a cycle through such an owner can be reported although
another of its threads was about to release. Only waiters with a
``deadlock_timeout`` leave pointers, so only cycles made of them are found.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, NamedTuple

from ..exceptions import LockDeadlock, LockError
from .calls import Call
from .keys import KeySpace
from .lua.deadlock import edge_script, mark_script, pointer_script

#: How often (s) a waiter past its deadlock_timeout looks again.
RECHECK = 0.5
#: How long a pointer lives (ms) without a new look.
POINTER_LIFE_MS = 5000
#: The longest chain followed.
MAX_HOPS = 32


class Wait(NamedTuple):
    """One edge of the wait-for graph: *owner* waits for *name* (acquire *nonce*, since
    *since_ms* by Redis's clock), which *holder* holds."""

    owner: str
    name: str
    nonce: str
    since_ms: int
    holder: str


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entry_wait(entry: str) -> tuple[int, str]:
    """(since_ms, nonce) of a waiter entry ``expiry|since|deadline|ttl|channel|nonce|meta``."""
    parts = entry.split("|", 6)
    return int(parts[1] or 0), parts[5]


def victim(cycle: tuple[Wait, ...]) -> str:
    """The owner whose wait is refused: the youngest wait's (largest owner on a tie)."""
    return max(cycle, key=lambda wait: (wait.since_ms, wait.owner)).owner


class DeadlockWatch:
    """What an acquire with a ``deadlock_timeout`` needs to look for a cycle."""

    __slots__ = ("keyspace", "owner", "name", "nonce", "timeout", "next_look", "cycle")

    def __init__(
        self, keyspace: KeySpace, owner: str, name: str, nonce: str, timeout: float
    ) -> None:
        self.keyspace = keyspace
        self.owner = owner
        self.name = name
        self.nonce = nonce
        #: Seconds of waiting before the first look.
        self.timeout = timeout
        #: When to look next (``clock()``; None until the wait began).
        self.next_look: float | None = None
        #: The cycle found by the last look, if any.
        self.cycle: tuple[Wait, ...] = ()

    def due(self, now: float) -> bool:
        """Whether to look now (the first call starts the wait's clock)."""
        if self.next_look is None:
            self.next_look = now + self.timeout
            return False
        return now >= self.next_look

    def bounded(self, pause: float, now: float) -> float:
        """*pause*, cut short to wake for the next look."""
        if self.next_look is None:
            return pause
        return max(0.0, min(pause, self.next_look - now))

    def pointer_key(self, owner: str) -> bytes:
        """The key of *owner*'s pointer, in the owner's own slot."""
        lock_key = self.keyspace.keys(owner).lock  # the owner as a name: its hash tag
        return f"{self.keyspace.prefix}:waitfor:{lock_key[lock_key.index('{') :]}".encode()

    def _edge_call(self, name: str, owner: str) -> Call:
        keys = self.keyspace.keys(name)
        return Call(
            edge_script, (keys.lock.encode(), keys.waiters.encode()), (owner,),
            "look for a deadlock", name,
        )  # fmt: skip

    def refused(
        self, run: Callable[[Call], Generator[Any, Any, Any]], now: float
    ) -> Generator[Any, Any, bool]:
        """Look for a cycle through this wait (*run*: the flows' ``run``); True when one
        was found and this wait is the one to refuse (:attr:`cycle` names it)."""
        self.next_look = now + RECHECK
        value = f"{self.nonce}|{self.name}"
        mark = Call(
            mark_script, (self.pointer_key(self.owner),), (value, POINTER_LIFE_MS),
            "look for a deadlock", self.name,
        )  # fmt: skip
        yield from run(mark)
        first = yield from self._walk(run)
        if not first:
            return False
        second = yield from self._walk(run)
        if second != first:
            return False
        self.cycle = first
        return victim(first) == self.owner

    def _walk(
        self, run: Callable[[Call], Generator[Any, Any, Any]]
    ) -> Generator[Any, Any, tuple[Wait, ...]]:
        """The chain of waits from this one; the cycle when it comes back, else ()."""
        owner, name, nonce = self.owner, self.name, self.nonce
        chain: list[Wait] = []
        for _ in range(MAX_HOPS):
            holder, entry = yield from run(self._edge_call(name, owner))
            if holder is None or entry is None:
                return ()
            since_ms, entry_nonce = _entry_wait(_text(entry))
            if entry_nonce != nonce:
                return ()  # that wait is over (another wait of the owner is not it)
            holder = _text(holder)
            chain.append(Wait(owner, name, nonce, since_ms, holder))
            if holder == self.owner:
                return tuple(chain)
            if any(wait.owner == holder for wait in chain):
                return ()  # a cycle this wait only leads into: its members will see it
            pointer = yield from run(
                Call(pointer_script, (self.pointer_key(holder),), (), "look for a deadlock",
                     self.name)
            )  # fmt: skip
            if pointer is None:
                return ()
            nonce, _, name = _text(pointer).partition("|")
            owner = holder
        return ()

    def error(self) -> LockDeadlock:
        """The refusal of this wait, naming the cycle."""
        steps = "; ".join(
            f"owner {w.owner!r} waits for {w.name!r}, held by {w.holder!r}" for w in self.cycle
        )
        return LockDeadlock(
            f"lock {self.name!r}: deadlock: {steps}. This wait, the youngest of the cycle, "
            "was refused (nothing of it is held); take nested locks in one order, or "
            "together with locks.lock_many()",
            name=self.name,
            cycle=tuple((w.owner, w.name, w.holder) for w in self.cycle),
        )


def watch_for(
    backend: Any, owner: str, name: str, nonce: str, timeout: float | None
) -> DeadlockWatch | None:
    """The watch of a blocking acquire with *timeout* (None: no detection); refused with
    a LockError on Redlock, whose masters keep no common queue to follow."""
    if timeout is None:
        return None
    if backend.features.quorum:
        raise LockError(
            f"lock {name!r}: deadlock_timeout needs one Redis or a Redis Cluster: Redlock's "
            "masters keep no common queue of waiters to follow",
            name=name,
        )
    return DeadlockWatch(backend.keyspace, owner, name, nonce, timeout)
