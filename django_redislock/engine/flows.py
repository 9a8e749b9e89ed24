"""The lock operations as flows: every decision written once, with no I/O.

A flow is a generator that *yields effects* (run this script, wait for a
hand-off, ...) and receives their outcomes; :mod:`.driver` runs it, once
blocking (``run_sync``) and once on asyncio (``run_async``). An I/O outcome
that leaves a script's effect unknown is thrown into the flow as
:class:`~.calls.AmbiguousReply`.

Effects and what the driver sends back:

* :class:`Run` -- the script's raw reply;
* :data:`HUB_READY` -- ``(subscribed, channel)`` of this driver's wake-up hub;
* :class:`Listen` -- registers the wait for hand-offs (the driver forgets it
  when the flow ends, however it ends); whether the hub is subscribed now;
* :data:`SUBSCRIBE` -- None once the hub's subscription is confirmed;
* :class:`Park` -- the fencing token handed to the wait, or None (time is up,
  or the hub asks every waiter to look again after a reconnect).

A call that asked for replica acknowledgements (``Call.replicas``) and got too
few is thrown into the flow as :class:`~.calls.NotReplicated`: the acquire flow
gives an unconfirmed grant back and tries again while its time allows.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any, NamedTuple

from ..exceptions import LockBackendError, LockNotReplicated
from .calls import AmbiguousReply, Attempt, Call, NotReplicated, decode_attempt
from .deadlock import DeadlockWatch
from .lua.common import HANDOFF_CLAIM_MS
from .mutex import FAIR, Kind

#: Upper bound of one wait between fallback polls (seconds).
POLL_SLICE = 1.0


def _jitter() -> float:
    return random.uniform(0.75, 1.0)


#: Run one script: the effect is the :class:`~.calls.Call` itself (no wrapper to build
#: on the hot path); ``effect.call`` is the call.
Run = Call


class Listen(NamedTuple):
    """Register the wait *nonce* with the wake-up hub."""

    nonce: str


class Park(NamedTuple):
    """Wait up to *seconds* for a hand-off to the wait *nonce*."""

    nonce: str
    seconds: float


class _HubReady:
    __slots__ = ()


class _Subscribe:
    __slots__ = ()


HUB_READY = _HubReady()
SUBSCRIBE = _Subscribe()

Effect = Call | Listen | Park | _HubReady | _Subscribe
Flow = Generator[Effect, Any, Any]


#: How many times a call is sent when its reply is lost: the nonce makes a repeat
#: harmless, and the repeat tells what the first one did.
SENDS = 2


def give_up(call: Call, exc: AmbiguousReply) -> LockBackendError:
    """The error once no reply of *call* came back after :data:`SENDS` sends."""
    error = LockBackendError(
        f"Redis error while trying to {call.action}: {exc.cause}", name=call.name
    )
    error.__cause__ = exc.cause
    return error


def run(call: Call) -> Generator[Effect, Any, Any]:
    """Run *call*; when the reply is lost, ask again (the nonce makes that safe)."""
    for sent in range(1, SENDS + 1):
        try:
            return (yield call)
        except AmbiguousReply as exc:
            if sent == SENDS:
                raise give_up(call, exc) from exc.cause
    raise AssertionError("unreachable")  # pragma: no cover


class AcquireOp:
    """One acquire: what its calls carry, and the caller's waiting policy."""

    __slots__ = (
        "keys", "owner", "nonce", "ttl_arg", "meta", "retention_arg", "name", "known",
        "blocking", "timeout", "claim_inline", "on_contended", "clock", "jitter", "replicas",
        "deadline", "kind", "deadlock", "asked",
    )  # fmt: skip

    def __init__(
        self,
        keys: Sequence[bytes],
        owner: str,
        nonce: str,
        ttl_arg: bytes,
        meta: bytes,
        retention_arg: bytes,
        name: str,
        *,
        known: bytes = b"",
        blocking: bool,
        timeout: float | None,
        claim_inline: bool = False,
        on_contended: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = _jitter,
        replicas: int = 0,
        kind: Kind = FAIR,
        deadlock: DeadlockWatch | None = None,
    ) -> None:
        #: The keys of the hold's *kind* (``kind.keys``).
        self.keys = keys
        self.owner = owner
        #: Identifies this acquire (and its wait) across retries.
        self.nonce = nonce
        self.ttl_arg = ttl_arg
        self.meta = meta
        self.retention_arg = retention_arg
        self.name = name
        #: How many holds the caller knows its owner has (b"": not known).
        self.known = known
        self.blocking = blocking
        #: Seconds to wait (None: no limit); only with *blocking*.
        self.timeout = timeout
        #: Claim a hand-off before returning (else the caller's renewal claims it).
        self.claim_inline = claim_inline
        #: Told the holder's remaining lease (ms, -1 without expiry) when the lock is held.
        self.on_contended = on_contended
        self.clock = clock
        self.jitter = jitter
        #: Replicas that must acknowledge a grant before it counts (0: none). A
        #: hand-off is then always claimed before returning: the claim is the new
        #: holder's own write, and its acknowledgement covers the grant before it.
        self.replicas = replicas
        if replicas:
            self.claim_inline = True
        #: When a blocking acquire gives up (set by the flow; None: no limit). Its
        #: acquire calls carry it, so backend retries stop there too.
        self.deadline: float | None = None
        #: What is acquired: a mutex (fair or barging) or a semaphore's or read-write
        #: lock's hold; it makes the calls.
        self.kind = kind
        #: Looks for a wait-for cycle once the wait is long enough (None: never).
        self.deadlock = deadlock
        #: When a blocking acquire's first call was sent (set by :func:`first_call`;
        #: 0.0: not yet): a hand-off to this wait is younger than that call.
        self.asked = 0.0

    def call(self, channel: bytes) -> Call:
        """The acquire script call; *channel* b"" means "do not queue when held"."""
        wait_left = b""
        if channel and self.deadline is not None:  # shown to operators while queued
            wait_left = str(max(0, int((self.deadline - self.clock()) * 1000))).encode()
        args = (
            self.owner, self.nonce, self.ttl_arg, self.meta, wait_left,
            self.retention_arg, channel, self.known,
        )  # fmt: skip
        return self.kind.acquire_call(self.keys, args, self.name, self.replicas, self.deadline)

    def decode(self, reply: Any) -> Attempt:
        """An acquire or cancel reply as an :class:`Attempt`; a refusal (the name is
        another primitive's, another limit, an upgrade) raises its LockError."""
        if isinstance(reply, (bytes, str)):
            raise self.kind.refusal(reply, self.name)
        return decode_attempt(reply)

    def claim_call(self) -> Call:
        """The call that takes a handed-off lock for its whole lease (with ``replicas``,
        a write that replicas acknowledge)."""
        ttl = int(self.ttl_arg)
        return self.kind.renew_call(
            self.keys, self.owner, ttl, self.name, self.replicas, claim=True
        )

    def undo_call(self) -> Call:
        """The call that gives back one hold this acquire got (a grant replicas did not
        confirm); the acquire's nonce makes a repeat count once."""
        return self.kind.release_call(
            self.keys, self.owner, self.nonce, self.retention_arg, False, self.name,
            "give back an unreplicated lock",
        )  # fmt: skip

    def retry_hint_ms(self) -> int:
        """How long to wait before asking again after a grant replicas did not confirm."""
        return int(UNREPLICATED_RETRY_MS * self.jitter())

    def cancel_call(self) -> Call:
        """The call that ends this acquire's wait (or finds it was granted meanwhile)."""
        return self.kind.cancel_call(
            self.keys, self.owner, self.nonce, self.retention_arg, self.name
        )


