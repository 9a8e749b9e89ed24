#!/usr/bin/env python
"""What ``wait_replicas`` costs, and what it buys, on a real primary and replica.

Two experiments, in one run, on throw-away loopback servers (a primary, and a
replica that replicates through a TCP proxy so that a lagging link is real):

1. ``cost``: acquire + release of a free lock with ``wait_replicas=0`` and ``1``,
   interleaved (the modes alternate every operation), healthy replica connected
   directly (no proxy).
2. ``failover``: a grant, a SIGKILL of the primary right after acquire returns,
   the replica promoted (``REPLICAOF NO ONE``, what Sentinel does), then a
   second client tries the lock on the promoted replica. Counted: how often the
   second client got it (two holders), and whether the next fencing token is
   larger than the first holder's. Per replication lag (0 = loopback as is; a
   few ms = a replica under load) and per ``wait_replicas``.

Run from the repository root::

    .venv/bin/python benchmarks/bench_replicas.py            # ~1 min
    .venv/bin/python benchmarks/bench_replicas.py --quick    # ~20 s

Results: a table on stdout and JSON in ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import redis  # noqa: E402
from scaleout_common import machine, setup, summary, write_result  # noqa: E402

setup(REDISLOCK_WAIT_TIMEOUT=0.5)

from django_redislock import LockManager  # noqa: E402
from tests.replication import ReplicatedPair  # noqa: E402


def cost(rounds: int) -> dict[str, Any]:
    """Per-operation acquire+release latency with and without waiting for the replica."""
    pair = ReplicatedPair(through_proxy=False)
    try:
        manager = LockManager(client=redis.Redis(port=pair.primary.port, socket_timeout=5))
        samples: dict[int, list[float]] = {0: [], 1: []}
        locks = {w: manager.lock("bench:cost", wait_replicas=w, auto_renew=False) for w in (0, 1)}
        for w in (0, 1):  # warm up: scripts loaded, connections made
            for _ in range(200):
                locks[w].acquire()
                locks[w].release()
        for i in range(rounds):
            for w in (0, 1) if i % 2 else (1, 0):
                started = time.perf_counter()
                locks[w].acquire()
                locks[w].release()
                samples[w].append((time.perf_counter() - started) * 1000)
    finally:
        pair.stop()
    return {f"wait_replicas={w}": summary(v) for w, v in samples.items()}


def failover_round(wait_replicas: int, lag: float, index: int) -> tuple[bool, bool]:
    """(a second client got the lock, the next token is larger) for one failover."""
    pair = ReplicatedPair()
    try:
        pair.proxy.reply_delay = lag
        name = f"bench:failover:{index}"
        first = LockManager(client=redis.Redis(port=pair.primary.port, socket_timeout=5)).lock(
            name, ttl=60, wait_replicas=wait_replicas, auto_renew=False
        )
        assert first.acquire(blocking=False)
        token = first.fencing_token or 0
        pair.kill_primary()
        pair.promote_replica()
        promoted = LockManager(client=redis.Redis(port=pair.replica.port, socket_timeout=5))
        second = promoted.lock(name, ttl=60, auto_renew=False, owner="second")
        double = second.acquire(blocking=False)
        if not double:
            promoted.force_release(name)
            second.acquire(blocking=False)
        return double, (second.fencing_token or 0) > token
    finally:
        pair.stop()


def failover(rounds: int, lags: list[float]) -> dict[str, Any]:
    """Double grants after a failover, per lag and wait_replicas."""
    out: dict[str, Any] = {}
    for lag in lags:
        for w in (0, 1):
            results = [failover_round(w, lag, i) for i in range(rounds)]
            out[f"lag={lag * 1000:g}ms wait_replicas={w}"] = {
                "rounds": rounds,
                "second_client_got_it": sum(d for d, _ in results),
                "next_token_larger": sum(t for _, t in results),
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    cost_rounds, failover_rounds = (2000, 10) if args.quick else (10000, 30)
    started = time.time()
    result = {
        "machine": machine(),
        "cost": cost(cost_rounds),
        "failover": failover(failover_rounds, [0.0, 0.005]),
    }
    print("acquire+release, healthy loopback replica:")
    for mode, row in result["cost"].items():
        print(f"  {mode:18} p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms")
    print("SIGKILL of the primary right after the grant, replica promoted:")
    for mode, row in result["failover"].items():
        print(
            f"  {mode:30} second client got the lock {row['second_client_got_it']}/"
            f"{row['rounds']}, next token larger {row['next_token_larger']}/{row['rounds']}"
        )
    out = write_result("replicas", result)
    print(f"({time.time() - started:.0f} s; written to {out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
