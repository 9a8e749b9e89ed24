#!/usr/bin/env python
"""Where does the client CPU of a critical section go? (diagnostic, not a comparison)

Runs the contended experiment's critical section (``GET counter``, sleep 1 ms,
``SET counter v+1``) in N forked processes for a few seconds, in four ways: with no
lock at all (what the critical section itself costs), and inside our lock (fair and
``fair=False``) and python-redis-lock's. It prints each process group's client CPU
(``time.process_time``, every thread of each process) per critical section, and
critical sections per second: the CPU a lock adds is the difference with the
no-lock row at N=1 (a free lock: create, acquire, release) and at N>1 (waiting,
waking and handing over, and the machine's oversubscription, which the no-lock row
at the same N shows). It also prints the p50 of each part of the critical section
(the ``GET``, the sleep, the ``SET``): work that other processes do while it runs
(a releaser queueing again, say) shows as a longer ``GET`` or sleep.

    .venv/bin/python benchmarks/diag_cpu.py --ns 1,8 --duration 3 --reps 2

Each (lock, N) runs *reps* times, interleaved; the figures are per run, so their
spread shows the machine's noise.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from call_timing import configure  # noqa: E402

#: How each way takes its lock ("none": no lock), as a context manager factory.
WAYS = ("none", "ours", "ours_unfair", "prl")


def _guard(way: str, client: Any) -> Any:
    if way == "none":
        from contextlib import nullcontext

        return nullcontext()
    if way == "prl":
        import redis_lock

        return redis_lock.Lock(client, "diag:cpu:prl", expire=30)
    from django_redislock import locks

    return locks.lock("diag:cpu:ours", ttl=30, fair=way == "ours")


#: The parts of a critical section whose times are kept.
PARTS = ("GET", "sleep", "SET")


def worker(url: str, way: str, duration: float, out: Any) -> None:
    """One process: critical sections until *duration* is over; to *out*: their count,
    the CPU seconds, and each section's parts in µs."""
    configure(url)
    import redis

    client = redis.Redis.from_url(url)
    client.ping()
    done, end = 0, time.monotonic() + duration
    clock = time.perf_counter_ns
    parts: list[tuple[float, float, float]] = []
    cpu0 = time.process_time()
    while time.monotonic() < end:
        with _guard(way, client):
            t0 = clock()
            value = client.get("diag:cpu:counter")
            t1 = clock()
            time.sleep(0.001)
            t2 = clock()
            client.set("diag:cpu:counter", int(value or 0) + 1)
            t3 = clock()
        parts.append(((t1 - t0) / 1e3, (t2 - t1) / 1e3, (t3 - t2) / 1e3))
        done += 1
    out.put((done, time.process_time() - cpu0, parts))


def run_once(url: str, way: str, n: int, duration: float) -> tuple[float, float, list[float]]:
    """(critical sections/s, client CPU µs per critical section, p50 µs of each part)
    of one run."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(url, way, duration, out)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=duration + 60) for _ in procs]
    for p in procs:
        p.join(10)
    sections = sum(count for count, _, _ in results)
    cpu = sum(seconds for _, seconds, _ in results)
    parts = [x for _, _, got in results for x in got]
    p50s = [statistics.median(x[i] for x in parts) for i in range(len(PARTS))]
    return sections / duration, cpu / max(1, sections) * 1e6, p50s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ns", default="1,8", help="process counts, comma-separated")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per run")
    ap.add_argument("--reps", type=int, default=2, help="runs per (way, N), interleaved")
    ap.add_argument("--ways", default=",".join(WAYS))
    args = ap.parse_args()
    from tests.redis_server import RedisServer

    server = RedisServer()
    try:
        ns = [int(x) for x in args.ns.split(",") if x]
        ways = [w for w in args.ways.split(",") if w]
        unknown = set(ways) - set(WAYS)
        if unknown:
            raise SystemExit(f"unknown ways {sorted(unknown)}; choose from {WAYS}")
        rows: dict[tuple[str, int], list[tuple[float, float, list[float]]]] = {}
        for _rep in range(args.reps):
            for n in ns:
                for way in ways:
                    rows.setdefault((way, n), []).append(
                        run_once(server.url, way, n, args.duration)
                    )
        parts = "/".join(PARTS)
        print(
            f"{'way':<12} {'N':>3}  {'CS/s per run':<16} {'client CPU µs/CS':<16} "
            f"p50 µs of {parts}, per run"
        )
        for (way, n), got in rows.items():
            rates = " ".join(f"{rate:6.0f}" for rate, _, _ in got)
            cpus = " ".join(f"{cpu:6.0f}" for _, cpu, _ in got)
            p50s = "  ".join("/".join(f"{v:.0f}" for v in p) for _, _, p in got)
            print(f"{way:<12} {n:>3}  {rates:<16} {cpus:<16} {p50s}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
