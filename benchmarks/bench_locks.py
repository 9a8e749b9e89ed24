#!/usr/bin/env python
"""Side-by-side benchmark: django-redislock vs redis-py Lock, python-redis-lock, pottery.

Everything runs in ONE invocation against ONE throw-away local redis-server, and
the libraries are interleaved (round-robin, rotating order) so that the noise of
a shared machine hits all of them alike. Report medians and ratios from the same
run, never absolute numbers from different runs.

Three experiments (issue 2, "Figures to report"):

1. ``uncontended``: one process, create + acquire + release of a free lock, timed
   per operation. Libraries rotate every ``--batch`` operations. The *floor* is
   the two round trips every lock needs: raw ``SET NX PX`` + ``EVALSHA``
   compare-and-delete.
2. ``contended``: N worker processes (forked once at start-up, idle until told)
   hammer ONE lock name for ``--duration`` seconds per (library, N). Each
   critical section does a non-atomic read-modify-write of a Redis counter
   (GET, sleep 1 ms, SET) so a broken mutual exclusion loses updates. Every
   process records CLOCK_MONOTONIC (shared by all processes on Linux) at acquire
   return, just before release and after release; from those we get hand-off
   latency (next holder's acquire return minus the previous holder's release
   call), overlaps (a second holder inside a critical section), per-process
   shares, and Redis commands per critical section (INFO stats).
3. ``wake``: a holder (process A) keeps the lock 200 ms while a waiter (process
   B) blocks in acquire; latency = B's acquire return minus A's release call.

Run from the repository root::

    .venv/bin/python benchmarks/bench_locks.py              # default, < ~4 min
    .venv/bin/python benchmarks/bench_locks.py --quick      # smoke test, ~40 s
    .venv/bin/python benchmarks/bench_locks.py --rounds 200 --duration 10 --reps 3

Before/after in one run: ``--baseline PATH`` (a ``git worktree`` of an older commit)
adds ``ours@baseline`` (our package imported from PATH) and ``ours@current`` (from
this tree) to every experiment. Both run in a spawned process per tree that forks
its own workers (the package name is the same, so they cannot share a process),
interleaved with the other libraries; compare the two with each other.

Results: a table on stdout and JSON in ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import logging
import multiprocessing as mp
import os
import platform
import random
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
_BENCH = str(Path(__file__).resolve().parent)
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)

# Before anything imports django_redislock: in a --baseline tree process, tree_pool
# puts that tree first on sys.path.
import redis  # noqa: E402
import tree_pool as T  # noqa: E402

CLOCK = time.CLOCK_MONOTONIC


def now_ns() -> int:
    """CLOCK_MONOTONIC in ns: one clock shared by every process on the host (Linux)."""
    return time.clock_gettime_ns(CLOCK)


# --------------------------------------------------------------------------------------
# Set-up shared by the parent and the (forked) workers.
# --------------------------------------------------------------------------------------

URL: str = ""
_R: redis.Redis | None = None
_MANAGER: Any = None


def configure(url: str) -> None:
    """Configure Django (standalone) and remember the Redis URL."""
    global URL
    URL = url
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["django_redislock"],
            CACHES={
                "default": {
                    "BACKEND": "django.core.cache.backends.redis.RedisCache",
                    "LOCATION": url,
                }
            },
            REDISLOCK_URL=url,
            USE_TZ=True,
            LOGGING_CONFIG=None,
        )
        django.setup()
    # pottery logs every blocking wait at INFO/WARNING; keep the table readable.
    logging.getLogger("pottery").setLevel(logging.ERROR)
    logging.getLogger("redis_lock").setLevel(logging.ERROR)


def client() -> redis.Redis:
    """This process's plain redis-py client (peers + counter + floor)."""
    global _R
    if _R is None:
        _R = redis.Redis.from_url(URL)
    return _R


def manager() -> Any:
    """This process's LockManager on the same URL (its own redis-py client)."""
    global _MANAGER
    if _MANAGER is None:
        from django_redislock import LockManager

        _MANAGER = LockManager(url=URL)
    return _MANAGER


def _reset_after_fork() -> None:
    global _R, _MANAGER
    _R = None
    _MANAGER = None


os.register_at_fork(after_in_child=_reset_after_fork)


# --------------------------------------------------------------------------------------
# Library adapters. ``make(name)`` returns a fresh lock object the way a user writes
# it (``with locks.lock(name):`` makes a new object every time), with .acquire() that
# blocks and .release().
# --------------------------------------------------------------------------------------

_CAD = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


class FloorLock:
    """The floor: raw SET NX PX + EVALSHA compare-and-delete (no blocking support)."""

    sha: str | None = None

    def __init__(self, name: str) -> None:
        self.r = client()
        self.key = name
        if FloorLock.sha is None:
            FloorLock.sha = self.r.script_load(_CAD)

    def acquire(self, blocking: bool = True) -> bool:
        self.token = secrets.token_hex(16)
        return bool(self.r.set(self.key, self.token, nx=True, px=30000))

    def release(self) -> None:
        if not self.r.evalsha(FloorLock.sha, 1, self.key, self.token):
            raise RuntimeError("floor: not owned")


class PotteryAdapter:
    def __init__(self, name: str) -> None:
        from pottery import Redlock

        self.lk = Redlock(key=name, masters={client()}, auto_release_time=30)

    def acquire(self, blocking: bool = True) -> bool:
        return self.lk.acquire(blocking=blocking, timeout=-1)

    def release(self) -> None:
        self.lk.release()


class OursRawScripts:
    """Our acquire and release scripts replayed raw (no Lock object): Lua + RTT only.

    The EVALSHA arguments are recorded from one real ``acquire()`` + ``release()``
    of our Lock (so this follows the engine's current script signature) and then
    replayed verbatim; replaying the same nonce is fine because the lock is free
    before every acquire.
    """

    _recorded: dict[str, list[tuple[Any, ...]]] = {}

    def __init__(self, name: str) -> None:
        self.client = manager().backend().client
        if name not in self._recorded:
            calls: list[tuple[Any, ...]] = []
            real = self.client.execute_command

            def recorder(*args: Any, **options: Any) -> Any:
                if args[0] == "EVALSHA":
                    calls.append(args[1:])
                return real(*args, **options)

            lk = manager().lock(name, ttl=30, auto_renew=False)
            lk.acquire()  # once unrecorded: loads the scripts (NOSCRIPT retries)
            lk.release()
            self.client.execute_command = recorder
            try:
                lk.acquire()
                lk.release()
            finally:
                del self.client.execute_command
            if len(calls) != 2:
                raise RuntimeError(f"expected 2 scripts per acquire+release, saw {len(calls)}")
            self._recorded[name] = calls
        self.acq_args, self.rel_args = self._recorded[name]

    def acquire(self, blocking: bool = True) -> bool:
        from django_redislock.engine.calls import decode_attempt

        return decode_attempt(self.client.evalsha(*self.acq_args))[0]

    def release(self) -> None:
        self.client.evalsha(*self.rel_args)


