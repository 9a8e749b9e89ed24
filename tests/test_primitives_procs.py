"""Semaphores, read-write locks and ``fair=False`` mutexes across real processes.

Every child is ``python -m tests.proc_primitives`` (a command-driven agent, see
that module) on the suite's redis-server. The invariants are checked inside
Redis by the agents' enter/leave scripts (atomic, so any two critical sections
that overlap are seen), or from Redis's own view of the holders right after the
operation under test (``locks.get(name).holders``, the queue's length, INFO
commandstats). Times are ``time.monotonic()``, one clock for every process on
Linux. Every wait is bounded.
"""

from __future__ import annotations

import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from django_redislock import locks
from tests.proc_primitives import checker_keys

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

#: The wake-up hub's fallback poll is 0.75-1 s: a grant well under that after a
#: release came from the release's message, not from the poll.
WOKEN_BY_MESSAGE = 0.5


class Child:
    """One agent process; its JSON events are read by a thread into a queue."""

    def __init__(self, *args: str, settings: str = "tests.settings", **env: str) -> None:
        environ = dict(os.environ, DJANGO_SETTINGS_MODULE=settings, PYTHONPATH=str(ROOT), **env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.proc_primitives", *args],
            cwd=ROOT,
            env=environ,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._kept: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._events.put(json.loads(line))
        self._events.put(None)

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def expect(self, ev: str, ident: str | None = None, timeout: float = 30) -> dict[str, Any]:
        """The next event *ev* (of hold/loop *ident*), waiting at most *timeout* s;
        a ``failed`` event of *ident* fails the test."""

        def match(event: dict[str, Any]) -> bool:
            if ident is not None and event.get("id") != ident:
                return False
            assert event["ev"] != "failed", f"child {self.proc.pid}: {event}"
            return bool(event["ev"] == ev)

        for event in self._kept:
            if match(event):
                self._kept.remove(event)
                return event
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {ev!r} event ({ident}) from child within {timeout} s"
            try:
                event = self._events.get(timeout=remaining)
            except queue.Empty:
                continue
            assert event is not None, f"child exited (rc={self.proc.poll()}) before {ev!r}"
            if match(event):
                return event
            self._kept.append(event)

    def pending(self, ev: str, ident: str) -> bool:
        """Whether an event *ev* of *ident* has arrived (without waiting)."""
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                break
            if event is not None:
                self._kept.append(event)
        return any(e["ev"] == ev and e.get("id") == ident for e in self._kept)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def spawn() -> Iterator[Callable[..., list[Child]]]:
    """Start *n* agents at once and wait until each is ready; all are killed after."""
    started: list[Child] = []

    def start(n: int, *args: str, **kwargs: str) -> list[Child]:
        children = [Child(*args, **kwargs) for _ in range(n)]
        started.extend(children)
        for child in children:
            child.expect("ready", timeout=30)
        return children

    yield start
    for child in started:
        child.kill()


@pytest.fixture
def name() -> str:
    return f"prim:{uuid.uuid4().hex[:12]}"


def queue_length(r: redis.Redis, name: str) -> int:
    return int(r.llen(locks.backend().keyspace.keys(name).queue))


def wait_queued(r: redis.Redis, name: str, n: int, timeout: float = 10) -> None:
    """Wait (bounded) until *n* waiters are queued for *name*."""
    deadline = time.monotonic() + timeout
    while queue_length(r, name) < n:
        assert time.monotonic() < deadline, f"{n} waiters never queued for {name}"
        time.sleep(0.01)


def holders(name: str) -> list[tuple[str, str]]:
    """(mode, owner) of every holder of *name*, in Redis's view now."""
    info = locks.get(name)
    return [] if info is None else sorted((h.mode, str(h.owner)) for h in info.holders)


def checked(r: redis.Redis, base: str) -> dict[str, int]:
    """The Redis-side checker's counts under *base*."""
    return {k: int(r.get(key) or 0) for k, key in checker_keys(base).items()}


# --- RW: a mixed load of reader and writer processes -------------------------------

READER_PROCS, WRITER_PROCS, THREADS = 3, 2, 2
MIXED_SECONDS = 4.0


@pytest.fixture(scope="module")
def mixed_load() -> Iterator[dict[str, Any]]:
    """One run shared by the two tests below: 3 reader and 2 writer processes of 2
    threads each loop on one read-write lock for 4 s; readers read a counter twice
    2 ms apart, writers increment it non-atomically (GET, 2 ms, SET)."""
    r = redis.Redis.from_url(settings.REDIS_URL)
    name, base = f"prim:mixed:{uuid.uuid4().hex[:8]}", f"chk:{uuid.uuid4().hex[:8]}"
    children = [Child() for _ in range(READER_PROCS + WRITER_PROCS)]
    try:
        for child in children:
            child.expect("ready")
        until = time.monotonic() + MIXED_SECONDS
        for i, child in enumerate(children):
            prim = "read" if i < READER_PROCS else "write"
            child.send(op="loop", id="mix", prim=prim, name=name, base=base, threads=THREADS,
                       until=until, hold=0.002, ttl=10, timeout=20)  # fmt: skip
        done = [child.expect("done", "mix", timeout=MIXED_SECONDS + 40) for child in children]
        yield {
            "reads": done[:READER_PROCS],
            "writes": done[READER_PROCS:],
            "checked": checked(r, base),
            "left": holders(name),
        }
    finally:
        for child in children:
            child.kill()


def test_rw_never_a_writer_with_another_writer_or_a_reader(mixed_load: dict[str, Any]) -> None:
    """W1: 0 violations (the Redis-side checker saw no writer beside another writer
    or a reader), no reader saw the counter change under it, and no lost update:
    the counter equals the write sections the writers counted."""
    reads, writes, seen = mixed_load["reads"], mixed_load["writes"], mixed_load["checked"]
    assert seen["violations"] == 0, seen
    assert sum(d["torn"] for d in reads) == 0
    write_sections = sum(sum(d["sections"]) for d in writes)
    assert write_sections > 0 and seen["counter"] == write_sections
    assert seen["readers"] == 0 and seen["exclusive"] == 0  # every section left
    # Readers did share the lock (a mutex would also pass the checks above).
    assert seen["most"] >= 2, seen
    assert all(d["timeouts"] == 0 for d in reads + writes)
    assert mixed_load["left"] == [], "every hold was released"


def test_rw_mixed_load_starves_neither_readers_nor_writers(mixed_load: dict[str, Any]) -> None:
    """W4: "readers and writers each get at least a third of the grants under a
    mixed load (no starvation)", made precise for unequal numbers of workers.

    Every worker (thread) loops acquire / 2 ms section / release with no pause, so
    every worker always wants the lock. In a FIFO, phase-fair queue a worker that
    was served queues behind everybody already waiting, so between two grants of
    one worker every other worker is served once: each worker gets about the same
    number of grants, readers (who share a phase) as writers (who take turns). The
    fair share of a side is therefore its share of the workers: with R reader and
    W writer workers, ``R / (R + W)`` of all grants for the readers (6/10 here)
    and ``W / (R + W)`` for the writers (4/10).

    Asserted, the general rule: each side gets at least a third of its fair
    share, ``reads >= grants * 6/10 / 3`` and ``writes >= grants * 4/10 / 3``,
    and every worker got grants. A fixed "a third of all grants" cannot be the
    rule in general: with 6 readers and 2 writers the writers' fair share is 1/4,
    below a third. Here both sides have at least a third of the workers, so the
    issue's literal bound applies too and is asserted as well: each side got at
    least a third of all grants.

    A writer-preferring lock fails this (the study's prototype: 756 reads vs
    4,052 writes by 6 readers and 2 writers, the readers at 0.21 of their share),
    and so does a reader-preferring one (overlapping readers keep the lock
    read-held: the writers get next to nothing), or a LIFO queue."""
    reads = [n for d in mixed_load["reads"] for n in d["sections"]]
    writes = [n for d in mixed_load["writes"] for n in d["sections"]]
    assert len(reads) == READER_PROCS * THREADS and len(writes) == WRITER_PROCS * THREADS
    grants = sum(reads) + sum(writes)
    workers = len(reads) + len(writes)
    read_share, write_share = len(reads) / workers, len(writes) / workers
    report = f"reads {reads} writes {writes}"
    assert sum(reads) >= grants * read_share / 3, report
    assert sum(writes) >= grants * write_share / 3, report
    assert min(read_share, write_share) >= 1 / 3  # so the issue's own bound applies:
    assert min(sum(reads), sum(writes)) >= grants / 3, report
    assert min(reads) > 0 and min(writes) > 0, report


# --- RW: a write release admits all head readers in one hand-off ------------------


def test_a_write_release_admits_every_head_reader_at_once(
    spawn: Callable[..., list[Child]], name: str, redis_client: redis.Redis
) -> None:
    """W6: four reader processes queue (one by one) behind a held write, and a
    writer process queues behind them. The write's release grants all four reads
    inside the release itself: right after it returns Redis lists the four
    readers as holders and only the writer still queued. Each reader learns it by
    the release's message (well under the fallback poll), after the release, and
    all four hold at once (every grant precedes every reader's release). The
    queued writer gets the lock only after the last reader left; every token is
    larger than the one before it."""
    writer = locks.rw_lock(name, ttl=30, auto_renew=False).write(owner="first-writer")
    assert writer.acquire(blocking=False)
    readers = spawn(5)
    for i, child in enumerate(readers[:4]):
        child.send(op="hold", id=f"r{i}", prim="read", name=name, ttl=10)
        wait_queued(redis_client, name, i + 1)
    readers[4].send(op="hold", id="w", prim="write", name=name, ttl=10)
    wait_queued(redis_client, name, 5)
    time.sleep(0.2)  # the waiters park: only a wake-up can get them now

    write_token = writer.fencing_token
    assert write_token is not None
    released = time.monotonic()
    assert writer.release() == 0
    after = holders(name)
    assert after == sorted(("read", f"r{i}@{c.proc.pid}") for i, c in enumerate(readers[:4]))
    assert queue_length(redis_client, name) == 1  # the writer

    grants = [child.expect("acquired", f"r{i}", 10) for i, child in enumerate(readers[:4])]
    assert all(released < g["t"] < released + WOKEN_BY_MESSAGE for g in grants), [
        g["t"] - released for g in grants
    ]
    assert all(g["token"] > write_token for g in grants)
    assert not readers[4].pending("acquired", "w"), "a writer got in beside the readers"
    first_release, last_release = math.inf, 0.0
    for i, child in enumerate(readers[:4]):
        child.send(op="release", id=f"r{i}")
        done = child.expect("released", f"r{i}")
        first_release = min(first_release, done["called"])
        last_release = max(last_release, done["called"])
    assert first_release > max(g["t"] for g in grants)  # they all held at once
    second = readers[4].expect("acquired", "w", 10)
    # (the last read's release hands the lock to the writer inside Redis: the writer
    # may hear of it before the releasing reader has read its reply)
    assert second["t"] > last_release
    assert second["token"] > max(g["token"] for g in grants)
    readers[4].send(op="release", id="w")
    readers[4].expect("released", "w")
    assert locks.get(name) is None


def test_a_reentrant_read_is_granted_while_another_process_writer_waits(
    spawn: Callable[..., list[Child]], name: str, redis_client: redis.Redis
) -> None:
    """W5 across processes: a reader process re-enters its read while a writer of
    another process is queued (no self-deadlock under the phase-fair queue); the
    writer gets the lock once both holds are released, by the release's message."""
    (reader,) = spawn(1)
    reader.send(op="hold", id="r", prim="read", name=name, ttl=10)
    reader.expect("acquired", "r")
    got: list[float] = []
    waiter = locks.rw_lock(name, ttl=10, auto_renew=False).write(owner="writer")
    thread = threading.Thread(target=lambda: waiter.acquire(timeout=10) and got.append(
        time.monotonic()))  # fmt: skip
    thread.start()
    wait_queued(redis_client, name, 1)
    reader.send(op="hold", id="r", prim="read", name=name, ttl=10)  # same owner again
    assert reader.expect("acquired", "r", 5)["waited"] < 1
    reader.send(op="release", id="r")
    assert reader.expect("released", "r")["left"] == 1
    assert not got and holders(name) == [("read", f"r@{reader.proc.pid}")]
    reader.send(op="release", id="r")
    last = reader.expect("released", "r")
    assert last["left"] == 0
    thread.join(10)
    assert got and got[0] - last["t"] < WOKEN_BY_MESSAGE
    assert holders(name) == [("write", "writer")]
    waiter.release()


# --- Semaphore ----------------------------------------------------------------------


def test_semaphore_never_more_than_limit_holders_across_processes(
    spawn: Callable[..., list[Child]], name: str, redis_client: redis.Redis
) -> None:
    """W7: five processes loop acquire / 5 ms section / release on a semaphore of
    limit 3 for 3 s. The Redis-side checker never saw a 4th holder inside, it did
    see 3 at once (the permits are used), and every process made progress."""
    base = f"chk:{uuid.uuid4().hex[:8]}"
    children = spawn(5)
    until = time.monotonic() + 3.0
    for child in children:
        child.send(op="loop", id="sem", prim="sem", name=name, limit=3, base=base,
                   until=until, hold=0.005, ttl=10, timeout=20)  # fmt: skip
    done = [child.expect("done", "sem", timeout=40) for child in children]
    seen = checked(redis_client, base)
    sections = [n for d in done for n in d["sections"]]
    assert seen["violations"] == 0, seen
    assert seen["most"] == 3, seen
    assert seen["readers"] == 0
    assert all(n > 0 for n in sections), sections
    assert all(d["timeouts"] == 0 for d in done)
    # FIFO: no process is left far behind the others (each gets a third of the mean).
    assert min(sections) >= sum(sections) / len(sections) / 3, sections
    assert locks.get(name) is None


def test_semaphore_waiters_are_served_in_the_order_they_queued(
    spawn: Callable[..., list[Child]], name: str, redis_client: redis.Redis
) -> None:
    """W7: with the 3 permits held, four processes queue one after the other. Each
    release hands the freed permit to the first of them, inside the release (the
    next holder is in Redis's list the moment release() returns), in queue order."""
    held = [locks.semaphore(name, 3, owner=f"p{i}", ttl=30, auto_renew=False) for i in range(3)]
    for permit in held:
        assert permit.acquire(blocking=False)
    waiters = spawn(4)
    for i, child in enumerate(waiters):
        child.send(op="hold", id=f"w{i}", prim="sem", name=name, limit=3, ttl=10)
        wait_queued(redis_client, name, i + 1)
    owners = [f"w{i}@{c.proc.pid}" for i, c in enumerate(waiters)]
    for i, permit in enumerate(held):
        assert permit.release() == 0
        expected = {f"p{j}" for j in range(i + 1, 3)} | set(owners[: i + 1])
        assert {owner for _, owner in holders(name)} == expected
        waiters[i].expect("acquired", f"w{i}", 10)
    assert queue_length(redis_client, name) == 1
    waiters[0].send(op="release", id="w0")
    waiters[0].expect("released", "w0")
    assert {owner for _, owner in holders(name)} == set(owners[1:])
    waiters[3].expect("acquired", "w3", 10)


# --- Crashed holders (SIGKILL) ------------------------------------------------------

LEASE = 1.0


def _kill_and_time(child: Child, acquire: Callable[[], bool]) -> float:
    """SIGKILL *child*, then time *acquire* (which must succeed)."""
    child.proc.send_signal(signal.SIGKILL)
    child.proc.wait(10)
    killed = time.monotonic()
    assert acquire()
    return time.monotonic() - killed


def test_a_sigkilled_reader_frees_its_share_within_one_lease(
    spawn: Callable[..., list[Child]], name: str
) -> None:
    """W2: a reader process holding with a 1 s lease, renewed by its watchdog (still
    held after 1.3 s, longer than the lease), is SIGKILLed; a writer waiting from
    the kill gets the lock within the lease + 1.5 s, and the dead reader is gone
    from the holders."""
    (reader,) = spawn(1)
    reader.send(op="hold", id="r", prim="read", name=name, ttl=LEASE)
    reader.expect("acquired", "r")
    writer = locks.rw_lock(name, ttl=10, auto_renew=False).write(owner="writer")
    time.sleep(LEASE + 0.3)
    assert not writer.acquire(blocking=False), "the live reader's lease is renewed"
    waited = _kill_and_time(reader, lambda: writer.acquire(timeout=10))
    assert waited <= LEASE + 1.5, waited
    assert holders(name) == [("write", "writer")]
    writer.release()


def test_a_sigkilled_permit_holder_frees_its_permit_within_one_lease(
    spawn: Callable[..., list[Child]], name: str
) -> None:
    """W7: a semaphore of limit 2, one permit held here (30 s), the other by a
    child (1 s lease, renewed). The child is SIGKILLed: another owner gets its
    permit within the lease + 1.5 s; the live permit is untouched."""
    mine = locks.semaphore(name, 2, owner="live", ttl=30, auto_renew=False)
    assert mine.acquire(blocking=False)
    (child,) = spawn(1)
    child.send(op="hold", id="s", prim="sem", name=name, limit=2, ttl=LEASE)
    child.expect("acquired", "s")
    other = locks.semaphore(name, 2, owner="other", ttl=10, auto_renew=False)
    assert not other.acquire(blocking=False)
    waited = _kill_and_time(child, lambda: other.acquire(timeout=10))
    assert waited <= LEASE + 1.5, waited
    assert holders(name) == [("permit", "live"), ("permit", "other")]
    assert mine.owned()
    other.release()
    mine.release()


# --- Clock skew between clients -----------------------------------------------------


@pytest.mark.parametrize("skew", [3600.0, -3600.0], ids=["ahead-1h", "behind-1h"])
def test_a_skewed_client_clock_neither_evicts_others_nor_decides_its_lease(
    spawn: Callable[..., list[Child]], name: str, skew: float
) -> None:
    """W8. The child's ``time.time()`` is shifted by *skew* (monkeypatched in that
    child process only: a fault between clients that a real server cannot
    produce). This process holds a permit of a semaphore (limit 2) and a read of
    a read-write lock, each with a 2 s lease kept alive by the watchdog; the child
    takes the other permit and another read with a 1 s lease, not renewed.

    Asserted: the child's acquires evict neither of our holds (both still listed,
    owned, not lost); the child's leases are 1 s by Redis's clock (listed with at
    most 1 s left, not 1 h more or already gone), so they still hold 0.5 s later
    and are gone within 1 s + 1.5 s, when another owner gets the permit and only
    our read is left; our holds outlive them."""
    sem_name, rw_name = f"{name}:sem", f"{name}:rw"
    permit = locks.semaphore(sem_name, 2, owner="mine", ttl=2)
    read = locks.rw_lock(rw_name, ttl=2).read(owner="mine")
    assert permit.acquire(blocking=False) and read.acquire(blocking=False)
    try:
        (child,) = spawn(1, "--skew", str(skew))
        child.send(op="hold", id="s", prim="sem", name=sem_name, limit=2, ttl=1.0,
                   auto_renew=False)  # fmt: skip
        child.send(op="hold", id="r", prim="read", name=rw_name, ttl=1.0, auto_renew=False)
        acquired = min(child.expect("acquired", "s")["t"], child.expect("acquired", "r")["t"])
        theirs = f"s@{child.proc.pid}", f"r@{child.proc.pid}"
        expected = ((sem_name, "permit", theirs[0]), (rw_name, "read", theirs[1]))
        for lock_name, mode, owner in expected:
            info = locks.get(lock_name)
            assert info is not None
            by_owner = {h.owner: h for h in info.holders}
            assert set(by_owner) == {"mine", owner}, info.holders
            assert by_owner[owner].mode == mode
            assert 0 < by_owner[owner].ttl <= 1.0, by_owner[owner]
            assert by_owner["mine"].ttl > 1.0
        time.sleep(max(0.0, acquired + 0.5 - time.monotonic()))
        assert {o for _, o in holders(sem_name)} == {"mine", theirs[0]}
        assert {o for _, o in holders(rw_name)} == {"mine", theirs[1]}
        other = locks.semaphore(sem_name, 2, owner="other", ttl=5, auto_renew=False)
        assert other.acquire(timeout=5)
        assert time.monotonic() - acquired <= 1.0 + 1.5
        assert holders(sem_name) == [("permit", "mine"), ("permit", "other")]
        deadline = time.monotonic() + 2
        while holders(rw_name) != [("read", "mine")]:  # an expired lease is dropped
            assert time.monotonic() < deadline, holders(rw_name)
            locks.rw_lock(rw_name).read(owner="probe").acquire(blocking=False)  # purges
            locks.rw_lock(rw_name).read(owner="probe").release()
            time.sleep(0.05)
        assert permit.owned() and read.owned() and not permit.lost and not read.lost
        other.release()
    finally:
        permit.release()
        read.release()


# --- fair=False ---------------------------------------------------------------------


def test_unfair_mutex_keeps_exclusion_and_loses_no_update_across_processes(
    spawn: Callable[..., list[Child]], name: str, redis_client: redis.Redis
) -> None:
    """Three processes of two threads loop on one ``fair=False`` lock for 3 s (a
    non-atomic GET / 1 ms / SET): the Redis-side checker saw no two holders at
    once, the counter equals the sections counted, every process got the lock."""
    base = f"chk:{uuid.uuid4().hex[:8]}"
    children = spawn(3)
    until = time.monotonic() + 3.0
    for child in children:
        child.send(op="loop", id="unfair", prim="lock", name=name, base=base, threads=2,
                   until=until, hold=0.001, ttl=10, timeout=20, fair=False)  # fmt: skip
    done = [child.expect("done", "unfair", timeout=40) for child in children]
    seen = checked(redis_client, base)
    per_process = [sum(d["sections"]) for d in done]
    assert seen["violations"] == 0, seen
    assert seen["counter"] == sum(per_process) > 0
    assert all(n > 0 for n in per_process), per_process
    assert all(d["timeouts"] == 0 for d in done)
    assert locks.get(name) is None


def test_unfair_waiter_is_woken_by_the_release(
    spawn: Callable[..., list[Child]], name: str, redis_client: redis.Redis
) -> None:
    """A ``fair=False`` release frees the lock and pokes the queued waiter of
    another process, which gets it well under the fallback poll."""
    holder = locks.lock(name, owner="holder", ttl=30, auto_renew=False, fair=False)
    assert holder.acquire(blocking=False)
    (child,) = spawn(1)
    child.send(op="hold", id="w", prim="lock", name=name, ttl=10, fair=False)
    wait_queued(redis_client, name, 1)
    time.sleep(0.3)  # parked
    released = time.monotonic()
    token = holder.fencing_token
    assert holder.release() == 0
    got = child.expect("acquired", "w", 10)
    assert got["t"] - released < WOKEN_BY_MESSAGE
    assert token is not None and got["token"] > token


def test_unfair_waiter_gets_in_against_a_holder_that_loops(
    spawn: Callable[..., list[Child]], name: str, redis_client: redis.Redis
) -> None:
    """A process loops on a ``fair=False`` lock with no pause between its sections
    (acquire, hold 5 ms, release, acquire again at once): a waiter of another
    process still gets the lock within 0.5 s, under the fallback poll (its first
    fallback attempt comes after 0.75-1 s): each release pokes it, and it takes
    the lock in one of the gaps."""
    stop = f"{name}:stop"
    churner, waiter = spawn(2)
    churner.send(op="churn", id="c", prim="lock", name=name, hold=0.005, gap=0,
                 stop=stop, fair=False, ttl=10, limit_s=20)  # fmt: skip
    churner.expect("churning", "c")
    time.sleep(0.3)
    waiter.send(op="hold", id="w", prim="lock", name=name, ttl=10, fair=False, timeout=10)
    got = waiter.expect("acquired", "w", 15)
    waiter.send(op="release", id="w")
    waiter.expect("released", "w")
    redis_client.set(stop, 1)
    churned = churner.expect("done", "c", 10)
    assert churned["sections"] > 20  # it did loop
    assert got["waited"] < WOKEN_BY_MESSAGE, got


def _script_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(
        int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval")
    )


def test_unfair_waiters_are_not_polled(
    spawn: Callable[..., list[Child]], name: str, redis_client: redis.Redis
) -> None:
    """Two processes wait on a ``fair=False`` lock held here for a long time: over
    2.5 s they run at most their fallback attempts (one per 0.75-1 s each, so at
    most 2 * (ceil(2.5 / 0.75) + 1) scripts), not a poll loop; then each release
    wakes the next one well under the fallback poll."""
    holder = locks.lock(name, owner="holder", ttl=30, auto_renew=False, fair=False)
    assert holder.acquire(blocking=False)
    children = spawn(2)
    for i, child in enumerate(children):
        child.send(op="hold", id="w", prim="lock", name=name, ttl=10, fair=False, timeout=20)
        wait_queued(redis_client, name, i + 1)
    window = 2.5
    before = _script_calls(redis_client)
    time.sleep(window)
    calls = _script_calls(redis_client) - before
    assert calls <= 2 * (math.ceil(window / 0.75) + 1), calls
    released = time.monotonic()
    holder.release()
    deadline = time.monotonic() + 10
    while not any(c.pending("acquired", "w") for c in children):
        assert time.monotonic() < deadline, "no waiter got the released lock"
        time.sleep(0.005)
    time.sleep(0.1)  # the other one must not get it too
    firsts = [c for c in children if c.pending("acquired", "w")]
    assert len(firsts) == 1
    first, second_child = firsts[0], next(c for c in children if c is not firsts[0])
    assert first.expect("acquired", "w")["t"] - released < WOKEN_BY_MESSAGE
    first.send(op="release", id="w")
    done = first.expect("released", "w")
    second = second_child.expect("acquired", "w", 10)
    assert second["t"] - done["t"] < WOKEN_BY_MESSAGE
    second_child.send(op="release", id="w")
    second_child.expect("released", "w")
