#!/usr/bin/env python
"""Side-by-side asyncio benchmark: our aacquire/arelease vs redis.asyncio Lock and pottery.

Everything runs in ONE invocation against ONE throw-away local redis-server, and
the libraries are interleaved (shuffled order every round / chunk) so that the
noise of a shared machine hits all of them alike, like ``bench_locks.py``.
Report medians and ratios from the same run, never absolute numbers from
different runs.

Three experiments:

1. ``uncontended``: one event loop in one process, create + acquire + release of
   a free lock, timed per operation. The *floor* is the two round trips every
   lock needs, on ``redis.asyncio``: ``SET key token NX PX 30000`` + ``EVALSHA``
   compare-and-delete.
2. ``handoff``: N asyncio tasks contend for ONE name for ``--duration`` seconds
   per (library, N, layout); the critical section is ``GET counter``,
   ``await asyncio.sleep(0.001)``, ``SET counter v+1`` (a broken mutual exclusion
   loses updates). Layout ``1p``: all N tasks in one event loop of one process;
   ``2p``: N/2 tasks in each of two processes. Every task records
   CLOCK_MONOTONIC (one clock for every process on Linux) at acquire return, at
   the release call and after it: hand-off latency = next holder's acquire
   return - previous holder's release call; overlaps; lost updates.
3. ``wake``: a holder task keeps the lock 200 ms while a waiter task blocks in
   acquire; latency = the waiter's acquire return - the holder's release call.
   ``xproc``: holder and waiter in two processes; ``same``: two tasks of one
   event loop.

Run from the repository root::

    .venv/bin/python benchmarks/bench_async.py              # default, about 3 minutes
    .venv/bin/python benchmarks/bench_async.py --quick      # smoke test, < 40 s

Before/after in one run: ``--baseline PATH`` (a ``git worktree`` of an older commit)
adds ``ours@baseline`` (our package imported from PATH) and ``ours@current`` (from
this tree) to every experiment, the way ``bench_locks.py --baseline`` does
(``tree_pool.py``): a spawned process per tree runs the uncontended operations in an
event loop of its own and forks its own hand-off / wake workers; compare the two with
each other.

Results: a table on stdout and JSON in ``benchmarks/results/async-<date>.json``.
Our library is skipped (with a note) when ``Lock`` has no ``aacquire``; pottery's
``AIORedlock`` likewise when pottery does not have it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import logging
import os
import random
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT / "benchmarks", ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

# First, before anything imports django_redislock: in a --baseline tree process,
# bench_locks imports tree_pool, which puts that tree first on sys.path.
import bench_locks as B  # noqa: E402
import redis  # noqa: E402
import redis.asyncio  # noqa: E402
import tree_pool as T  # noqa: E402

now_ns = B.now_ns
pct = B.pct
fmt = B.fmt
table = B.table

# --------------------------------------------------------------------------------------
# Per-process set-up (reset in forked workers)
# --------------------------------------------------------------------------------------

URL = ""
_MANAGER: Any = None


def configure(url: str) -> None:
    global URL
    URL = url
    B.configure(url)
    logging.getLogger("pottery").setLevel(logging.ERROR)


def manager() -> Any:
    """This process's LockManager on URL (it makes one redis.asyncio client per loop)."""
    global _MANAGER
    if _MANAGER is None:
        from django_redislock import LockManager

        _MANAGER = LockManager(url=URL)
    return _MANAGER


def _reset_after_fork() -> None:
    global _MANAGER
    _MANAGER = None


os.register_at_fork(after_in_child=_reset_after_fork)


class Ctx:
    """What one event loop uses: a redis.asyncio client (peers, counter, floor) + our manager."""

    def __init__(self) -> None:
        self.r = redis.asyncio.Redis.from_url(URL)
        self.floor_loaded = False

    @property
    def mgr(self) -> Any:
        return manager()

    async def aclose(self) -> None:
        await self.r.aclose()


# --------------------------------------------------------------------------------------
# Library adapters: ``make(ctx, name)`` returns a fresh lock object (as a user writes
# ``async with locks.lock(name):``) with ``await acquire(blocking)`` / ``await release()``
# and ``await cycle()`` (the uncontended operation: acquire + release).
# --------------------------------------------------------------------------------------

_CAD = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)
_CAD_SHA = hashlib.sha1(_CAD.encode()).hexdigest()


class AFloor:
    """The floor: raw SET NX PX + EVALSHA compare-and-delete on redis.asyncio (no waiting)."""

    def __init__(self, ctx: Ctx, name: str) -> None:
        self.ctx = ctx
        self.r = ctx.r
        self.key = name

    async def acquire(self, blocking: bool = True) -> bool:
        if not self.ctx.floor_loaded:
            await self.r.script_load(_CAD)
            self.ctx.floor_loaded = True
        self.token = secrets.token_hex(16)
        return bool(await self.r.set(self.key, self.token, nx=True, px=30000))

    async def release(self) -> None:
        if not await self.r.evalsha(_CAD_SHA, 1, self.key, self.token):
            raise RuntimeError("floor: not owned")

    async def cycle(self) -> None:
        if not await self.acquire(False):
            raise RuntimeError("floor: uncontended acquire failed")
        await self.release()


class AGeneric:
    """A lock with async acquire(blocking=...) and release()."""

    lk: Any

    async def acquire(self, blocking: bool = True) -> bool:
        return bool(await self.lk.acquire(blocking=blocking))

    async def release(self) -> None:
        await self.lk.release()

    async def cycle(self) -> None:
        if not await self.acquire(True):
            raise RuntimeError("uncontended acquire failed")
        await self.release()