class Reused:
    """Wraps one long-lived lock object (acquire/release it again and again)."""

    def __init__(self, lk: Any) -> None:
        self.lk = lk

    def acquire(self, blocking: bool = True) -> bool:
        return self.lk.acquire(blocking=blocking)

    def release(self) -> None:
        self.lk.release()


_REUSED: dict[tuple[str, str], Any] = {}


def _reused(kind: str, name: str, factory: Callable[[], Any]) -> Any:
    key = (kind, name)
    if key not in _REUSED:
        _REUSED[key] = Reused(factory())
    return _REUSED[key]


def _prl(name: str, **kw: Any) -> Any:
    import redis_lock

    return redis_lock.Lock(client(), name, expire=30, **kw)


@dataclass(frozen=True)
class Lib:
    key: str
    label: str
    make: Callable[[str], Any]
    blocking: bool = True  # usable for the contended / wake experiments


LIBS: dict[str, Lib] = {
    lib.key: lib
    for lib in [
        Lib("floor", "floor: SET NX PX + EVALSHA CAD", FloorLock, blocking=False),
        Lib("redispy", "redis-py Lock (sleep 0.1)", lambda n: client().lock(n, timeout=30)),
        Lib(
            "redispy_1ms",
            "redis-py Lock (sleep 0.001)",
            lambda n: client().lock(n, timeout=30, sleep=0.001),
        ),
        Lib("prl", "python-redis-lock", lambda n: _prl(n)),
        Lib("prl_renew", "python-redis-lock auto_renewal", lambda n: _prl(n, auto_renewal=True)),
        Lib("pottery", "pottery Redlock", PotteryAdapter),
        Lib("ours", "ours auto_renew=True", lambda n: manager().lock(n, ttl=30, auto_renew=True)),
        Lib(
            "ours_unfair",
            "ours fair=False auto_renew=True",
            lambda n: manager().lock(n, ttl=30, auto_renew=True, fair=False),
        ),
        Lib(
            "ours_norenew",
            "ours auto_renew=False",
            lambda n: manager().lock(n, ttl=30, auto_renew=False),
        ),
        Lib(
            "ours_reused",
            "ours auto_renew=True, reused Lock",
            lambda n: _reused("ours", n, lambda: manager().lock(n, ttl=30, auto_renew=True)),
        ),
        Lib("ours_raw", "ours: raw acquire+release scripts", OursRawScripts, blocking=False),
    ]
}

UNCONTENDED_DEFAULT = [
    "floor",
    "redispy",
    "prl",
    "prl_renew",
    "pottery",
    "ours",
    "ours_norenew",
    "ours_reused",
    "ours_raw",
]
CONTENDED_DEFAULT = ["ours", "ours_unfair", "prl", "redispy", "redispy_1ms", "pottery"]
WAKE_DEFAULT = ["ours", "prl", "redispy", "redispy_1ms", "pottery"]

#: ``--baseline``: library keys run in a tree process (tree_pool.py).
TREE_ENV = T.TREE_ENV
REMOTE = T.REMOTE


# --------------------------------------------------------------------------------------
# Statistics helpers
# --------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return None
    s = sorted(values)
    idx = min(len(s) - 1, max(0, int(round(q / 100.0 * (len(s) - 1)))))
    return s[idx]


fmt = T.fmt


# --------------------------------------------------------------------------------------
# 1. Uncontended
# --------------------------------------------------------------------------------------


def uncontended_ops(lib_key: str, name: str, count: int) -> list[tuple[float, float]]:
    """*count* create + acquire + release of a free lock: (wall us, thread CPU us) each."""
    make = LIBS[lib_key].make
    blocking = lib_key not in ("floor", "ours_raw")
    thread_ns = time.thread_time_ns
    perf_ns = time.perf_counter_ns
    out = []
    for _ in range(count):
        c0 = thread_ns()
        t0 = perf_ns()
        lk = make(name)
        if not lk.acquire(blocking=blocking):
            raise RuntimeError(f"{lib_key}: uncontended acquire failed")
        lk.release()
        t1 = perf_ns()
        out.append(((t1 - t0) / 1000.0, (thread_ns() - c0) / 1000.0))
    return out


def _ops(k: str, name: str, count: int, untimed: int = 1) -> list[tuple[float, float]]:
    """uncontended_ops here, or in k's tree process (timed there, the same way), after
    *untimed* operations in the same place."""
    if k in REMOTE:
        tree, inner = REMOTE[k]
        return tree.uncontended(inner, name, count, untimed)
    return warm_ops(k, name, count, untimed)  # as in the tree processes


