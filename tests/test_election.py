"""Leader election (``locks.election``) in one process: terms, standbys, resign, deposition,
the observer fallback, asyncio, and the misuses, on a real redis-server.

The multi-process proofs (SIGKILL, SIGSTOP past the lease, a partition) are in
tests/test_runner.py, through the command runner.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_redislock import LockManager, LockNotAcquired
from django_redislock.election import ElectionError, LeadershipLost
from django_redislock.election import signals as election_signals
from django_redislock.engine.identity import HOSTNAME


@pytest.fixture
def manager() -> LockManager:
    return LockManager("default")


class Recorder:
    """Collects one election signal's sends for the election *name* (from any thread:
    another test's leftovers are not counted) and lets a test await them."""

    def __init__(self, signal: Any, name: str) -> None:
        self.signal, self.name = signal, name
        self.sent: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        signal.connect(self._receive, weak=False)

    def _receive(self, sender: object, **kwargs: Any) -> None:
        if kwargs.get("name") != self.name:
            return
        with self._cond:
            self.sent.append(kwargs)
            self._cond.notify_all()

    def wait(self, count: int, timeout: float) -> list[dict[str, Any]]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.sent) >= count, timeout), (
                f"{len(self.sent)} of {count} sends within {timeout} s"
            )
            return list(self.sent)

    def close(self) -> None:
        self.signal.disconnect(self._receive)


@pytest.fixture
def recorders(name: str) -> Iterator[dict[str, Recorder]]:
    made = {
        "elected": Recorder(election_signals.elected, name),
        "deposed": Recorder(election_signals.deposed, name),
        "changed": Recorder(election_signals.leader_changed, name),
    }
    yield made
    for recorder in made.values():
        recorder.close()


def test_campaign_makes_a_leader_everyone_can_see(manager: LockManager, name: str) -> None:
    election = manager.election(name, ttl=5, purpose="beat")
    observer = manager.election(name)
    assert observer.leader() is None
    term = election.campaign(timeout=2)
    assert election.term == term and election.is_leader
    leader = observer.leader()
    assert leader is not None
    assert (leader.term, leader.host, leader.pid, leader.purpose) == (
        term,
        HOSTNAME,
        os.getpid(),
        "beat",
    )
    assert leader.since is not None and leader.ttl is not None and 0 < leader.ttl <= 5
    assert observer.is_current(term) and election.is_current()
    assert not observer.is_current(term - 1)
    assert not observer.is_current()  # it leads nothing: no term of its own
    assert election.resign() is True
    assert election.term is None and not election.is_current(term)
    assert observer.leader() is None
    assert election.resign() is False  # nothing left to resign


def test_a_standby_is_handed_the_leadership_by_the_resign(
    manager: LockManager, name: str, recorders: dict[str, Recorder]
) -> None:
    first, second = manager.election(name, ttl=5), manager.election(name, ttl=5)
    term1 = first.campaign(timeout=2)
    got: list[int] = []
    standby = threading.Thread(target=lambda: got.append(second.campaign(timeout=10)))
    standby.start()
    deadline = time.monotonic() + 5
    while True:  # bounded: the standby shows in the queue once it waits
        leader = first.leader()
        assert leader is not None
        if leader.standbys:
            break
        assert time.monotonic() < deadline, "the standby never queued"
        time.sleep(0.02)
    assert leader.standbys[0].pid == os.getpid()
    assert not got
    started = time.monotonic()
    first.resign()
    standby.join(5)
    assert got and got[0] > term1, "terms increase strictly from leader to leader"
    assert time.monotonic() - started < 1.0, "the hand-off woke the standby, not a poll"
    assert not first.is_current(term1) and second.is_current(got[0])
    assert [s["term"] for s in recorders["elected"].wait(2, 2)] == [term1, got[0]]
    changes = [(s["term"], s["previous"]) for s in recorders["changed"].wait(3, 2)]
    # (Two threads send these: the resign's and the new leader's may come in either order.)
    assert changes[0] == (term1, None)
    assert sorted(changes[1:], key=str) == sorted([(None, term1), (got[0], None)], key=str)
    second.resign()


