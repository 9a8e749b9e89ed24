#!/usr/bin/env python
"""Pub/sub latency on a Redis Cluster with plain redis-py clients (none of our code).

On a throw-away 3 primary + 3 replica loopback cluster (tests/redis_cluster.py),
a subscriber thread blocks in ``get_message`` on one node; the main thread sends a
message and takes the time its reply arrives; the subscriber takes the time the
message arrives. Each mode prints p50/p99/max of (message - reply) in ms, and how
many of them took over 20 ms:

* ``same-node``: ``PUBLISH`` and ``SUBSCRIBE`` on the same primary;
* ``cross-node``: ``PUBLISH`` on primary B, ``SUBSCRIBE`` on primary A (the message
  crosses the cluster bus);
* ``sharded``: ``SPUBLISH`` and ``SSUBSCRIBE`` on the primary serving the channel's
  slot (Redis 7+; the message stays on that shard).

Messages are sent at a fixed pace (``--gap`` ms apart), the way hand-offs come.

Run from the repository root::

    .venv/bin/python benchmarks/diag_cluster_pubsub.py --rounds 400     # ~30 s
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from typing import Any

import redis
from scaleout_common import percentile

from tests.redis_cluster import Cluster


def measure(
    publisher: redis.Redis, subscriber: redis.Redis, mode: str, rounds: int, gap: float
) -> list[float]:
    """Latencies (ms) from the publish's reply to the message, *rounds* times."""
    channel = "diag:{wake}:chan"
    pubsub = subscriber.pubsub()
    if mode == "sharded":
        pubsub.ssubscribe(channel)
    else:
        pubsub.subscribe(channel)
    while pubsub.get_message(timeout=5) is None:  # the confirmation
        pass
    received: list[float] = []
    ready = threading.Event()

    def read() -> None:
        ready.set()
        while len(received) < rounds:
            message = pubsub.get_message(timeout=5)
            if message is None:
                return
            if message["type"] in ("message", "smessage"):
                received.append(time.perf_counter())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    ready.wait(5)
    sent: list[float] = []
    command = "SPUBLISH" if mode == "sharded" else "PUBLISH"
    for i in range(rounds):
        time.sleep(gap)
        publisher.execute_command(command, channel, f"m{i}")
        sent.append(time.perf_counter())
    thread.join(10)
    pubsub.close()
    return [(r - s) * 1000 for r, s in zip(received, sent, strict=False)]


def report(mode: str, samples: list[float]) -> dict[str, Any]:
    """p50/p99/max and the count over 20 ms."""
    out = {
        "mode": mode,
        "n": len(samples),
        "p50_ms": round(statistics.median(samples), 3),
        "p99_ms": round(percentile(samples, 99), 3),
        "max_ms": round(max(samples), 3),
        "over_20ms": sum(1 for s in samples if s > 20),
    }
    print(
        f"{mode:10} n={out['n']:4} p50 {out['p50_ms']:7.3f} ms  p99 {out['p99_ms']:7.3f} ms"
        f"  max {out['max_ms']:7.3f} ms  >20ms: {out['over_20ms']}"
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--gap", type=float, default=2.0, help="ms between messages")
    parser.add_argument("--modes", default="same-node,cross-node,sharded")
    args = parser.parse_args()
    cluster = Cluster()
    try:
        a, b = (redis.Redis(port=s.port, socket_timeout=10) for s in cluster.primaries[:2])
        shard_port = cluster.server_for_slot(cluster.client().keyslot("diag:{wake}:chan")).port
        shard = redis.Redis(port=shard_port, socket_timeout=10)
        pairs = {"same-node": (a, a), "cross-node": (b, a), "sharded": (shard, shard)}
        for mode in args.modes.split(","):
            publisher, subscriber = pairs[mode]
            report(mode, measure(publisher, subscriber, mode, args.rounds, args.gap / 1000))
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
