#!/usr/bin/env python
"""Many locks held by one process: what an acquire and a renewal cost as the holds grow.

Issue 42, item 2 ("constant cost per lock"). One throw-away local redis-server; each
part runs in a fresh process of its own (so the holds of one do not weigh on the other):

1. ``acquire``: one process takes distinct, uncontended locks (default ttl, 30 s) and,
   each time it holds N of them (``--sizes``), times ``--samples`` more acquires: p50
   and p90 (µs), client CPU per acquire, and p50 ÷ the p50 of a forked reference
   process that holds 10 (their batches interleaved: a shared machine's noise hits
   both alike). Then, past the first renewals,
   holding the most, it sleeps ``--window`` seconds while the watchdog renews: client
   CPU per renewal (the process's CPU, every thread, over the renewals Redis ran:
   ``cmdstat_evalsha``; one EVALSHA per renewal, pipelined), the server's CPU per
   renewal (``INFO cpu``), and the holds lost.
2. ``short-ttl``: ``--short-held`` locks at a ttl of ``--short-ttl`` seconds (3), then the
   same renewal figures over ``--window`` seconds, and the holds lost meanwhile
   (including while they were being taken).

Each part also shows the renewals a second the watchdog computes its holds need, the
ceiling it warns over (``REDISLOCK_WATCHDOG_CEILING``) and the warnings it gave.

Run from the repository root::

    .venv/bin/python benchmarks/bench_scale.py            # ~2 minutes: 100,000 held, 30,000 at 3 s
    .venv/bin/python benchmarks/bench_scale.py --quick    # ~20 s: 10,000 held, 3,000 at 3 s

Results: a table on stdout and JSON in ``benchmarks/results/scale-<date-time>.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class _Count(logging.Handler):
    """Counts the watchdog's warnings."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.ceiling = 0
        self.behind = 0
        self.other = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "over its ceiling" in message:
            self.ceiling += 1
        elif "falling behind" in message:
            self.behind += 1
        else:
            self.other += 1


def _setup(url: str) -> tuple[Any, Any, _Count]:
    import django
    import redis
    from django.conf import settings

    settings.configure(INSTALLED_APPS=["django_redislock"], REDISLOCK_URL=url, USE_TZ=True)
    django.setup()
    from django_redislock import LockManager

    count = _Count()
    logger = logging.getLogger("django_redislock")
    logger.addHandler(count)
    logger.propagate = False  # one line per lost hold would flood the table
    return LockManager(url=url), redis.Redis.from_url(url), count


def _ceiling() -> float:
    """The watchdog's ceiling (0.0 on a tree from before it)."""
    try:
        from django_redislock.primitives.watch_load import ceiling
    except ImportError:
        return 0.0
    return ceiling()


def _server_stats(r: Any) -> tuple[int, float]:
    """(EVALSHA calls, the server's CPU seconds) so far."""
    evalsha = r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    cpu = r.info("cpu")
    return int(evalsha), float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _renewal_window(r: Any, held: list[Any], seconds: float) -> dict[str, Any]:
    """Sleep *seconds* while the watchdog renews *held*; its figures."""
    from django_redislock.engine.watchdog import watchdog

    e0, c0 = _server_stats(r)
    cpu0, t0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    cpu1, t1 = time.process_time(), time.perf_counter()
    e1, c1 = _server_stats(r)
    renewals = max(e1 - e0, 1)
    return {
        "held": len(held),
        "window_s": round(t1 - t0, 2),
        "renewals": e1 - e0,
        "renewals_per_s": round((e1 - e0) / (t1 - t0)),
        "cpu_per_s": round((cpu1 - cpu0) / (t1 - t0), 3),
        "cpu_us_per_renewal": round((cpu1 - cpu0) / renewals * 1e6, 2),
        "redis_cpu_us_per_renewal": round((c1 - c0) / renewals * 1e6, 2),
        "lost": sum(1 for lock in held if lock.lost),
        # (getattr: the script also runs on a tree from before the ceiling, for a before/after)
        "needed_per_s": round(getattr(watchdog, "renewals_per_second", lambda: 0.0)()),
    }