def bench_uncontended(libs: list[str], rounds: int, batch: int, warmup: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {k: [] for k in libs}
    cpu: dict[str, list[float]] = {k: [] for k in libs}
    per_round: dict[str, list[float]] = {k: [] for k in libs}
    names = {k: f"bench:u:{k}" for k in libs}

    for k in libs:  # warm-up: script loading, connections, threads, imports
        _ops(k, names[k], warmup)
    order = list(libs)
    started = time.monotonic()
    for _ in range(rounds):
        random.shuffle(order)
        for k in order:
            got = _ops(k, names[k], batch)
            mine = [wall for wall, _c in got]
            samples[k].extend(mine)
            cpu[k].extend(c for _w, c in got)
            per_round[k].append(statistics.median(mine))
    elapsed = time.monotonic() - started
    # Redis-side CPU and commands per operation, one short pass per library: the
    # server process's CPU (INFO cpu: every request's reading, running and reply; the
    # commands' own times in INFO commandstats would count a script's commands twice,
    # in the script's time and in their own), and the commands run, those inside Lua
    # too (INFO commandstats).
    r = client()
    server_us: dict[str, float] = {}
    commands: dict[str, float] = {}
    for k in libs:
        n = max(50, min(1500, rounds * batch))  # (the server's CPU is a total: many ops)
        r.config_resetstat()
        cpu0 = _redis_cpu(r)
        _ops(k, names[k], n, untimed=0)  # every operation counts
        server_us[k] = (_redis_cpu(r) - cpu0) * 1e6 / n
        stats = {
            name: v
            for name, v in r.info("commandstats").items()
            if "resetstat" not in name and "info" not in name
        }
        commands[k] = sum(v["calls"] for v in stats.values()) / n
    calls = {
        k: REMOTE[k][0].python_calls(REMOTE[k][1], names[k])
        if k in REMOTE
        else python_calls(k, names[k])
        for k in libs
    }
    floor_p50 = pct(samples["floor"], 50) if "floor" in samples else None
    rows = {}
    for k in libs:
        s = samples[k]
        p50, p90 = pct(s, 50), pct(s, 90)
        paired = (
            [a / b for a, b in zip(per_round[k], per_round["floor"], strict=True)]
            if "floor" in per_round
            else []
        )
        rows[k] = {
            "label": LIBS[k].label,
            "n": len(s),
            "p50_us": p50,
            "p90_us": p90,
            "p99_us": pct(s, 99),
            "mean_us": statistics.fmean(s),
            "ratio_p50_to_floor": (p50 / floor_p50) if floor_p50 else None,
            "ratio_p90_to_floor": (p90 / pct(samples["floor"], 90)) if floor_p50 else None,
            "paired_ratio_median": statistics.median(paired) if paired else None,
            "client_cpu_p50_us": pct(cpu[k], 50),
            "redis_cpu_us_per_op": server_us[k],
            "redis_commands_per_op": commands[k],
            "python_calls_per_op": calls[k]["total"],
            "our_python_calls_per_op": calls[k]["ours"],
        }
    T.paired_to_baseline(per_round, rows)
    return {"rounds": rounds, "batch": batch, "elapsed_s": elapsed, "rows": rows}


# --------------------------------------------------------------------------------------
# Worker processes (forked once, before the parent starts any thread)
# --------------------------------------------------------------------------------------


def _sleep_until(t_ns: int) -> None:
    while True:
        left = t_ns - now_ns()
        if left <= 0:
            return
        time.sleep(min(left / 1e9, 0.05))


def worker_contend(
    lib_key: str, name: str, counter: str, start_ns: int, end_ns: int, hard_end_ns: int
) -> dict[str, Any]:
    make = LIBS[lib_key].make
    r = client()
    r.ping()
    make(name)  # warm imports / script registration before the start
    recs: list[tuple[int, int, int]] = []
    _sleep_until(start_ns)
    sends0 = _SENDS[0]
    cpu0 = os.times()
    while now_ns() < end_ns:
        lk = make(name)
        if not lk.acquire():
            raise RuntimeError("blocking acquire returned False")
        t_acq = now_ns()
        v = int(r.get(counter) or 0)
        time.sleep(0.001)
        r.set(counter, v + 1)
        t_rel = now_ns()
        lk.release()
        recs.append((t_acq, t_rel, now_ns()))
        if t_rel > hard_end_ns:  # a library that wedges must not hang the run
            break
    cpu1 = os.times()
    return {
        "pid": os.getpid(),
        "recs": recs,
        "round_trips": _SENDS[0] - sends0,
        "cpu_s": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
    }


def worker_wake(
    role: str,
    lib_key: str,
    name: str,
    trials: int,
    hold_s: float,
    ev_held: Any,
    ev_waiting: Any,
    ev_done: Any,
) -> dict[str, Any]:
    make = LIBS[lib_key].make
    client().ping()
    make(name)
    out = []
    for _ in range(trials):
        if role == "holder":
            lk = make(name)
            if not lk.acquire():
                raise RuntimeError("holder could not acquire")
            t_held = now_ns()
            ev_held.set()
            _sleep_until(t_held + int(hold_s * 1e9))
            if not ev_waiting.wait(10):
                raise RuntimeError("waiter did not show up")
            ev_waiting.clear()
            t_rel = now_ns()
            lk.release()
            out.append((t_rel, now_ns()))
            if not ev_done.wait(30):
                raise RuntimeError("waiter never got the lock")
            ev_done.clear()
        else:
            if not ev_held.wait(10):
                raise RuntimeError("holder did not start")
            ev_held.clear()
            # Start waiting at a random moment of the hold, so a poller's phase is random
            # relative to the release (blocked for hold/2 .. hold).
            time.sleep(random.uniform(0, hold_s / 2))
            lk = make(name)
            ev_waiting.set()
            if not lk.acquire():
                raise RuntimeError("waiter: blocking acquire returned False")
            t_acq = now_ns()
            lk.release()
            out.append((t_acq,))
            ev_done.set()
    return {"recs": out}


_SENDS = [0]


def _count_round_trips() -> None:
    """Count requests sent by this process (a pipeline counts once; pub/sub pushes don't)."""
    from redis.connection import AbstractConnection

    orig = AbstractConnection.send_packed_command

    def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
        _SENDS[0] += 1
        return orig(self, command, check_health)

    AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]


def worker_main(conn: Any, events: tuple[Any, Any, Any]) -> None:
    logging.getLogger("pottery").setLevel(logging.ERROR)
    _count_round_trips()
    while True:
        if not conn.poll(3600):
            return
        cmd = conn.recv()
        op = cmd.pop("op")
        if op == "exit":
            return
        try:
            if op == "contend":
                res = worker_contend(**cmd)
            elif op == "wake":
                res = worker_wake(ev_held=events[0], ev_waiting=events[1], ev_done=events[2], **cmd)
            else:
                res = {"error": f"unknown op {op}"}
        except Exception as exc:  # report, don't die: the parent shows the error
            res = {"error": f"{type(exc).__name__}: {exc}"}
        conn.send(res)