#: About how long an acquire waits to try again after its grant was not
#: replicated (ms; jittered), while its timeout allows.
UNREPLICATED_RETRY_MS = 200


def not_replicated(op: AcquireOp, exc: NotReplicated) -> LockNotReplicated:
    """The error of an acquire whose grant replicas did not confirm in time."""
    error = LockNotReplicated(
        f"could not acquire lock {op.name!r}: only {exc.acks} of the {exc.required} "
        "replicas it waits for (wait_replicas) acknowledged the grant in time, so it "
        "was given back; check the replicas (INFO replication) or lower wait_replicas",
        name=op.name,
        acks=exc.acks,
        required=exc.required,
    )
    return error


def _decode_claim(reply: Any) -> Attempt:
    """A CLAIM reply as an attempt: held when claimed (the fence is not part of it)."""
    return Attempt(int(reply) == 1, 0, 1)


def _ask(
    op: AcquireOp, call: Call, decode: Callable[[Any], Attempt] | None = None
) -> Generator[Effect, Any, tuple[Attempt, NotReplicated | None]]:
    """Run an acquire (or, with *decode*, a claim) *call*; a grant replicas did not
    confirm is given back and reported as "held" for a short, jittered while, with
    the failure.

    A re-entry is kept even when unconfirmed: its owner's first hold was confirmed,
    and giving one hold back would let the retry's repeated nonce answer for a hold
    that is no longer there."""
    if decode is None:
        decode = op.decode
    try:
        return decode((yield from run(call))), None
    except NotReplicated as exc:
        attempt = decode(exc.reply)
        if not attempt.held or attempt.holds > 1:
            return attempt, None  # nothing new was granted: the acknowledgement does not matter
        yield from run(op.undo_call())
        return Attempt(False, op.retry_hint_ms(), 0), exc


def next_pause(pttl_ms: int, deadline: float | None, now: float, jitter: float) -> float | None:
    """How long a queued waiter sleeps before asking again; None once its deadline passed.

    A bounded, jittered fallback poll (the hand-off normally wakes it first),
    never past the holder's lease (a crashed holder frees the lock then), never
    past the caller's deadline.
    """
    pause = POLL_SLICE * jitter
    if pttl_ms >= 0:
        pause = min(pause, pttl_ms / 1000.0 + 0.001)
    if deadline is not None:
        if now >= deadline:
            return None
        pause = min(pause, deadline - now)
    return pause