def _timed_acquires(manager: Any, prefix: str, count: int, held: list[Any], keep: int) -> Any:
    """Take *count* fresh locks, each timed (wall, CPU); they join *held*, of which at
    most *keep* stay held (0: all) -- the oldest are released, untimed."""
    times, cpus = [], []
    for _ in range(count):
        lock = manager.lock(f"{prefix}:{time.monotonic_ns()}")
        t, c = time.perf_counter(), time.thread_time()
        lock.acquire()
        times.append(time.perf_counter() - t)
        cpus.append(time.thread_time() - c)
        held.append(lock)
        if keep and len(held) > keep:
            held.pop(0).release()
    return times, cpus


def _reference(conn: Any, url: str) -> None:
    """The forked reference process: holds about 10 locks, and on each request times
    that many acquires (so both sides meet the same noise of a shared machine)."""
    manager, _, _ = _setup(url)
    held: list[Any] = []
    while True:
        count = conn.recv()
        if count is None:
            os._exit(0)
        conn.send(_timed_acquires(manager, "reference", count, held, keep=10))


def part_acquire(url: str, sizes: list[int], samples: int, window: float) -> dict[str, Any]:
    import multiprocessing

    ours, theirs = multiprocessing.Pipe()
    reference = multiprocessing.get_context("fork").Process(target=_reference, args=(theirs, url))
    reference.start()
    manager, r, count = _setup(url)
    ceiling = _ceiling()

    held: list[Any] = []
    rows = []
    serial = 0
    first = time.monotonic()
    for size in sizes:
        while len(held) < size:
            lock = manager.lock(f"scale:{serial}")
            serial += 1
            lock.acquire()
            held.append(lock)
        times, cpus, ref_times = [], [], []
        for _ in range(6):  # interleaved with the reference, a sixth of the samples each
            t, c = _timed_acquires(manager, "scale", samples // 6, held, keep=0)
            times += t
            cpus += c
            ours.send(samples // 6)
            ref_times += ours.recv()[0]
        times.sort()
        rows.append(
            {
                "held": size,
                "p50_us": round(statistics.median(times) * 1e6, 1),
                "p90_us": round(times[int(0.9 * len(times))] * 1e6, 1),
                "cpu_us": round(statistics.median(cpus) * 1e6, 1),
                "reference_p50_us": round(statistics.median(ref_times) * 1e6, 1),
            }
        )
    ours.send(None)
    for row in rows:
        row["p50_ratio"] = round(row["p50_us"] / row["reference_p50_us"], 2)
    # Past the first renewals (a third of the 30 s ttl after the first acquire).
    time.sleep(max(0.0, first + 11.0 - time.monotonic()))
    renewal = _renewal_window(r, held, window)
    renewal.update(ceiling=ceiling, warned_ceiling=count.ceiling, warned_behind=count.behind)
    return {"acquire": rows, "renewal": renewal}


def part_short_ttl(url: str, held_count: int, ttl: float, window: float) -> dict[str, Any]:
    manager, r, count = _setup(url)
    ceiling = _ceiling()

    held = []
    t = time.perf_counter()
    for i in range(held_count):
        lock = manager.lock(f"short:{i}", ttl=ttl)
        lock.acquire()
        held.append(lock)
    took = time.perf_counter() - t
    renewal = _renewal_window(r, held, window)
    renewal.update(
        ttl=ttl,
        acquire_all_s=round(took, 1),
        ceiling=ceiling,
        warned_ceiling=count.ceiling,
        warned_behind=count.behind,
    )
    return {"renewal": renewal}


def _child(args: argparse.Namespace) -> int:
    if args.part == "acquire":
        result = part_acquire(args.url, args.sizes, args.samples, args.window)
    else:
        result = part_short_ttl(args.url, args.short_held, args.short_ttl, args.window)
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # 100,000 Locks need no orderly teardown


def _run_part(args: argparse.Namespace, part: str, url: str) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--part", part, "--url", url]
    argv += ["--sizes", ",".join(map(str, args.sizes)), "--samples", str(args.samples)]
    argv += ["--window", str(args.window), "--short-held", str(args.short_held)]
    argv += ["--short-ttl", str(args.short_ttl)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])  # type: ignore[no-any-return]
    raise RuntimeError(f"part {part} failed:\n{out.stdout}\n{out.stderr}")


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells
    )