class Pool:
    """*size* worker processes forked now, each running *target* (worker_main)."""

    def __init__(self, size: int, target: Callable[[Any, Any], None] | None = None) -> None:
        ctx = mp.get_context("fork")
        self.events = (ctx.Event(), ctx.Event(), ctx.Event())
        self.conns = []
        self.procs = []
        for _ in range(size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=target or worker_main, args=(child, self.events), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)

    def clear_events(self) -> None:
        for ev in self.events:
            ev.clear()

    def run(
        self, cmds: list[dict[str, Any]], timeout: float, clear_events: bool = False
    ) -> list[dict[str, Any]]:
        """Send *cmds* to the first len(cmds) workers and collect their answers."""
        if clear_events:
            self.clear_events()
        if len(cmds) > len(self.conns):
            raise RuntimeError(f"{len(cmds)} commands for a pool of {len(self.conns)}")
        for conn, cmd in zip(self.conns, cmds, strict=False):
            conn.send(cmd)
        out = []
        deadline = time.monotonic() + timeout
        for conn in self.conns[: len(cmds)]:
            if not conn.poll(max(0.1, deadline - time.monotonic())):
                raise RuntimeError("a worker did not answer in time")
            out.append(conn.recv())
        return out

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send({"op": "exit"})
            except Exception:
                pass
        for p in self.procs:
            p.join(2)
            if p.is_alive():
                p.terminate()


#: Code flags of generators and coroutines, whose every resumption is a "call" event.
_RESUMABLE = (
    inspect.CO_GENERATOR
    | inspect.CO_COROUTINE
    | inspect.CO_ASYNC_GENERATOR
    | inspect.CO_ITERABLE_COROUTINE
)


@contextmanager
def counting_calls() -> Iterator[dict[str, int]]:
    """Count the Python function calls this thread makes in the ``with`` block:
    ``total``, and ``ours`` (those in django_redislock's own code). A generator or a
    coroutine counts once, however often it is resumed (how often depends on when
    replies arrive)."""
    counts = {"total": 0, "ours": 0}
    started: set[Any] = set()  # the generator and coroutine frames seen (kept alive)

    def count(frame: Any, event: str, _arg: Any) -> None:
        if event != "call":
            return
        if frame.f_code.co_flags & _RESUMABLE:
            if frame in started:
                return
            started.add(frame)
        counts["total"] += 1
        if "django_redislock" in frame.f_code.co_filename:
            counts["ours"] += 1

    sys.setprofile(count)
    try:
        yield counts
    finally:
        started.clear()  # (what the frames kept alive is collected while still counted)
        sys.setprofile(None)


def fewest(counted: list[dict[str, int]]) -> dict[str, int]:
    """The fewest calls of several counted operations, figure by figure: what the
    operation itself makes, without work that happened to run during one of them
    (a collection, a reconnection, another task's callback)."""
    return {key: min(c[key] for c in counted) for key in counted[0]}


def python_calls(lib_key: str, name: str) -> dict[str, int]:
    """Python function calls made by one warm create + acquire + release of *lib_key*
    (see :func:`counting_calls`; the fewest of three). Counted, not timed: a change to
    our layer shows here however noisy the machine."""
    uncontended_ops(lib_key, name, 3)  # warm: scripts loaded, connections made
    make = LIBS[lib_key].make
    blocking = lib_key not in ("floor", "ours_raw")
    counted = []
    for _ in range(3):
        with counting_calls() as counts:
            lk = make(name)
            lk.acquire(blocking=blocking)
            lk.release()
            del lk  # (its collection is part of the operation)
        counted.append(counts)
    return fewest(counted)


def warm_ops(lib_key: str, name: str, count: int, untimed: int) -> list[tuple[float, float]]:
    """A batch of uncontended_ops after *untimed* untimed ones, so that every batch starts
    warm wherever it runs (the main process, a tree process: tree_pool.TreePool)."""
    if untimed:
        uncontended_ops(lib_key, name, untimed)
    return uncontended_ops(lib_key, name, count)


def tree_main(conn: Any, url: str, size: int) -> None:
    """A tree process (tree_pool.TreePool): django_redislock from $BENCH_REDISLOCK_TREE,
    its own fork Pool of *size* workers, uncontended operations run here."""
    configure(url)
    pool = Pool(size) if size else None  # forked before any connection or thread
    T.serve(conn, pool, {"uncontended": warm_ops, "calls": python_calls})


def _remote_only(name: str) -> Any:
    raise RuntimeError("ours@current / ours@baseline run in their tree process only")


_route = T.route


# --------------------------------------------------------------------------------------
# 2. Contended
# --------------------------------------------------------------------------------------


def _commands_processed(r: redis.Redis) -> int:
    return int(r.info("stats")["total_commands_processed"])


def cpu_seconds(info: dict[str, Any]) -> float:
    """The server process's CPU seconds so far, from its ``INFO cpu`` (user + system)."""
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _redis_cpu(r: redis.Redis) -> float:
    return cpu_seconds(r.info("cpu"))


def run_measured(
    runner: Any, cmds: list[dict[str, Any]], timeout: float
) -> tuple[list[dict[str, Any]], int, float]:
    """*cmds* run by *runner* (a Pool), with the commands Redis processed and the
    CPU seconds it spent meanwhile."""
    r = client()
    cmds0, cpu0 = _commands_processed(r), _redis_cpu(r)
    results = runner.run(cmds, timeout=timeout)
    return results, _commands_processed(r) - cmds0, _redis_cpu(r) - cpu0


