#!/usr/bin/env python
"""Fault run: the lock under real faults, with fencing and liveness invariants checked.

One throw-away ``redis-server`` (AOF on, ``appendfsync everysec``) on a free loopback
port, and a ``tests.tcp_proxy.TcpProxy`` in front of it. Worker processes (spawned)
loop on ONE lock name::

    with manager.lock("shared", ttl=2, timeout=30) as held:
        <enter>  sleep 5-20 ms  <fenced write with held.fencing_token>

Half of them reach Redis through the proxy, half directly, so a partition of the
proxy cuts off some clients only. Each worker reports every step to the parent over
its own pipe (enter, write, exit and how it ended, errors, ``lock_lost`` signals)
with ``time.monotonic()`` timestamps (CLOCK_MONOTONIC is one clock for every process
on Linux). Two more processes, the *long holders* (one through the proxy, one
direct), each hold a lock of their own (``long:proxy``, ``long:direct``, ttl 2 s)
for as long as they can, so every fault also shows what happens to a hold that is
being renewed when the fault strikes. A monitor thread in the parent polls the lock
hashes directly (bypassing the proxy) to date when leases ran out in Redis.

The parent injects the faults in turn, each bounded in time, with quiet periods in
between (the next fault waits for recovery, at most 30 s):

- Redis SIGKILL + restart on the same port, from its AOF; and once into an empty
  data directory (as a restart without persistence);
- Redis SIGSTOP for 0.5, 2 and 4 s, then SIGCONT;
- the proxy blackholed for 3 s and for 8 s (a partition of half the clients), armed when a
  client behind the proxy has just entered the critical section;
- the proxy refusing connections for 2 s (``set_down``);
- a holder SIGSTOPped for 5 s (longer than its 2 s lease); the first queued waiter
  SIGSTOPped for 5 s;
- a holder SIGKILLed in its critical section, the first queued waiter SIGKILLed
  (each replaced by a new worker);
- Redis full for 2 s (``maxmemory 1``, ``noeviction``).

Checked afterwards: fenced writes in time order (a write whose token is not above
every earlier write's is rejected by a fencing resource; it must come from a holder
that was told its lock was lost, and a resource that accepts equal tokens must never
see a token twice), raw overlaps of critical sections and whether the earlier holder
was told, duplicate and regressing tokens, per fault the time to recover (first
critical section entered after the fault ended), the longest stretch without any
critical section, progress of every worker after the fault (no process hung), and
for cut-off holders when they learned of the loss against when their lease ran out.

Run from the repository root::

    .venv/bin/python benchmarks/fault_run.py              # default, about 3 minutes
    .venv/bin/python benchmarks/fault_run.py --quick      # smoke test, about 1 minute
    .venv/bin/python benchmarks/fault_run.py --minutes 10 # cycles the faults

Results: a table on stdout and JSON in ``benchmarks/results/faults-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as mp_wait
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from redis.backoff import NoBackoff  # noqa: E402
from redis.retry import Retry  # noqa: E402

SHARED = "shared"
LONG_NAMES = {"proxy": "long:proxy", "direct": "long:direct"}
TTL = 2.0
ACQUIRE_TIMEOUT = 30.0
#: The lock clients' socket timeouts (redis-py's own retries are off; the engine
#: retries an acquire/release once itself).
SOCKET_TIMEOUT = 1.0
CONNECT_TIMEOUT = 1.0
#: A worker that reports nothing for this long after a fault ended counts as hung.
PROGRESS_BOUND = 10.0
#: The most the run waits for recovery before the next fault.
RECOVERY_BOUND = 30.0
ERROR_BACKOFF = 0.05
KEY_PREFIX = "redislock"


def now() -> float:
    """CLOCK_MONOTONIC: one clock for every process on the host (Linux)."""
    return time.monotonic()


def lock_client(port: int) -> redis.Redis:
    """The redis-py client of a worker's LockManager."""
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=CONNECT_TIMEOUT,
        retry=Retry(NoBackoff(), 0),
    )


# --------------------------------------------------------------------------------------
# Worker side (spawned processes).
# --------------------------------------------------------------------------------------


class Sender:
    """Thread-safe sends over the worker's pipe (main thread and the watchdog's signal)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    def __call__(self, *msg: Any) -> None:
        with self.lock:
            try:
                self.conn.send(msg)
            except (OSError, ValueError):
                pass


def _setup_worker(log_path: str) -> None:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(INSTALLED_APPS=["django_redislock"], USE_TZ=True, LOGGING_CONFIG=None)
        django.setup()
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(mono).3f %(threadName)s %(levelname)s %(message)s"))

    def stamp(record: logging.LogRecord) -> bool:
        record.mono = now()  # the run's clock, to line logs up with the events
        return True

    handler.addFilter(stamp)
    log = logging.getLogger("django_redislock")
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    log.propagate = False


def _classify(exc: BaseException) -> str:
    cause = exc.__cause__
    if "out of memory" in str(exc):
        return "backend:oom"
    return f"backend:{type(cause).__name__}" if cause is not None else "backend"


def worker_main(
    idx: int,
    role: str,
    group: str,
    port: int,
    conn: Connection,
    stop: Any,
    hard_deadline: float,
    log_path: str,
    seed: int,
) -> None:
    """One worker: loop on the shared lock (role "shared") or hold a long lock ("long")."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    parent = os.getppid()
    send = Sender(conn)
    _setup_worker(log_path)
    from django_redislock import (
        LockBackendError,
        LockError,
        LockLost,
        LockManager,
        LockNotAcquired,
    )
    from django_redislock.signals import lock_lost

    manager = LockManager(client=lock_client(port))
    name = SHARED if role == "shared" else LONG_NAMES[group]
    current: dict[str, Any] = {"lock": None, "hid": None, "token": None}

    def on_lost(sender: Any, lock: Any, reason: str = "", **kwargs: Any) -> None:
        hid = current["hid"] if lock is current["lock"] else None
        send("lost", idx, hid, current["token"], now(), reason)

    lock_lost.connect(on_lost, weak=False)
    rng = random.Random(seed)
    send("ready", idx, os.getpid(), now())
    seq = 0
    while not stop.value and now() < hard_deadline and os.getppid() == parent:
        seq += 1
        hid = f"{idx}.{seq}"
        lk = manager.lock(name, ttl=TTL, timeout=ACQUIRE_TIMEOUT)
        current.update(lock=lk, hid=hid, token=None)
        t_call = now()
        entered = False
        token: int | None = None
        t_out: float | None = None
        failed = False
        try:
            with lk as held:
                entered = True
                token = held.fencing_token
                current["token"] = token
                send("in", idx, hid, token, now(), t_call)
                if role == "shared":
                    time.sleep(rng.uniform(0.005, 0.020))
                    send("write", idx, hid, token, now(), held.lost)
                else:
                    while not held.lost and not stop.value and now() < hard_deadline:
                        time.sleep(0.02)
                t_out = now()
            send("out", idx, hid, token, t_out, now(), "ok", "")
        except LockLost as exc:
            send("out", idx, hid, token, t_out or now(), now(), "lost", str(exc)[:300])
        except LockNotAcquired:
            send("err", idx, "not_acquired", t_call, now(), "")
            failed = True
        except LockBackendError as exc:
            if entered:
                send("out", idx, hid, token, t_out or now(), now(), "release_error", str(exc)[:300])
            else:
                send("err", idx, _classify(exc), t_call, now(), str(exc)[:300])
            failed = True
        except LockError as exc:
            kind = f"lock_error:{type(exc).__name__}"
            if entered:
                send("out", idx, hid, token, t_out or now(), now(), kind, str(exc)[:300])
            else:
                send("err", idx, kind, t_call, now(), str(exc)[:300])
            failed = True
        except Exception as exc:  # anything else is a finding: report it, carry on
            send("err", idx, f"unexpected:{type(exc).__name__}", t_call, now(), repr(exc)[:300])
            failed = True
        current.update(lock=None, hid=None, token=None)
        if failed:
            time.sleep(ERROR_BACKOFF)
    send("bye", idx, now())


