"""Shaped runs: the cost of a guarded call with ``rate=`` or ``cooldown=`` against plain
``@single_instance``, side by side.

One process, one throw-away redis-server (tests/redis_server.py), a function guarded
three ways on keys of its own; per round, ``--ops`` calls of each (alternating, so drift
hits all alike): p50/p99 µs per call and the ratio of the p50s to plain (the cooldown
to plain on a fresh key per call, as it is measured). The rate is high enough (10,000
per second, the most a window may count) and the cooldown short enough (1 ms, each call
on a fresh key) that no call is refused: what is measured is the admission (``ADMIT``, in
the lock attempt's round trip) and the cooldown's start (``COOL``, in the release's),
not waiting.

Coalescing and debouncing act on Celery messages (a pending run is a new message), so
their cost is a worker's, not a call's: ``bench_celery.py --shaping`` measures every
mode on a real worker against a plain ``@single_instance`` task.

::

    .venv/bin/python benchmarks/bench_shaping.py             # 5 rounds of 2,000 calls
    .venv/bin/python benchmarks/bench_shaping.py --quick     # smoke test
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from call_timing import configure, cpu_model, percentile, timed  # noqa: E402

from tests.redis_server import RedisServer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 300 calls")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.ops = 2, 300

    server = RedisServer()
    try:
        configure(server.url)
        import redis

        from django_redislock import single_instance

        @single_instance("bench:plain")
        def plain() -> None:
            pass

        @single_instance("bench:rate", rate="10000/s")
        def rated() -> None:
            pass

        fresh = itertools.count()

        @single_instance("bench:fresh:{n}")
        def plain_fresh(n: int) -> None:
            pass

        @single_instance("bench:cool:{n}", cooldown=0.001)
        def cooled(n: int) -> None:
            pass

        calls: dict[str, Callable[[], Any]] = {
            "plain": plain,
            "rate": rated,
            "plain, fresh key": lambda: plain_fresh(next(fresh)),
            "cooldown": lambda: cooled(next(fresh)),
        }
        #: What each is compared with: a cooldown is measured on a fresh key per call.
        baseline = {"cooldown": "plain, fresh key"}
        samples: dict[str, list[float]] = {k: [] for k in calls}
        for call in calls.values():  # warm-up: scripts loaded, connections made
            timed(call, 50)
        for _ in range(args.rounds):
            for key, call in calls.items():
                samples[key].extend(timed(call, args.ops))
        print(
            f"{cpu_model()}, redis-py {redis.__version__}, {args.rounds} rounds x {args.ops} calls"
        )
        print(f"{'guard':<18} {'p50 µs':>8} {'p99 µs':>8} {'p50 / its plain':>16}")
        for key, values in samples.items():
            p50 = statistics.median(values)
            base = statistics.median(samples[baseline.get(key, "plain")])
            print(f"{key:<18} {p50:>8.1f} {percentile(values, 0.99):>8.1f} {p50 / base:>15.2f}x")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
