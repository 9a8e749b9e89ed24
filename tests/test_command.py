"""``manage.py redislock list|show|release|extend``, on mutexes, semaphores and rw locks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_redislock import Lock, locks


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