class ARedisPy(AGeneric):
    def __init__(self, ctx: Ctx, name: str, sleep: float = 0.1) -> None:
        self.lk = ctx.r.lock(name, timeout=30, sleep=sleep)


class APottery(AGeneric):
    def __init__(self, ctx: Ctx, name: str) -> None:
        from pottery import AIORedlock

        self.lk = AIORedlock(key=name, masters={ctx.r}, auto_release_time=30)

    async def acquire(self, blocking: bool = True) -> bool:
        return bool(await self.lk.acquire(blocking=blocking, timeout=-1))


class AOurs(AGeneric):
    """Ours through ``await aacquire()`` / ``await arelease()``."""

    def __init__(self, ctx: Ctx, name: str, **options: Any) -> None:
        self.lk = ctx.mgr.lock(name, ttl=30, **options)

    async def acquire(self, blocking: bool = True) -> bool:
        return bool(await self.lk.aacquire(blocking=blocking))

    async def release(self) -> None:
        await self.lk.arelease()


class AOursWith(AOurs):
    """Ours through ``async with lock:`` (the uncontended cycle)."""

    async def cycle(self) -> None:
        async with self.lk:
            pass


def _ours_missing() -> str | None:
    try:
        from django_redislock import Lock
    except Exception as exc:  # pragma: no cover - the package is always there
        return f"cannot import django_redislock: {exc}"
    if not hasattr(Lock, "aacquire"):
        return "django_redislock.Lock has no aacquire() yet"
    return None


def _pottery_missing() -> str | None:
    try:
        from pottery import AIORedlock  # noqa: F401
    except Exception as exc:
        return f"pottery has no AIORedlock ({type(exc).__name__}: {exc})"
    return None


@dataclass(frozen=True)
class Lib:
    key: str
    label: str
    make: Callable[[Ctx, str], Any]
    blocking: bool = True  # usable for the hand-off / wake experiments
    missing: Callable[[], str | None] = lambda: None


LIBS: dict[str, Lib] = {
    lib.key: lib
    for lib in [
        Lib("floor", "floor: SET NX PX + EVALSHA CAD", AFloor, blocking=False),
        Lib("ours", "ours aacquire/arelease", AOurs, missing=_ours_missing),
        Lib("ours_with", "ours async with", AOursWith, blocking=False, missing=_ours_missing),
        Lib(
            "ours_norenew",
            "ours aacquire, auto_renew=False",
            lambda c, n: AOurs(c, n, auto_renew=False),
            missing=_ours_missing,
        ),
        Lib("redispy", "redis.asyncio Lock (sleep 0.1)", ARedisPy),
        Lib(
            "redispy_1ms",
            "redis.asyncio Lock (sleep 0.001)",
            lambda c, n: ARedisPy(c, n, sleep=0.001),
        ),
        Lib("pottery", "pottery AIORedlock", APottery, missing=_pottery_missing),
    ]
}

UNCONTENDED_DEFAULT = ["floor", "ours", "ours_with", "ours_norenew", "redispy", "pottery"]
HANDOFF_DEFAULT = ["ours", "redispy", "redispy_1ms", "pottery"]
WAKE_DEFAULT = ["ours", "redispy", "redispy_1ms", "pottery"]


def usable(libs: list[str], notes: dict[str, str]) -> list[str]:
    out = []
    for k in libs:
        if k not in LIBS:
            raise SystemExit(f"unknown library {k!r}; choose from {', '.join(LIBS)}")
        why = LIBS[k].missing()
        if why:
            notes[k] = f"skipped: {why}"
        else:
            out.append(k)
    return out


# --------------------------------------------------------------------------------------
# 1. Uncontended (in the parent, one event loop)
# --------------------------------------------------------------------------------------


async def _aredis_cpu(r: Any) -> float:
    """:func:`bench_locks.cpu_seconds` of an asyncio client's server."""
    return B.cpu_seconds(await r.info("cpu"))


async def uncontended_ops(
    ctx: Ctx, lib_key: str, name: str, count: int
) -> list[tuple[float, float]]:
    """*count* create + acquire + release of a free lock: (wall us, thread CPU us) each."""
    make = LIBS[lib_key].make
    thread_ns = time.thread_time_ns
    perf_ns = time.perf_counter_ns
    out = []
    for _ in range(count):
        c0 = thread_ns()
        t0 = perf_ns()
        await make(ctx, name).cycle()
        t1 = perf_ns()
        out.append(((t1 - t0) / 1000.0, (thread_ns() - c0) / 1000.0))
    return out


async def python_calls(ctx: Ctx, lib_key: str, name: str) -> dict[str, int]:
    """Python function calls of one warm create + acquire + release of *lib_key*, the
    event loop's included (see ``bench_locks.counting_calls``; the fewest of three)."""
    await uncontended_ops(ctx, lib_key, name, 3)  # warm: scripts, connections
    make = LIBS[lib_key].make
    counted = []
    for _ in range(3):
        with B.counting_calls() as counts:
            await make(ctx, name).cycle()
        counted.append(counts)
    return B.fewest(counted)