def test_campaign_gives_up_at_its_timeout(manager: LockManager, name: str) -> None:
    leader, other = manager.election(name, ttl=5), manager.election(name, ttl=5)
    leader.campaign()
    started = time.monotonic()
    with pytest.raises(LockNotAcquired, match="not elected within 0.3 s"):
        other.campaign(timeout=0.3)
    assert 0.25 < time.monotonic() - started < 2
    with pytest.raises(LockNotAcquired):
        other.campaign(timeout=0)  # one attempt
    assert not other.is_leader
    leader.resign()
    assert other.campaign(timeout=0) > 0  # the failed campaigns left nothing behind
    other.resign()


def test_misuses_are_refused_with_what_to_do(manager: LockManager, name: str) -> None:
    election = manager.election(name, ttl=5)
    term = election.campaign()
    with pytest.raises(ElectionError, match=r"already leads .*resign\(\) first"):
        election.campaign()
    with pytest.raises(TypeError, match="term must be an int"):
        election.is_current("7")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="term must be an int"):
        election.is_current(True)
    election.resign()
    with pytest.raises(ValueError, match="ttl"):
        manager.election(name, ttl=0)
    with pytest.raises(TypeError, match="purpose"):
        manager.election(name, purpose=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        election.campaign(timeout=-1)
    with pytest.raises(TypeError, match="extra"):
        manager.election(name, extra={"not json": object()})
    assert not election.is_current(term)


def test_a_second_campaign_of_one_candidate_is_refused(manager: LockManager, name: str) -> None:
    holder, candidate = manager.election(name, ttl=5), manager.election(name, ttl=5)
    holder.campaign()
    waiting = threading.Thread(target=lambda: _ignore(LockNotAcquired, candidate.campaign, 5))
    waiting.start()
    deadline = time.monotonic() + 5
    while not (holder.leader() or _none()).standbys:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(ElectionError, match="campaign of this candidate is already running"):
        candidate.campaign(timeout=0)
    holder.resign()
    waiting.join(5)
    assert candidate.is_leader
    candidate.resign()


def _ignore(error: type[BaseException], func: Any, *args: Any) -> None:
    try:
        func(*args)
    except error:
        pass


def _none() -> Any:
    class Empty:
        standbys = ()

    return Empty()


def test_an_operator_release_deposes_the_leader(
    manager: LockManager, name: str, recorders: dict[str, Recorder]
) -> None:
    election = manager.election(name, ttl=1.5)
    with pytest.raises(LeadershipLost, match="was lost while the block ran") as raised:
        with election.leading(timeout=2) as term:
            assert manager.force_release(name)
            # The watchdog's next renewal (every ttl/3) finds the hold gone.
            sent = recorders["deposed"].wait(1, 3)
            assert sent[0]["term"] == term and sent[0]["election"] is election
            assert not election.is_leader and election.term is None
            assert not election.is_current(term)
    assert raised.value.term == term
    assert election.deposed_reason
    changes = [(s["term"], s["previous"]) for s in recorders["changed"].wait(2, 2)]
    assert changes == [(term, None), (None, term)]
    # It may campaign again, and gets a newer term.
    assert election.campaign(timeout=2) > term
    election.resign()


def test_a_resign_that_finds_the_leadership_taken_reports_it(
    manager: LockManager, name: str, recorders: dict[str, Recorder]
) -> None:
    election = manager.election(name, ttl=30)
    term = election.campaign()
    manager.force_release(name)
    usurper = manager.election(name, ttl=30)
    usurper.campaign(timeout=0)
    assert election.resign() is False
    assert recorders["deposed"].wait(1, 1)[0]["term"] == term
    assert usurper.is_current()
    usurper.resign()


def test_an_observer_is_pushed_the_change(manager: LockManager, name: str) -> None:
    election, observer = manager.election(name, ttl=30), manager.election(name)
    assert observer.wait_for_change(None, 0.2) == (False, None)
    timer = threading.Timer(0.3, election.campaign)
    timer.start()
    started = time.monotonic()
    change = observer.wait_for_change(None, 10)
    took = time.monotonic() - started
    assert change.changed and change.leader is not None and change.leader.term == election.term
    assert took < 1.5, f"the new leader's announcement woke the observer ({took:.2f} s)"
    term = change.leader.term
    threading.Timer(0.3, election.resign).start()
    started = time.monotonic()
    change = observer.wait_for_change(term, 10)
    assert change == (True, None)
    # Woken by the resign, not by the 30 s lease running out.
    assert time.monotonic() - started < 1.5


def test_an_observer_wakes_when_a_dead_leaders_lease_runs_out(
    manager: LockManager, name: str
) -> None:
    # A leader that died announces nothing: the lease (1 s, not renewed) runs out.
    dead = manager.lock(name, ttl=1, auto_renew=False, owner="dead-leader")
    assert dead.acquire()
    term = dead.fencing_token
    observer = manager.election(name)
    started = time.monotonic()
    change = observer.wait_for_change(term, 10)
    took = time.monotonic() - started
    assert change == (True, None)
    assert 0.5 < took < 2.5, f"looked again at the lease's end ({took:.2f} s)"


def test_asyncio_twins(manager: LockManager, name: str) -> None:
    async def main() -> None:
        election, other = manager.election(name, ttl=5), manager.election(name, ttl=5)
        async with election.leading(timeout=2) as term:
            assert await election.ais_current(term)
            leader = await other.aleader()
            assert leader is not None and leader.term == term
            with pytest.raises(LockNotAcquired):
                await other.acampaign(timeout=0.2)
            waiting = asyncio.ensure_future(other.await_for_change(term, 5))
        change = await asyncio.wait_for(waiting, 5)
        assert change == (True, None)
        assert not await election.ais_current(term)
        # A cancelled campaign leaves the queue and the candidate free to try again.
        term2 = await election.acampaign()
        task = asyncio.ensure_future(other.acampaign())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await election.aresign()
        assert await other.acampaign(timeout=2) > term2
        assert await other.aresign()

    asyncio.run(main())


def test_elections_refuse_redlock(name: str) -> None:
    from tests.redis_server import RedisServer

    servers = [RedisServer() for _ in range(3)]
    try:
        manager = LockManager(redlock_caches=[s.url for s in servers])
        election = manager.election(name, ttl=5)
        with pytest.raises(ElectionError, match="Redlock"):
            election.campaign()
        with pytest.raises(ElectionError, match="Redlock"):
            election.is_current(5)
    finally:
        for server in servers:
            server.stop()


def test_a_forked_child_does_not_lead(manager: LockManager, name: str) -> None:
    election = manager.election(name, ttl=5)
    election.campaign()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            refused = False
            try:
                election.campaign(timeout=0)
            except ElectionError:
                refused = True
            ok = election.term is None and not election.is_leader and refused
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    assert election.is_current()
    election.resign()


def test_manage_py_redislock_show_lists_leader_and_standbys(
    manager: LockManager, name: str
) -> None:
    from io import StringIO

    from django.core.management import call_command

    leader, standby = manager.election(name, ttl=5, purpose="beat"), manager.election(name, ttl=5)
    term = leader.campaign()
    waiting = threading.Thread(target=lambda: standby.campaign(timeout=10))
    waiting.start()
    try:
        deadline = time.monotonic() + 5
        while not (leader.leader() or _none()).standbys:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the standby never queued"
            time.sleep(0.02)
        out = StringIO()
        call_command("redislock", "show", name, stdout=out)
        text = out.getvalue()
        assert "kind: election" in text and "purpose: beat" in text and f"fence={term}" in text
        standby_line = next(line for line in text.splitlines() if line.startswith("  #1\t"))
        assert standby.term is None and f"/{os.getpid()}/" in standby_line
    finally:
        leader.resign()
        waiting.join(10)
        standby.resign()


def test_a_blocking_campaign_in_an_event_loop_is_refused(manager: LockManager, name: str) -> None:
    from django_redislock.exceptions import BlockingCallInEventLoop

    election = manager.election(name, ttl=5)

    async def main() -> None:
        with pytest.raises(BlockingCallInEventLoop, match="aacquire"):
            election.campaign()

    asyncio.run(main())
    assert election.campaign(timeout=0) > 0  # nothing was left behind by the refusal
    election.resign()
