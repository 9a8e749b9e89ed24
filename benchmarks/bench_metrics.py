#!/usr/bin/env python
"""What lock metrics cost: uncontended acquire + release with metrics off and on, paired.

One invocation, one throw-away local redis-server, one process. Modes rotate every
``--batch`` operations (the order rotates too), so a shared machine's noise hits
them alike; compare the medians of one run with each other, never across runs:

* ``off``: no exporter enabled; the lock signals have no receivers (the cost when
  neither prometheus_client nor opentelemetry-api is installed is this one: the
  metrics package is then never imported);
* ``prometheus``: ``metrics.enable("prometheus")`` (the default registry);
* ``otel``: ``metrics.enable("opentelemetry")`` with the SDK's MeterProvider and
  an in-memory reader configured as the global provider (recording for real);
* ``both``: the two at once.

Each operation is ``lock.acquire()`` + ``lock.release()`` of a free lock (one Lock
object per batch), timed with ``perf_counter_ns``. Round trips to Redis dominate
that figure and a shared machine makes it noisy, so a second experiment,
``recording``, times what metrics add without Redis: the ``lock_acquired`` and
``lock_released`` signals an acquire + release sends, with their receivers, per
mode (CPU only; what the first experiment's overhead should be).

Run from the repository root::

    .venv/bin/python benchmarks/bench_metrics.py              # ~30 s
    .venv/bin/python benchmarks/bench_metrics.py --rounds 10 --batch 200   # a smoke test

Results: a table on stdout and JSON in ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from typing import Any

import bench_locks as bl  # noqa: E402  (puts the repository on sys.path)

MODES = ("off", "prometheus", "otel", "both")
_EXPORTERS = {
    "off": (),
    "prometheus": ("prometheus",),
    "otel": ("opentelemetry",),
    "both": ("prometheus", "opentelemetry"),
}


def _use_otel_sdk() -> None:
    """Make the SDK's meter provider (with an in-memory reader) the global one."""
    from opentelemetry import metrics as otel_metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    otel_metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


def batch(mode: str, count: int) -> list[float]:
    """*count* acquire + release pairs in *mode*, each in microseconds."""
    from django_redislock import metrics

    metrics.disable()
    if _EXPORTERS[mode]:
        metrics.enable(*_EXPORTERS[mode])
    lock = bl.manager().lock(f"bench:metrics:{mode}", ttl=30)
    clock = time.perf_counter_ns
    out = []
    for _ in range(count):
        start = clock()
        lock.acquire()
        lock.release()
        out.append((clock() - start) / 1000)
    metrics.disable()
    return out


def recording(mode: str, count: int) -> float:
    """Microseconds per acquire + release's worth of signals in *mode* (no Redis)."""
    from django_redislock import metrics, signals
    from django_redislock.primitives.lock import Lock

    metrics.disable()
    if _EXPORTERS[mode]:
        metrics.enable(*_EXPORTERS[mode])
    lock = bl.manager().lock("bench:metrics:recording", ttl=30)
    acquired, released = signals.lock_acquired, signals.lock_released
    start = time.perf_counter_ns()
    for _ in range(count):
        if acquired.receivers:
            acquired.send(
                sender=Lock, lock=lock, name=lock.name, owner="o", fencing_token=1,
                hold_count=1, waited=0.0002,
            )  # fmt: skip
        if released.receivers:
            released.send(
                sender=Lock, lock=lock, name=lock.name, owner="o", hold_count=0, held=0.01
            )
    took = (time.perf_counter_ns() - start) / 1000 / count
    metrics.disable()
    return took


def run(rounds: int, size: int, warmup: int) -> dict[str, Any]:
    """Rounds of one batch per mode, the order rotating each round."""
    for mode in MODES:
        batch(mode, warmup)
    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    #: Per round, each mode's batch median minus the off batch's: the paired overhead.
    paired: dict[str, list[float]] = {mode: [] for mode in MODES}
    for r in range(rounds):
        order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
        medians = {}
        for mode in order:
            values = batch(mode, size)
            samples[mode].extend(values)
            medians[mode] = statistics.median(values)
        for mode in MODES:
            paired[mode].append(medians[mode] - medians["off"])
    off = statistics.median(samples["off"])
    results: dict[str, Any] = {}
    for mode in MODES:
        values = sorted(samples[mode])
        median = statistics.median(values)
        results[mode] = {
            "ops": len(values),
            "median_us": median,
            "p90_us": values[int(len(values) * 0.9)],
            "overhead_us": median - off,
            "paired_overhead_us": statistics.median(paired[mode]),
            "ratio": median / off,
            # The best of several runs: the CPU cost, with the least interference.
            "recording_us": min(recording(mode, 20 * size) for _ in range(5)),
        }
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--redis-url", help="an existing Redis (default: start one)")
    parser.add_argument("--out", help="the JSON file (default: benchmarks/results/...)")
    args = parser.parse_args(argv)
    server, url = bl.redis_server(args.redis_url)
    try:
        bl.configure(url)
        _use_otel_sdk()
        results = run(args.rounds, args.batch, args.warmup)
    finally:
        if server is not None:
            server.stop()
    rows = [
        [
            mode,
            str(r["ops"]),
            bl.fmt(r["median_us"]),
            bl.fmt(r["p90_us"]),
            f"{r['overhead_us']:+.1f}",
            f"{r['paired_overhead_us']:+.1f}",
            f"{r['ratio']:.3f}",
        ]
        for mode, r in results.items()
    ]
    print("uncontended acquire + release, one process (us)")
    print(bl.table(["metrics", "ops", "median", "p90", "overhead", "paired", "x off"], rows))
    print("paired: the median over rounds of (batch median - that round's off batch median)")
    print()
    print("recording: the signals of one acquire + release with their receivers, no Redis (us)")
    costs = [[mode, f"{r['recording_us']:.2f}"] for mode, r in results.items()]
    print(bl.table(["metrics", "us"], costs))
    bl.write_json(
        {
            "experiment": "metrics",
            "args": vars(args),
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "results": results,
        },
        args.out,
        "metrics-%Y-%m-%d-%H%M%S.json",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