async def _uncontended(
    libs: list[str], rounds: int, batch: int, warmup: int, notes: dict[str, str]
) -> dict[str, Any]:
    ctx = Ctx()
    names = {k: f"bench:au:{k}" for k in libs}

    async def ops(k: str, count: int, untimed: int = 1) -> list[tuple[float, float]]:
        """Here, or in k's tree process (timed there the same way; it blocks this loop,
        which has nothing else to do meanwhile)."""
        if k in T.REMOTE:
            tree, inner = T.REMOTE[k]
            return tree.uncontended(inner, names[k], count, untimed)
        return await warm_ops(ctx, k, names[k], count, untimed)  # as in the tree processes

    live = []
    for k in libs:  # warm-up: scripts, connections, imports; drop a library that fails
        try:
            await ops(k, warmup)
            live.append(k)
        except Exception as exc:
            notes[k] = f"skipped in uncontended: {type(exc).__name__}: {exc}"
    samples: dict[str, list[float]] = {k: [] for k in live}
    cpu: dict[str, list[float]] = {k: [] for k in live}
    per_round: dict[str, list[float]] = {k: [] for k in live}
    order = list(live)
    started = time.monotonic()
    for _ in range(rounds):
        random.shuffle(order)
        for k in order:
            got = await ops(k, batch)
            mine = [wall for wall, _c in got]
            cpu[k].extend(c for _w, c in got)
            samples[k].extend(mine)
            per_round[k].append(statistics.median(mine))
    elapsed = time.monotonic() - started
    # Redis-side CPU and commands per operation, one short pass per library (as in
    # bench_locks: the server process's CPU, and the commands run, those inside Lua too).
    server_us: dict[str, float] = {}
    commands: dict[str, float] = {}
    for k in live:
        n = max(50, min(1500, rounds * batch))  # (the server's CPU is a total: many ops)
        await ctx.r.config_resetstat()
        cpu0 = await _aredis_cpu(ctx.r)
        await ops(k, n, untimed=0)  # every operation counts
        server_us[k] = (await _aredis_cpu(ctx.r) - cpu0) * 1e6 / n
        stats = {
            name: v
            for name, v in (await ctx.r.info("commandstats")).items()
            if "resetstat" not in name and "info" not in name
        }
        commands[k] = sum(v["calls"] for v in stats.values()) / n
    calls = {}
    for k in live:
        if k in T.REMOTE:
            tree, inner = T.REMOTE[k]
            calls[k] = tree.python_calls(inner, names[k])
        else:
            calls[k] = await python_calls(ctx, k, names[k])
    await ctx.aclose()
    floor = samples.get("floor")
    floor_p50 = pct(floor, 50) if floor else None
    floor_p90 = pct(floor, 90) if floor else None
    rows = {}
    for k in live:
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
            "ratio_p50_to_floor": (p50 / floor_p50) if floor_p50 and p50 else None,
            "ratio_p90_to_floor": (p90 / floor_p90) if floor_p90 and p90 else None,
            "paired_ratio_median": statistics.median(paired) if paired else None,
            "client_cpu_p50_us": pct(cpu[k], 50),
            "redis_cpu_us_per_op": server_us[k],
            "redis_commands_per_op": commands[k],
            "python_calls_per_op": calls[k]["total"],
            "our_python_calls_per_op": calls[k]["ours"],
        }
    T.paired_to_baseline(per_round, rows)
    return {"rounds": rounds, "batch": batch, "elapsed_s": elapsed, "rows": rows}


def bench_uncontended(
    libs: list[str], rounds: int, batch: int, warmup: int, notes: dict[str, str]
) -> dict[str, Any]:
    return asyncio.run(_uncontended(libs, rounds, batch, warmup, notes))


# --------------------------------------------------------------------------------------
# Worker processes (forked once, before the parent starts an event loop or a thread)
# --------------------------------------------------------------------------------------

_SENDS = [0]


def _count_round_trips() -> None:
    """Count requests sent by this process on redis.asyncio (a pipeline counts once)."""
    from redis.asyncio.connection import AbstractConnection

    orig = AbstractConnection.send_packed_command

    async def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
        _SENDS[0] += 1
        return await orig(self, command, check_health)

    AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]


async def _sleep_until(t_ns: int) -> None:
    left = t_ns - now_ns()
    if left > 0:
        await asyncio.sleep(left / 1e9)


async def _warm(ctx: Ctx, lib_key: str, name: str) -> None:
    """Connections, scripts and imports before the clock starts (on another name)."""
    await ctx.r.ping()
    lk = LIBS[lib_key].make(ctx, f"{name}:warm:{os.getpid()}")
    if not await lk.acquire(False):
        raise RuntimeError("warm-up acquire failed")
    await lk.release()


async def _contend(
    lib_key: str,
    name: str,
    counter: str,
    tasks: int,
    start_ns: int,
    end_ns: int,
    hard_end_ns: int,
) -> dict[str, Any]:
    ctx = Ctx()
    make = LIBS[lib_key].make
    r = ctx.r
    await _warm(ctx, lib_key, name)
    recs: list[tuple[int, int, int, int]] = []

    async def task(i: int) -> None:
        await _sleep_until(start_ns)
        while now_ns() < end_ns:
            lk = make(ctx, name)
            if not await lk.acquire():
                raise RuntimeError("blocking acquire returned False")
            t_acq = now_ns()
            v = int(await r.get(counter) or 0)
            await asyncio.sleep(0.001)
            await r.set(counter, v + 1)
            t_rel = now_ns()
            await lk.release()
            recs.append((t_acq, t_rel, now_ns(), i))
            if t_rel > hard_end_ns:  # a library that wedges must not hang the run
                break

    sends0 = _sends()
    cpu0 = os.times()
    errors: list[str] = []
    running = [asyncio.ensure_future(task(i)) for i in range(tasks)]
    limit = (hard_end_ns - now_ns()) / 1e9 + 5
    done, pending = await asyncio.wait(running, timeout=limit)
    for t in pending:
        t.cancel()
        errors.append("task still blocked at the hard end (cancelled)")
    if pending:
        await asyncio.wait(pending, timeout=5)
    for t in done:
        if t.exception() is not None:
            exc = t.exception()
            errors.append(f"{type(exc).__name__}: {exc}")
    cpu1 = os.times()
    sends = _sends() - sends0
    await ctx.aclose()
    return {
        "pid": os.getpid(),
        "recs": recs,
        "round_trips": sends,
        "cpu_s": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
        "task_errors": errors[:5],
    }


