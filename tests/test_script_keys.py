"""Every script the package sends names at least one key.

Serverless cluster offerings (ElastiCache Serverless) refuse a script that names
no key ("ERR Lua scripts without any input keys are not supported"). A real
redis-server's ``MONITOR`` shows every command the package sends to it, from
every connection (pipelines, the watchdog's batches, asyncio, Redlock's raw
commands and the ``EVAL`` it writes behind): a representative workload runs
against it, and each ``EVAL`` / ``EVALSHA`` must have ``numkeys`` >= 1. The
workload must also have sent every script the package has (else a script it
missed could name none), so a new script needs a line of workload here.

The cluster backend sends the same calls as a single Redis (the calls are made
above the backends), so it is not run here.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from django.test import override_settings

from django_redislock import LockManager, LockNotAcquired, RunLimited, single_instance
from django_redislock.engine.calls import Call
from django_redislock.engine.driver import call_sync
from django_redislock.engine.lua import common as common_scripts
from django_redislock.engine.lua import deadlock as deadlock_scripts
from django_redislock.engine.lua import fenced as fenced_scripts
from django_redislock.engine.lua import mutex as scripts
from django_redislock.engine.lua import observe as observe_scripts
from django_redislock.engine.lua import operator as operator_scripts
from django_redislock.engine.lua import quorum as quorum_scripts
from django_redislock.engine.lua import shaping as shaping_scripts
from django_redislock.engine.lua import shared as shared_scripts
from django_redislock.engine.lua.common import Script
from django_redislock.guards.shaping import shaping_key, shaping_state
from tests.redis_server import RedisServer

MARKER = "redislock-monitor-end"
SCRIPT_COMMANDS = {"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO"}
_ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b"}


def _unescape(raw: bytes) -> bytes:
    """An argument as MONITOR quotes it (``sdscatrepr``), back to its bytes."""

    def one(match: re.Match[bytes]) -> bytes:
        body = match.group(1)
        if body[:1] == b"x":
            return bytes([int(body[1:], 16)])
        return _ESCAPES.get(body, body)

    return re.sub(rb"\\(x[0-9a-fA-F]{2}|.)", one, raw)


class Monitor:
    """The commands a redis-server receives from clients, read with ``MONITOR`` on a
    connection of its own until :meth:`stop`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = redis.Redis.from_url(url, socket_timeout=30)
        # A connection of its own, made directly (redis-py 5.0's pool asks for a
        # command name, later ones warn when given one).
        self.conn = self.client.connection_pool.make_connection()
        self.conn.connect()
        self.conn.send_command("MONITOR")
        assert self.conn.read_response() in (b"OK", "OK")
        self.commands: list[list[bytes]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                line = self.conn.read_response()
            except redis.ConnectionError:
                return  # the server was stopped (a test that failed first)
            line = line if isinstance(line, bytes) else str(line).encode()
            if MARKER.encode() in line:
                return
            if b" lua]" in line.split(b'"', 1)[0]:
                continue  # run by a script, not sent by a client
            self.commands.append([_unescape(a) for a in _ARG.findall(line)])

    def stop(self) -> list[list[bytes]]:
        """Every command seen (each as its arguments), once the marker came through."""
        with redis.Redis.from_url(self.url, socket_timeout=5) as other:
            other.echo(MARKER)
        self.thread.join(30)
        assert not self.thread.is_alive(), "MONITOR never showed the end marker"
        self.conn.disconnect()
        self.client.close()
        return self.commands


def _script_calls(commands: list[list[bytes]]) -> list[list[bytes]]:
    return [c for c in commands if c and c[0].upper().decode() in SCRIPT_COMMANDS]


def _sha(command: list[bytes]) -> str:
    """The SHA1 of the script a command runs (EVAL sends the text)."""
    if command[0].upper().startswith(b"EVALSHA"):
        return command[1].decode()
    return hashlib.sha1(command[1]).hexdigest()


def _package_scripts(*modules: object) -> dict[str, str]:
    """Every Script the package defines in *modules*: sha -> name."""
    found = {}
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, Script):
                found[value.sha] = value.name
    return found


