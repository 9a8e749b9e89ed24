"""Several locks taken, or released, in one round trip: the common case of ``lock_many``.

A :class:`~.lock_set.LockSet` takes its locks in the global order, one at a time,
each waiting as long as the set's timeout allows. Where the backend runs several calls
in one round trip (one Redis, Sentinel included; a Redis Cluster: one per node), the
set first sends one attempt for every lock at once, none of which queues:

* every lock granted: that was the whole acquire (two round trips for the set's
  ``with`` block, whatever its size, where one by one it took two per lock);
* otherwise the locks granted before the first refused one are kept (a prefix of the
  order), those granted after it are given back at once (held out of order while the
  set waits, they could deadlock with another set that holds the refused lock and
  waits for them), and the set waits for the refused one; once it holds it, the locks
  after it get one attempt each at once again, and so on.

A fair lock with waiters refuses the attempt as it refuses any acquire (no barging),
so the set then queues for it in order like everybody else. Releasing the set goes in
one round trip too, newest first.

Locks with ``wait_replicas``, and Redlock, go one lock at a time. Every decision is the
Lock's own: its acquire op, reply decoding and bookkeeping (``_acquire_op``,
``AcquireOp.decode``, ``_settle_acquire``) and its release's (``_release_call``,
``_release_unconfirmed``, ``_settle_release``, ``_end_block``); this module only batches
their calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..engine import flows
from ..engine.driver import call_async, call_many_async, call_many_sync, call_sync
from ..engine.holds import Hold
from ..engine.identity import new_nonce
from ..exceptions import LockBackendError, LockNotOwned
from .event_loop import finish_in_background
from .refusals import UNREAD

if TYPE_CHECKING:
    from ..engine.backends.base import AsyncBackend, Backend, BatchingAsyncBackend
    from ..engine.calls import Attempt, Call, Prior
    from .lock import Lock


def batch_backend(locks: Sequence[Lock], least: int = 2) -> Backend | None:
    """The blocking backend that can take *locks* in one round trip, or None (one lock
    at a time): at least *least* locks, of one source, none waiting for replicas, not
    on Redlock (whose grants each need a majority)."""
    if not _batchable(locks, least):
        return None
    backend = locks[0]._source.backend()
    return None if backend.features.quorum else backend


def abatch_backend(locks: Sequence[Lock], least: int = 2) -> BatchingAsyncBackend | None:
    """:func:`batch_backend` for asyncio (only backends with ``run_many``)."""
    if not _batchable(locks, least):
        return None
    backend: Any = locks[0]._source.abackend()
    if backend.features.quorum or not hasattr(backend, "run_many"):
        return None
    return backend  # type: ignore[no-any-return]


def _batchable(locks: Sequence[Lock], least: int) -> bool:
    if len(locks) < least:
        return False
    source = locks[0]._source
    return all(lock._source is source and not lock.wait_replicas for lock in locks)


# -- acquire ----------------------------------------------------------------------------


class LockAttempt(NamedTuple):
    """One lock's attempt in a batch: its acquire op (one attempt, never queued)."""

    lock: Lock
    op: flows.AcquireOp
    made_up: bool


class Taken(NamedTuple):
    """What a batch of attempts got, in the set's order (every lock granted went to the
    caller's list as it was settled: those before the first lock not granted are kept)."""

    #: Granted after the first lock that was not (the last ones of the caller's list):
    #: the set gives these back before it waits.
    surplus: list[Lock]
    #: The index of the first lock not granted (None: all were).
    missed: int | None
    #: The first refusal or failure (a name of another primitive, a Redis error): the
    #: set gives back everything and raises it.
    error: Exception | None
    #: The attempt at the first lock not granted, and what Redis answered (None when
    #: all were granted, or a failure came first).
    refused: tuple[LockAttempt, Attempt] | None


#: More calls for an attempts' round trip, made from the attempts (see :func:`take_sync`).
Also = Callable[[Sequence["LockAttempt"]], Sequence["Call"]]


def attempts(
    locks: Sequence[Lock], backend: Any, also: Also | None = None
) -> tuple[list[LockAttempt], list[Call]]:
    """One attempt per lock of *locks* (the caller's owner of each), and the batch's
    calls: theirs, then *also*'s."""
    made: list[LockAttempt] = []
    for lock in locks:
        owner, made_up = lock._caller()
        op = lock._acquire_op(backend, owner, made_up, False, None)
        made.append(LockAttempt(lock, op, made_up))
    calls = [flows.first_call(a.op, b"") for a in made]
    return made, calls if also is None else [*calls, *also(made)]


