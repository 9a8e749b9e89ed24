"""``manage.py redislock list|show|release``."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_redislock import locks


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