async def _wait_event(ev: Any, timeout: float) -> bool:
    """Wait for a multiprocessing Event without blocking the event loop."""
    return bool(await asyncio.get_running_loop().run_in_executor(None, ev.wait, timeout))


async def _wake_xproc(
    role: str, lib_key: str, name: str, trials: int, hold_s: float, events: Any
) -> dict[str, Any]:
    ev_held, ev_waiting, ev_done = events
    ctx = Ctx()
    make = LIBS[lib_key].make
    await _warm(ctx, lib_key, name)
    out: list[tuple[int, ...]] = []
    for _ in range(trials):
        if role == "holder":
            lk = make(ctx, name)
            if not await lk.acquire():
                raise RuntimeError("holder could not acquire")
            t_held = now_ns()
            ev_held.set()
            await _sleep_until(t_held + int(hold_s * 1e9))
            if not await _wait_event(ev_waiting, 10):
                raise RuntimeError("waiter did not show up")
            ev_waiting.clear()
            t_rel = now_ns()
            await lk.release()
            out.append((t_rel, now_ns()))
            if not await _wait_event(ev_done, 30):
                raise RuntimeError("waiter never got the lock")
            ev_done.clear()
        else:
            if not await _wait_event(ev_held, 10):
                raise RuntimeError("holder did not start")
            ev_held.clear()
            # Start waiting at a random moment of the hold, so a poller's phase is random
            # relative to the release (blocked for hold/2 .. hold).
            await asyncio.sleep(random.uniform(0, hold_s / 2))
            lk = make(ctx, name)
            ev_waiting.set()
            if not await lk.acquire():
                raise RuntimeError("waiter: blocking acquire returned False")
            t_acq = now_ns()
            await lk.release()
            out.append((t_acq,))
            ev_done.set()
    await ctx.aclose()
    return {"recs": out}


async def _wake_same(lib_key: str, name: str, trials: int, hold_s: float) -> dict[str, Any]:
    """Holder and waiter as two tasks of one event loop."""
    ctx = Ctx()
    make = LIBS[lib_key].make
    await _warm(ctx, lib_key, name)
    out: list[tuple[int, int, int]] = []
    for _ in range(trials):
        held = asyncio.Event()
        waiting = asyncio.Event()
        t_rel: list[int] = []

        async def holder(held: asyncio.Event, waiting: asyncio.Event, t_rel: list[int]) -> None:
            lk = make(ctx, name)
            if not await lk.acquire():
                raise RuntimeError("holder could not acquire")
            t_held = now_ns()
            held.set()
            await _sleep_until(t_held + int(hold_s * 1e9))
            await asyncio.wait_for(waiting.wait(), 10)
            t_rel.append(now_ns())
            await lk.release()
            t_rel.append(now_ns())

        async def waiter(held: asyncio.Event, waiting: asyncio.Event) -> int:
            await asyncio.wait_for(held.wait(), 10)
            await asyncio.sleep(random.uniform(0, hold_s / 2))
            lk = make(ctx, name)
            waiting.set()
            if not await lk.acquire():
                raise RuntimeError("waiter: blocking acquire returned False")
            t_acq = now_ns()
            await lk.release()
            return t_acq

        h = asyncio.ensure_future(holder(held, waiting, t_rel))
        t_acq = await asyncio.wait_for(waiter(held, waiting), hold_s + 30)
        await h
        out.append((t_rel[0], t_rel[1], t_acq))
    await ctx.aclose()
    return {"recs": out}


def _sends() -> int:
    """Requests sent by this process: redis.asyncio + blocking redis-py (our renewals)."""
    return _SENDS[0] + B._SENDS[0]


def worker_main(conn: Any, events: tuple[Any, Any, Any]) -> None:
    logging.getLogger("pottery").setLevel(logging.ERROR)
    _count_round_trips()
    B._count_round_trips()  # our watchdog renews through a blocking client, in a thread
    while True:
        if not conn.poll(3600):
            return
        cmd = conn.recv()
        op = cmd.pop("op")
        if op == "exit":
            return
        try:
            if op == "contend":
                res = asyncio.run(_contend(**cmd))
            elif op == "wake":
                res = asyncio.run(_wake_xproc(events=events, **cmd))
            elif op == "wake_same":
                res = asyncio.run(_wake_same(**cmd))
            else:
                res = {"error": f"unknown op {op}"}
        except Exception as exc:  # report, don't die: the parent shows the error
            res = {"error": f"{type(exc).__name__}: {exc}"}
        conn.send(res)


#: --baseline, in a tree process: its one event loop and Ctx for the uncontended batches.
_TREE_LOOP: list[tuple[asyncio.AbstractEventLoop, Ctx]] = []