def _assert_every_script_names_a_key(commands: list[list[bytes]]) -> set[str]:
    calls = _script_calls(commands)
    assert calls, "the workload sent no script"
    keyless = [c[:3] for c in calls if int(c[2]) < 1]
    assert keyless == [], f"scripts sent without a key: {keyless}"
    return {_sha(c) for c in calls}


@pytest.fixture
def server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.stop()


def _wait_for(condition, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _mutex_workload(m: LockManager) -> None:
    lock = m.lock("keys:a", ttl=5)
    assert lock.acquire() and lock.acquire()  # a grant, a re-entry
    assert lock.extend(1)
    lock.release()
    lock.release()
    assert m.lock("keys:barging", fair=False).acquire()

    holder = m.lock("keys:b", owner="holder")
    assert holder.acquire()
    got: list[bool] = []
    waiter = m.lock("keys:b", owner="waiter", auto_renew=False)  # claims a hand-off inline
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=10)))
    thread.start()
    queue = m.backend().keyspace.keys("keys:b").queue
    raw = m.backend().client
    _wait_for(lambda: raw.llen(queue) == 1, "the waiter never queued")
    holder.release()  # a hand-off
    thread.join(10)
    assert got == [True]
    with pytest.raises(LockNotAcquired):
        with m.lock("keys:b", owner="late", timeout=0.1):  # waits, then cancels
            pass
    waiter.release()

    renewed = m.lock("keys:renewed", ttl=0.6)
    assert renewed.acquire()
    time.sleep(0.5)  # the watchdog renews at a third of the lease
    assert renewed.locked()
    renewed.release()

    lost = m.lock("keys:lost", ttl=0.6)
    assert lost.acquire()
    assert m.force_release("keys:lost")
    _wait_for(lambda: any(e.event == "lost" for e in m.history("keys:lost")), "no 'lost' event")

    parked = m.lock("keys:parked")
    assert parked.acquire()
    assert parked._transfer("keys-parked-owner", lease=5) == 1
    assert m.force_extend("keys:parked", 5)
    assert m.force_release("keys:parked")


def _shared_workload(m: LockManager) -> None:
    sem = m.semaphore("keys:sem", limit=2, ttl=0.6)
    first, second = sem, m.semaphore("keys:sem", limit=2, owner="second")
    assert first.acquire() and second.acquire()
    assert first.extend(1)
    time.sleep(0.5)  # renewals
    assert not m.semaphore("keys:sem", limit=2, owner="third").acquire(timeout=0.1)  # cancel
    first.release()
    second.release()
    rw = m.rw_lock("keys:rw")
    with rw.read():
        pass
    with rw.write():
        pass


def _reads_workload(m: LockManager) -> None:
    assert m.lock("keys:held", ttl=30).acquire()
    assert m.get("keys:held") is not None
    assert m.get_many(["keys:held", "keys:none"])
    m.scan_page("0")
    list(m.active())
    m.history("keys:a")
    assert m.force_release("keys:held")
    m.backend().scripting_refusals()
    election = m.election("keys:elected", ttl=5)
    assert election.is_current(election.campaign())  # the campaign announces
    assert election.wait_for_change(None, 1).changed and election.resign()  # a watch
    # Store-enforced fencing: CHECK and GUARDED_WRITE.
    with m.lock("keys:fenced", ttl=30) as held:
        token = held.check()
        assert m.is_current("keys:fenced", token)
        held.guarded().set("keys:{keys:fenced}:value", "1")
    # Deadlock detection: a wait past its deadlock_timeout marks its pointer, reads the
    # lock's edge and the holder's pointer (none: no cycle), and times out.
    holder = m.lock("keys:dl", owner="dl-holder")
    assert holder.acquire()
    waiter = m.lock("keys:dl", owner="dl-waiter", deadlock_timeout=0.05)
    assert not waiter.acquire(timeout=0.5)
    holder.release()


async def _async_workload(m: LockManager) -> None:
    try:
        lock = m.lock("keys:async")
        assert await lock.aacquire()
        assert await lock.aextend(1)
        await lock.arelease()
        assert await m.aget("keys:async") is None
        holder = m.lock("keys:async", owner="holder")
        assert await holder.aacquire()
        assert not await m.lock("keys:async", owner="other").aacquire(timeout=0.1)
        assert await m.aforce_release("keys:async")
    finally:
        await m.source.abackend().aclose()