def settle(
    made: Sequence[LockAttempt],
    replies: Sequence[Any],
    started: float,
    backend: Backend | None,
    taken: list[Lock],
) -> tuple[Taken, list[Any]]:
    """Record each granted attempt as its Lock records an acquire (hold table, watchdog,
    signal), in order, adding its Lock to *taken* first: whatever is raised meanwhile (a
    signal receiver's error), the caller gives back every lock granted;
    *backend*: the blocking one (None on asyncio). Returns what the attempts got, and
    the replies of the batch's other calls."""
    surplus: list[Lock] = []
    missed: int | None = None
    error: Exception | None = None
    refused: tuple[LockAttempt, Attempt] | None = None
    for index, (attempt, reply) in enumerate(zip(made, replies[: len(made)], strict=True)):
        try:
            if isinstance(reply, Exception):  # this call failed (a LockBackendError)
                if isinstance(reply, LockBackendError):
                    attempt.lock._backend_error(attempt.op.owner, "acquire", reply)
                raise reply
            outcome = attempt.op.decode(reply)
        except Exception as exc:  # this lock's refusal or failure
            error = error or exc
            missed = index if missed is None else missed
            continue
        if not outcome.held:
            if missed is None:
                missed, refused = index, (attempt, outcome)
            continue
        taken.append(attempt.lock)
        if missed is not None:
            surplus.append(attempt.lock)
        try:
            attempt.lock._settle_acquire(attempt.op, attempt.made_up, outcome, started, backend)
        except Exception as exc:  # a receiver's: the set gives everything back, raising it
            error = error or exc
    return Taken(surplus, missed, error, refused), list(replies[len(made) :])


def tell_refused(got: Taken, started: float, backend: Backend | None) -> None:
    """For a set that does not wait, its attempt at the lock it missed was that lock's
    one attempt: tell ``lock_contended`` and ``lock_not_acquired`` receivers about it as
    a one-attempt acquire does (a set that waits tells them when it waits)."""
    if got.error is not None or got.refused is None:
        return
    attempt, outcome = got.refused
    if attempt.op.on_contended is not None:
        attempt.op.on_contended(outcome.value)
    attempt.lock._settle_acquire(attempt.op, attempt.made_up, outcome, started, backend)


def failed_batch(made: Sequence[LockAttempt], error: LockBackendError) -> None:
    """Tell each lock's ``lock_backend_error`` receivers that the batch failed."""
    for attempt in made:
        attempt.lock._backend_error(attempt.op.owner, "acquire", error)


def take_sync(
    locks: Sequence[Lock],
    backend: Backend,
    started: float,
    taken: list[Lock],
    also: Also | None = None,
) -> tuple[Taken, list[Any]]:
    """One attempt at every lock of *locks*, in one round trip; those granted go to
    *taken* (see :func:`settle`). *also*: more calls for the same round trip, made from
    the attempts (they run after them); their replies come second."""
    made, calls = attempts(locks, backend, also)
    try:
        replies = call_many_sync(calls, backend)
    except LockBackendError as error:
        failed_batch(made, error)
        raise
    return settle(made, replies, started, backend, taken)


async def take_async(
    locks: Sequence[Lock],
    backend: BatchingAsyncBackend,
    started: float,
    taken: list[Lock],
    also: Also | None = None,
) -> tuple[Taken, list[Any]]:
    """:func:`take_sync` for asyncio. Cancelled in flight, it finds out in the background
    which attempts were granted and gives those back (each Lock's own undo)."""
    made, calls = attempts(locks, backend, also)
    try:
        replies = await call_many_async(calls, backend)
    except asyncio.CancelledError:
        await finish_in_background(_undo_all(made, backend))
        raise
    except LockBackendError as error:
        failed_batch(made, error)
        raise
    return settle(made, replies, started, None, taken)


async def _undo_all(made: Sequence[LockAttempt], backend: BatchingAsyncBackend) -> None:
    for attempt in made:
        await attempt.lock._undo_acquire(attempt.op, attempt.op.owner, backend)


# -- release ----------------------------------------------------------------------------


class Release(NamedTuple):
    """One lock's release in a batch: the caller's owner, its local hold (for the end of
    a ``with`` block), and the call."""

    lock: Lock
    owner: str
    made_up: bool
    hold: Hold | None
    call: Call


def releases(locks: Sequence[Lock], backend: Any) -> list[Release]:
    """One release of one hold per lock of *locks* (in the order given)."""
    made = []
    for lock in locks:
        owner, made_up = lock._caller()
        hold = lock._holds.get(owner)
        nonce = lock._holds.release_nonce(owner, False, new_nonce)
        call = lock._release_call(backend, owner, nonce, False)
        made.append(Release(lock, owner, made_up, hold, call))
    return made


def released(release: Release, reply: Any, holder: Any) -> None:
    """What Redis's *reply* to *release* means, as :meth:`Lock.release` reads it (raises
    its LockBackendError or LockNotOwned); *holder*: the lock's snapshot after a refusal."""
    lock = release.lock
    if isinstance(reply, Exception):  # this call failed (a LockBackendError)
        if isinstance(reply, LockBackendError):
            lock._release_unconfirmed(release.owner, release.made_up, False, reply)
        raise reply
    lock._settle_release(release.owner, release.made_up, False, int(reply), holder)


def refused(reply: Any) -> bool:
    """Whether a release's *reply* says the caller did not hold the lock (the lock is
    then read, for the error)."""
    return not isinstance(reply, Exception) and int(reply) < 0