def run_contended_once(
    pool: Pool, lib_key: str, n: int, duration: float, tag: str
) -> dict[str, Any]:
    r = client()
    name = f"bench:c:{lib_key}:{tag}"
    counter = f"bench:counter:{lib_key}:{tag}"
    r.delete(counter)
    start = now_ns() + int(0.5e9)
    end = start + int(duration * 1e9)
    hard_end = end + int(max(5.0, duration) * 1e9)
    runner, inner = _route(pool, lib_key)
    results, cmds, redis_cpu = run_measured(
        runner,
        [
            dict(
                op="contend",
                lib_key=inner,
                name=name,
                counter=counter,
                start_ns=start,
                end_ns=end,
                hard_end_ns=hard_end,
            )
            for _ in range(n)
        ],
        timeout=duration + 60,
    )
    errors = [res["error"] for res in results if "error" in res]
    counter_value = int(r.get(counter) or 0)
    recs = []  # (t_acq, t_rel_call, t_rel_return, worker index)
    per_proc = []
    for i, res in enumerate(results):
        got = res.get("recs", [])
        per_proc.append(len(got))
        recs.extend((a, b, c, i) for a, b, c in got)
    recs.sort()
    total = len(recs)
    handoff_ms, handoff_after_ret_ms = [], []
    overlaps = 0
    switches = 0
    for prev, nxt in zip(recs, recs[1:], strict=False):
        if nxt[0] < prev[1]:
            overlaps += 1  # the next holder returned from acquire before we released
            continue
        handoff_ms.append((nxt[0] - prev[1]) / 1e6)
        handoff_after_ret_ms.append((nxt[0] - prev[2]) / 1e6)
        switches += nxt[3] != prev[3]
    span = (recs[-1][2] - recs[0][0]) / 1e9 if total > 1 else duration
    body_ms = [(rec[1] - rec[0]) / 1e6 for rec in recs]
    fewest, most = (min(per_proc), max(per_proc)) if per_proc else (0, 0)
    return {
        "lib": lib_key,
        "label": LIBS[lib_key].label,
        "n": n,
        "duration_s": duration,
        "critical_sections": total,
        "cs_per_s": total / duration,
        "handoff_p50_ms": pct(handoff_ms, 50),
        "handoff_p90_ms": pct(handoff_ms, 90),
        "handoff_p99_ms": pct(handoff_ms, 99),
        "handoff_from_release_return_p50_ms": pct(handoff_after_ret_ms, 50),
        "cs_body_p50_ms": pct(body_ms, 50),
        "fewest": fewest,
        "most": most,
        "fewest_most_ratio": (fewest / most) if most else None,
        "holder_changes_pct": 100.0 * switches / max(1, total - 1),
        "lost_updates": total - counter_value,
        "overlaps": overlaps,
        "redis_cmds_per_cs": cmds / total if total else None,
        "round_trips_per_cs": (
            sum(res.get("round_trips", 0) for res in results) / total if total else None
        ),
        "client_cpu_ms_per_cs": (
            1000 * sum(res.get("cpu_s", 0.0) for res in results) / total if total else None
        ),
        "redis_cpu_ms_per_cs": 1000 * redis_cpu / total if total else None,
        "span_s": span,
        "errors": errors,
    }


def bench_contended(
    pool: Pool,
    libs: list[str],
    ns: list[int],
    duration: float,
    reps: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    order = list(libs)
    for rep in range(reps):
        for n in ns:
            random.shuffle(order)
            for k in order:
                res = run_contended_once(pool, k, n, duration, f"{n}:{rep}")
                runs.append(res)
                log(
                    f"  contended N={n:<3} rep {rep + 1}/{reps} {res['label']:<32} "
                    f"{res['cs_per_s']:7.1f} CS/s  handoff p50 {fmt(res['handoff_p50_ms'], 2)} ms  "
                    f"fewest/most {res['fewest']}/{res['most']}  lost {res['lost_updates']}"
                    + (f"  ERRORS {res['errors'][:1]}" if res["errors"] else "")
                )
    # Aggregate: median over reps of each metric (reps=1: the run itself).
    agg: dict[str, dict[str, Any]] = {}
    for n in ns:
        for k in libs:
            mine = [r for r in runs if r["lib"] == k and r["n"] == n]
            row: dict[str, Any] = {"lib": k, "label": LIBS[k].label, "n": n, "reps": len(mine)}
            for field in (
                "cs_per_s",
                "handoff_p50_ms",
                "handoff_p90_ms",
                "handoff_p99_ms",
                "handoff_from_release_return_p50_ms",
                "fewest_most_ratio",
                "cs_body_p50_ms",
                "holder_changes_pct",
                "redis_cmds_per_cs",
                "round_trips_per_cs",
                "client_cpu_ms_per_cs",
                "redis_cpu_ms_per_cs",
                "fewest",
                "most",
            ):
                vals = [r[field] for r in mine if r[field] is not None]
                row[field] = statistics.median(vals) if vals else None
            row["lost_updates"] = sum(r["lost_updates"] for r in mine)
            row["overlaps"] = sum(r["overlaps"] for r in mine)
            row["critical_sections"] = sum(r["critical_sections"] for r in mine)
            row["errors"] = [e for r in mine for e in r["errors"]]
            agg[f"{k}@{n}"] = row
    return {"duration_s": duration, "reps": reps, "ns": ns, "runs": runs, "rows": agg}


# --------------------------------------------------------------------------------------
# 3. Wake latency
# --------------------------------------------------------------------------------------


def bench_wake(
    pool: Pool, libs: list[str], trials: int, hold_s: float, chunk: int, log: Callable[[str], None]
) -> dict[str, Any]:
    lat: dict[str, list[float]] = {k: [] for k in libs}
    lat_ret: dict[str, list[float]] = {k: [] for k in libs}
    rel_rtt: dict[str, list[float]] = {k: [] for k in libs}
    errors: dict[str, list[str]] = {k: [] for k in libs}
    order = list(libs)
    done = 0
    while done < trials:
        t = min(chunk, trials - done)
        random.shuffle(order)
        for k in order:
            name = f"bench:w:{k}"
            runner, inner = _route(pool, k)
            common = dict(lib_key=inner, name=name, trials=t, hold_s=hold_s)
            cmds = [
                dict(op="wake", role="holder", **common),
                dict(op="wake", role="waiter", **common),
            ]
            timeout = t * (hold_s + 2) + 30
            res = runner.run(cmds, timeout, clear_events=True)
            if any("error" in x for x in res):
                errors[k].extend(x["error"] for x in res if "error" in x)
                continue
            pairs = zip(res[0]["recs"], res[1]["recs"], strict=False)
            for (t_rel, t_rel_ret), (t_acq,) in pairs:
                lat[k].append((t_acq - t_rel) / 1e6)
                lat_ret[k].append((t_acq - t_rel_ret) / 1e6)
                rel_rtt[k].append((t_rel_ret - t_rel) / 1e6)
        done += t
        log(f"  wake: {done}/{trials} trials per library")
    rows = {}
    for k in libs:
        rows[k] = {
            "label": LIBS[k].label,
            "n": len(lat[k]),
            "p50_ms": pct(lat[k], 50),
            "p90_ms": pct(lat[k], 90),
            "max_ms": max(lat[k]) if lat[k] else None,
            "from_release_return_p50_ms": pct(lat_ret[k], 50),
            "release_call_p50_ms": pct(rel_rtt[k], 50),
            "errors": errors[k],
        }
    return {"trials": trials, "hold_s": hold_s, "rows": rows}


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=False))
        )

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _calls(row: dict[str, Any]) -> str:
    """Python calls per operation, and ours among them ("-": not counted in that run)."""
    total = row.get("python_calls_per_op")
    if total is None:
        return "-"
    ours = row.get("our_python_calls_per_op") or 0
    return f"{total} ({ours})" if ours else str(total)