# --------------------------------------------------------------------------------------
# Parent side: Redis, workers, the pipe reader, the monitor.
# --------------------------------------------------------------------------------------


class RedisProc:
    """The run's redis-server: killed, restarted (same port), paused at will."""

    def __init__(self, base_dir: str) -> None:
        from tests.redis_server import free_port, redis_server_binary

        self.binary = redis_server_binary()
        self.port = free_port()
        self.base_dir = base_dir
        self.dir = ""
        self.dirs = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, fresh_dir: bool) -> None:
        if fresh_dir or not self.dir:
            self.dirs += 1
            self.dir = os.path.join(self.base_dir, f"redis-{self.dirs}")
            os.makedirs(self.dir, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--maxmemory-policy",
                "noeviction",
                "--dir",
                self.dir,
                "--logfile",
                os.path.join(self.dir, "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C reaches us; we stop it
        )

    def wait_ready(self, timeout: float = 20.0) -> bool:
        from example_project.embedded_redis import answers_ping

        deadline = now() + timeout
        while now() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            if answers_ping(self.port):
                return True
            time.sleep(0.01)
        return False

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip()


class Worker:
    def __init__(self, idx: int, role: str, group: str, proc: Any, conn: Connection) -> None:
        self.idx = idx
        self.role = role
        self.group = group
        self.proc = proc
        self.conn = conn
        self.pid: int = int(proc.pid)
        self.ready_at: float | None = None
        self.gone_at: float | None = None  # killed by the run
        self.paused = False


def signal_worker(worker: Worker, sig: int) -> None:
    """Signal one worker process (never a process group: its pid must be a real one)."""
    if worker.pid <= 1:
        raise RuntimeError(f"worker {worker.idx} has no pid")
    try:
        os.kill(worker.pid, sig)
    except OSError:
        pass


class Recorder:
    """Reads every worker's pipe; keeps the messages; runs armed actions on ``in``."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.cond = threading.Condition()
        self.conns: dict[Connection, int] = {}
        self.closed: list[int] = []
        self._armed: tuple[Callable[[tuple[Any, ...]], bool], Callable[[Any], None]] | None = None
        self.fired: tuple[Any, ...] | None = None
        self.fired_at = 0.0
        self.ready: dict[int, float] = {}
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="recorder", daemon=True)

    def add(self, conn: Connection, idx: int) -> None:
        with self.cond:
            self.conns[conn] = idx

    def arm(self, pred: Callable[[tuple[Any, ...]], bool], action: Callable[[Any], None]) -> None:
        with self.cond:
            self.fired = None
            self._armed = (pred, action)

    def disarm(self) -> tuple[Any, ...] | None:
        with self.cond:
            self._armed = None
            return self.fired

    def wait_fired(self, timeout: float) -> tuple[Any, ...] | None:
        deadline = now() + timeout
        with self.cond:
            while self.fired is None and now() < deadline:
                self.cond.wait(max(0.0, min(0.2, deadline - now())))
            self._armed = None
            return self.fired

    def _run(self) -> None:
        while not self.stopping:
            with self.cond:
                conns = list(self.conns)
            if not conns:
                time.sleep(0.05)
                continue
            for conn in mp_wait(conns, timeout=0.2):
                try:
                    msg = conn.recv()  # type: ignore[union-attr]
                except Exception:  # EOF (the worker exited or was killed), or garbage
                    with self.cond:
                        self.closed.append(self.conns.pop(conn, -1))  # type: ignore[arg-type]
                    continue
                with self.cond:
                    self.events.append(msg)
                    if msg[0] == "ready":
                        self.ready[msg[1]] = msg[3]
                    armed = self._armed
                    if armed is not None and msg[0] == "in" and armed[0](msg):
                        self._armed = None
                        armed[1](msg)
                        self.fired = msg
                        self.fired_at = now()
                    self.cond.notify_all()

    def snapshot(self, start: int = 0) -> list[tuple[Any, ...]]:
        with self.cond:
            return self.events[start:]

    def count(self) -> int:
        with self.cond:
            return len(self.events)


class Monitor:
    """Polls the lock hashes directly (not through the proxy) to date leases in Redis."""

    def __init__(self, port: int, names: list[str], interval: float = 0.01) -> None:
        from django_redislock.engine.keys import KeySpace

        space = KeySpace(KEY_PREFIX)
        self.keys = {name: space.keys(name).lock for name in names}
        self.client = redis.Redis(
            host="127.0.0.1",
            port=port,
            socket_timeout=0.5,
            socket_connect_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        )
        self.interval = interval
        #: (name, fence) -> {"pid", "first", "last", "expires", "gone"}
        self.leases: dict[tuple[str, int], dict[str, Any]] = {}
        self.current: dict[str, tuple[int, dict[str, Any]] | None] = {n: None for n in names}
        self.stopping = False
        self.errors = 0
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="monitor", daemon=True)

    def _run(self) -> None:
        while not self.stopping:
            try:
                pipe = self.client.pipeline(transaction=False)
                for key in self.keys.values():
                    pipe.hmget(key, "fence", "meta")
                    pipe.pttl(key)
                t0 = now()
                replies = pipe.execute()
                t_obs = (t0 + now()) / 2
            except Exception:
                self.errors += 1
                time.sleep(0.05)
                continue
            with self.lock:
                for i, name in enumerate(self.keys):
                    (fence, meta), pttl = replies[2 * i], replies[2 * i + 1]
                    self._observe(name, fence, meta, pttl, t_obs)
            time.sleep(self.interval)

    def _observe(self, name: str, fence: Any, meta: Any, pttl: int, t: float) -> None:
        cur = self.current[name]
        token = int(fence) if fence is not None else None
        if cur is not None and cur[0] != token:
            cur[1]["gone"] = t
            self.current[name] = cur = None
        if token is None:
            return
        if cur is None:
            pid = None
            try:
                pid = json.loads(meta).get("pid") if meta else None
            except ValueError:
                pass
            entry = self.leases.setdefault((name, token), {"pid": pid, "first": t})
            self.current[name] = cur = (token, entry)
        entry = cur[1]
        entry["last"] = t
        if pttl is not None and pttl >= 0:
            entry["expires"] = t + pttl / 1000.0

    def lease(self, name: str, token: int | None) -> dict[str, Any] | None:
        with self.lock:
            entry = self.leases.get((name, token)) if token is not None else None
            return dict(entry) if entry else None

    def holder(self, name: str) -> tuple[int, Any] | None:
        with self.lock:
            cur = self.current[name]
            return (cur[0], cur[1].get("pid")) if cur else None


class Run:
    """The fault run: processes, faults, and the raw records for the analysis."""

    def __init__(self, args: argparse.Namespace, base_dir: str) -> None:
        from tests.tcp_proxy import TcpProxy

        self.args = args
        self.base_dir = base_dir
        self.ctx = mp.get_context("spawn")
        self.stop_flag = self.ctx.RawValue("i", 0)
        self.redis = RedisProc(base_dir)
        self.redis.start(fresh_dir=True)
        if not self.redis.wait_ready():
            self.redis.kill()
            raise RuntimeError("redis-server did not start")
        self.proxy = TcpProxy(self.redis.port)
        self.control = redis.Redis(
            host="127.0.0.1",
            port=self.redis.port,
            socket_timeout=2,
            socket_connect_timeout=1,
            retry=Retry(NoBackoff(), 0),
        )
        from django_redislock.engine.keys import KeySpace

        self.shared_keys = KeySpace(KEY_PREFIX).keys(SHARED)
        self.recorder = Recorder()
        self.monitor = Monitor(self.redis.port, [SHARED, *LONG_NAMES.values()])
        self.workers: dict[int, Worker] = {}
        self.next_idx = 0
        self.faults: list[dict[str, Any]] = []
        self.hard_deadline = 0.0
        self.rng = random.Random(args.seed)

    # -- processes ---------------------------------------------------------------------
    def spawn(self, role: str, group: str) -> Worker:
        idx = self.next_idx
        self.next_idx += 1
        reader, writer = self.ctx.Pipe(duplex=False)
        port = self.proxy.port if group == "proxy" else self.redis.port
        log_path = os.path.join(self.base_dir, f"worker-{idx}.log")
        proc = self.ctx.Process(
            target=worker_main,
            args=(
                idx,
                role,
                group,
                port,
                writer,
                self.stop_flag,
                self.hard_deadline,
                log_path,
                self.rng.randrange(1 << 30),
            ),
            name=f"fault-worker-{idx}",
            daemon=True,
        )
        proc.start()
        writer.close()
        worker = Worker(idx, role, group, proc, reader)
        self.workers[idx] = worker
        self.recorder.add(reader, idx)
        return worker

    def wait_ready(self, workers: list[Worker], timeout: float) -> bool:
        deadline = now() + timeout
        while now() < deadline:
            self.refresh_ready()
            if all(w.ready_at is not None for w in workers):
                return True
            time.sleep(0.05)
        return False

    def refresh_ready(self) -> None:
        with self.recorder.cond:
            ready = dict(self.recorder.ready)
        for idx, t in ready.items():
            self.workers[idx].ready_at = t

    def by_pid(self, pid: Any) -> Worker | None:
        for w in self.workers.values():
            if w.pid == pid and w.gone_at is None:
                return w
        return None

    def shared_workers(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.role == "shared" and w.gone_at is None]

    def cleanup(self) -> None:
        self.stop_flag.value = 1
        for w in self.workers.values():
            if w.proc.is_alive():
                signal_worker(w, signal.SIGCONT)
        self.redis.signal(signal.SIGCONT)
        self.proxy.blackhole(False)
        deadline = now() + 5
        for w in self.workers.values():
            w.proc.join(max(0.0, deadline - now()))
        for w in self.workers.values():
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(5)
        self.recorder.stopping = True
        self.monitor.stopping = True
        self.proxy.close()
        self.redis.kill()

    # -- faults ------------------------------------------------------------------------
    def first_waiter(self, attempts: int = 100) -> Worker | None:
        """The worker first in the shared lock's queue (read straight from Redis)."""
        keys = self.shared_keys
        for _ in range(attempts):
            try:
                owner = self.control.lindex(keys.queue, 0)
                entry = self.control.hget(keys.waiters, owner) if owner else None
            except redis.RedisError:
                owner = entry = None
            if entry:
                meta = entry.decode().split("|", 4)[4]
                try:
                    worker = self.by_pid(json.loads(meta).get("pid"))
                except ValueError:
                    worker = None
                if worker is not None and worker.role == "shared":
                    return worker
            time.sleep(0.01)
        return None

    def holder_token(self) -> int | None:
        try:
            fence = self.control.hget(self.shared_keys.lock, "fence")
        except redis.RedisError:
            return None
        return int(fence) if fence is not None else None

    def fault(self, kind: str, arg: float) -> dict[str, Any]:
        rec: dict[str, Any] = {"fault": kind, "arg": arg}
        if kind == "redis_restart":
            fresh = bool(arg)
            rec["fault"] = "redis_restart_empty" if fresh else "redis_restart_aof"
            rec["holder_before"] = self.monitor.holder(SHARED)
            rec["t_start"] = now()
            self.redis.kill()
            self.redis.start(fresh_dir=fresh)
            ok = self.redis.wait_ready()
            rec["t_end"] = now()
            try:
                fence = self.control.hget(self.shared_keys.fence, "fence")
            except redis.RedisError:
                fence = None
            rec["fence_counter_at_restart"] = int(fence) if fence is not None else None
            rec["restarted"] = ok
            rec["down_s"] = rec["t_end"] - rec["t_start"]
        elif kind == "redis_pause":
            rec["fault"] = f"redis_pause_{arg:g}s"
            rec["t_start"] = now()
            self.redis.signal(signal.SIGSTOP)
            time.sleep(arg)
            self.redis.signal(signal.SIGCONT)
            rec["t_end"] = now()
        elif kind == "blackhole":
            rec["fault"] = f"proxy_blackhole_{arg:g}s"
            proxied = {w.idx for w in self.shared_workers() if w.group == "proxy"}
            self.recorder.arm(lambda m: m[1] in proxied, lambda m: self.proxy.blackhole(True))
            fired = self.recorder.wait_fired(10)
            if fired is None:  # no proxied client entered in 10 s: cut anyway
                self.proxy.blackhole(True)
            rec["t_start"] = self.recorder.fired_at if fired is not None else now()
            rec["target"] = self._target(fired)
            time.sleep(arg)
            self.proxy.blackhole(False)
            rec["t_end"] = now()
        elif kind == "proxy_down":
            rec["fault"] = f"proxy_down_{arg:g}s"
            rec["t_start"] = now()
            self.proxy.set_down(True)
            time.sleep(arg)
            self.proxy.set_down(False)
            rec["t_end"] = now()
        elif kind in ("holder_pause", "holder_kill"):
            sig = signal.SIGSTOP if kind == "holder_pause" else signal.SIGKILL
            rec["fault"] = f"holder_paused_{arg:g}s" if kind == "holder_pause" else "holder_killed"
            shared = {w.idx for w in self.shared_workers()}

            def hit(msg: tuple[Any, ...]) -> None:
                w = self.workers[msg[1]]
                signal_worker(w, sig)

            self.recorder.arm(lambda m: m[1] in shared, hit)
            fired = self.recorder.wait_fired(10)
            rec["t_start"] = self.recorder.fired_at if fired is not None else now()
            if fired is None:
                rec["t_end"] = now()
                rec["skipped"] = "no holder entered within 10 s"
                return rec
            victim = self.workers[fired[1]]
            rec["target"] = self._target(fired)
            rec["target"]["holding_confirmed"] = self.holder_token() == fired[3]
            self._finish_victim(rec, victim, kind == "holder_pause", arg)
        elif kind in ("waiter_pause", "waiter_kill"):
            rec["fault"] = f"waiter_paused_{arg:g}s" if kind == "waiter_pause" else "waiter_killed"
            victim = self.first_waiter()
            rec["t_start"] = now()
            if victim is None:
                rec["t_end"] = now()
                rec["skipped"] = "no queued waiter found"
                return rec
            signal_worker(victim, signal.SIGSTOP if kind == "waiter_pause" else signal.SIGKILL)
            rec["target"] = {"idx": victim.idx, "pid": victim.pid, "group": victim.group}
            self._finish_victim(rec, victim, kind == "waiter_pause", arg)
        elif kind == "redis_full":
            rec["fault"] = f"redis_full_{arg:g}s"
            rec["t_start"] = now()
            self.control.config_set("maxmemory", 1)
            time.sleep(arg)
            self.control.config_set("maxmemory", 0)
            rec["t_end"] = now()
        else:  # pragma: no cover
            raise ValueError(kind)
        return rec

    def _target(self, fired: tuple[Any, ...] | None) -> dict[str, Any]:
        if fired is None:
            return {}
        w = self.workers[fired[1]]
        return {
            "idx": w.idx,
            "pid": w.pid,
            "group": w.group,
            "hid": fired[2],
            "token": fired[3],
            "t_in": fired[4],
        }

    def _finish_victim(
        self, rec: dict[str, Any], victim: Worker, paused: bool, secs: float
    ) -> None:
        if paused:
            victim.paused = True
            time.sleep(secs)
            signal_worker(victim, signal.SIGCONT)
            victim.paused = False
            rec["t_end"] = now()
        else:
            victim.gone_at = rec["t_end"] = now()
            victim.proc.join(5)
            new = self.spawn("shared", victim.group)
            rec["replacement"] = new.idx

    def wait_recovered(self, t_end: float, quiet: float) -> None:
        """Sleep the quiet period, and on until the lock and every worker have moved on."""
        start = self.recorder.count()
        time.sleep(quiet)
        deadline = t_end + RECOVERY_BOUND
        while now() < deadline:
            self.refresh_ready()
            events = self.recorder.snapshot(max(0, start - 2000))
            entered = any(e[0] == "in" and e[4] >= t_end and self._is_shared(e[1]) for e in events)
            seen = {e[1] for e in events if e[0] != "ready" and _t(e) >= t_end}
            pending = [
                w
                for w in self.workers.values()
                if w.role == "shared"
                and w.gone_at is None
                and w.ready_at is not None
                and w.idx not in seen
            ]
            if entered and not pending:
                return
            time.sleep(0.1)

    def _is_shared(self, idx: int) -> bool:
        return self.workers[idx].role == "shared"


def _t(ev: tuple[Any, ...]) -> float:
    """The time an event reports progress at."""
    kind = ev[0]
    if kind == "in":
        return float(ev[4])
    if kind == "write":
        return float(ev[4])
    if kind == "out":
        return float(ev[5])
    if kind == "err":
        return float(ev[4])
    if kind in ("lost",):
        return float(ev[4])
    if kind in ("ready", "bye"):
        return float(ev[-1])
    return 0.0


# --------------------------------------------------------------------------------------
# Analysis.
# --------------------------------------------------------------------------------------


def build_holds(events: list[tuple[Any, ...]]) -> dict[str, dict[str, Any]]:
    holds: dict[str, dict[str, Any]] = {}
    for ev in events:
        kind = ev[0]
        if kind == "in":
            holds[ev[2]] = {
                "idx": ev[1],
                "hid": ev[2],
                "token": ev[3],
                "t_in": ev[4],
                "t_call": ev[5],
            }
        elif kind == "write" and ev[2] in holds:
            holds[ev[2]].update(t_write=ev[4], lost_at_write=ev[5])
        elif kind == "out" and ev[2] in holds:
            holds[ev[2]].update(t_out=ev[4], t_exit=ev[5], outcome=ev[6], detail=ev[7])
        elif kind == "lost" and ev[2] in holds:
            holds[ev[2]].setdefault("t_lost", ev[4])
            holds[ev[2]].setdefault("lost_reason", ev[5])
    for h in holds.values():
        told = [t for t in (h.get("t_lost"),) if t is not None]
        if h.get("outcome") == "lost":
            told.append(h["t_exit"])
        h["told"] = bool(told) or bool(h.get("lost_at_write"))
        h["t_told"] = min(told) if told else None
    return holds


def check_invariants(holds: dict[str, dict[str, Any]], shared: set[int]) -> dict[str, Any]:
    """Fencing and overlaps on the shared lock. One worker is one owner (one thread)."""
    mine = [h for h in holds.values() if h["idx"] in shared]
    writes = sorted((h for h in mine if "t_write" in h), key=lambda h: h["t_write"])
    # Two fencing resources: one that rejects tokens below the highest it has seen
    # (accepts equal ones), and one that accepts only tokens above it (the docs'
    # `fence__lt=token` UPDATE).
    hi_lenient = 0
    hi_strict, hi_strict_idx = 0, -1
    accepted_twice: list[dict[str, Any]] = []
    accepted_twice_same_owner = 0
    rejected = {"holder_told": 0, "holder_not_told": 0, "same_owner_same_token": 0}
    silent: list[dict[str, Any]] = []
    same_owner: list[dict[str, Any]] = []
    seen_tokens: dict[int, dict[str, Any]] = {}
    for h in writes:
        tok = h["token"]
        if tok >= hi_lenient:
            first = seen_tokens.setdefault(tok, h)
            if first is not h:
                if first["idx"] == h["idx"]:
                    accepted_twice_same_owner += 1
                else:
                    accepted_twice.append(_brief(h, other=first["hid"]))
            hi_lenient = tok
        if tok > hi_strict:
            hi_strict, hi_strict_idx = tok, h["idx"]
        elif h["told"]:
            rejected["holder_told"] += 1
        elif tok == hi_strict and h["idx"] == hi_strict_idx:
            rejected["same_owner_same_token"] += 1
            same_owner.append(_brief(h))
        else:
            rejected["holder_not_told"] += 1
            silent.append(_brief(h, highest=hi_strict))
    # Entries in time order.
    entries = sorted(mine, key=lambda h: h["t_in"])
    hi, hi_idx = 0, -1
    low_entries = {"told": 0, "not_told": 0, "same_owner_same_token": 0}
    for h in entries:
        if h["token"] <= hi:
            if h["told"]:
                low_entries["told"] += 1
            elif h["token"] == hi and h["idx"] == hi_idx:
                low_entries["same_owner_same_token"] += 1
            else:
                low_entries["not_told"] += 1
        if h["token"] > hi:
            hi, hi_idx = h["token"], h["idx"]
    owners_by_token: dict[int, set[int]] = {}
    grants_by_token: Counter[int] = Counter()
    for h in mine:
        owners_by_token.setdefault(h["token"], set()).add(h["idx"])
        grants_by_token[h["token"]] += 1
    dup_tokens = {
        "to_different_owners": sum(1 for o in owners_by_token.values() if len(o) > 1),
        "to_one_owner_in_separate_blocks": sum(
            1 for t, n in grants_by_token.items() if n > 1 and len(owners_by_token[t]) == 1
        ),
    }
    # Raw overlaps of [t_in, t_out].
    overlaps = {"total": 0, "earlier_told": 0, "later_told": 0, "nobody_told": 0}
    overlap_examples: list[dict[str, Any]] = []
    active: list[dict[str, Any]] = []
    for h in entries:
        active = [a for a in active if a.get("t_out", a["t_in"]) > h["t_in"]]
        for a in active:
            overlaps["total"] += 1
            if a["told"]:
                overlaps["earlier_told"] += 1
            elif h["told"]:
                overlaps["later_told"] += 1
            else:
                overlaps["nobody_told"] += 1
            if len(overlap_examples) < 20:
                overlap_examples.append({"earlier": _brief(a), "later": _brief(h)})
        if "t_out" in h:
            active.append(h)
    return {
        "holds": len(mine),
        "writes": len(writes),
        "writes_accepted_twice_same_token": len(accepted_twice),
        "writes_accepted_twice_same_token_same_owner": accepted_twice_same_owner,
        "writes_accepted_twice_examples": accepted_twice[:20],
        "writes_rejected_by_strict_fencing": rejected,
        "writes_rejected_not_told_examples": silent[:20],
        "writes_rejected_same_owner_examples": same_owner[:20],
        "entries_with_token_not_above_earlier": low_entries,
        "tokens_granted_more_than_once": dup_tokens,
        "overlaps": overlaps,
        "overlap_examples": overlap_examples,
        "holds_never_finished": sum(1 for h in mine if "t_exit" not in h),
    }


def _brief(h: dict[str, Any], **extra: Any) -> dict[str, Any]:
    keys = (
        "idx",
        "hid",
        "token",
        "t_in",
        "t_write",
        "t_out",
        "t_exit",
        "outcome",
        "told",
        "t_told",
        "lost_reason",
        "lost_at_write",
    )
    out = {k: h.get(k) for k in keys if h.get(k) is not None}
    out.update(extra)
    return out


def analyse_fault(
    f: dict[str, Any],
    t_next: float,
    events: list[tuple[Any, ...]],
    holds: dict[str, dict[str, Any]],
    workers: dict[int, Worker],
    monitor: Monitor,
) -> dict[str, Any]:
    t0, t1 = f["t_start"], f["t_end"]
    role = {w.idx: w.role for w in workers.values()}
    group = {w.idx: w.group for w in workers.values()}
    shared_in = sorted(h["t_in"] for h in holds.values() if role.get(h["idx"]) == "shared")
    after = [t for t in shared_in if t >= t1]
    recovered = after[0] if after else None
    out: dict[str, Any] = {k: v for k, v in f.items() if not k.startswith("t_")}
    out["duration_s"] = t1 - t0
    out["recovery_s"] = None if recovered is None else recovered - t1
    for g in ("proxy", "direct"):
        ts = [
            h["t_in"]
            for h in holds.values()
            if role.get(h["idx"]) == "shared" and group.get(h["idx"]) == g and h["t_in"] >= t1
        ]
        out[f"recovery_{g}_s"] = min(ts) - t1 if ts else None
    # The longest stretch without any critical section entered, around the fault.
    gap = 0.0
    end = recovered if recovered is not None else t_next
    prev = max((t for t in shared_in if t < t0), default=t0)
    for t in [t for t in shared_in if t0 <= t <= end] + [end]:
        gap = max(gap, t - prev)
        prev = t
    out["longest_gap_s"] = gap
    # Errors between this fault's start and the next's, by kind and group.
    errs: Counter[str] = Counter()
    for ev in events:
        if ev[0] == "err" and t0 <= ev[4] < t_next:
            errs[f"{group.get(ev[1])}:{ev[2]}"] += 1
        elif ev[0] == "out" and ev[6] != "ok" and t0 <= ev[5] < t_next:
            errs[f"{group.get(ev[1])}:exit_{ev[6]}"] += 1
    out["errors"] = dict(errs)
    # Progress of every worker after the fault ended.
    first_after: dict[int, float] = {}
    for ev in events:
        if ev[0] in ("ready", "bye"):
            continue
        t = _t(ev)
        if t >= t1 and ev[1] not in first_after:
            first_after[ev[1]] = t
    delays = {}
    hung = []
    for w in workers.values():
        if w.role != "shared" or w.ready_at is None or w.ready_at > t1:
            continue
        if w.gone_at is not None and w.gone_at <= t1:
            continue
        d = first_after.get(w.idx)
        delays[w.idx] = None if d is None else d - t1
        if d is None or d - t1 > PROGRESS_BOUND:
            hung.append(w.idx)
    known = [d for d in delays.values() if d is not None]
    out["progress_max_s"] = max(known) if known else None
    out["hung_workers"] = hung
    # The cut-off / paused / killed holder.
    target = f.get("target") or {}
    if target.get("hid"):
        h = holds.get(target["hid"], {})
        lease = monitor.lease(SHARED, target.get("token")) or {}
        rel = {
            k: (v - t0 if isinstance(v, float) else v)
            for k, v in lease.items()
            if k in ("expires", "gone")
        }
        tgt = dict(target, **{"lease_" + k: v for k, v in rel.items()})
        tgt.update(
            outcome=h.get("outcome"),
            told=h.get("told"),
            lost_reason=h.get("lost_reason"),
            lost_at_write=h.get("lost_at_write"),
        )
        if h.get("t_told") is not None:
            tgt["told_at"] = h["t_told"] - t0
            if "expires" in rel:
                tgt["told_before_expiry_s"] = rel["expires"] - tgt["told_at"]
        if h.get("t_write") is not None:
            tgt["write_at"] = h["t_write"] - t0
        if h.get("t_exit") is not None:
            tgt["exit_at"] = h["t_exit"] - t0
        nxt = [x for x in holds.values() if role.get(x["idx"]) == "shared" and x["t_in"] > t0]
        if nxt:
            first = min(nxt, key=lambda x: x["t_in"])
            tgt["next_holder_in_at"] = first["t_in"] - t0
            tgt["next_token_above"] = first["token"] > (target.get("token") or 0)
        out["target"] = tgt
    elif target:
        victim = target["idx"]
        handed = [x for x in holds.values() if x["idx"] == victim and x["t_in"] >= t0]
        tgt = dict(target)
        if handed:
            h = min(handed, key=lambda x: x["t_in"])
            tgt.update(
                entered_at=h["t_in"] - t0,
                token=h["token"],
                outcome=h.get("outcome"),
                told=h.get("told"),
                lost_at_write=h.get("lost_at_write"),
                lost_reason=h.get("lost_reason"),
            )
            hi = max(
                (
                    x["token"]
                    for x in holds.values()
                    if role.get(x["idx"]) == "shared" and x["t_in"] < h["t_in"]
                ),
                default=0,
            )
            tgt["token_below_earlier_holder"] = h["token"] <= hi
        with monitor.lock:
            grants = [
                (tok, e)
                for (name, tok), e in monitor.leases.items()
                if name == SHARED and e.get("pid") == target.get("pid") and e["first"] >= t0
            ]
        if grants:
            tok, e = min(grants, key=lambda g: g[1]["first"])
            tgt["lock_handed_to_it_at"] = e["first"] - t0
            if e.get("gone") is not None:
                tgt["held_in_redis_s"] = e["gone"] - e["first"]
        out["target"] = tgt
    # The long holders: was the hold they had when the fault began lost, and when.
    longs = {}
    for g, name in LONG_NAMES.items():
        cand = [
            h
            for h in holds.values()
            if role.get(h["idx"]) == "long"
            and group.get(h["idx"]) == g
            and h["t_in"] < t0
            and h.get("t_exit", float("inf")) > t0
        ]
        if not cand:
            longs[g] = None
            continue
        h = max(cand, key=lambda x: x["t_in"])
        lost = h["told"] and h.get("t_told") is not None and h["t_told"] < t_next
        info: dict[str, Any] = {"token": h["token"], "lost": lost}
        if lost:
            info.update(outcome=h.get("outcome"), reason=h.get("lost_reason"))
            info["told_at"] = h["t_told"] - t0
            lease = monitor.lease(name, h["token"]) or {}
            if f["fault"] == "redis_restart_empty":
                info["lock_gone_with_data_at"] = t1 - t0  # no lease: the data is gone
            elif "expires" in lease:
                info["lease_expired_at"] = lease["expires"] - t0
                info["told_before_expiry_s"] = lease["expires"] - h["t_told"]
            again = [
                x["t_in"]
                for x in holds.values()
                if group.get(x["idx"]) == g and role.get(x["idx"]) == "long" and x["t_in"] > t0
            ]
            if again:
                info["held_again_at"] = min(again) - t0
        longs[g] = info
    out["long_holders"] = longs
    # Fencing tokens around a restart.
    if f["fault"].startswith("redis_restart"):
        before = [
            h["token"] for h in holds.values() if role.get(h["idx"]) == "shared" and h["t_in"] < t0
        ]
        after_h = sorted(
            (h for h in holds.values() if role.get(h["idx"]) == "shared" and h["t_in"] >= t1),
            key=lambda h: h["t_in"],
        )
        if before and after_h:
            hi = max(before)
            out["max_token_before"] = hi
            out["first_token_after"] = after_h[0]["token"]
            out["token_step"] = after_h[0]["token"] - hi
            out["grants_after_not_above_before"] = sum(1 for h in after_h if h["token"] <= hi)
            top = max(
                (h for h in holds.values() if role.get(h["idx"]) == "shared" and h["t_in"] < t0),
                key=lambda h: h["token"],
            )
            fresh = [h for h in after_h if (h["token"], h["idx"]) != (hi, top["idx"])]
            if fresh:
                out["first_other_grant_token_step"] = fresh[0]["token"] - hi
            out["reentered_surviving_hold"] = (after_h[0]["token"], after_h[0]["idx"]) == (
                hi,
                top["idx"],
            )
            if f.get("fence_counter_at_restart") is not None:
                out["fence_counter_at_restart_minus_max_before"] = (
                    f["fence_counter_at_restart"] - hi
                )
        longs_lost = [
            h
            for h in holds.values()
            if role.get(h["idx"]) == "long"
            and h.get("t_told") is not None
            and t0 <= h["t_told"] < t_next
        ]
        out["long_holders_told_at"] = {group[h["idx"]]: h["t_told"] - t1 for h in longs_lost}
    return out


def log_summary(base_dir: str) -> dict[str, Any]:
    """The workers' log lines by kind, and the busiest second of failed renewals."""
    counts: Counter[str] = Counter()
    per_second: Counter[tuple[str, int]] = Counter()
    for path in Path(base_dir).glob("worker-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            stamp, _, rest = line.partition(" ")
            message = rest.partition(" ")[2]  # without the thread's name
            if "renewal of" in message and "failed" in message:
                try:
                    per_second[(path.stem, int(float(stamp)))] += 1
                except ValueError:
                    pass
            text = re.sub(r"'[^']*'", "'…'", message)
            text = re.sub(r"\d+(\.\d+)?", "N", text)
            counts[text[:110]] += 1
    busiest = max(per_second.items(), key=lambda kv: kv[1], default=None)
    return {
        "lines": dict(counts.most_common(40)),
        "max_failed_renewals_in_one_second": busiest[1] if busiest else 0,
        "max_failed_renewals_worker": busiest[0][0] if busiest else None,
    }


# --------------------------------------------------------------------------------------
# Reporting.
# --------------------------------------------------------------------------------------


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def report(result: dict[str, Any]) -> str:
    lines = []
    cfg = result["config"]
    lines.append(
        f"Fault run: {cfg['minutes']:g} min, {cfg['shared_workers']} workers on {SHARED!r} "
        f"(ttl {TTL:g} s; half through the proxy) + 2 long holders; socket timeout "
        f"{SOCKET_TIMEOUT:g} s; Redis AOF everysec"
    )
    base = result["baseline"]
    lines.append(
        f"Quiet baseline: {fmt(base['cs_per_s'], 1)} CS/s, longest gap between entries "
        f"{fmt(base['longest_gap_s'], 3)} s"
    )
    lines.append("")
    head = (
        f"{'fault':24} {'dur':>5} {'recov':>6} {'prox':>6} {'dir':>6} {'gap':>6} "
        f"{'prog':>5} {'hung':>4}  long holders (told / lease end, s from start)  errors"
    )
    lines.append(head)
    lines.append("-" * len(head))
    for f in result["faults"]:
        longs = []
        for g, info in (f.get("long_holders") or {}).items():
            if info is None:
                longs.append(f"{g[0]}:-")
            elif info["lost"]:
                end = info.get("lease_expired_at", info.get("lock_gone_with_data_at"))
                longs.append(f"{g[0]}:lost {fmt(info.get('told_at'))}/{fmt(end)}")
            else:
                longs.append(f"{g[0]}:kept")
        errs = ",".join(f"{k}={v}" for k, v in sorted(f["errors"].items()))
        lines.append(
            f"{f['fault']:24} {fmt(f['duration_s'], 1):>5} {fmt(f['recovery_s']):>6} "
            f"{fmt(f['recovery_proxy_s']):>6} {fmt(f['recovery_direct_s']):>6} "
            f"{fmt(f['longest_gap_s']):>6} {fmt(f['progress_max_s'], 1):>5} "
            f"{len(f['hung_workers']):>4}  {' '.join(longs):42} {errs[:120]}"
        )
    lines.append("")
    lines.append(
        "recov = first critical section entered after the fault ended (prox/dir: by "
        "group); gap = longest stretch without any entry; prog = slowest worker's "
        "first report after the fault"
    )
    lines.append("")
    for f in result["faults"]:
        tgt = f.get("target")
        if tgt:
            keys = (
                "idx",
                "group",
                "token",
                "holding_confirmed",
                "lease_expires",
                "lease_gone",
                "told_at",
                "told_before_expiry_s",
                "write_at",
                "exit_at",
                "outcome",
                "lost_reason",
                "lost_at_write",
                "next_holder_in_at",
                "next_token_above",
                "lock_handed_to_it_at",
                "held_in_redis_s",
                "entered_at",
                "token_below_earlier_holder",
                "skipped",
            )
            parts = [f"{k}={fmt(tgt[k])}" for k in keys if k in tgt]
            lines.append(f"{f['fault']}: target " + " ".join(parts))
        if "token_step" in f:
            lines.append(
                f"{f['fault']}: fence counter at restart - highest token before: "
                f"{f.get('fence_counter_at_restart_minus_max_before')}; first grant after "
                f"re-entered the surviving hold of its owner: {f.get('reentered_surviving_hold')};"
                f" first grant to another owner: step {f.get('first_other_grant_token_step')}"
            )
            lines.append(
                f"{f['fault']}: max token before {f['max_token_before']}, first after "
                f"{f['first_token_after']} (step {f['token_step']:+d}); grants after the "
                f"restart not above the highest before: {f['grants_after_not_above_before']}; "
                f"long holders told (s after restart): "
                + ", ".join(f"{g} {v:.2f}" for g, v in f["long_holders_told_at"].items())
            )
    inv = result["invariants"]
    lines.append("")
    lines.append("Invariants (shared lock):")
    lines.append(f"  holds {inv['holds']}, fenced writes {inv['writes']}")
    lines.append(
        "  writes accepted twice with the same token (resource rejecting lower "
        f"tokens only): {inv['writes_accepted_twice_same_token']}"
    )
    lines.append(
        "  same, by one owner in two blocks (it re-entered a hold that survived its "
        f"failed release): {inv['writes_accepted_twice_same_token_same_owner']}"
    )
    lines.append(
        "  writes rejected by a strict fencing check (token not above the highest "
        f"seen): {inv['writes_rejected_by_strict_fencing']}"
    )
    lines.append(
        f"  entries with a token not above an earlier entry: "
        f"{inv['entries_with_token_not_above_earlier']}"
    )
    lines.append(f"  tokens granted more than once: {inv['tokens_granted_more_than_once']}")
    lines.append(f"  overlapping critical sections: {inv['overlaps']}")
    lines.append(f"  holds never finished (holder killed): {inv['holds_never_finished']}")
    lines.append(
        f"  hung workers after a fault: {result['hung_total']}; workers that did not "
        f"stop in time at the end: {result['not_stopped']}"
    )
    lines.append(f"  unexpected exceptions in workers: {result['unexpected_errors']}")
    logs = result["worker_logs"]
    lines.append(
        f"  worker log: {sum(logs['lines'].values())} lines; failed renewals logged by one "
        f"worker in one second, at most: {logs['max_failed_renewals_in_one_second']}"
    )
    lines.append("")
    lines.append("Verdict: " + ("; ".join(result["violations"]) or "no invariant violated"))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Main.
# --------------------------------------------------------------------------------------

FAULTS: list[tuple[str, float, float]] = [
    # (kind, argument, rough duration for planning)
    ("redis_pause", 0.5, 0.5),
    ("blackhole", 3.0, 3.0),
    ("holder_kill", 0.0, 2.0),
    ("redis_restart", 0.0, 0.5),  # AOF
    ("redis_pause", 2.0, 2.0),
    ("proxy_down", 2.0, 2.0),
    ("waiter_kill", 0.0, 2.0),
    ("holder_pause", 5.0, 5.0),
    ("redis_full", 2.0, 2.0),
    ("redis_pause", 4.0, 4.0),
    ("blackhole", 8.0, 8.0),
    ("waiter_pause", 5.0, 5.0),
    ("redis_restart", 1.0, 0.5),  # empty data directory
]


def git_state() -> dict[str, str]:
    def git(*args: str) -> str:
        try:
            out = subprocess.run(
                ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return out.stdout.strip()

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "subject": git("log", "-1", "--format=%s")[:120],
        "uncommitted_in_package_and_tests": git(
            "status", "--porcelain", "--", "django_redislock", "tests"
        ),
    }


def result_path(quick: bool) -> Path:
    stamp = time.strftime("%Y-%m-%d")
    base = ROOT / "benchmarks" / "results" / f"faults-{stamp}{'-quick' if quick else ''}"
    path = base.with_suffix(".json")
    if path.exists():
        path = Path(f"{base}-{time.strftime('%H%M%S')}.json")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="length (default 3)")
    parser.add_argument("--quick", action="store_true", help="smoke test, about a minute")
    parser.add_argument("--workers", type=int, default=8, help="workers on the shared lock")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep-logs", action="store_true", help="keep the workers' logs")
    parser.add_argument("--out", type=Path, default=None, help="JSON result path")
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes = 40 / 60
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    total = args.minutes * 60
    fault_time = sum(f[2] for f in FAULTS)
    min_quiet = 1.5 if args.quick else 4.0
    cycles = max(1, int(total // (fault_time + len(FAULTS) * 12.0)))
    quiet = max(min_quiet, (total - cycles * fault_time) / (cycles * len(FAULTS) + 1))
    schedule = FAULTS * cycles

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started ignoring it
    base_dir = tempfile.mkdtemp(prefix="fault-run-")
    run: Run | None = None
    started = time.time()
    try:
        run = Run(args, base_dir)
        run.hard_deadline = now() + total * 2 + 300  # workers stop by themselves after this
        run.recorder.thread.start()
        run.monitor.thread.start()
        workers = [
            run.spawn("shared", "proxy" if i % 2 == 0 else "direct") for i in range(args.workers)
        ]
        workers += [run.spawn("long", "proxy"), run.spawn("long", "direct")]
        if not run.wait_ready(workers, 90):
            raise RuntimeError("workers did not start within 90 s")
        print(
            f"redis-server on {run.redis.port}, proxy on {run.proxy.port}; "
            f"{len(schedule)} faults, quiet {quiet:.1f} s",
            flush=True,
        )
        t_begin = now()
        time.sleep(quiet)
        t_first_fault = now()
        for kind, arg, _ in schedule:
            f = run.fault(kind, arg)
            run.faults.append(f)
            print(
                f"  {f['fault']:24} at {f['t_start'] - t_begin:6.1f} s, "
                f"{f['t_end'] - f['t_start']:.2f} s{'  ' + f['skipped'] if 'skipped' in f else ''}",
                flush=True,
            )
            run.wait_recovered(f["t_end"], quiet)
        t_finish = now()
        run.stop_flag.value = 1
        deadline = now() + ACQUIRE_TIMEOUT + 10
        for w in run.workers.values():
            w.proc.join(max(0.0, deadline - now()))
        not_stopped = [w.idx for w in run.workers.values() if w.proc.is_alive()]
        time.sleep(0.3)  # the last messages
        run.refresh_ready()
        events = run.recorder.snapshot()
        holds = build_holds(events)
        shared = {w.idx for w in run.workers.values() if w.role == "shared"}
        faults_out = []
        for i, f in enumerate(run.faults):
            t_next = run.faults[i + 1]["t_start"] if i + 1 < len(run.faults) else t_finish
            faults_out.append(analyse_fault(f, t_next, events, holds, run.workers, run.monitor))
        invariants = check_invariants(holds, shared)
        base_in = sorted(
            h["t_in"]
            for h in holds.values()
            if h["idx"] in shared and t_begin <= h["t_in"] < t_first_fault
        )
        base_gaps = [b - a for a, b in zip(base_in, base_in[1:], strict=False)]
        unexpected = Counter(
            ev[2]
            for ev in events
            if ev[0] == "err" and str(ev[2]).startswith(("unexpected", "lock_error"))
        )
        hung_total = sum(len(f["hung_workers"]) for f in faults_out)
        violations = []
        if invariants["writes_accepted_twice_same_token"]:
            violations.append(
                f"{invariants['writes_accepted_twice_same_token']} fenced writes "
                "accepted twice with one token"
            )
        if invariants["writes_rejected_by_strict_fencing"]["holder_not_told"]:
            violations.append(
                f"{invariants['writes_rejected_by_strict_fencing']['holder_not_told']} "
                "fenced writes out of order from holders never told of a loss"
            )
        if invariants["tokens_granted_more_than_once"]["to_different_owners"]:
            violations.append(
                f"{invariants['tokens_granted_more_than_once']['to_different_owners']} "
                "tokens granted to two different owners"
            )
        if invariants["overlaps"]["nobody_told"]:
            violations.append(
                f"{invariants['overlaps']['nobody_told']} overlaps where no holder was told"
            )
        if hung_total:
            violations.append(f"{hung_total} hung worker(s) after faults")
        if not_stopped:
            violations.append(f"workers {not_stopped} did not stop at the end")
        if unexpected:
            violations.append(f"unexpected exceptions {dict(unexpected)}")
        for f in faults_out:
            if f.get("recovery_s") is None:
                violations.append(f"no recovery after {f['fault']}")
        err_totals: Counter[str] = Counter()
        for ev in events:
            if ev[0] == "err":
                err_totals[ev[2]] += 1
            elif ev[0] == "out" and ev[6] != "ok":
                err_totals["exit_" + ev[6]] += 1
        result: dict[str, Any] = {
            "benchmark": "fault_run",
            "command": "python benchmarks/fault_run.py " + " ".join(argv or sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
            "wall_s": time.time() - started,
            "machine": {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "redis_py": redis.__version__,
                "redis_server": run.redis.version(),
            },
            "git": git_state(),
            "config": {
                "minutes": args.minutes,
                "quick": args.quick,
                "seed": args.seed,
                "shared_workers": args.workers,
                "ttl_s": TTL,
                "acquire_timeout_s": ACQUIRE_TIMEOUT,
                "socket_timeout_s": SOCKET_TIMEOUT,
                "connect_timeout_s": CONNECT_TIMEOUT,
                "redis_py_retries": 0,
                "critical_section_s": [0.005, 0.020],
                "quiet_s": quiet,
                "cycles": cycles,
                "progress_bound_s": PROGRESS_BOUND,
                "redis": "appendonly yes, appendfsync everysec, save '', noeviction",
                "start_method": "spawn",
            },
            "baseline": {
                "cs_per_s": len(base_in) / (t_first_fault - t_begin),
                "longest_gap_s": max(base_gaps) if base_gaps else None,
                "median_gap_s": statistics.median(base_gaps) if base_gaps else None,
            },
            "faults": faults_out,
            "invariants": invariants,
            "hung_total": hung_total,
            "not_stopped": not_stopped,
            "unexpected_errors": dict(unexpected),
            "outcome_totals": dict(err_totals),
            "monitor_errors": run.monitor.errors,
            "worker_logs": log_summary(base_dir),
            "violations": violations,
        }
        if args.keep_logs:
            with open(os.path.join(base_dir, "events.json"), "w") as fh:
                json.dump({"events": events, "faults": run.faults}, fh, default=str)
        text = report(result)
        print()
        print(text)
        path = args.out or result_path(args.quick)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"\nJSON: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        return 1 if violations else 0
    except KeyboardInterrupt:
        print("\ninterrupted; cleaning up", file=sys.stderr)
        return 130
    finally:
        if run is not None:
            run.cleanup()
        if args.keep_logs:
            print(f"worker logs and Redis data kept in {base_dir}", file=sys.stderr)
        else:
            shutil.rmtree(base_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
