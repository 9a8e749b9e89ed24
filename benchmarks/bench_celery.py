#!/usr/bin/env python
"""Per-task overhead of single-instance Celery tasks on a real worker.

Variants (all trivial ``return n`` bodies, every call with a fresh ``n`` so no
lock is ever contended):

* ``plain``: no lock (the baseline);
* ``floor``: a bare ``SET NX PX`` before the body and ``DEL`` after it, on the
  client our locks use: two round trips and nothing else, the least any
  run-time lock can add (the figure the run-time modes are compared with);
* ``lock_only``: a plain task whose body is ``with locks.lock("bench-lock:{n}")``:
  our lock without the task integration around it;
* ``decorated``: ``@single_instance("bench:{n}")`` under ``@app.task``;
* ``based``: ``base=SingleInstanceTask`` (run-time lock only);
* ``based_unique``: ``SingleInstanceTask`` with ``unique_on_enqueue=True``
  (a lock taken in ``apply_async``, re-entered and released by the worker);
* ``once_task`` / ``singleton_task``: celery-once and celery-singleton (both
  lock at enqueue), when installed (``pip install -e . --group bench``).

One real ``celery worker --pool=solo`` (one process, so runtimes are not
disturbed by a sibling) on a throw-away local redis-server (broker DB 1,
results DB 2, our locks DB 0, peers' locks DB 5). Variants are interleaved
batch by batch in rotating order so machine noise hits them alike.

Figures per variant:

* ``enqueue``: median wall time of one ``apply_async`` in the client;
* ``runtime``: median task runtime as the worker measures it ("succeeded in"),
  which includes the run-time lock acquire/release;
* ``added``: ``runtime`` minus the baseline's, and ``enqueue`` minus the
  baseline's: the per-task overhead;
* ``tasks/s``: batch size / (first publish -> last result), median over batches.

Run from the repository root::

    .venv/bin/python benchmarks/bench_celery.py               # 3000 tasks per variant
    .venv/bin/python benchmarks/bench_celery.py --tasks 600   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

from tests import celery_app as ca  # noqa: E402  (starts redis-server, sets up Django)

BASE_VARIANTS = ["plain", "floor", "lock_only", "decorated", "based", "based_unique"]
LINE = re.compile(r"Task tests\.celery_app\.(\w+)\[[^\]]+\] succeeded in ([0-9.eE-]+)s")


def run(tasks: int, batch: int) -> dict[str, Any]:
    """Run the benchmark; return the figures."""
    import redis

    base = ca.settings.REDIS_URL.rsplit("/", 1)[0]
    for db in (0, 1, 2, 5):
        redis.Redis.from_url(f"{base}/{db}").flushdb()
    variants = BASE_VARIANTS + ca.PEERS
    worker = ca.Worker(pool="solo", concurrency=1, name="bench")
    enqueue: dict[str, list[float]] = {v: [] for v in variants}
    rates: dict[str, list[float]] = {v: [] for v in variants}
    counter = 0
    try:
        worker.wait_ready()
        # Warm-up: imports, script loading, connections.
        for v in variants:
            getattr(ca, v).delay(-1 - variants.index(v)).get(timeout=60)
        rounds = max(1, tasks // batch)
        for r in range(rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for v in order:
                task = getattr(ca, v)
                results = []
                start = time.perf_counter()
                for _ in range(batch):
                    counter += 1
                    t0 = time.perf_counter()
                    results.append(task.apply_async((counter,)))
                    enqueue[v].append(time.perf_counter() - t0)
                for res in results:
                    res.get(timeout=120)
                rates[v].append(batch / (time.perf_counter() - start))
        time.sleep(0.5)  # let the worker flush its log file
    finally:
        worker.stop()
    runtimes: dict[str, list[float]] = {v: [] for v in variants}
    for line in worker.log.read_text().splitlines():
        m = LINE.search(line)
        if m and m.group(1) in runtimes:
            runtimes[m.group(1)].append(float(m.group(2)))
    from django_redislock import locks

    leftover = sum(1 for _ in locks.active())  # held locks (fence counters are not locks)
    figures: dict[str, Any] = {}
    for v in variants:
        figures[v] = {
            "tasks": len(enqueue[v]),
            "enqueue_us": statistics.median(enqueue[v]) * 1e6,
            "runtime_us": statistics.median(runtimes[v]) * 1e6 if runtimes[v] else None,
            "tasks_per_s": statistics.median(rates[v]),
        }
    plain = figures["plain"]
    for v in variants:
        f = figures[v]
        f["added_enqueue_us"] = f["enqueue_us"] - plain["enqueue_us"]
        f["added_runtime_us"] = (
            None if f["runtime_us"] is None else f["runtime_us"] - plain["runtime_us"]
        )
    return {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "tasks_per_variant": tasks,
        "batch": batch,
        "locks_left_held": leftover,
        "variants": figures,
    }


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=3000, help="tasks per variant")
    ap.add_argument("--batch", type=int, default=200, help="tasks per interleaved batch")
    ap.add_argument("--out", default=None, help="JSON output path")
    args = ap.parse_args(argv)
    results = run(args.tasks, args.batch)
    print(
        f"{'variant':<16}{'tasks':>7}{'enqueue us':>12}{'+enq us':>9}"
        f"{'runtime us':>12}{'+run us':>9}{'tasks/s':>9}"
    )
    for v, f in results["variants"].items():
        print(
            f"{v:<16}{f['tasks']:>7}{f['enqueue_us']:>12.0f}{f['added_enqueue_us']:>9.0f}"
            f"{(f['runtime_us'] or 0):>12.0f}{(f['added_runtime_us'] or 0):>9.0f}"
            f"{f['tasks_per_s']:>9.0f}"
        )
    print(f"locks still held afterwards (must be 0): {results['locks_left_held']}")
    out = (
        Path(args.out)
        if args.out
        else (ROOT / "benchmarks" / "results" / time.strftime("celery-%Y-%m-%d-%H%M%S.json"))
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