def report(results: dict[str, Any]) -> str:
    out = []
    u = results.get("uncontended")
    if u:
        out.append(
            f"\n1. Uncontended create+acquire+release, one process "
            f"({u['rounds']} rounds x {u['batch']} ops per library, interleaved)"
        )
        rows = [
            [
                r["label"],
                fmt(r["p50_us"]),
                fmt(r["p90_us"]),
                fmt(r["ratio_p50_to_floor"], 2) + "x",
                fmt(r["ratio_p90_to_floor"], 2) + "x",
                fmt(r["paired_ratio_median"], 2) + "x",
                fmt(r["client_cpu_p50_us"]),
                fmt(r["redis_cpu_us_per_op"]),
                fmt(r.get("redis_commands_per_op"), 1),
                _calls(r),
                str(r["n"]),
            ]
            for r in u["rows"].values()
        ]
        out.append(
            table(
                [
                    "library",
                    "p50 us",
                    "p90 us",
                    "p50/floor",
                    "p90/floor",
                    "paired",
                    "client CPU us",
                    "Redis CPU us",
                    "Redis cmds",
                    "Py calls (ours)",
                    "samples",
                ],
                rows,
            )
        )
    c = results.get("contended")
    if c:
        out.append(
            f"\n2. Contended: N processes, one name, 1 ms critical section + GET/SET counter, "
            f"{c['duration_s']:g} s per library per N, {c['reps']} rep(s) (medians over reps)"
        )
        rows = []
        for r in c["rows"].values():
            rows.append(
                [
                    f"{r['label']} N={r['n']}",
                    fmt(r["cs_per_s"]),
                    fmt(r["handoff_p50_ms"], 2),
                    fmt(r["handoff_p90_ms"], 2),
                    fmt(r["cs_body_p50_ms"], 2),
                    f"{fmt(r['fewest'], 0)}/{fmt(r['most'], 0)}",
                    fmt(r["fewest_most_ratio"], 2),
                    fmt(r["holder_changes_pct"], 0),
                    fmt(r["round_trips_per_cs"], 1),
                    fmt(r["redis_cmds_per_cs"], 1),
                    fmt(r["client_cpu_ms_per_cs"], 2),
                    fmt(r["redis_cpu_ms_per_cs"], 2),
                    str(r["lost_updates"]),
                    str(r["overlaps"]),
                    "ERR" if r["errors"] else "",
                ]
            )
        out.append(
            table(
                [
                    "library",
                    "CS/s",
                    "handoff p50 ms",
                    "p90 ms",
                    "CS body ms",
                    "fewest/most",
                    "ratio",
                    "switch %",
                    "RTT/CS",
                    "Redis cmds/CS",
                    "client CPU ms/CS",
                    "Redis CPU ms/CS",
                    "lost",
                    "overlap",
                    "",
                ],
                rows,
            )
        )
    w = results.get("wake")
    if w:
        out.append(
            f"\n3. Wake latency: waiter blocked on a lock held {w['hold_s'] * 1000:.0f} ms "
            f"(acquire return - release call), {w['trials']} trials per library"
        )
        rows = [
            [
                r["label"],
                fmt(r["p50_ms"], 2),
                fmt(r["p90_ms"], 2),
                fmt(r["max_ms"], 2),
                fmt(r["from_release_return_p50_ms"], 2),
                fmt(r["release_call_p50_ms"], 2),
                str(r["n"]),
                "ERR" if r["errors"] else "",
            ]
            for r in w["rows"].values()
        ]
        out.append(
            table(
                [
                    "library",
                    "p50 ms",
                    "p90 ms",
                    "max ms",
                    "p50 from release reply",
                    "release call p50 ms",
                    "trials",
                    "",
                ],
                rows,
            )
        )
    out.extend(before_after(results))
    t = results.get("targets")
    if t:
        out.append("\nTargets for ours:")
        for item in t:
            out.append(f"  [{'PASS' if item['ok'] else 'MISS'}] {item['what']}: {item['value']}")
    return "\n".join(out)


#: --baseline: the contended and wake figures in the before/after table.
_CONTENDED_COMPARED = (
    ("cs_per_s", "CS/s", 1),
    ("handoff_p50_ms", "hand-off p50 ms", 3),
    ("handoff_p90_ms", "hand-off p90 ms", 3),
    ("fewest_most_ratio", "fewest/most", 2),
    ("round_trips_per_cs", "round trips/CS", 1),
    ("redis_cmds_per_cs", "Redis commands/CS", 1),
    ("client_cpu_ms_per_cs", "client CPU ms/CS", 3),
)
_WAKE_COMPARED = T.WAKE_COMPARED


def before_after(results: dict[str, Any]) -> list[str]:
    """``--baseline``: ours@current vs ours@baseline, same run, same process model."""
    trees = results.get("baseline")
    if not trees:
        return []
    cur, base = T.CURRENT, T.BASELINE
    out = T.before_after_head(trees)
    rows = T.uncontended_rows(results.get("uncontended", {}).get("rows", {}))
    c = results.get("contended", {}).get("rows", {})
    for n in results.get("contended", {}).get("ns", []):
        a, b = c.get(f"{cur}@{n}"), c.get(f"{base}@{n}")
        rows += T.compare_rows(f"contended N={n}", a, b, _CONTENDED_COMPARED)
        if a and b:
            rows.append(T.lost_row(f"contended N={n}", a, b))
    w = results.get("wake", {}).get("rows", {})
    rows += T.compare_rows("wake", w.get(cur), w.get(base), _WAKE_COMPARED)
    out.append(table(T.BEFORE_AFTER_HEADERS, rows))
    return out


