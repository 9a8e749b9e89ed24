#!/usr/bin/env python
"""Semaphore and read-write lock throughput: ours vs the peers that exist, in one run.

One throw-away local redis-server, one pool of worker processes forked at start-up,
every (experiment, library) cell interleaved in a shuffled order per repetition so
that the noise of a shared machine hits all libraries alike (the method of
``bench_locks.py``, whose set-up, workers' pool and statistics this script reuses).

1. ``semaphore``: N processes (``--ns``, default 8) loop over ``acquire``, a critical
   section (``INCR`` of a counter, sleep 1 ms), ``release`` on ONE semaphore name
   with ``--limit`` permits (default 3), for ``--duration`` s. Libraries:

   - ``ours``: ``locks.semaphore(name, limit=3)`` (FIFO queue, hand-off on release);
   - ``zset`` / ``zset_1ms``: the hand-rolled "Redis in Action" sorted-set
     semaphore as swarthy/redis-semaphore (Node) writes it: one Lua script drops
     the members older than the lease *by the client's clock*, admits the caller
     if ``ZCARD < limit`` (``ZADD`` with the client's time as score), else the
     caller sleeps ``retryInterval`` (swarthy's default 10 ms; and 1 ms) and
     tries again; release is ``ZREM``. Redisson's ``PermitExpirableSemaphore``
     also scores permits with the client's clock;
   - ``redis_semaphore``: the PyPI package Redis-Semaphore 0.2.2 (bluele): a
     Redis list of ``limit`` tokens taken with ``BLPOP`` (blocking, FIFO, no
     lease) and pushed back on release.

   Reported: permits/s, the most holders seen at once (by the timestamps; must be
   <= limit), the mean number of holders (how busy the permits are kept), wait =
   acquire return - acquire call (p50/p90/p99), fewest/most grants per process,
   round trips, Redis commands and CPU per grant.

2. ``rwlock``: ``--readers`` (6) reader and ``--writers`` (2) writer processes loop
   on ONE read-write lock for ``--duration`` s. A read does ``GET data``, sleeps
   1 ms, ``GET data`` again (a changed value is a *torn read*); a write does
   ``GET data``, sleeps 1 ms, ``SET data v+1`` (a lost increment is a *lost
   write*). Libraries:

   - ``ours``: ``locks.rw_lock(name).read()`` / ``.write()`` (phase-fair queue);
   - ``counter``: the common hand-rolled pattern: readers ``INCR`` an anonymous
     reader counter when no writer key exists, writers ``SET writer NX PX`` when
     the counter is 0 (each check-and-act one Lua script, so it is atomic),
     release ``DECR`` / compare-and-delete, waiters poll every 1 ms;
   - ``redis_rw_lock``: the PyPI package redis-rw-lock 1.0.6 (a writer-priority
     "light switch" lock built of five python-redis-lock locks and two counters).

   Reported: reads/s, writes/s, the share of each among the grants, the most
   readers seen at once, wait p50/p99 per role, processes that got nothing,
   overlap violations (a writer's critical section intersecting anyone else's,
   by the timestamps), torn reads and lost writes.

Every timestamp is CLOCK_MONOTONIC, one clock for all processes on Linux; a critical
section is recorded from just after acquire returned to just before release is
called, so an overlap seen is an overlap that happened. Throughput counts the grants
that came within the ``--duration`` window. A worker stuck in an acquire is
interrupted (SIGALRM) a few seconds after the window and reported as an error.
pottery has no semaphore nor read-write lock.

Run from the repository root::

    .venv/bin/python benchmarks/bench_primitives.py            # default, ~3 min
    .venv/bin/python benchmarks/bench_primitives.py --quick    # smoke test, ~25 s

Results: a table on stdout and JSON in ``benchmarks/results/primitives-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import secrets
import signal
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import bench_locks as bl  # noqa: E402  (puts the repository on sys.path)

ROOT = bl.ROOT
now_ns = bl.now_ns
pct = bl.pct
fmt = bl.fmt

#: Seconds a worker may stay in an acquire after the window before SIGALRM stops it.
GRACE_S = 10.0


# --------------------------------------------------------------------------------------
# Peers written here (the patterns, as their authors publish them)
# --------------------------------------------------------------------------------------

_ZSET_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[3]) - tonumber(ARGV[2]))
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


class ZsetSemaphore:
    """The client-clock sorted-set semaphore (swarthy/redis-semaphore's ``Semaphore``).

    ARGV: limit, lease ms, the client's time in ms (the score), a random id.
    A waiter polls every *retry* seconds; no queue, no wake-up.
    """

    def __init__(self, name: str, limit: int, retry: float, lease_ms: int = 10_000) -> None:
        self.r = bl.client()
        self.script = self.r.register_script(_ZSET_ACQUIRE)
        self.key, self.limit, self.retry, self.lease_ms = name, limit, retry, lease_ms
        self.ident = secrets.token_hex(16)

    def acquire(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            now_ms = int(time.time() * 1000)  # the client's clock decides expiry
            if self.script(keys=[self.key], args=[self.limit, self.lease_ms, now_ms, self.ident]):
                return True
            if time.monotonic() + self.retry > deadline:
                return False
            time.sleep(self.retry)

    def release(self) -> None:
        self.r.zrem(self.key, self.ident)


class BlpopSemaphore:
    """Redis-Semaphore (PyPI, bluele): ``BLPOP`` a token from a list of ``limit``."""

    def __init__(self, name: str, limit: int) -> None:
        from redis_semaphore import Semaphore

        self.sem = Semaphore(bl.client(), count=limit, namespace=name)

    def acquire(self, timeout: float) -> bool:
        from redis_semaphore import NotAvailable

        try:
            self.sem.acquire(timeout=max(1, math.ceil(timeout)))  # BLPOP: whole seconds
        except NotAvailable:
            return False
        return True

    def release(self) -> None:
        if self.sem.release() is False:
            raise RuntimeError("redis_semaphore: token not held at release")


class OurAcquire:
    """Our lock objects behind the ``acquire(timeout) -> bool`` of this benchmark."""

    def __init__(self, lk: Any) -> None:
        self.lk = lk

    def acquire(self, timeout: float) -> bool:
        return bool(self.lk.acquire(timeout=timeout))

    def release(self) -> None:
        self.lk.release()


_RW_READ = """
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('INCR', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return 1
end
return 0
"""
_RW_WRITE = """
if (tonumber(redis.call('GET', KEYS[1])) or 0) <= 0 then
  if redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[1]) then return 1 end
end
return 0
"""


class CounterRW:
    """The common hand-rolled rw lock: an anonymous reader counter + a SET NX writer.

    Readers share one counter (and one lease: the counter's PEXPIRE); each
    check-and-act is one Lua script; waiters poll every *retry* seconds.
    """

    def __init__(self, name: str, mode: str, retry: float = 0.001, lease_ms: int = 30_000):
        self.r = bl.client()
        self.keys = [f"{name}:readers", f"{name}:writer"]
        self.mode, self.retry, self.lease_ms = mode, retry, lease_ms
        self.script = self.r.register_script(_RW_READ if mode == "r" else _RW_WRITE)
        self.cad = self.r.register_script(bl._CAD)
        self.token = secrets.token_hex(16)

    def acquire(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if self.script(keys=self.keys, args=[self.lease_ms, self.token]):
                return True
            if time.monotonic() + self.retry > deadline:
                return False
            time.sleep(self.retry)

    def release(self) -> None:
        if self.mode == "r":
            self.r.decr(self.keys[0])
        elif not self.cad(keys=self.keys[1:], args=[self.token]):
            raise RuntimeError("counter rw: writer key not ours at release")


class PackageRW:
    """redis-rw-lock (PyPI, swapnilsm): ``RWLock(conn, name, mode, expire)``.

    It has no acquire timeout: a starved side waits until the other stops (the
    window's end); SIGALRM bounds it.
    """

    def __init__(self, name: str, mode: str) -> None:
        from redis_rw_lock import RWLock

        self.lk = RWLock(bl.client(), name, RWLock.READ if mode == "r" else RWLock.WRITE, 30)

    def acquire(self, timeout: float) -> bool:
        self.lk.acquire()
        return True

    def release(self) -> None:
        self.lk.release()


@dataclass(frozen=True)
class Lib:
    key: str
    label: str
    make: Callable[..., Any]
    needs: str | None = None  # the module a PyPI peer needs (skipped if missing)


def _ours_rw(name: str, mode: str) -> OurAcquire:
    rw = bl.manager().rw_lock(name, ttl=30, auto_renew=True)
    return OurAcquire(rw.read() if mode == "r" else rw.write())


SEM_LIBS: dict[str, Lib] = {
    lib.key: lib
    for lib in [
        Lib(
            "ours",
            "ours locks.semaphore",
            lambda n, limit: OurAcquire(
                bl.manager().semaphore(n, limit=limit, ttl=30, auto_renew=True)
            ),
        ),
        Lib("zset", "ZSET client clock, poll 10 ms", lambda n, lim: ZsetSemaphore(n, lim, 0.010)),
        Lib(
            "zset_1ms", "ZSET client clock, poll 1 ms", lambda n, lim: ZsetSemaphore(n, lim, 0.001)
        ),
        Lib("redis_semaphore", "Redis-Semaphore (BLPOP)", BlpopSemaphore, "redis_semaphore"),
    ]
}
RW_LIBS: dict[str, Lib] = {
    lib.key: lib
    for lib in [
        Lib("ours", "ours locks.rw_lock", _ours_rw),
        Lib("counter", "INCR/DECR readers + SET NX writer, poll 1 ms", CounterRW),
        Lib("redis_rw_lock", "redis-rw-lock (writer priority)", PackageRW, "redis_rw_lock"),
    ]
}
SEM_DEFAULT = list(SEM_LIBS)
RW_DEFAULT = list(RW_LIBS)


# --------------------------------------------------------------------------------------
# Workers (forked by bl.Pool before the parent starts any thread)
# --------------------------------------------------------------------------------------


class _Stuck(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Stuck("still in acquire after the window (SIGALRM)")


def worker_loop(
    kind: str,
    lib_key: str,
    name: str,
    role: str,
    limit: int,
    data: str,
    start_ns: int,
    end_ns: int,
    hard_end_ns: int,
) -> dict[str, Any]:
    """One process's loop over acquire / critical section / release until *end_ns*.

    *kind* ``sem``: the critical section is ``INCR data`` + 1 ms. *kind* ``rw``,
    *role* ``r``: ``GET data`` + 1 ms + ``GET data`` (torn if they differ);
    *role* ``w``: ``GET data`` + 1 ms + ``SET data v+1``.
    """
    lib = (SEM_LIBS if kind == "sem" else RW_LIBS)[lib_key]

    def make() -> Any:
        return lib.make(name, limit) if kind == "sem" else lib.make(name, role)

    r = bl.client()
    r.ping()
    make()  # imports, script objects, connections before the start
    recs: list[tuple[int, int, int, int]] = []  # acquire call, return, release call, return
    torn = 0
    error = None
    bl._sleep_until(start_ns)
    sends0 = bl._SENDS[0]
    cpu0 = os.times()
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, max(0.1, (hard_end_ns - now_ns()) / 1e9))
    try:
        while now_ns() < end_ns:
            lk = make()
            t_call = now_ns()
            if not lk.acquire(max(0.1, (hard_end_ns - t_call) / 1e9 - 1.0)):
                error = "acquire timed out after the window"
                break
            t_acq = now_ns()
            if kind == "sem":
                r.incr(data)
                time.sleep(0.001)
            elif role == "r":
                v = r.get(data)
                time.sleep(0.001)
                torn += r.get(data) != v
            else:
                v = int(r.get(data) or 0)
                time.sleep(0.001)
                r.set(data, v + 1)
            t_rel = now_ns()
            lk.release()
            recs.append((t_call, t_acq, t_rel, now_ns()))
    except _Stuck as exc:
        error = str(exc)
    except Exception as exc:  # reported by the parent
        error = f"{type(exc).__name__}: {exc}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    cpu1 = os.times()
    return {
        "role": role,
        "recs": recs,
        "torn": torn,
        "round_trips": bl._SENDS[0] - sends0,
        "cpu_s": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
        "error": error,
    }


def worker_main(conn: Any, events: Any) -> None:
    """bl.Pool's worker, for this benchmark's one command."""
    bl._count_round_trips()
    while True:
        if not conn.poll(3600):
            return
        cmd = conn.recv()
        if cmd.pop("op") != "loop":
            return
        try:
            res = worker_loop(**cmd)
        except Exception as exc:  # before the loop (set-up): report, don't die
            res = {"role": cmd["role"], "recs": [], "torn": 0, "round_trips": 0, "cpu_s": 0.0}
            res["error"] = f"{type(exc).__name__}: {exc}"
        conn.send(res)


# --------------------------------------------------------------------------------------
# One cell: start the processes together, gather, analyse
# --------------------------------------------------------------------------------------


def sweep(intervals: list[tuple[int, int, str]]) -> dict[str, int]:
    """Most holders at once, most readers at once, and the critical sections that
    began while a writer held or began a write while anyone held (violations)."""
    events = []
    for a, b, role in intervals:
        events.append((a, 1, role))
        events.append((b, 0, role))  # at equal times an end sorts before a start
    events.sort()
    active = readers = writers = 0
    most = most_readers = violations = 0
    for _t, start, role in events:
        d = 1 if start else -1
        if start and (writers or (role == "w" and active)):
            violations += 1
        active += d
        if role == "w":
            writers += d
        else:
            readers += d
        most = max(most, active)
        most_readers = max(most_readers, readers)
    return {"most_holders": most, "most_readers": most_readers, "violations": violations}


def run_cell(
    pool: bl.Pool, kind: str, lib_key: str, roles: list[str], limit: int, duration: float, tag: str
) -> dict[str, Any]:
    r = bl.client()
    name = f"bench:{kind}:{lib_key}:{tag}"
    data = f"bench:data:{kind}:{lib_key}:{tag}"
    lib = (SEM_LIBS if kind == "sem" else RW_LIBS)[lib_key]
    r.delete(data)
    start = now_ns() + int(0.5e9)
    end = start + int(duration * 1e9)
    hard_end = end + int(GRACE_S * 1e9)
    common = dict(
        op="loop",
        kind=kind,
        lib_key=lib_key,
        name=name,
        limit=limit,
        data=data,
        start_ns=start,
        end_ns=end,
        hard_end_ns=hard_end,
    )
    results, cmds, redis_cpu = bl.run_measured(
        pool, [dict(common, role=role) for role in roles], timeout=duration + GRACE_S + 30
    )
    value = int(r.get(data) or 0)
    errors = [res["error"] for res in results if res.get("error")]
    intervals = [(a, c, res["role"]) for res in results for (_w, a, c, _x) in res["recs"]]
    checks = sweep(intervals)
    total = len(intervals)
    row: dict[str, Any] = {
        "lib": lib_key,
        "label": lib.label,
        "processes": len(roles),
        "duration_s": duration,
        "grants": total,
        "most_holders": checks["most_holders"],
        "mean_holders": sum(c - a for a, c, _r in intervals) / (duration * 1e9),
        "round_trips_per_grant": sum(res["round_trips"] for res in results) / total
        if total
        else None,
        "redis_cmds_per_grant": cmds / total if total else None,
        "client_cpu_ms_per_grant": 1000 * sum(res["cpu_s"] for res in results) / total
        if total
        else None,
        "redis_cpu_ms_per_grant": 1000 * redis_cpu / total if total else None,
        "errors": errors,
    }
    for role in sorted(set(roles)):
        mine = [res for res in results if res["role"] == role]
        in_window = [[rec for rec in res["recs"] if rec[1] <= end] for res in mine]
        waits = [(rec[1] - rec[0]) / 1e6 for res in mine for rec in res["recs"]]
        per_proc = [len(x) for x in in_window]
        p = "" if kind == "sem" else ("read_" if role == "r" else "write_")
        row[f"{p}per_s"] = sum(per_proc) / duration
        row[f"{p}wait_p50_ms"] = pct(waits, 50)
        row[f"{p}wait_p90_ms"] = pct(waits, 90)
        row[f"{p}wait_p99_ms"] = pct(waits, 99)
        row[f"{p}fewest"] = min(per_proc)
        row[f"{p}most"] = max(per_proc)
        row[f"{p}starved"] = sum(1 for x in per_proc if x == 0)
    if kind == "sem":
        row["limit"] = limit
        row["over_limit"] = checks["most_holders"] > limit
        row["counter_mismatch"] = value - total
    else:
        row["most_readers"] = checks["most_readers"]
        row["violations"] = checks["violations"]
        row["torn_reads"] = sum(res["torn"] for res in results)
        writes = sum(len(res["recs"]) for res in results if res["role"] == "w")
        row["lost_writes"] = writes - value
        done = row["read_per_s"] + row["write_per_s"]
        row["read_share_pct"] = 100 * row["read_per_s"] / done if done else None
        row["write_share_pct"] = 100 * row["write_per_s"] / done if done else None
    return row


#: Fields summed (not medians) over repetitions: any one of them is a failure.
SUMMED = ("violations", "torn_reads", "lost_writes", "counter_mismatch", "grants")


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repetitions of the numbers, sums of the failures, maxima of the peaks."""
    row = dict(runs[0])
    row["reps"] = len(runs)
    for field, v in runs[0].items():
        if field in ("most_holders", "most_readers"):
            row[field] = max(r[field] for r in runs)
        elif field == "over_limit":
            row[field] = any(r[field] for r in runs)
        elif field == "errors":
            row[field] = [e for r in runs for e in r["errors"]]
        elif field in SUMMED:
            row[field] = sum(r[field] for r in runs)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            vals = [r[field] for r in runs if r[field] is not None]
            row[field] = statistics.median(vals) if vals else None
    return row


def run_grid(
    pool: bl.Pool, cells: list[tuple[str, str, list[str]]], args: Any, log: Callable[[str], None]
) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(args.reps):
        order = list(cells)
        random.shuffle(order)
        for key, lib_key, roles in order:
            kind = key.split("@")[0]
            res = run_cell(pool, kind, lib_key, roles, args.limit, args.duration, f"{key}:{rep}")
            runs.setdefault(key, []).append(res)
            if kind == "sem":
                what = (
                    f"{res['per_s']:7.1f} permits/s  most holders {res['most_holders']}"
                    f"  wait p50 {fmt(res['wait_p50_ms'], 2)} ms"
                )
            else:
                what = (
                    f"{res['read_per_s']:7.1f} reads/s {res['write_per_s']:6.1f} writes/s  "
                    f"violations {res['violations']}"
                )
            log(
                f"  {key:<22} rep {rep + 1}/{args.reps} {res['label']:<44} {what}"
                + (f"  ERRORS {res['errors'][:1]}" if res["errors"] else "")
            )
    return runs


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def report(results: dict[str, Any]) -> str:
    out = []
    sem = results.get("semaphore")
    if sem:
        out.append(
            f"\n1. Semaphore, limit {results['args']['limit']}: N processes, critical section "
            f"INCR + 1 ms, {results['args']['duration']:g} s per cell, "
            f"{results['args']['reps']} rep(s) (medians; most holders = max over reps)"
        )
        rows = [
            [
                f"{r['label']} N={r['processes']}",
                fmt(r["per_s"]),
                f"{r['most_holders']}/{r['limit']}",
                fmt(r["mean_holders"], 2),
                fmt(r["wait_p50_ms"], 2),
                fmt(r["wait_p90_ms"], 2),
                fmt(r["wait_p99_ms"], 2),
                f"{fmt(r['fewest'], 0)}/{fmt(r['most'], 0)}",
                fmt(r["round_trips_per_grant"], 1),
                fmt(r["redis_cmds_per_grant"], 1),
                fmt(r["client_cpu_ms_per_grant"], 2),
                fmt(r["redis_cpu_ms_per_grant"], 3),
                "ERR" if r["errors"] else "",
            ]
            for r in sem.values()
        ]
        out.append(
            bl.table(
                [
                    "library",
                    "permits/s",
                    "most/limit",
                    "mean holders",
                    "wait p50 ms",
                    "p90",
                    "p99",
                    "fewest/most",
                    "RTT/grant",
                    "Redis cmds/grant",
                    "client CPU ms",
                    "Redis CPU ms",
                    "",
                ],
                rows,
            )
        )
    rw = results.get("rwlock")
    if rw:
        a = results["args"]
        out.append(
            f"\n2. Read-write lock: {a['readers']} reader + {a['writers']} writer processes, "
            f"read = GET + 1 ms + GET, write = GET + 1 ms + SET, {a['duration']:g} s per cell, "
            f"{a['reps']} rep(s)"
        )
        rows = [
            [
                r["label"],
                fmt(r["read_per_s"]),
                fmt(r["write_per_s"]),
                f"{fmt(r['read_share_pct'], 0)}/{fmt(r['write_share_pct'], 0)}",
                str(r["most_readers"]),
                f"{fmt(r['read_wait_p50_ms'], 2)}/{fmt(r['read_wait_p99_ms'], 1)}",
                f"{fmt(r['write_wait_p50_ms'], 2)}/{fmt(r['write_wait_p99_ms'], 1)}",
                f"{fmt(r['read_fewest'], 0)}/{fmt(r['read_most'], 0)}",
                f"{fmt(r['write_fewest'], 0)}/{fmt(r['write_most'], 0)}",
                f"{fmt(r['read_starved'], 0)}/{fmt(r['write_starved'], 0)}",
                fmt(r["round_trips_per_grant"], 1),
                fmt(r["redis_cmds_per_grant"], 1),
                str(r["violations"]),
                str(r["torn_reads"]),
                str(r["lost_writes"]),
                "ERR" if r["errors"] else "",
            ]
            for r in rw.values()
        ]
        out.append(
            bl.table(
                [
                    "library",
                    "reads/s",
                    "writes/s",
                    "share r/w %",
                    "most readers",
                    "read wait p50/p99 ms",
                    "write wait p50/p99",
                    "reads fewest/most",
                    "writes fewest/most",
                    "starved r/w",
                    "RTT/grant",
                    "Redis cmds/grant",
                    "violations",
                    "torn",
                    "lost",
                    "",
                ],
                rows,
            )
        )
    for section in (sem or {}, rw or {}):
        for key, r in section.items():
            for e in sorted(set(r["errors"]))[:3]:
                out.append(f"  error in {key}: {e}")
    t = results.get("targets")
    if t:
        out.append("\nChecks:")
        for item in t:
            out.append(f"  [{'PASS' if item['ok'] else 'MISS'}] {item['what']}: {item['value']}")
    skipped = results.get("skipped")
    if skipped:
        out.append("\nSkipped: " + "; ".join(skipped))
    return "\n".join(out)


def checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    t: list[dict[str, Any]] = []
    for r in results.get("semaphore", {}).values():
        t.append(
            {
                "what": f"{r['label']} N={r['processes']}: never more than {r['limit']} holders",
                "value": f"most {r['most_holders']}",
                "ok": not r["over_limit"] and not r["errors"],
            }
        )
    for key, r in results.get("rwlock", {}).items():
        t.append(
            {
                "what": f"{r['label']}: no writer with anyone else, no torn read, no lost write",
                "value": f"{r['violations']} violations, {r['torn_reads']} torn, "
                f"{r['lost_writes']} lost",
                "ok": not (r["violations"] or r["torn_reads"] or r["lost_writes"] or r["errors"]),
            }
        )
        if key == "rw@ours":
            t.append(
                {
                    "what": "ours rw: no process starved",
                    "value": f"{r['read_starved']} readers, {r['write_starved']} writers "
                    "without a grant (median over reps)",
                    "ok": r["read_starved"] == 0 and r["write_starved"] == 0,
                }
            )
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="semaphore,rwlock", help="experiments (semaphore,rwlock)")
    ap.add_argument("--ns", default="8", help="semaphore: process counts (default 8)")
    ap.add_argument("--limit", type=int, default=3, help="semaphore: permits (default 3)")
    ap.add_argument("--readers", type=int, default=6, help="rwlock: reader processes")
    ap.add_argument("--writers", type=int, default=2, help="rwlock: writer processes")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per cell (default 8)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions (default 3)")
    ap.add_argument("--sem-libs", default=",".join(SEM_DEFAULT))
    ap.add_argument("--rw-libs", default=",".join(RW_DEFAULT))
    ap.add_argument("--quick", action="store_true", help="smoke test: 2.5 s cells, one rep")
    ap.add_argument("--redis-url", default=None, help="use this Redis instead of starting one")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/...)")
    ap.add_argument("--no-json", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration, args.reps = 2.5, 1
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    ns = [int(x) for x in args.ns.split(",") if x.strip()]
    skipped: list[str] = []

    def available(libs: dict[str, Lib], keys: str) -> list[str]:
        out = []
        for k in (x for x in keys.split(",") if x):
            lib = libs[k]
            if lib.needs:
                try:
                    __import__(lib.needs)
                except ImportError:
                    skipped.append(f"{lib.label}: `pip install` the package with `{lib.needs}`")
                    continue
            out.append(k)
        return out

    cells: list[tuple[str, str, list[str]]] = []
    if "semaphore" in only:
        for n in ns:
            for k in available(SEM_LIBS, args.sem_libs):
                cells.append((f"sem@{k}@{n}", k, ["sem"] * n))
    if "rwlock" in only:
        roles = ["r"] * args.readers + ["w"] * args.writers
        for k in available(RW_LIBS, args.rw_libs):
            cells.append((f"rw@{k}", k, roles))

    def log(msg: str) -> None:
        print(msg, flush=True)

    server, url = bl.redis_server(args.redis_url)
    bl.configure(url)
    machine = bl.machine_info()
    import importlib.metadata as md

    for dist in ("Redis-Semaphore", "redis-rw-lock"):
        try:
            machine.setdefault("versions", {})[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    machine["redis_server"] = bl.client().info("server").get("redis_version")
    results: dict[str, Any] = {"machine": machine, "args": vars(args), "redis_url": url}
    bl.client().flushdb()
    size = max((len(roles) for _k, _l, roles in cells), default=0)
    log(
        f"redis {machine['redis_server']} at {url}; {os.cpu_count()} CPUs; "
        f"load {machine['loadavg_at_start']}; {len(cells)} cells x {args.reps} rep(s) x "
        f"{args.duration:g} s"
    )
    pool = bl.Pool(size, target=worker_main) if size else None
    started = time.monotonic()
    try:
        runs = run_grid(pool, cells, args, log) if pool else {}
    finally:
        if pool is not None:
            pool.close()
        if server is not None:
            server.stop()
    results["elapsed_s"] = time.monotonic() - started
    results["machine"]["loadavg_at_end"] = os.getloadavg()
    results["runs"] = runs
    for key, mine in runs.items():
        section = "semaphore" if key.startswith("sem@") else "rwlock"
        results.setdefault(section, {})[key] = aggregate(mine)
    results["skipped"] = skipped
    results["targets"] = checks(results)
    print(report(results))
    print(f"\n(total {results['elapsed_s']:.0f} s; load at end {machine['loadavg_at_end']})")
    if not args.no_json:
        suffix = "-quick" if args.quick else ""
        bl.write_json(results, args.out, f"primitives-%Y-%m-%d-%H%M%S{suffix}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
