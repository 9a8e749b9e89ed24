#!/usr/bin/env python
"""Where does django-redislock's hand-off time go? (diagnostic, not a comparison)

Runs the contended experiment of ``bench_locks.py`` for our lock only, with the
waiter path instrumented by monkeypatching *in the benchmark processes* (the
engine is not modified). Every timestamp is CLOCK_MONOTONIC, shared by all
processes, so a hand-off splits into:

* ``release call -> message``: the releaser's request reaches Redis, the release
  script runs, PUBLISH, and the thread reading the process's wake-up
  subscription (usually the waiter itself) reads and parses the message;
* ``message -> waiter awake``: from the dispatch of that message until
  ``WakeHub.wait()`` returns the fence in the acquiring thread (a thread
  wake-up + GIL only when another thread was the reader);
* ``awake -> acquire returns``: the rest of ``acquire()`` after the wake-up
  (unregister, watchdog registration, signals).

It also reports the same contended run for python-redis-lock (BLPOP wake-up + one
more SET NX round trip) as the reference, and a ``--ns 2`` run isolates the
machine's oversubscription from the mechanism itself.

    .venv/bin/python benchmarks/diag_handoff.py --ns 2,8,32 --duration 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_locks as B  # noqa: E402

_T: dict[str, int] = {}


def instrument() -> None:
    """Patch the waiter path of this process (called in each worker after fork)."""
    from django_redislock.engine import wakeup

    orig_dispatch = wakeup.WakeHub._dispatch
    orig_wait = wakeup.WakeHub.wait

    def _dispatch(self: Any, data: Any) -> None:
        _T["msg"] = B.now_ns()
        orig_dispatch(self, data)
        _T["set_done"] = B.now_ns()

    def wait(self: Any, waiter: Any, timeout: float) -> int | None:
        fence = orig_wait(self, waiter, timeout)
        if fence is not None:
            _T["awake"] = B.now_ns()
        return fence

    wakeup.WakeHub._dispatch = _dispatch  # type: ignore[method-assign]
    wakeup.WakeHub.wait = wait  # type: ignore[method-assign]


def worker(conn: Any) -> None:
    instrument()
    while True:
        if not conn.poll(600):
            return
        cmd = conn.recv()
        op = cmd.pop("op", "contend")
        if op == "exit":
            return
        conn.send(contend(**cmd) if op == "contend" else wake(**cmd))


def contend(lib_key: str, name: str, counter: str, start_ns: int, end_ns: int) -> dict[str, Any]:
    make = B.LIBS[lib_key].make
    r = B.client()
    r.ping()
    make(name)
    recs = []
    B._sleep_until(start_ns)
    while B.now_ns() < end_ns:
        _T.clear()
        lk = make(name)
        lk.acquire()
        t_acq = B.now_ns()
        v = int(r.get(counter) or 0)
        time.sleep(0.001)
        r.set(counter, v + 1)
        t_rel = B.now_ns()
        lk.release()
        recs.append((t_acq, t_rel, B.now_ns(), _T.get("msg"), _T.get("set_done"), _T.get("awake")))
    return {"recs": recs, "threads": threading.active_count()}


def wake(role: str, lib_key: str, name: str, trials: int) -> dict[str, Any]:
    """Holder keeps the lock 200 ms; waiter (blocked 100-200 ms) records its wake-up steps."""
    import random

    make = B.LIBS[lib_key].make
    r = B.client()
    r.ping()
    make(name)
    out = []
    for _ in range(trials):
        base = B.now_ns() + int(0.05e9)
        B._sleep_until(base)
        if role == "holder":
            lk = make(name)
            lk.acquire()
            B._sleep_until(base + int(0.2e9))
            t_rel = B.now_ns()
            lk.release()
            out.append((t_rel, B.now_ns()))
            B._sleep_until(base + int(0.3e9))
        else:
            B._sleep_until(base + int(random.uniform(0.01, 0.1) * 1e9))
            _T.clear()
            lk = make(name)
            lk.acquire()
            t_acq = B.now_ns()
            lk.release()
            out.append((t_acq, _T.get("msg"), _T.get("set_done"), _T.get("awake")))
            B._sleep_until(base + int(0.3e9))
    return {"recs": out}


def run_wake(conns: list[Any], libs: list[str], trials: int) -> None:
    for lib in libs:
        start = B.now_ns() + int(0.3e9)
        for c, role in zip(conns[:2], ("holder", "waiter"), strict=False):
            c.send(dict(op="wake", role=role, lib_key=lib, name=f"diag:w:{lib}", trials=trials))
        holder, waiter = (c.recv() for c in conns[:2])
        del start
        parts: dict[str, list[float]] = {
            "wake (from release call)": [],
            "release call rtt": [],
            "rel->msg": [],
            "msg->awake": [],
            "awake->acq": [],
        }
        pairs = zip(holder["recs"], waiter["recs"], strict=False)
        for (t_rel, t_ret), (t_acq, msg, _set_done, awake) in pairs:
            parts["wake (from release call)"].append((t_acq - t_rel) / 1e6)
            parts["release call rtt"].append((t_ret - t_rel) / 1e6)
            if msg and awake:
                parts["rel->msg"].append((msg - t_rel) / 1e6)
                parts["msg->awake"].append((awake - msg) / 1e6)
                parts["awake->acq"].append((t_acq - awake) / 1e6)
        print(
            f"wake {lib:10} "
            + "  ".join(
                f"{k} p50 {statistics.median(v):.3f}/p90 {B.pct(v, 90):.3f}"
                for k, v in parts.items()
                if v
            ),
            flush=True,
        )


def run(libs: list[str], ns: list[int], duration: float, wake_trials: int = 0) -> None:
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    size = max(ns + [2])
    ns = [n for n in ns if n > 0] if duration > 0 else []
    conns, procs = [], []
    for _ in range(size):
        a, b = ctx.Pipe()
        p = ctx.Process(target=worker, args=(b,), daemon=True)
        p.start()
        conns.append(a)
        procs.append(p)
    try:
        if wake_trials:
            run_wake(conns, libs, wake_trials)
        for n in ns:
            for lib in libs:
                start = B.now_ns() + int(0.5e9)
                cmd = dict(
                    lib_key=lib,
                    name=f"diag:{lib}:{n}",
                    counter=f"diag:cnt:{lib}:{n}",
                    start_ns=start,
                    end_ns=start + int(duration * 1e9),
                )
                for c in conns[:n]:
                    c.send(dict(cmd))
                res = [c.recv() for c in conns[:n]]
                recs = sorted(r for x in res for r in x["recs"])
                parts: dict[str, list[float]] = {
                    "handoff": [],
                    "rel->msg": [],
                    "msg->awake": [],
                    "awake->acq": [],
                    "set_done->awake": [],
                    "release rtt": [],
                }
                for prev, nxt in zip(recs, recs[1:], strict=False):
                    parts["handoff"].append((nxt[0] - prev[1]) / 1e6)
                    parts["release rtt"].append((prev[2] - prev[1]) / 1e6)
                    if nxt[3] and nxt[5]:
                        parts["rel->msg"].append((nxt[3] - prev[1]) / 1e6)
                        parts["msg->awake"].append((nxt[5] - nxt[3]) / 1e6)
                        parts["set_done->awake"].append((nxt[5] - nxt[4]) / 1e6)
                        parts["awake->acq"].append((nxt[0] - nxt[5]) / 1e6)
                print(
                    f"{lib:14} N={n:<3} {len(recs) / duration:6.0f} CS/s  "
                    + "  ".join(
                        f"{k} p50 {statistics.median(v):.3f}/p90 {B.pct(v, 90):.3f}"
                        for k, v in parts.items()
                        if v
                    ),
                    flush=True,
                )
    finally:
        for c in conns:
            c.send({"op": "exit"})
        for p in procs:
            p.join(2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="2,8,32")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--libs", default="ours,prl")
    ap.add_argument("--wake-trials", type=int, default=20, help="0 = skip the wake-up breakdown")
    args = ap.parse_args()
    from tests.redis_server import RedisServer

    server = RedisServer()
    try:
        B.configure(server.url)
        ns = [int(x) for x in args.ns.split(",") if x]
        run(args.libs.split(","), ns, args.duration, args.wake_trials)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