def check_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    t: list[dict[str, Any]] = []
    u = results.get("uncontended", {}).get("rows", {})
    if "ours" in u and u["ours"]["ratio_p50_to_floor"] is not None:
        v = u["ours"]["ratio_p50_to_floor"]
        t.append(
            {
                "what": "uncontended p50 within 1.25x of the floor (auto_renew=True)",
                "value": f"{v:.2f}x",
                "ok": v <= 1.25,
            }
        )
    c = results.get("contended", {}).get("rows", {})
    for n in results.get("contended", {}).get("ns", []):
        t.extend(unfair_targets(c, n))
        ours = c.get(f"ours@{n}")
        if not ours:
            continue
        fair_peers = [
            r
            for k, r in c.items()
            if r["n"] == n
            and not r["lib"].startswith("ours")
            and (r["fewest_most_ratio"] or 0) >= 0.7
            and r["lost_updates"] == 0
        ]
        best = max((r["cs_per_s"] for r in fair_peers), default=0.0)
        t.append(
            {
                "what": f"N={n}: CS/s above every non-starving peer",
                "value": f"{ours['cs_per_s']:.0f} vs best fair peer {best:.0f}"
                + (
                    f" ({', '.join(r['label'] for r in fair_peers)})"
                    if fair_peers
                    else " (no peer kept fewest/most >= 0.7)"
                ),
                "ok": ours["cs_per_s"] > best,
            }
        )
        hp = ours["handoff_p50_ms"]
        t.append(
            {
                "what": f"N={n}: handoff p50 < 0.5 ms",
                "value": f"{fmt(hp, 3)} ms",
                "ok": hp is not None and hp < 0.5,
            }
        )
        fr = ours["fewest_most_ratio"]
        t.append(
            {
                "what": f"N={n}: fewest/most >= 0.7",
                "value": fmt(fr, 2),
                "ok": fr is not None and fr >= 0.7,
            }
        )
        t.append(
            {
                "what": f"N={n}: zero lost updates / overlaps",
                "value": f"{ours['lost_updates']} lost, {ours['overlaps']} overlaps",
                "ok": ours["lost_updates"] == 0 and ours["overlaps"] == 0,
            }
        )
    w = results.get("wake", {}).get("rows", {})
    if "ours" in w and w["ours"]["p50_ms"] is not None:
        t.append(
            {
                "what": "wake after a 200 ms hold within 1 ms (p50)",
                "value": f"{w['ours']['p50_ms']:.3f} ms",
                "ok": w["ours"]["p50_ms"] < 1.0,
            }
        )
    return t + regression_checks(results)


#: Issue 9: ``fair=False`` must beat these peers (both barge or poll) in CS/s.
UNFAIR_PEERS = ("prl", "redispy", "redispy_1ms")