def ended(exc_type: type[BaseException] | None, release: Release, reply: Any, holder: Any) -> None:
    """The end of *release*'s ``with`` block (leaving it with *exc_type*), as
    ``Lock.__exit__`` ends it (``partial(ended, exc_type)`` is a release step)."""
    try:
        released(release, reply, holder)
    except (LockBackendError, LockNotOwned) as error:
        release.lock._end_block(release.owner, release.hold, exc_type, error)
    else:
        release.lock._end_block(release.owner, release.hold, exc_type, None)


Step = Callable[[Release, Any, Any], None]


def release_sync(locks: Sequence[Lock], backend: Backend, step: Step) -> list[Exception | None]:
    """Release one hold of each of *locks* in one round trip; what *step* (``released``,
    or ``ended`` with the block's exception type) raised for each, or None."""
    made = releases(locks, backend)
    try:
        replies: list[Any] = call_many_sync([r.call for r in made], backend)
    except LockBackendError as error:
        replies = [error] * len(made)
    outcomes: list[Exception | None] = []
    for release, reply in zip(made, replies, strict=True):
        holder = release.lock._peek() if refused(reply) else UNREAD
        outcomes.append(_outcome(step, release, reply, holder))
    return outcomes


async def release_async(
    locks: Sequence[Lock], backend: BatchingAsyncBackend, step: Step
) -> list[Exception | None]:
    """:func:`release_sync` for asyncio. Cancelled in flight, the releases are finished in
    the background with the same nonces (so none counts twice), as ``arelease`` does."""
    made = releases(locks, backend)
    calls = [r.call for r in made]
    try:
        replies: list[Any] = await call_many_async(calls, backend)
    except asyncio.CancelledError:
        await finish_in_background(_finish_releases(made, calls, backend))
        raise
    except LockBackendError as error:
        replies = [error] * len(made)
    outcomes: list[Exception | None] = []
    for release, reply in zip(made, replies, strict=True):
        holder = await release.lock._apeek() if refused(reply) else UNREAD
        outcomes.append(_outcome(step, release, reply, holder))
    return outcomes


async def _finish_releases(
    made: Sequence[Release], calls: Sequence[Call], backend: BatchingAsyncBackend
) -> None:
    replies = await call_many_async(calls, backend)
    outcomes = [
        _outcome(released, release, reply, UNREAD)
        for release, reply in zip(made, replies, strict=True)
    ]
    failed = [e for e in outcomes if e is not None and not isinstance(e, LockNotOwned)]
    if failed:
        raise failed[0]  # (logged by finish_in_background)


def _outcome(step: Step, release: Release, reply: Any, holder: Any) -> Exception | None:
    try:
        step(release, reply, holder)
    except Exception as error:
        return error
    return None


# -- a call before a release -------------------------------------------------------------


def run_prior_sync(prior: Prior, backend: Backend) -> None:
    """Send *prior* in a round trip of its own and tell it how that went."""
    try:
        reply = call_sync(prior.call, backend)
    except LockBackendError as error:
        reply = error
    prior.settle(reply)


async def run_prior_async(prior: Prior, backend: AsyncBackend) -> None:
    """:func:`run_prior_sync` for asyncio."""
    try:
        reply = await call_async(prior.call, backend)
    except LockBackendError as error:
        reply = error
    prior.settle(reply)


def after_prior_sync(prior: Prior, call: Call, lock: Lock, backend: Backend) -> Any:
    """*call* (a release of *lock*) sent right after *prior*, in the same round trip
    where the backend batches (else *prior* goes first, alone): *call*'s reply, or its
    LockBackendError raised; *prior* is told its own outcome first. *prior* goes with
    its source (``Call.inline``): a batch sent again after a NOSCRIPT runs it first
    again, never after *call* only."""
    batching = batch_backend([lock], least=1)
    if batching is None:
        run_prior_sync(prior, backend)
        return call_sync(call, backend)
    try:
        first, reply = call_many_sync(_prior_first(prior, call), batching)
    except LockBackendError as error:
        first = reply = error
    return _settled(prior, first, reply)


async def after_prior_async(prior: Prior, call: Call, lock: Lock, backend: AsyncBackend) -> Any:
    """:func:`after_prior_sync` for asyncio."""
    batching = abatch_backend([lock], least=1)
    if batching is None:
        await run_prior_async(prior, backend)
        return await call_async(call, backend)
    try:
        first, reply = await call_many_async(_prior_first(prior, call), batching)
    except LockBackendError as error:
        first = reply = error
    return _settled(prior, first, reply)


def _prior_first(prior: Prior, call: Call) -> list[Call]:
    return [prior.call._replace(inline=True), call]


def _settled(prior: Prior, first: Any, reply: Any) -> Any:
    """*prior* told its outcome (*first*); the call after it's *reply*, or its error raised."""
    prior.settle(first)
    if isinstance(reply, Exception):
        raise reply
    return reply
