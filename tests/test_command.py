"""``manage.py redislock list|show|release|extend``, on mutexes, semaphores and rw locks;
waiters (threads) and liveness (a holder in a child process, stopped with SIGSTOP)."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from datetime import datetime
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_redislock import Lock, locks
from tests.holding import QueuedWaiters, wait_until
from tests.test_liveness import HolderProcess


def _run(*args: str) -> str:
    out = StringIO()
    call_command("redislock", *args, stdout=out)
    return out.getvalue()


def test_list_show_release(name: str) -> None:
    lock = locks.lock(name, owner="cli-owner", purpose="cli test")
    lock.acquire()
    listing = _run("list", "--prefix", name)
    assert name in listing and "1 lock(s) held" in listing
    shown = json.loads(_run("show", name, "--json"))
    assert shown["owner"] == "cli-owner" and shown["purpose"] == "cli test"
    assert shown["fencing_token"] == lock.fencing_token
    with pytest.raises(CommandError, match="no longer"):
        _run("release", name, "--owner", "someone-else")
    assert "released" in _run("release", name, "--fencing-token", str(lock.fencing_token))
    assert locks.get(name) is None
    with pytest.raises(CommandError, match="not held"):
        _run("show", name)
    with pytest.raises(CommandError, match="not held"):
        _run("release", name)


def test_list_json_and_limit() -> None:
    for i in range(3):
        locks.lock(f"cli:{i}", owner="o").acquire()
    lines = _run("list", "--json", "--prefix", "cli:").splitlines()
    assert sorted(json.loads(line)["name"] for line in lines) == ["cli:0", "cli:1", "cli:2"]
    assert "stopped after 2" in _run("list", "--limit", "2")


def test_invalid_name_is_a_command_error() -> None:
    with pytest.raises(CommandError, match="empty"):
        _run("show", "")


# --- semaphores and read-write locks: every holder, per-holder actions ---------------------


@pytest.fixture
def two_permits(name: str) -> Iterator[tuple[Lock, Lock]]:
    """Two permits of the semaphore *name* (limit 3), held by owners "a" and "b"."""
    a = locks.semaphore(name, 3, owner="a", ttl=60, auto_renew=False, purpose="export")
    b = locks.semaphore(name, 3, owner="b", ttl=60, auto_renew=False)
    assert a.acquire(blocking=False) and b.acquire(blocking=False)
    yield a, b
    for lk in (a, b):
        if lk.owned():
            lk.release()


def _lease_of(name: str, owner: str) -> float:
    info = locks.get(name)
    assert info is not None
    (ttl,) = [h.ttl for h in info.holders if h.owner == owner]
    return ttl


def test_list_and_show_every_holder(name: str, two_permits: tuple[Lock, Lock]) -> None:
    a, b = two_permits
    rw = locks.rw_lock(f"{name}:rw", owner="r1", ttl=60, auto_renew=False)
    other = locks.rw_lock(f"{name}:rw", owner="r2", ttl=60, auto_renew=False)
    assert rw.read().acquire(blocking=False) and other.read().acquire(blocking=False)
    try:
        listing = _run("list", "--prefix", name)
        assert "2 lock(s) held" in listing
        assert f"{name}\tsemaphore 2/3\t" in listing and f"{name}:rw\trwlock 2 readers\t" in listing
        for line in ("  permit\towner=a\t", f"fence={a.fencing_token}", f"fence={b.fencing_token}",
                     "  read\towner=r1\t", "  read\towner=r2\t"):  # fmt: skip
            assert line in listing, line
        shown = json.loads(_run("show", name, "--json"))
        assert shown["primitive"] == "semaphore" and shown["limit"] == 3
        assert [(h["mode"], h["owner"], h["fencing_token"]) for h in shown["holders"]] == [
            ("permit", "a", a.fencing_token),
            ("permit", "b", b.fencing_token),
        ]
        assert shown["holders"][0]["purpose"] == "export" and 0 < shown["holders"][1]["ttl"] <= 60
        text = _run("show", f"{name}:rw")
        assert "primitive: rwlock" in text and "holders: 2" in text and "owner=r2" in text
        lines = _run("list", "--json", "--prefix", f"{name}:rw").splitlines()
        assert [h["mode"] for h in json.loads(lines[0])["holders"]] == ["read", "read"]
    finally:
        rw.read().release()
        other.read().release()


def test_release_one_holder_by_owner_and_token(name: str, two_permits: tuple[Lock, Lock]) -> None:
    a, b = two_permits
    with pytest.raises(CommandError, match="no longer"):
        _run("release", name, "--owner", "a", "--token", str(b.fencing_token))
    assert a.owned() and b.owned()
    out = _run("release", name, "--owner", "a", "--token", str(a.fencing_token))
    assert f"released 1 holder(s) of {name!r}" in out and "owner=a" in out
    assert [h.owner for h in locks.get(name).holders] == ["b"] and b.owned() and not a.owned()
    out = _run("release", name, "--fencing-token", str(b.fencing_token))
    assert "released 1 holder(s)" in out and locks.get(name) is None


def test_release_every_holder(name: str, two_permits: tuple[Lock, Lock]) -> None:
    out = _run("release", name)
    assert f"released 2 holder(s) of {name!r}" in out and locks.get(name) is None


def test_extend_one_holder(name: str, two_permits: tuple[Lock, Lock]) -> None:
    a, b = two_permits
    with pytest.raises(CommandError, match="no longer"):
        _run("extend", name, "300", "--owner", "nobody")
    out = _run("extend", name, "300", "--owner", "b", "--token", str(b.fencing_token))
    assert f"extended 1 holder(s) of {name!r} by 300s" in out and "owner=b" in out
    assert 300 < _lease_of(name, "b") <= 360 and _lease_of(name, "a") <= 60
    _run("extend", name, "100")
    assert 100 < _lease_of(name, "a") <= 160 and 400 < _lease_of(name, "b") <= 460


def test_extend_a_mutex(name: str) -> None:
    with pytest.raises(CommandError, match="not held"):
        _run("extend", name, "10")
    lock = locks.lock(name, owner="m", ttl=60, auto_renew=False)
    lock.acquire()
    with pytest.raises(CommandError, match="no longer"):
        _run("extend", name, "10", "--token", str(lock.fencing_token + 1))
    assert "lease now" in _run("extend", name, "30", "--owner", "m")
    assert 80 < lock.ttl() <= 90
    with pytest.raises(CommandError):
        _run("extend", name, "0")
    lock.release()
    forever = locks.lock(name, owner="m", ttl=None, no_expiry=True)
    forever.acquire()
    with pytest.raises(CommandError, match="no expiry"):
        _run("extend", name, "10")
    forever.release()


# --- waiters and liveness ---------------------------------------------------------------------


@pytest.fixture
def waiting(name: str) -> Iterator[QueuedWaiters]:
    """Threads waiting for the lock *name*."""
    waiters = QueuedWaiters(name)
    yield waiters
    waiters.close()


def test_show_lists_the_waiters_in_order(name: str, waiting: QueuedWaiters) -> None:
    holder = locks.lock(name, owner="holder", ttl=30, purpose="nightly run")
    assert holder.acquire()
    try:
        waiting.add(locks.lock(name, owner="first", ttl=30, purpose="second run"), 30)
        waiting.add(locks.lock(name, owner="second", ttl=30), None)
        shown = json.loads(_run("show", name, "--json"))
        assert shown["queue_length"] == 2
        first, second = shown["waiters"]
        assert (first["position"], first["owner"], first["mode"]) == (1, "first", "exclusive")
        assert (second["position"], second["owner"], second["deadline"]) == (2, "second", None)
        assert first["purpose"] == "second run" and first["pid"] == os.getpid()
        # "since" is Redis's clock at the first queueing; the deadline is Redis's clock at
        # the latest (re)queue plus the wait the waiter had left when it sent it: a request
        # slower to reach Redis than the first moves it that much later (CI met 30.001).
        assert (
            25
            < (
                datetime.fromisoformat(first["deadline"])
                - datetime.fromisoformat(first["waiting_since"])
            ).total_seconds()
            <= 30.5
        )
        assert 0 <= first["waited"] < 10 and first["lease"] == 30
        text = _run("show", name)
        assert "waiters: 2" in text and "queue_length: 2" in text
        lines = [line for line in text.splitlines() if line.startswith("  #")]
        assert lines[0].startswith("  #1\towner=first\texclusive\t")
        assert re.search(
            r"\tpurpose=second run\twaiting for \d\.\d s \(since \d\d:\d\d:\d\d\)\t"
            r"gives up in \d\d s \(at \d\d:\d\d:\d\d\)$",
            lines[0],
        ), lines[0]
        assert lines[1].startswith("  #2\towner=second\t") and lines[1].endswith("\tno limit")
        listing = _run("list", "--prefix", name)
        assert "\tqueue=2\trenewed " in listing
        (row,) = [
            json.loads(line) for line in _run("list", "--json", "--prefix", name).splitlines()
        ]
        assert [w["owner"] for w in row["waiters"]] == ["first", "second"]
    finally:
        holder.release()


def test_a_stopped_holder_is_shown_overdue(name: str) -> None:
    child = HolderProcess(f"locks.lock({name!r}, ttl=6, purpose='stuck job')")
    try:
        listing = _run("list", "--prefix", name)
        assert "\tqueue=0\trenewed " in listing and "NOT RENEWED" not in listing
        shown = json.loads(_run("show", name, "--json"))
        assert shown["renewing"] and not shown["overdue"] and shown["renewed_ago"] < 3
        child.stop()
        # Renewals are due every 2 s: overdue once 3 s pass without one (half the lease).
        wait_until(lambda: getattr(locks.get(name), "overdue", False), timeout=5)
        listing = _run("list", "--prefix", name)
        assert "\tNOT RENEWED for " in listing, listing
        shown = json.loads(_run("show", name, "--json"))
        assert shown["overdue"] and shown["renewed_ago"] > 3
        (holder,) = shown["holders"]
        assert holder["overdue"] and holder["pid"] == child.proc.pid
        assert re.search(r"liveness: NOT RENEWED for \d\.\d s\n", _run("show", name))
    finally:
        child.kill()


def test_a_lease_meant_to_run_out_says_so(name: str) -> None:
    lock = locks.lock(name, owner="queued", ttl=60, auto_renew=False)
    assert lock.acquire()
    try:
        listing = _run("list", "--prefix", name)
        assert listing.splitlines()[0].endswith("\tnot renewed (runs out)")
        shown = json.loads(_run("show", name, "--json"))
        assert shown["renewing"] is False and shown["overdue"] is False
        assert shown["holders"][0]["renewing"] is False
    finally:
        lock.release()


def test_holders_of_a_semaphore_each_have_their_liveness(name: str) -> None:
    live = HolderProcess(f"locks.semaphore({name!r}, limit=2, ttl=6)")
    stuck = HolderProcess(f"locks.semaphore({name!r}, limit=2, ttl=6)")
    try:
        stuck.stop()
        wait_until(lambda: getattr(locks.get(name), "overdue", False), timeout=6)
        lines = _run("list", "--prefix", name).splitlines()
        assert "\tNOT RENEWED for " in lines[0]  # the lock: its worst holder
        by_owner = {line.split("\t")[1]: line for line in lines[1:3]}
        assert "\tNOT RENEWED for " in by_owner[f"owner={stuck.owner}"]
        assert "\trenewed " in by_owner[f"owner={live.owner}"]
    finally:
        live.kill()
        stuck.kill()


def test_the_listed_waiters_are_capped_and_say_so(name: str) -> None:
    holder = locks.lock(name, owner="holder", ttl=60, auto_renew=False)
    assert holder.acquire()

    def wait(n: int) -> None:
        lock = locks.lock(name, owner=f"w{n:02}", ttl=30)
        if lock.acquire(timeout=30):  # each in turn, once the holder leaves
            lock.release()

    threads = [threading.Thread(target=wait, args=(n,), daemon=True) for n in range(51)]
    try:
        for thread in threads:
            thread.start()
        wait_until(lambda: getattr(locks.get(name), "queue_length", 0) == 51, timeout=20)
        text = _run("show", name)
        assert "waiters: 50 listed of 51 in the queue\n" in text
        assert text.count("\n  #") == 50
    finally:
        holder.release()
        for thread in threads:
            thread.join(40)