def unfair_targets(c: dict[str, dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """``ours_unfair`` at N=*n*: CS/s above python-redis-lock and redis-py ``Lock``
    (each variant that ran), no lost update nor overlap. Fairness is not a target
    of a barging lock: its fewest/most is shown, not checked."""
    mine = c.get(f"ours_unfair@{n}")
    if not mine:
        return []
    peers = [c[f"{k}@{n}"] for k in UNFAIR_PEERS if f"{k}@{n}" in c]
    best = max(peers, key=lambda r: r["cs_per_s"] or 0.0, default=None)
    out = []
    if best is not None:
        out.append(
            {
                "what": f"N={n}: fair=False CS/s above python-redis-lock and redis-py Lock",
                "value": f"{mine['cs_per_s']:.0f} vs {best['cs_per_s']:.0f} ({best['label']})",
                "ok": mine["cs_per_s"] > best["cs_per_s"],
            }
        )
    out.append(
        {
            "what": f"N={n}: fair=False zero lost updates / overlaps",
            "value": f"{mine['lost_updates']} lost, {mine['overlaps']} overlaps",
            "ok": mine["lost_updates"] == 0 and mine["overlaps"] == 0,
        }
    )
    return out


#: --baseline: how much worse than the baseline (same run) still counts as no regression.
NO_REGRESSION_TOLERANCE = 0.05


def regression_checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    """ours@current vs ours@baseline: within NO_REGRESSION_TOLERANCE of the baseline."""
    cur, base, tol = "ours@current", "ours@baseline", NO_REGRESSION_TOLERANCE
    t: list[dict[str, Any]] = []

    def worse(what: str, a: float | None, b: float | None, higher_is_better: bool) -> None:
        if a is None or not b:
            return
        ratio = a / b
        ok = ratio >= 1 - tol if higher_is_better else ratio <= 1 + tol
        t.append(
            {
                "what": f"no sync regression ({tol:.0%} tolerance): {what}",
                "value": f"current/baseline {ratio:.3f}x",
                "ok": ok,
            }
        )

    u = results.get("uncontended", {}).get("rows", {})
    if cur in u and base in u:
        worse("uncontended p50", u[cur]["p50_us"], u[base]["p50_us"], False)
        paired = u[cur].get("paired_ratio_to_baseline")
        if paired is not None:
            worse("uncontended paired ratio", paired, 1.0, False)
    c = results.get("contended", {}).get("rows", {})
    for n in results.get("contended", {}).get("ns", []):
        a, b = c.get(f"{cur}@{n}"), c.get(f"{base}@{n}")
        if a and b:
            worse(f"N={n} CS/s", a["cs_per_s"], b["cs_per_s"], True)
            worse(f"N={n} hand-off p50", a["handoff_p50_ms"], b["handoff_p50_ms"], False)
    w = results.get("wake", {}).get("rows", {})
    if cur in w and base in w:
        worse("wake p50", w[cur]["p50_ms"], w[base]["p50_ms"], False)
    return t


def pin_processes() -> str:
    """``--pin``: the Redis server's main thread on the first CPU this process may use,
    this process and every process it starts afterwards on the others (inherited by
    forked and spawned children). Unpinned, one of two tree processes of the same
    tree could run an asyncio cycle a fifth faster than the other, which one varying
    from run to run (likely where the scheduler placed it relative to Redis); pinned,
    they measure alike (benchmarks/README.md). Returns what was done, for the results."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return "not pinned: one CPU"
    server_pid = int(client().info("server")["process_id"])
    try:
        os.sched_setaffinity(server_pid, {cpus[0]})
    except OSError as exc:  # not a process of this machine's (or not ours to pin)
        return f"not pinned: redis-server pid {server_pid}: {exc}"
    os.sched_setaffinity(0, set(cpus[1:]))
    return f"redis-server (pid {server_pid}) on CPU {cpus[0]}, the benchmark on {cpus[1:]}"


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import importlib.metadata as md

        info["versions"] = {
            p: md.version(p)
            for p in ("redis", "python-redis-lock", "pottery", "Django", "django-redislock")
        }
    except Exception:
        pass
    try:
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        info["engine_uncommitted_changes"] = subprocess.run(
            ["git", "status", "--porcelain", "--", "django_redislock"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.split("\n")[:-1]
    except Exception:
        pass
    return info


def redis_server(url: str | None) -> tuple[Any, str]:
    """(None, *url*), or a throw-away redis-server started now and its URL."""
    if url is not None:
        return None, url
    from tests.redis_server import RedisServer

    server = RedisServer()
    return server, server.url


def write_json(results: dict[str, Any], out: str | None, pattern: str) -> None:
    """Write *results* to *out*, or ``benchmarks/results/<strftime(pattern)>``; say where."""
    path = Path(out) if out else ROOT / "benchmarks" / "results" / time.strftime(pattern)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=str))
    print(f"JSON: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--only",
        default="uncontended,wake,contended",
        help="experiments to run, comma-separated (uncontended,wake,contended)",
    )
    ap.add_argument("--rounds", type=int, default=400, help="uncontended: rounds (default 400)")
    ap.add_argument("--batch", type=int, default=4, help="uncontended: ops per library per round")
    ap.add_argument("--warmup", type=int, default=50, help="uncontended: warm-up ops per library")
    ap.add_argument("--ns", default="8,32", help="contended: process counts (default 8,32)")
    ap.add_argument(
        "--duration", type=float, default=5.0, help="contended: seconds per library per N"
    )
    ap.add_argument("--reps", type=int, default=1, help="contended: interleaved repetitions")
    ap.add_argument("--trials", type=int, default=30, help="wake: trials per library")
    ap.add_argument(
        "--hold", type=float, default=0.2, help="wake: how long the holder keeps the lock (s)"
    )
    ap.add_argument("--uncontended-libs", default=",".join(UNCONTENDED_DEFAULT))
    ap.add_argument("--contended-libs", default=",".join(CONTENDED_DEFAULT))
    ap.add_argument("--wake-libs", default=",".join(WAKE_DEFAULT))
    ap.add_argument("--quick", action="store_true", help="small smoke-test sizes")
    ap.add_argument("--redis-url", default=None, help="use this Redis instead of starting one")
    ap.add_argument(
        "--out", default=None, help="JSON output path (default benchmarks/results/<stamp>.json)"
    )
    ap.add_argument("--no-json", action="store_true")
    ap.add_argument(
        "--own-process",
        default="",
        metavar="LIBS",
        help="uncontended: also run each of these libraries (comma-separated) alone in a "
        "spawned process of its own, as <lib>@own: warm caches, as ours@current and "
        "ours@baseline have (the in-process rows interleave every library in one process)",
    )
    T.add_argument(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.duration, args.trials = 60, 1.5, 6
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    ns = [int(x) for x in args.ns.split(",") if x.strip()]
    lib_lists = {
        "uncontended": [k for k in args.uncontended_libs.split(",") if k],
        "contended": [k for k in args.contended_libs.split(",") if k],
        "wake": [k for k in args.wake_libs.split(",") if k],
    }
    baseline = T.baseline_path(ap, args.baseline)
    if baseline is not None:
        for libs in lib_lists.values():
            libs.extend(k for k in ("ours@current", "ours@baseline") if k not in libs)

    def log(msg: str) -> None:
        print(msg, flush=True)

    server, url = redis_server(args.redis_url)
    configure(url)
    results: dict[str, Any] = {"machine": machine_info(), "args": vars(args), "redis_url": url}
    results["machine"]["redis_server"] = client().info("server").get("redis_version")
    client().flushdb()
    log(
        f"redis {results['machine']['redis_server']} at {url}; {os.cpu_count()} CPUs; "
        f"load {results['machine']['loadavg_at_start']}"
    )

    # Fork the workers first, while this process has no threads and no connections.
    pool = None
    size = (max(ns + [2]) if "contended" in only else 2) if only & {"contended", "wake"} else 0
    if size:
        pool = Pool(size)
    trees: list[T.TreePool] = []
    if baseline is not None:
        # Spawned (not forked): each imports django_redislock from its own tree.
        trees, results["baseline"] = T.start_trees(ROOT, baseline, tree_main, (url, size), log)
        for key, (tp, _inner) in T.REMOTE.items():
            label = f"{key} {tp.info.get('commit', '?')} auto_renew=True"
            LIBS[key] = Lib(key, label, _remote_only)
    for key in (k for k in args.own_process.split(",") if k):
        if key not in LIBS:
            ap.error(f"--own-process: unknown library {key!r}")
        log(f"starting the {key}@own process ...")
        trees.append(T.TreePool(ROOT, tree_main, url, 0))
        T.REMOTE[f"{key}@own"] = (trees[-1], key)
        LIBS[f"{key}@own"] = Lib(f"{key}@own", f"{LIBS[key].label}, own process", _remote_only)
        lib_lists["uncontended"].append(f"{key}@own")
    started = time.monotonic()
    try:
        if "uncontended" in only:
            libs = lib_lists["uncontended"]
            log(
                f"1. uncontended: {len(libs)} libraries x {args.rounds} rounds "
                f"x {args.batch} ops ..."
            )
            gc.collect()
            results["uncontended"] = bench_uncontended(libs, args.rounds, args.batch, args.warmup)
        if "wake" in only:
            assert pool is not None
            libs = lib_lists["wake"]
            log(f"3. wake latency: {len(libs)} libraries x {args.trials} trials ...")
            results["wake"] = bench_wake(pool, libs, args.trials, args.hold, chunk=5, log=log)
        if "contended" in only:
            assert pool is not None
            libs = lib_lists["contended"]
            log(
                f"2. contended: {len(libs)} libraries x N={ns} x {args.duration:g} s "
                f"x {args.reps} rep(s) ..."
            )
            results["contended"] = bench_contended(pool, libs, ns, args.duration, args.reps, log)
    finally:
        for tp in trees:
            tp.close()
        if pool is not None:
            pool.close()
        if server is not None:
            server.stop()
    results["elapsed_s"] = time.monotonic() - started
    results["machine"]["loadavg_at_end"] = os.getloadavg()
    results["targets"] = check_targets(results)
    print(report(results))
    print(
        f"\n(total {results['elapsed_s']:.0f} s; "
        f"load average at end {results['machine']['loadavg_at_end']})"
    )
    if not args.no_json:
        write_json(
            results,
            args.out,
            "locks-before-after-%Y-%m-%d-%H%M%S.json"
            if baseline is not None
            else "locks-%Y-%m-%d-%H%M%S.json",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