def _tree_loop() -> tuple[asyncio.AbstractEventLoop, Ctx]:
    """A tree process's one event loop and Ctx, kept for the whole run, as the parent's is."""
    if not _TREE_LOOP:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        _TREE_LOOP.append((loop, Ctx()))
    return _TREE_LOOP[0]


def _tree_uncontended(
    lib_key: str, name: str, count: int, untimed: int
) -> list[tuple[float, float]]:
    """A tree process's uncontended batch (see tree_pool.TreePool.uncontended)."""
    loop, ctx = _tree_loop()
    return loop.run_until_complete(warm_ops(ctx, lib_key, name, count, untimed))


def _tree_python_calls(lib_key: str, name: str) -> dict[str, int]:
    """A tree process's count of one operation's Python calls (see python_calls)."""
    loop, ctx = _tree_loop()
    return loop.run_until_complete(python_calls(ctx, lib_key, name))


async def warm_ops(
    ctx: Ctx, lib_key: str, name: str, count: int, untimed: int
) -> list[tuple[float, float]]:
    """A batch of uncontended_ops after *untimed* untimed ones, so that every batch starts
    warm wherever it runs (the main process, a tree process)."""
    if untimed:
        await uncontended_ops(ctx, lib_key, name, untimed)
    return await uncontended_ops(ctx, lib_key, name, count)


def tree_main(conn: Any, url: str, size: int) -> None:
    """A tree process (tree_pool.TreePool): django_redislock from $BENCH_REDISLOCK_TREE,
    its own fork pool of *size* asyncio workers, uncontended operations run here."""
    configure(url)
    # Forked before any connection, thread or event loop.
    pool = B.Pool(size, target=worker_main) if size else None
    T.serve(conn, pool, {"uncontended": _tree_uncontended, "calls": _tree_python_calls})


def _remote_only(ctx: Ctx, name: str) -> Any:
    raise RuntimeError("ours@current / ours@baseline run in their tree process only")


# --------------------------------------------------------------------------------------
# 2. Hand-off
# --------------------------------------------------------------------------------------


