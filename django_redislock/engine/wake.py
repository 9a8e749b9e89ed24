"""The hand-off message and the buffer of early grants, shared by both wake-up hubs (pure).

A release that hands the lock to a waiter publishes ``"<nonce> <fence>"`` on
the waiter's hub channel; ``"<nonce>"`` alone only pokes the waiter (the lock
was freed without a hand-off: look again, as backends without a queue do).
A grant or a poke can arrive before its waiter has registered (the waiter
queued, and the release came first): the hub keeps it briefly.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from .lua.common import WAKE_SURE

#: Hand-offs kept for waiters that have not registered yet (oldest dropped).
EARLY_GRANTS_KEPT = 256
#: What :class:`EarlyGrants` keeps for a poke (fencing tokens are never 0).
POKED = 0


def parse_grant(data: bytes | str) -> tuple[str, int | None]:
    """Split a hand-off message into (nonce of the wait, fencing token or None for a poke)."""
    text = data.decode() if isinstance(data, bytes) else data
    nonce, _, fence = text.partition(" ")
    return nonce, int(fence) if fence else None


#: A repeated release's answer to one sent with its hub's channel (see
#: :func:`release_outcome`).
POKE_ALL = ("*", b"*")


class LocalWakeups(Protocol):
    """What a release delivers a wake-up to in its own process (an asyncio hub)."""

    def deliver(self, data: bytes | str) -> None:
        """Pass a wake-up message to the waiter it is for."""

    def poke_all(self) -> None:
        """Wake every waiter to ask Redis again."""


def release_outcome(reply: Any, hub: Callable[[], LocalWakeups]) -> int:
    """A release's reply as the holds left (0: released; -1: not owned).

    A release sent with its hub's channel gets, when it handed the lock to a waiter
    of that hub (or poked one), the wake-up message instead of 0 (a semaphore's or
    read-write lock's, a list of them: one per place handed on): it is delivered
    here (*hub* gives the hub), and was not published. A repeat of such a release
    (its first reply lost, or abandoned by a cancellation) may have lost that
    message: it answers ``*``, and every waiter of the hub asks Redis again.
    """
    if type(reply) is int:
        return reply
    if isinstance(reply, (bytes, str)):
        if reply in POKE_ALL:
            hub().poke_all()
        else:
            hub().deliver(reply)
        return 0
    if isinstance(reply, list):  # a semaphore's or read-write lock's places
        for message in reply:
            hub().deliver(message)
        return 0
    return int(reply)


class EarlyGrants:
    """Grants (and pokes) for waits not registered yet, bounded (not thread-safe:
    callers lock)."""

    def __init__(self, kept: int = EARLY_GRANTS_KEPT) -> None:
        self._kept = max(1, kept)
        self._grants: OrderedDict[str, int] = OrderedDict()

    def put(self, nonce: str, fence: int | None) -> None:
        """Keep *fence* (None: a poke) for the wait *nonce*, dropping the oldest past
        the bound; a poke never replaces a grant."""
        if fence is None:
            if nonce in self._grants:
                return
            fence = POKED
        self._grants.pop(nonce, None)
        if len(self._grants) >= self._kept:
            self._grants.popitem(last=False)
        self._grants[nonce] = fence

    def take(self, nonce: str) -> int | None:
        """The grant (or :data:`POKED`) kept for *nonce*, if any (removed)."""
        return self._grants.pop(nonce, None)


class Signal(Protocol):
    """What a waiter's event must do (``threading.Event`` or ``asyncio.Event``)."""

    def set(self) -> None:
        """Wake whoever waits on it."""


class WaitSlot:
    """One wait's mailbox, shared by both hubs: a hand-off's fence, or a poke."""

    __slots__ = ("event", "fence", "poked")

    def __init__(self, event: Signal) -> None:
        self.event = event
        self.fence: int | None = None
        #: Asked to look at the lock again (hand-offs may have been missed).
        self.poked = False

    def deliver(self, fence: int) -> None:
        """Record the hand-off and wake the waiter."""
        self.fence = fence
        self.event.set()

    def receive(self, early: int) -> None:
        """Deliver what :meth:`EarlyGrants.take` kept: a grant, or a poke."""
        if early == POKED:
            self.poke()
        else:
            self.deliver(early)

    def poke(self) -> None:
        """Wake the waiter so that it asks Redis again."""
        self.poked = True
        self.event.set()


def queue_channel(channel_arg: bytes, on_script_server: bool) -> bytes:
    """The channel a hub's waiters name in their queue entries once its subscription
    is confirmed: marked with :data:`~.scripts.WAKE_SURE` where the hub subscribes on
    the server that runs the scripts, so that a hand-off finds a dead waiter's
    process by its wake-up reaching nobody (see ``handoff`` in :mod:`.scripts`)."""
    return WAKE_SURE + channel_arg if on_script_server else channel_arg
