"""Observers of an election: waiting, without campaigning, until the leading term changes.

An observer is not in the lock's queue, so a release does not wake it. Instead each wait
registers its wake-up hub's channel and a nonce in ``P:watchers:{NAME}`` (the WATCH
script, which also returns the current term and the leader's remaining lease in the
same round trip), and whoever changes the leadership through an ``Election`` -- a new
leader once elected, a leader that resigns -- pokes every registered observer (the
ANNOUNCE script, ``engine/lua/observe.py``). The hub delivers the poke like a waiter's.

Not every change is announced: a leader that dies with no standby announces nothing,
and a lease simply runs out. So the observer also wakes when the leader's lease (as the
WATCH reply said) would have run out, and looks again. Every wait is bounded by the
caller's timeout. :func:`watch` is the wait as a flow (engine/flows.py): the drivers
``run_sync`` and ``run_async`` perform its effects, so both flavours are this one code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from django_redislock.engine.calls import Call
from django_redislock.engine.flows import HUB_READY, SUBSCRIBE, Effect, Listen, Park, run
from django_redislock.engine.lua.observe import announce_script, watch_script

if TYPE_CHECKING:
    from django_redislock.engine.keys import KeySpace

#: A registration lives at most this long (s); a longer wait registers again.
WATCH_LIFE_CAP = 60.0
#: How long after the leader's lease would have run out the observer looks (s).
LEASE_SLACK = 0.05


def watchers_key(keyspace: KeySpace, name: str) -> str:
    """``P:watchers:{NAME}``: the lock's hash tag, so it is in the lock's slot."""
    lock = keyspace.keys(name).lock
    return f"{keyspace.prefix}:watchers:{lock[len(keyspace.prefix) + 1 :]}"


def watch_call(keyspace: KeySpace, name: str, channel: bytes, nonce: str, left: float) -> Call:
    """Register the wait *nonce* on *channel* for about *left* seconds, and read the term."""
    life_ms = int((min(max(left, 0.0), WATCH_LIFE_CAP) + 1.0) * 1000)
    keys = (keyspace.keys(name).lock.encode(), watchers_key(keyspace, name).encode())
    return Call(watch_script, keys, (channel + b" " + nonce.encode(), str(life_ms).encode()),
                "watch an election", name)  # fmt: skip


def announce_call(keyspace: KeySpace, name: str) -> Call:
    """Poke every observer registered for the election *name*."""
    key = watchers_key(keyspace, name).encode()
    return Call(announce_script, (key,), (), "announce a change of leader", name)


def read_watch(reply: Any) -> tuple[int | None, int]:
    """(the leading term or None, the leader's remaining lease in ms, < 0: none)."""
    raw, pttl = reply
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return (int(text) if text else None), int(pttl)


def wake_in(pttl_ms: int, left: float) -> float:
    """How long to wait for a poke: until the timeout, or until the leader's lease would
    have run out (a leader that died announces nothing), whichever comes first."""
    if pttl_ms < 0:
        return left
    return min(left, pttl_ms / 1000.0 + LEASE_SLACK)


def watch(
    keyspace: KeySpace,
    name: str,
    nonce: str,
    known: int | None,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
) -> Generator[Effect, Any, bool]:
    """Wait until the leading term of *name* is not *known* (True), or until *deadline*
    by *clock* (False). Subscribed before registering in Redis, so no poke is missed."""
    yield Listen(nonce)
    yield SUBSCRIBE
    _, channel = yield HUB_READY
    while True:
        left = deadline - clock()
        term, pttl = read_watch((yield from run(watch_call(keyspace, name, channel, nonce, left))))
        if term != known:
            return True
        if left <= 0:
            return False
        yield Park(nonce, wake_in(pttl, left))
