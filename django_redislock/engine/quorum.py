"""Redlock's decisions: how the replies of N independent masters make one answer (pure).

A quorum backend sends each lock call to every master and hands the replies
(a reply, or the exception of a master that failed or did not answer in time)
to the functions here, which decide the answer in the format the flows already
read (see :mod:`.calls`): a grant, "held" with a hint of how long to wait,
a release count, a renewal's 1 or 0. They also say what to undo.

The rules follow the Redlock algorithm:

* a lock is held when a majority (``N // 2 + 1``) granted it, and the time left
  of its lease after the round trip and the clock drift allowance (the
  *validity*) is still a useful part of the lease;
* a failed attempt is undone on every master, including those whose reply was
  lost (their write may have landed);
* a renewal counts only when a majority renewed; fewer, and the hold is lost.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from ..exceptions import LockError, QuorumNotReached
from .calls import Call, decode_attempt
from .lua.mutex import (
    acquire_script,
    cancel_script,
    claim_script,
    extend_script,
    release_script,
    renew_script,
)
from .lua.operator import force_extend_script, force_release_script
from .lua.quorum import (
    rl_acquire_script,
    rl_cancel_script,
    rl_commit_script,
    rl_release_script,
)

#: The clock drift allowance: this share of the lease, plus DRIFT_MS.
DRIFT_FACTOR = 0.01
DRIFT_MS = 2
#: A grant is kept only if at least this share of the lease is still valid.
MIN_VALIDITY_FACTOR = 0.5
#: How long each master may take to answer one call (ms), as a share of the
#: lease, within bounds. The Redlock paper suggests 5-50 ms for a 10 s lease; the
#: floor is higher here so that a busy machine (a garbage collection, a loaded
#: core) does not count as a failed master, and the validity check keeps even the
#: longest round far inside the lease.
NODE_TIMEOUT_FACTOR = 0.01
NODE_TIMEOUT_MIN_MS = 20.0
NODE_TIMEOUT_MAX_MS = 100.0
#: Node timeout of calls without a lease (releases, renewals, operator actions).
DEFAULT_NODE_TIMEOUT_MS = 100.0
#: After a split vote, contenders wait a random 5-50 ms before asking again.
SPLIT_BACKOFF_MS = (5, 50)

Reply = Any  # a master's reply, or the Exception it answered with (None: no answer)


def not_reached(action: str, answered: int, masters: int, name: str | None) -> QuorumNotReached:
    """The error of a call that only *answered* of *masters* masters answered in time."""
    needed = quorum(masters)
    return QuorumNotReached(
        f"could not {action}: only {answered} of {masters} Redis masters answered in time "
        f"and a Redlock needs {needed}; check the masters in REDISLOCK_REDLOCK_CACHES",
        name=name,
        answered=answered,
        masters=masters,
        needed=needed,
    )


def quorum(masters: int) -> int:
    """How many masters make a majority."""
    return masters // 2 + 1


def node_timeout_ms(ttl_ms: int) -> float:
    """How long each master may take to answer a call on a lock with lease *ttl_ms*."""
    if ttl_ms <= 0:
        return DEFAULT_NODE_TIMEOUT_MS
    return min(NODE_TIMEOUT_MAX_MS, max(NODE_TIMEOUT_MIN_MS, ttl_ms * NODE_TIMEOUT_FACTOR))


def validity_ms(ttl_ms: int, elapsed_ms: float) -> float:
    """How long a lock granted by a majority is safe to use, from when the round began."""
    if ttl_ms <= 0:
        return float("inf")  # no expiry
    return ttl_ms - elapsed_ms - (ttl_ms * DRIFT_FACTOR + DRIFT_MS)


def answered(replies: Sequence[Reply]) -> list[Any]:
    """The replies of the masters that answered (without an error)."""
    return [r for r in replies if r is not None and not isinstance(r, Exception)]


@dataclass(frozen=True)
class AcquireOutcome:
    """What a round of acquire replies means."""

    #: The reply for the flows (a grant, or ``-2 - pttl`` with a wait hint).
    reply: Any
    #: Whether the grants of this round must be undone on every master.
    undo: bool
    #: Raise this once undone: too few masters answered to decide.
    error: QuorumNotReached | None = None


def decide_acquire(
    replies: Sequence[Reply],
    ttl_ms: int,
    elapsed_ms: float,
    *,
    name: str | None = None,
    backoff: Callable[[int, int], int] = random.randint,
) -> AcquireOutcome:
    """Combine the masters' ACQUIRE replies.

    Granted by a majority within a useful validity: the grant, with the largest
    token and hold count the masters gave (re-entries carry the client's count,
    so the counts agree). Otherwise undo everywhere; the reply is "held" with the
    holder's shortest remaining lease when a majority names a holder and none
    granted, else a short random backoff: a split vote (contenders spread out),
    or a lock in transition (a release that reached some masters first).
    When too few masters answered to decide, the outcome carries a
    :class:`QuorumNotReached` to raise once whatever was granted is undone.
    """
    masters = len(replies)
    got = answered(replies)
    if len(got) < quorum(masters):
        error = not_reached("acquire the lock", len(got), masters, name)
        return AcquireOutcome(-1, True, error)
    attempts = [decode_attempt(r) for r in got]
    grants = [a for a in attempts if a.held]
    useful = validity_ms(ttl_ms, elapsed_ms) >= ttl_ms * MIN_VALIDITY_FACTOR
    if len(grants) >= quorum(masters) and useful:
        fence = max(a.value for a in grants)
        count = max(a.holds for a in grants)
        if all(isinstance(r, int) for r in got if decode_attempt(r).held) and count == 1:
            return AcquireOutcome(fence, False)
        return AcquireOutcome([fence, count], False)
    held = [a.value for a in attempts if not a.held]
    if not grants and len(held) >= quorum(masters):
        leases = [p for p in held if p >= 0]
        pttl = min(leases) if leases else -1
    else:
        pttl = backoff(*SPLIT_BACKOFF_MS)
    return AcquireOutcome(-2 - pttl, bool(grants) or len(got) < masters)


def decide_count(replies: Sequence[Reply], action: str, name: str | None = None) -> int:
    """Combine replies that are a number per master (RELEASE: holds left, -1 not owned).

    The answer of a majority, or the most common answer among those who
    answered when they are a majority. Raises :class:`QuorumNotReached` when too
    few answered.
    """
    masters = len(replies)
    got = [int(r) for r in answered(replies)]
    if len(got) < quorum(masters):
        raise not_reached(action, len(got), masters, name)
    owned = [r for r in got if r >= 0]
    if len(owned) >= quorum(masters):
        return min(owned)
    value, _ = Counter(got).most_common(1)[0]
    return -1 if value >= 0 else value


def decide_renewal(replies: Sequence[Reply]) -> int:
    """A renewal (RENEW/CLAIM) counts (1) only when a majority renewed; else lost (0)."""
    renewed = sum(1 for r in answered(replies) if int(r) == 1)
    return 1 if renewed >= quorum(len(replies)) else 0


def decide_extend(replies: Sequence[Reply], name: str | None = None) -> int:
    """Combine EXTEND replies (new lease in ms; -1 not owned; -2 no expiry): the lease
    a majority agreed to (the shortest of them), else the most common refusal."""
    masters = len(replies)
    got = [int(r) for r in answered(replies)]
    if len(got) < quorum(masters):
        raise not_reached("extend the lock", len(got), masters, name)
    extended = sorted(r for r in got if r > 0)
    if len(extended) >= quorum(masters):
        return extended[0]
    value, _ = Counter(r for r in got if r <= 0).most_common(1)[0]
    return value


def decide_any(replies: Sequence[Reply], action: str, name: str | None = None) -> int:
    """Operator actions (force release/extend): the strongest answer any master gave
    (1 = done / the new lease), once a majority answered."""
    masters = len(replies)
    got = [int(r) for r in answered(replies)]
    if len(got) < quorum(masters):
        raise not_reached(action, len(got), masters, name)
    return max(got)


def decide_snapshot(snapshots: Sequence[Any | None], masters: int) -> Any | None:
    """The snapshot of one lock as a majority of masters sees it (one owner), or None
    when no holder has a majority. *snapshots* has one entry per master that
    answered (None: the lock is not there). The shortest remaining lease is shown,
    with the largest token (each master makes its own; the holder got the largest)."""
    groups: dict[Any, list[Any]] = {}
    for snap in snapshots:
        if snap is not None:
            groups.setdefault(snap.owner, []).append(snap)
    for group in groups.values():
        if len(group) >= quorum(masters):
            shortest = min(group, key=lambda s: s.ttl if s.ttl is not None else float("inf"))
            tokens = [s.fencing_token for s in group if s.fencing_token is not None]
            return replace(shortest, fencing_token=max(tokens) if tokens else None)
    return None


# -- how each call runs on the masters ---------------------------------------------

Combine = Callable[[list[Reply], float], Any]


class Plan(NamedTuple):
    """How one call runs on the masters."""

    #: What each master is sent.
    sent: Call
    #: Turns the replies (and the round's duration in ms) into the answer.
    combine: Combine
    #: Per-master timeout (s).
    timeout: float


def plan(call: Call) -> Plan:
    """How *call* (a call the flows or the manager made) runs on a quorum of masters."""
    script, args = call.script, call.args
    timeout = DEFAULT_NODE_TIMEOUT_MS / 1000
    if script is acquire_script:
        ttl_ms = int(args[2])
        timeout = node_timeout_ms(ttl_ms) / 1000
        return Plan(
            call._replace(script=rl_acquire_script),
            lambda replies, elapsed: decide_acquire(replies, ttl_ms, elapsed, name=call.name),
            timeout,
        )
    if script is release_script:
        everything = args[3] if len(args) > 3 else b""
        sent = call._replace(script=rl_release_script, args=(*args[:3], everything, b""))
        return Plan(
            sent,
            lambda replies, _: decide_count(replies, call.action, call.name),
            timeout,
        )
    if script is cancel_script:
        return Plan(
            call._replace(script=rl_cancel_script),
            lambda replies, elapsed: decide_acquire(replies, 0, elapsed, name=call.name),
            timeout,
        )
    if script in (renew_script, claim_script):
        return Plan(call, lambda replies, _: decide_renewal(replies), timeout)
    if script is extend_script:
        return Plan(
            call,
            lambda replies, _: decide_extend(replies, call.name),
            timeout,
        )
    if script in (force_release_script, force_extend_script):
        return Plan(
            call,
            lambda replies, _: decide_any(replies, call.action, call.name),
            timeout,
        )
    raise LockError(
        f"lock {call.name!r}: semaphores and read-write locks are not available on Redlock "
        "(REDISLOCK_REDLOCK_CACHES); use them on one Redis, Sentinel or a Redis Cluster "
        "(see docs/redlock.md)",
        name=call.name,
    )


def undo_call(call: Call, retention_arg: bytes) -> Call:
    """Gives back, on every master, what an acquire that did not reach a majority got."""
    owner, nonce = call.args[0], call.args[1]
    return Call(
        rl_release_script,
        call.keys,
        (owner, nonce, retention_arg, b"", b"quiet"),
        "give back a lock that did not reach a majority",
        call.name,
    )


# -- monotonic fencing: a second round ------------------------------------------------


def commit_call(call: Call, reply: Any) -> Call | None:
    """The second round of monotonic fencing after an acquire answered *reply*: make
    the fresh grant's token (the largest counter of the majority that granted it)
    every master's floor. None when there is nothing to commit (no fresh grant: a
    re-entry keeps its token). Any two majorities share a master, and that master's
    counter already holds the previous holder's committed token, so each new token
    is larger than every earlier one, whatever the clocks do."""
    if not isinstance(reply, int) or reply <= 0:
        return None
    owner, nonce = call.args[0], call.args[1]
    return Call(rl_commit_script, call.keys, (owner, nonce, reply), "commit the token", call.name)


def decide_commit(
    reply: Any, replies: Sequence[Reply], backoff: Callable[[int, int], int] = random.randint
) -> AcquireOutcome:
    """The acquire's answer once its commit round came back: the grant when a majority
    committed, else undo and ask again soon."""
    committed = sum(1 for r in answered(replies) if int(r) == 1)
    if committed >= quorum(len(replies)):
        return AcquireOutcome(reply, False)
    return AcquireOutcome(-2 - backoff(*SPLIT_BACKOFF_MS), True)