def _shaping_workload(m: LockManager) -> None:
    @single_instance("keys:shaped", manager=m, rate="1/m", cooldown=5)
    def shaped() -> None:
        pass

    shaped()  # admitted, then cooled down
    with pytest.raises(RunLimited):
        shaped()
    shaping_state(shaped, "keys:shaped")
    # Coalescing's scripts, as the Celery integration sends them (keys on the name's tag).
    backend = m.backend()
    pending = shaping_key(backend, "keys:shaped", "pending")
    retired = shaping_key(backend, "keys:shaped", "retired")
    order = shaping_key(backend, "keys:shaped", "order")
    lock_key = backend.keyspace.keys("keys:shaped").lock
    for script, keys, args in (
        (shaping_scripts.NUMBER, (order,), (60_000,)),
        (shaping_scripts.PEND, (lock_key, pending, retired, order), ("{}", "t1", 60_000, 1, "r")),
        (shaping_scripts.SWEEP, (pending, retired, order, lock_key), ("t1", 1, "o", 1, 1)),
        (shaping_scripts.TAKE, (pending, retired, order), (60_000, 60_000)),
        (
            shaping_scripts.DEBOUNCE,
            (shaping_key(backend, "keys:shaped", "debounce"),),
            ("{}", "t1", 1000, "t2", 60_000, 1),
        ),
    ):
        call_sync(Call(script, keys, args, "test", "keys:shaped"), backend)


def test_every_script_names_a_key_on_one_redis(server: RedisServer) -> None:
    m = LockManager(url=f"{server.url}?socket_timeout=5")
    monitor = Monitor(server.url)
    _mutex_workload(m)
    _shared_workload(m)
    _reads_workload(m)
    asyncio.run(_async_workload(m))
    _shaping_workload(m)
    sent = _assert_every_script_names_a_key(monitor.stop())
    expected = _package_scripts(
        common_scripts,
        scripts,
        shared_scripts,
        operator_scripts,
        observe_scripts,
        fenced_scripts,
        deadlock_scripts,
        shaping_scripts,
    )
    missed = {name for sha, name in expected.items() if sha not in sent}
    assert missed == set(), f"the workload never sent {sorted(missed)}: add it here"


def test_every_script_names_a_key_on_redlock(masters: list[RedisServer]) -> None:
    urls = [f"{s.url}?socket_timeout=5" for s in masters]
    with override_settings(REDISLOCK_REDLOCK_MONOTONIC_FENCING=True):  # the commit round
        m = LockManager(redlock_caches=urls)
        monitor = Monitor(masters[0].url)
        lock = m.lock("keys:rl", ttl=0.6)
        assert lock.acquire() and lock.acquire()
        assert lock.extend(1)
        time.sleep(0.5)  # renewals
        assert not m.lock("keys:rl", owner="other").acquire(timeout=0.1)  # waits, cancels
        lock.release()
        lock.release()
        assert m.lock("keys:rl2").acquire()
        assert m.force_extend("keys:rl2", 5)
        assert m.force_release("keys:rl2")
        m.backend().scripting_refusals()
        sent = _assert_every_script_names_a_key(monitor.stop())
    expected = _package_scripts(quorum_scripts)
    missed = {name for sha, name in expected.items() if sha not in sent}
    assert missed == set(), f"the workload never sent {sorted(missed)}: add it here"


def test_the_workloads_cover_every_module_with_scripts() -> None:
    """A module of new scripts must be named in one of the workload tests above."""
    import importlib
    import pkgutil
    from pathlib import Path

    import django_redislock.engine as engine

    covered = {
        common_scripts, scripts, shared_scripts, operator_scripts, observe_scripts,
        fenced_scripts, deadlock_scripts, quorum_scripts, shaping_scripts,
    }  # fmt: skip
    with_scripts = set()
    for info in pkgutil.walk_packages(engine.__path__, engine.__name__ + "."):
        module = importlib.import_module(info.name)
        source = Path(module.__file__ or "").read_text(encoding="utf-8")
        if re.search(r"=\s*Script\(", source):  # the module makes scripts of its own
            with_scripts.add(module)
    assert scripts in with_scripts  # the search still finds them
    assert with_scripts <= covered, sorted(m.__name__ for m in with_scripts - covered)
