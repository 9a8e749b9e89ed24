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

``--bus-nodelay`` then sets ``TCP_NODELAY`` on every TCP socket of every node (gdb
attached to each redis-server of this run, calling ``setsockopt``) and measures
``cross-node`` again: Redis 7.0 sets it on the cluster-bus links it accepts but not
on those it opens (``clusterCron``'s ``connConnect``), which ``PUBLISH`` is
broadcast on; with it set, the ~40 ms waits (Nagle's algorithm holding a frame
until the receiving node's delayed ACK) are gone.

Run from the repository root::

    .venv/bin/python benchmarks/diag_cluster_pubsub.py --rounds 400     # ~30 s
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
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


def tcp_fds(pid: int) -> list[int]:
    """The file descriptors of process *pid* that are TCP sockets."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as lines:
            inodes.update(line.split()[9] for line in list(lines)[1:])
    fds = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            fds.append(int(fd))
    return fds


def set_nodelay(pid: int) -> int:
    """Set TCP_NODELAY on every TCP socket of the redis-server *pid* (through gdb);
    how many calls succeeded."""
    steps = ["set $one = (int*)malloc(4)", "set *$one = 1"]
    steps += [f"call (int)setsockopt({fd}, 6, 1, $one, 4)" for fd in tcp_fds(pid)]
    command = ["gdb", "-p", str(pid), "-batch", "-nx"]
    for step in steps:
        command += ["-ex", step]
    out = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    return sum(1 for line in out.splitlines() if line.startswith("$") and line.endswith("= 0"))


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
    parser.add_argument(
        "--bus-nodelay",
        action="store_true",
        help="then set TCP_NODELAY on the nodes' sockets (gdb) and measure cross-node again",
    )
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
        if args.bus_nodelay:
            done = sum(set_nodelay(server.process.pid) for server in cluster.servers)
            print(f"TCP_NODELAY set on {done} sockets of the {len(cluster.servers)} nodes")
            samples = measure(b, a, "cross-node", args.rounds, args.gap / 1000)
            report("cross-node, bus with TCP_NODELAY", samples)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