RENEWAL_COLUMNS = [
    ("held", "held"),
    ("needed/s", "needed_per_s"),
    ("sent/s", "renewals_per_s"),
    ("CPU/s", "cpu_per_s"),
    ("µs CPU/renewal", "cpu_us_per_renewal"),
    ("Redis µs CPU/renewal", "redis_cpu_us_per_renewal"),
    ("lost", "lost"),
    ("ceiling", "ceiling"),
    ("warned (ceiling, behind)", "warned"),
]


def _renewal_row(label: str, renewal: dict[str, Any]) -> list[Any]:
    renewal = {**renewal, "warned": f"{renewal['warned_ceiling']}, {renewal['warned_behind']}"}
    return [label, *[renewal[key] for _, key in RENEWAL_COLUMNS]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, shorter windows")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--window", type=float)
    parser.add_argument("--short-held", type=int)
    parser.add_argument("--short-ttl", type=float, default=3.0)
    parser.add_argument("--url", help="a Redis URL (default: a throw-away redis-server)")
    parser.add_argument("--part", choices=["acquire", "short-ttl"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help="the JSON file (default: benchmarks/results/...)")
    args = parser.parse_args(argv)
    args.sizes = args.sizes or ([10, 1_000, 10_000] if args.quick else [10, 1_000, 10_000, 100_000])
    args.window = args.window or (4.0 if args.quick else 12.0)
    args.short_held = args.short_held or (3_000 if args.quick else 30_000)
    if args.part:
        return _child(args)
    server = None
    url = args.url
    if url is None:
        from tests.redis_server import RedisServer

        server = RedisServer()
        url = server.url
    try:
        acquire = _run_part(args, "acquire", url)
        redis_flush(url)
        short = _run_part(args, "short-ttl", url)
    finally:
        if server is not None:
            server.stop()
    headers = ["held", "acquire p50 µs", "p90 µs", "CPU µs", "10 held p50 µs", "p50 ÷ 10 held"]
    keys = ["held", "p50_us", "p90_us", "cpu_us", "reference_p50_us", "p50_ratio"]
    print(
        f"Acquire of a free lock at N held (ttl 30 s, {args.samples} samples each), "
        "interleaved with a process that holds 10"
    )
    print(_table(headers, [[row[k] for k in keys] for row in acquire["acquire"]]))
    print(f"\nRenewals over {args.window:g} s")
    rows = [
        _renewal_row("default ttl (30 s)", acquire["renewal"]),
        _renewal_row(f"ttl {args.short_ttl:g} s", short["renewal"]),
    ]
    print(_table(["", *[h for h, _ in RENEWAL_COLUMNS]], rows))
    print(f"(taking the {args.short_held:,} short-ttl locks took "
          f"{short['renewal']['acquire_all_s']} s)")  # fmt: skip
    results = {"args": {k: v for k, v in vars(args).items() if k != "part"}, "acquire": acquire,
               "short_ttl": short, "commit": _commit()}  # fmt: skip
    path = (
        Path(args.out)
        if args.out
        else ROOT / "benchmarks" / "results" / time.strftime("scale-%Y-%m-%d-%H%M%S.json")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    print(f"JSON: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


def redis_flush(url: str) -> None:
    """Empty the server between the parts."""
    import redis

    redis.Redis.from_url(url).flushall()


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