#: The outcome of an acquire's first call made outside the flow (see
#: :func:`.driver.acquire_sync`): the hub's ``(subscribed, channel)`` as
#: :data:`HUB_READY` answers them (``(False, b"")`` for one attempt), and the attempt.
First = tuple[bool, bytes, Attempt]


def first_call(op: AcquireOp, channel: bytes) -> Call:
    """The first acquire call of *op*, on *channel* (b"": one attempt, never queued);
    a blocking acquire's wait starts here (its deadline)."""
    if op.blocking:
        now = op.asked = op.clock()
        op.deadline = None if op.timeout is None else now + op.timeout
    return op.call(channel)


def acquire(op: AcquireOp, first: First | None = None) -> Generator[Effect, Any, Attempt]:
    """Acquire, waiting in the FIFO queue for a hand-off when *op* blocks.

    *first*: the outcome of the first call when the caller made it already (a
    driver's shortcut for the common case, a lock granted at once: no flow at all).
    """
    if first is None:
        ready, channel = (yield HUB_READY) if op.blocking else (False, b"")
        attempt, failed = yield from _ask(op, first_call(op, channel))
    else:
        (ready, channel, attempt), failed = first, None
    if attempt.held:
        return attempt
    if op.on_contended is not None and failed is None:
        op.on_contended(attempt.value)
    if not op.blocking:
        if failed is not None:
            raise not_replicated(op, failed)
        return attempt
    deadline = op.deadline
    # Queued. A hand-off published from now on reaches the hub, which keeps it
    # for this wait even if it arrives before the registration.
    subscribed = yield Listen(op.nonce)
    # When the last call that found the lock not ours was sent: a hand-off to this
    # wait is younger than that (a call that finds the lock ours already, handed to
    # this wait before the wake-up was read, does not move it).
    heard = op.asked or op.clock()
    if not (ready and subscribed):
        # The hub was not subscribed when we queued: a hand-off published
        # meanwhile was missed, so ask once more after subscribing (naming the
        # channel as a confirmed subscription's, see wake.queue_channel).
        yield SUBSCRIBE
        ready, channel = yield HUB_READY
        asked = op.clock()
        attempt, failed = yield from _ask(op, op.call(channel))
        if not attempt.held:
            heard = asked
    while True:
        while not attempt.held:
            pause = next_pause(attempt.value, deadline, op.clock(), op.jitter())
            if pause is None:
                # Leave the queue -- or learn that the lock was handed to us meanwhile.
                attempt = op.decode((yield from run(op.cancel_call())))
                if not attempt.held:
                    if failed is not None:
                        raise not_replicated(op, failed)
                    return attempt
                break
            watch = op.deadlock
            if watch is not None:
                if watch.due(op.clock()) and (yield from watch.refused(run, op.clock())):
                    # The youngest wait of a cycle: leave the queue (or find the lock was
                    # handed to us meanwhile: then there is no deadlock left).
                    attempt = op.decode((yield from run(op.cancel_call())))
                    if attempt.held:
                        break
                    raise watch.error()
                pause = watch.bounded(pause, op.clock())
            fence = yield Park(op.nonce, pause)
            if fence is not None:
                attempt = Attempt(True, fence, 1)
            elif deadline is None or op.clock() < deadline:
                asked = op.clock()
                attempt, failed = yield from _ask(op, op.call(channel))
                if not attempt.held:
                    heard = asked
            # else: time is up -- straight to the cancel, which also finds a hand-off
        # Granted after queueing: a hand-off, leased for the claim window only. Claim
        # it now if asked to, or if it may be older than half the window: the last
        # call that found the lock not ours was sent that long ago (the waiter was
        # paused, or starved of the GIL among many threads, or subscribing took
        # long: the window may have run out and the lock moved on).
        if not (op.claim_inline or op.clock() - heard > _STALE):
            return attempt._replace(handed=True)
        claimed, failed = yield from _ask(op, op.claim_call(), _decode_claim)
        if claimed.held:
            return attempt._replace(handed=True)
        if failed is None:
            # The claim window ran out before we claimed it: queue again.
            asked = op.clock()
            attempt, failed = yield from _ask(op, op.call(channel))
            if not attempt.held:
                heard = asked
        else:
            attempt = claimed


#: A waiter not heard from by Redis for this long (s) claims a hand-off before returning.
_STALE = HANDOFF_CLAIM_MS / 2000


def cancel(op: AcquireOp) -> Generator[Effect, Any, Attempt]:
    """Resolve an acquire abandoned mid-flight: leave the queue, or find it was granted."""
    return op.decode((yield from run(op.cancel_call())))


def call_once(call: Call) -> Generator[Effect, Any, Any]:
    """A flow of one idempotent call (release, extend, operator actions)."""
    return (yield from run(call))