def _split(n: int, procs: int) -> list[int]:
    return [n // procs + (1 if i < n % procs else 0) for i in range(procs)]


def run_handoff_once(
    pool: B.Pool, lib_key: str, n: int, procs: int, duration: float, tag: str
) -> dict[str, Any]:
    r = B.client()
    name = f"bench:ah:{lib_key}:{tag}"
    counter = f"bench:acounter:{lib_key}:{tag}"
    r.delete(counter)
    start = now_ns() + int(0.4e9)
    end = start + int(duration * 1e9)
    hard_end = end + int(max(5.0, duration) * 1e9)
    runner, inner = T.route(pool, lib_key)
    cmds_before = B._commands_processed(r)
    rcpu0 = B._redis_cpu(r)
    results = runner.run(
        [
            dict(
                op="contend",
                lib_key=inner,
                name=name,
                counter=counter,
                tasks=t,
                start_ns=start,
                end_ns=end,
                hard_end_ns=hard_end,
            )
            for t in _split(n, procs)
        ],
        timeout=duration + 90,
    )
    redis_cpu = B._redis_cpu(r) - rcpu0
    cmds = B._commands_processed(r) - cmds_before
    errors = [res["error"] for res in results if "error" in res]
    errors += [e for res in results for e in res.get("task_errors", [])]
    counter_value = int(r.get(counter) or 0)
    recs = []  # (t_acq, t_rel_call, t_rel_return, process index, task index)
    per_task = []
    for p, res in enumerate(results):
        got = res.get("recs", [])
        counts: dict[int, int] = {}
        for a, b, c, i in got:
            recs.append((a, b, c, p, i))
            counts[i] = counts.get(i, 0) + 1
        per_task.extend(counts.get(i, 0) for i in range(_split(n, procs)[p]))
    recs.sort()
    total = len(recs)
    handoff_ms: list[float] = []
    handoff_after_ret_ms: list[float] = []
    overlaps = switches = proc_switches = 0
    for prev, nxt in zip(recs, recs[1:], strict=False):
        if nxt[0] < prev[1]:
            overlaps += 1  # the next holder returned from acquire before we released
            continue
        handoff_ms.append((nxt[0] - prev[1]) / 1e6)
        handoff_after_ret_ms.append((nxt[0] - prev[2]) / 1e6)
        switches += nxt[3:] != prev[3:]
        proc_switches += nxt[3] != prev[3]
    body_ms = [(rec[1] - rec[0]) / 1e6 for rec in recs]
    fewest, most = (min(per_task), max(per_task)) if per_task else (0, 0)
    return {
        "lib": lib_key,
        "label": LIBS[lib_key].label,
        "n": n,
        "procs": procs,
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
        "process_changes_pct": 100.0 * proc_switches / max(1, total - 1),
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
        "errors": errors,
    }


_HANDOFF_FIELDS = (
    "cs_per_s",
    "handoff_p50_ms",
    "handoff_p90_ms",
    "handoff_p99_ms",
    "handoff_from_release_return_p50_ms",
    "cs_body_p50_ms",
    "fewest_most_ratio",
    "holder_changes_pct",
    "process_changes_pct",
    "redis_cmds_per_cs",
    "round_trips_per_cs",
    "client_cpu_ms_per_cs",
    "redis_cpu_ms_per_cs",
    "fewest",
    "most",
)


def bench_handoff(
    pool: B.Pool,
    libs: list[str],
    ns: list[int],
    layouts: list[int],
    duration: float,
    reps: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    order = list(libs)
    for rep in range(reps):
        for n in ns:
            for procs in layouts:
                random.shuffle(order)
                for k in order:
                    res = run_handoff_once(pool, k, n, procs, duration, f"{n}:{procs}:{rep}")
                    runs.append(res)
                    log(
                        f"  handoff N={n:<3} {procs}p rep {rep + 1}/{reps} {res['label']:<34} "
                        f"{res['cs_per_s']:7.1f} CS/s  p50 {fmt(res['handoff_p50_ms'], 2)} ms  "
                        f"fewest/most {res['fewest']}/{res['most']}  "
                        f"lost {res['lost_updates']}  overlaps {res['overlaps']}"
                        + (f"  ERRORS {res['errors'][:1]}" if res["errors"] else "")
                    )
    agg: dict[str, dict[str, Any]] = {}
    for n in ns:
        for procs in layouts:
            for k in libs:
                mine = [r for r in runs if r["lib"] == k and r["n"] == n and r["procs"] == procs]
                row: dict[str, Any] = {
                    "lib": k,
                    "label": LIBS[k].label,
                    "n": n,
                    "procs": procs,
                    "reps": len(mine),
                }
                for field in _HANDOFF_FIELDS:
                    vals = [r[field] for r in mine if r[field] is not None]
                    row[field] = statistics.median(vals) if vals else None
                row["lost_updates"] = sum(r["lost_updates"] for r in mine)
                row["overlaps"] = sum(r["overlaps"] for r in mine)
                row["critical_sections"] = sum(r["critical_sections"] for r in mine)
                row["errors"] = [e for r in mine for e in r["errors"]]
                agg[f"{k}:N{n}:{procs}p"] = row
    return {
        "duration_s": duration,
        "reps": reps,
        "ns": ns,
        "layouts": layouts,
        "runs": runs,
        "rows": agg,
    }


# --------------------------------------------------------------------------------------
# 3. Wake
# --------------------------------------------------------------------------------------

WAKE_MODES = ("xproc", "same")


def bench_wake(
    pool: B.Pool,
    libs: list[str],
    modes: list[str],
    trials: int,
    hold_s: float,
    chunk: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    keys = [(k, m) for k in libs for m in modes]
    lat: dict[tuple[str, str], list[float]] = {x: [] for x in keys}
    lat_ret: dict[tuple[str, str], list[float]] = {x: [] for x in keys}
    rel_rtt: dict[tuple[str, str], list[float]] = {x: [] for x in keys}
    errors: dict[tuple[str, str], list[str]] = {x: [] for x in keys}
    order = list(keys)
    done = 0
    while done < trials:
        t = min(chunk, trials - done)
        random.shuffle(order)
        for k, mode in order:
            name = f"bench:aw:{k}:{mode}"
            runner, inner = T.route(pool, k)
            common = dict(lib_key=inner, name=name, trials=t, hold_s=hold_s)
            timeout = t * (hold_s + 2) + 30
            try:
                if mode == "xproc":
                    res = runner.run(
                        [
                            dict(op="wake", role="holder", **common),
                            dict(op="wake", role="waiter", **common),
                        ],
                        timeout,
                        clear_events=True,
                    )
                    if any("error" in x for x in res):
                        errors[k, mode].extend(x["error"] for x in res if "error" in x)
                        continue
                    pairs = zip(res[0]["recs"], res[1]["recs"], strict=False)
                    got = [(a, b, c) for (a, b), (c,) in pairs]
                else:
                    (res1,) = runner.run([dict(op="wake_same", **common)], timeout)
                    if "error" in res1:
                        errors[k, mode].append(res1["error"])
                        continue
                    got = [tuple(x) for x in res1["recs"]]
            except RuntimeError as exc:  # a worker that does not answer wedges the pool
                errors[k, mode].append(str(exc))
                raise
            for t_rel, t_rel_ret, t_acq in got:
                lat[k, mode].append((t_acq - t_rel) / 1e6)
                lat_ret[k, mode].append((t_acq - t_rel_ret) / 1e6)
                rel_rtt[k, mode].append((t_rel_ret - t_rel) / 1e6)
        done += t
        log(f"  wake: {done}/{trials} trials per library and mode")
    rows = {}
    for k, mode in keys:
        x = (k, mode)
        rows[f"{k}:{mode}"] = {
            "lib": k,
            "mode": mode,
            "label": LIBS[k].label,
            "n": len(lat[x]),
            "p50_ms": pct(lat[x], 50),
            "p90_ms": pct(lat[x], 90),
            "max_ms": max(lat[x]) if lat[x] else None,
            "from_release_return_p50_ms": pct(lat_ret[x], 50),
            "release_call_p50_ms": pct(rel_rtt[x], 50),
            "errors": errors[x],
        }
    return {"trials": trials, "hold_s": hold_s, "modes": modes, "rows": rows}


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def report(results: dict[str, Any]) -> str:
    out = []
    u = results.get("uncontended")
    if u:
        out.append(
            f"\n1. Uncontended create+acquire+release, one event loop "
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
                B._calls(r),
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
                    "Py calls (ours)",
                    "samples",
                ],
                rows,
            )
        )
    h = results.get("handoff")
    if h:
        out.append(
            f"\n2. Hand-off: N asyncio tasks (1p: one process; 2p: N/2 in each of two), one "
            f"name, GET / sleep 1 ms / SET counter, {h['duration_s']:g} s per run, "
            f"{h['reps']} rep(s) (medians over reps)"
        )
        rows = []
        for r in h["rows"].values():
            rows.append(
                [
                    f"{r['label']} N={r['n']} {r['procs']}p",
                    fmt(r["cs_per_s"]),
                    fmt(r["handoff_p50_ms"], 2),
                    fmt(r["handoff_p90_ms"], 2),
                    fmt(r["cs_body_p50_ms"], 2),
                    f"{fmt(r['fewest'], 0)}/{fmt(r['most'], 0)}",
                    fmt(r["fewest_most_ratio"], 2),
                    fmt(r["holder_changes_pct"], 0),
                    fmt(r["process_changes_pct"], 0) if r["procs"] > 1 else "",
                    fmt(r["round_trips_per_cs"], 1),
                    fmt(r["redis_cmds_per_cs"], 1),
                    fmt(r["client_cpu_ms_per_cs"], 2),
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
                    "proc switch %",
                    "RTT/CS",
                    "Redis cmds/CS",
                    "client CPU ms/CS",
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
            f"(acquire return - release call), {w['trials']} trials per library and mode "
            f"(xproc: holder and waiter in two processes; same: two tasks of one loop)"
        )
        rows = [
            [
                f"{r['label']} {r['mode']}",
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
    errs = [
        (key, r["errors"])
        for part in ("handoff", "wake")
        for key, r in results.get(part, {}).get("rows", {}).items()
        if r["errors"]
    ]
    if errs:
        out.append("\nErrors (first of each row):")
        out.extend(f"  {key}: {e[0]} ({len(e)} in all)" for key, e in errs)
    if results.get("notes"):
        out.append("\nNotes:")
        out.extend(f"  {k}: {v}" for k, v in results["notes"].items())
    t = results.get("targets")
    if t:
        out.append("\nTargets for ours:")
        for item in t:
            out.append(f"  [{'PASS' if item['ok'] else 'MISS'}] {item['what']}: {item['value']}")
    return "\n".join(out)


#: --baseline: the hand-off and wake figures in the before/after table.
_HANDOFF_COMPARED = (
    ("cs_per_s", "CS/s", 1),
    ("handoff_p50_ms", "hand-off p50 ms", 3),
    ("handoff_p90_ms", "hand-off p90 ms", 3),
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
    h = results.get("handoff", {})
    for n in h.get("ns", []):
        for procs in h.get("layouts", []):
            a = h["rows"].get(f"{cur}:N{n}:{procs}p")
            b = h["rows"].get(f"{base}:N{n}:{procs}p")
            where = f"hand-off N={n} {procs}p"
            rows += T.compare_rows(where, a, b, _HANDOFF_COMPARED)
            if a and b:
                rows.append(T.lost_row(where, a, b))
    w = results.get("wake", {})
    for mode in w.get("modes", []):
        a, b = w["rows"].get(f"{cur}:{mode}"), w["rows"].get(f"{base}:{mode}")
        rows += T.compare_rows(f"wake {mode}", a, b, _WAKE_COMPARED)
    out.append(table(T.BEFORE_AFTER_HEADERS, rows))
    return out


def check_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    t: list[dict[str, Any]] = []
    u = results.get("uncontended", {}).get("rows", {})
    for k in ("ours", "ours_with"):
        if k in u and u[k]["ratio_p50_to_floor"] is not None:
            v = u[k]["ratio_p50_to_floor"]
            t.append(
                {
                    "what": f"uncontended p50 within 1.25x of the async floor ({LIBS[k].label})",
                    "value": f"{v:.2f}x (paired {fmt(u[k]['paired_ratio_median'], 2)}x)",
                    "ok": v <= 1.25,
                }
            )
    for r in results.get("handoff", {}).get("rows", {}).values():
        if r["lib"] != "ours":
            continue
        hp = r["handoff_p50_ms"]
        where = f"N={r['n']} {r['procs']}p"
        t.append(
            {
                "what": f"{where}: hand-off p50 < 0.5 ms",
                "value": f"{fmt(hp, 3)} ms",
                "ok": hp is not None and hp < 0.5 and not r["errors"],
            }
        )
        t.append(
            {
                "what": f"{where}: zero lost updates / overlaps",
                "value": f"{r['lost_updates']} lost, {r['overlaps']} overlaps"
                + (f", {len(r['errors'])} errors" if r["errors"] else ""),
                "ok": r["lost_updates"] == 0 and r["overlaps"] == 0 and not r["errors"],
            }
        )
    for r in results.get("wake", {}).get("rows", {}).values():
        if r["lib"] == "ours" and r["p50_ms"] is not None:
            t.append(
                {
                    "what": f"wake ({r['mode']}) after a {results['wake']['hold_s'] * 1000:.0f} ms"
                    " hold within 1 ms (p50)",
                    "value": f"{r['p50_ms']:.3f} ms",
                    "ok": r["p50_ms"] < 1.0,
                }
            )
    return t


def _out_path(quick: bool, before_after: bool = False) -> Path:
    base = ROOT / "benchmarks" / "results"
    prefix = "async-before-after-" if before_after else "async-"
    stem = time.strftime(prefix + "%Y-%m-%d") + ("-quick" if quick else "")
    out = base / f"{stem}.json"
    if out.exists():
        out = base / f"{stem}-{time.strftime('%H%M%S')}.json"
    return out


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument(
        "--only",
        default="uncontended,handoff,wake",
        help="experiments to run, comma-separated (uncontended,handoff,wake)",
    )
    ap.add_argument("--rounds", type=int, default=400, help="uncontended: rounds (default 400)")
    ap.add_argument("--batch", type=int, default=4, help="uncontended: ops per library per round")
    ap.add_argument("--warmup", type=int, default=50, help="uncontended: warm-up ops per library")
    ap.add_argument("--ns", default="8,32", help="hand-off: task counts (default 8,32)")
    ap.add_argument(
        "--layouts",
        default="1,2",
        help="hand-off: processes the N tasks are spread over (default 1,2)",
    )
    ap.add_argument(
        "--duration", type=float, default=3.0, help="hand-off: seconds per library per N, layout"
    )
    ap.add_argument("--reps", type=int, default=1, help="hand-off: interleaved repetitions")
    ap.add_argument("--trials", type=int, default=30, help="wake: trials per library and mode")
    ap.add_argument("--wake-modes", default="xproc,same", help="wake: xproc,same")
    ap.add_argument(
        "--hold", type=float, default=0.2, help="wake: how long the holder keeps the lock (s)"
    )
    ap.add_argument("--uncontended-libs", default=",".join(UNCONTENDED_DEFAULT))
    ap.add_argument("--handoff-libs", default=",".join(HANDOFF_DEFAULT))
    ap.add_argument("--wake-libs", default=",".join(WAKE_DEFAULT))
    ap.add_argument("--quick", action="store_true", help="small smoke-test sizes (< 40 s)")
    ap.add_argument("--redis-url", default=None, help="use this Redis instead of starting one")
    ap.add_argument(
        "--pin",
        action="store_true",
        help="Redis on one CPU, the benchmark's processes on the others: use for a "
        "--baseline before/after (see benchmarks/README.md)",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="JSON output path (default benchmarks/results/async-<date>.json)",
    )
    ap.add_argument("--no-json", action="store_true")
    T.add_argument(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup, args.duration, args.trials = 40, 20, 0.6, 3
        args.reps = 1
    only = set(_csv(args.only))
    unknown = only - {"uncontended", "handoff", "wake"}
    if unknown:
        ap.error(f"unknown experiment(s) {sorted(unknown)}")
    ns = [int(x) for x in _csv(args.ns)]
    layouts = [int(x) for x in _csv(args.layouts)]
    modes = _csv(args.wake_modes)
    if set(modes) - set(WAKE_MODES):
        ap.error(f"--wake-modes: choose from {WAKE_MODES}")
    baseline = T.baseline_path(ap, args.baseline)

    def log(msg: str) -> None:
        print(msg, flush=True)

    server = None
    url = args.redis_url
    if url is None:
        from tests.redis_server import RedisServer

        server = RedisServer()
        url = server.url
    configure(url)
    notes: dict[str, str] = {}
    results: dict[str, Any] = {
        "machine": B.machine_info(),
        "args": vars(args),
        "redis_url": url,
        "notes": notes,
    }
    results["machine"]["redis_server"] = B.client().info("server").get("redis_version")
    B.client().flushdb()
    log(
        f"redis {results['machine']['redis_server']} at {url}; {os.cpu_count()} CPUs; "
        f"load {results['machine']['loadavg_at_start']}"
    )
    if args.pin:  # before any worker or tree process starts: they inherit it
        results["machine"]["pinned"] = B.pin_processes()
        log(f"pinned: {results['machine']['pinned']}")
    ulibs = usable(_csv(args.uncontended_libs), notes)
    hlibs = [k for k in usable(_csv(args.handoff_libs), notes) if LIBS[k].blocking]
    wlibs = [k for k in usable(_csv(args.wake_libs), notes) if LIBS[k].blocking]
    for k, why in notes.items():
        log(f"  note: {k} {why}")

    # Fork the workers first, while this process has no threads, loops or connections.
    pool = None
    size = (max(layouts + [2]) if "handoff" in only else 2) if only & {"handoff", "wake"} else 0
    if size:
        pool = B.Pool(size, target=worker_main)
    trees: list[T.TreePool] = []
    try:
        if baseline is not None:
            # Spawned (not forked): each imports django_redislock from its own tree.
            trees, results["baseline"] = T.start_trees(ROOT, baseline, tree_main, (url, size), log)
            for key, (tp, _inner) in T.REMOTE.items():
                label = f"{key} {tp.info.get('commit', '?')} aacquire/arelease"
                LIBS[key] = Lib(key, label, _remote_only)
                for libs in (ulibs, hlibs, wlibs):
                    libs.append(key)
        started = time.monotonic()
        if "uncontended" in only and ulibs:
            log(f"1. uncontended: {len(ulibs)} libraries x {args.rounds} x {args.batch} ops ...")
            gc.collect()
            results["uncontended"] = bench_uncontended(
                ulibs, args.rounds, args.batch, args.warmup, notes
            )
        if "wake" in only and wlibs:
            assert pool is not None
            log(f"3. wake: {len(wlibs)} libraries x {modes} x {args.trials} trials ...")
            results["wake"] = bench_wake(
                pool, wlibs, modes, args.trials, args.hold, chunk=5, log=log
            )
        if "handoff" in only and hlibs:
            assert pool is not None
            log(
                f"2. hand-off: {len(hlibs)} libraries x N={ns} x layouts {layouts} x "
                f"{args.duration:g} s x {args.reps} rep(s) ..."
            )
            results["handoff"] = bench_handoff(
                pool, hlibs, ns, layouts, args.duration, args.reps, log
            )
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
        out = Path(args.out) if args.out else _out_path(args.quick, baseline is not None)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1, default=str))
        print(f"JSON: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
