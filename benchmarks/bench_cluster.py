#!/usr/bin/env python
"""Locks on Redis Cluster against one Redis, on throw-away loopback servers.

Three measurements in one run (a 3 primary + 3 replica cluster and one plain
redis-server, all started here):

1. ``uncontended``: acquire + release of a free lock, per operation, on one Redis
   and on the cluster, interleaved (the targets alternate every operation; the
   cluster names are spread over the three primaries). Target: cluster within 1.15x.
   A third target, ``node``, is the one-Redis backend on one cluster primary (names
   of its slots): the server's own share of the gap.
2. ``handoff``: a waiting thread is handed the lock by the release, on the
   cluster, the lock on another node than the process's default hub (the one a
   wait naming no lock uses): the time from ``release()`` being called to the
   waiter's ``acquire()`` returning (p50/p99), and from the release's reply to
   that return (``reply_to_wake``: p50/p99/max). Target: p99 under 5 ms. Then the
   same with every wait on the default hub (``via_bus``: the engine before the
   waits listened on the lock's node; its wake-ups cross the cluster bus).
3. ``renewal``: one watchdog round for 10,000 held locks over the three primaries:
   the real backend's ``run_many`` with the renewal calls the watchdog builds
   (one plain pipeline per node). Target: well under a second.

Run from the repository root::

    .venv/bin/python benchmarks/bench_cluster.py            # ~1 min
    .venv/bin/python benchmarks/bench_cluster.py --quick    # ~20 s

Results: a table on stdout and JSON in ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

import redis  # noqa: E402
from scaleout_common import machine, setup, summary, write_result  # noqa: E402

setup()

from django_redislock import LockManager  # noqa: E402
from django_redislock.engine.calls import Call  # noqa: E402
from django_redislock.engine.lua.mutex import renew_script  # noqa: E402
from tests.redis_cluster import Cluster  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402


def spread_names(manager: LockManager, prefix: str, per_node: int) -> list[str]:
    """Names under *prefix*, *per_node* on each primary, interleaved by node."""
    backend = manager.backend()
    by_node: dict[str, list[str]] = {}
    i = 0
    while len(by_node) < 3 or min(len(v) for v in by_node.values()) < per_node:
        name = f"{prefix}{i}"
        node = backend.client.get_node_from_key(backend.keyspace.keys(name).lock).name
        by_node.setdefault(node, []).append(name)
        i += 1
    columns = [names[:per_node] for names in by_node.values()]
    return [name for row in zip(*columns, strict=True) for name in row]


def uncontended(
    single: LockManager, cluster: LockManager, node: LockManager, rounds: int
) -> dict[str, Any]:
    """Acquire+release of a free lock: one Redis, the cluster, and (``node``) the
    one-Redis backend on one cluster primary with names of its slots, interleaved
    (what the server in cluster mode costs, without the cluster backend's routing)."""
    backend = cluster.backend()
    port = node.backend().client.connection_pool.connection_kwargs["port"]
    on_node = [
        n
        for n in (f"bench:n{i}" for i in range(1000))
        if backend.client.get_node_from_key(backend.keyspace.keys(n).lock).port == port
    ][:3]
    locks = {
        "single": [single.lock(f"bench:u{i}", auto_renew=False) for i in range(3)],
        "cluster": [cluster.lock(n, auto_renew=False) for n in spread_names(cluster, "bench:u", 1)],
        "node": [node.lock(n, auto_renew=False) for n in on_node],
    }
    samples: dict[str, list[float]] = {target: [] for target in locks}
    for target in locks.values():  # warm up: scripts loaded, connections made
        for _ in range(300):
            for lock in target:
                lock.acquire()
                lock.release()
    order = list(locks)
    for i in range(rounds):
        for target in order[i % 3 :] + order[: i % 3]:
            lock = locks[target][i % 3]
            started = time.perf_counter()
            lock.acquire()
            lock.release()
            samples[target].append((time.perf_counter() - started) * 1000)
    out: dict[str, Any] = {target: summary(values) for target, values in samples.items()}
    out["ratio_p50"] = round(out["cluster"]["p50_ms"] / out["single"]["p50_ms"], 3)
    out["node_ratio_p50"] = round(out["node"]["p50_ms"] / out["single"]["p50_ms"], 3)
    return out


def handoff(cluster: LockManager, rounds: int, via_bus: bool = False) -> dict[str, Any]:
    """Release → the waiting thread's acquire returns, across nodes; *via_bus*: every
    wait uses the default hub (the engine before 2026-12-02: the wake-up crosses the
    cluster bus)."""
    backend = cluster.backend()
    if via_bus:
        backend.hub = lambda key=None: type(backend).hub(backend)  # type: ignore[method-assign]
    backend.hub().wait_ready()
    hub_node = backend.hub_node
    name = next(
        n
        for n in spread_names(cluster, "bench:h", 1)
        if backend.client.get_node_from_key(backend.keyspace.keys(n).lock).name != hub_node
    )
    queue_key = backend.keyspace.keys(name).queue
    # The hub a wait on this lock uses (on the lock's node) subscribes now, not in round 1.
    backend.hub(backend.keyspace.keys(name).lock).wait_ready()
    samples: list[float] = []
    after_reply: list[float] = []
    holder = cluster.lock(name, auto_renew=False)
    for _ in range(rounds):
        holder.acquire()
        acquired_at: list[float] = []

        def wait(acquired_at: list[float] = acquired_at) -> None:
            waiter = cluster.lock(name, auto_renew=False)
            waiter.acquire(timeout=10)
            acquired_at.append(time.perf_counter())
            waiter.release()

        thread = threading.Thread(target=wait)
        thread.start()
        deadline = time.monotonic() + 5
        while not backend.client.exists(queue_key) and time.monotonic() < deadline:
            time.sleep(0.001)
        released = time.perf_counter()
        holder.release()
        replied = time.perf_counter()
        thread.join(10)
        samples.append((acquired_at[0] - released) * 1000)
        after_reply.append((acquired_at[0] - replied) * 1000)
    slowest = max(range(rounds), key=lambda i: after_reply[i])
    wake = {
        **summary(after_reply),
        "max_ms": round(after_reply[slowest], 4),
        "max_round": slowest,
        "over_20ms": sum(1 for ms in after_reply if ms > 20),
    }
    return {**summary(samples), "reply_to_wake": wake, "default_hub_node_differs": True}


def renewal(cluster: LockManager, count: int) -> dict[str, Any]:
    """One renewal round of *count* held locks over the primaries (the watchdog's run_many)."""
    backend = cluster.backend()
    held = [cluster.lock(f"bench:r{i}", ttl=120, auto_renew=False) for i in range(count)]
    for lock in held:
        lock.acquire(blocking=False)
    calls = [
        Call(
            renew_script,
            (backend.keyspace.keys(lock.name).lock,),
            (lock.owner, 120_000),
            "renew the lock",
            lock.name,
        )
        for lock in held
    ]
    backend.run_many(calls[:100])  # warm up
    rounds = []
    for _ in range(3):
        started = time.perf_counter()
        results = backend.run_many(calls)
        rounds.append((time.perf_counter() - started) * 1000)
        assert results == [1] * count, "a renewal failed"
    nodes = {backend.client.get_node_from_key(c.keys[0]).name for c in calls}
    for lock in held:
        lock.release()
    return {"locks": count, "primaries": len(nodes), "rounds_ms": [round(r, 1) for r in rounds]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    rounds, handoffs = (3000, 100) if args.quick else (20000, 400)
    started = time.time()
    cluster_servers = Cluster()
    single_server = RedisServer()
    try:
        single = LockManager(client=redis.Redis(port=single_server.port, socket_timeout=5))
        cluster = LockManager(client=cluster_servers.client())
        node_port = cluster_servers.primaries[0].port
        node = LockManager(client=redis.Redis(port=node_port, socket_timeout=5))
        result = {
            "machine": machine(),
            "uncontended": uncontended(single, cluster, node, rounds),
            "handoff_cluster": handoff(cluster, handoffs),
            "handoff_cluster_via_bus": handoff(
                LockManager(client=cluster_servers.client()), handoffs, via_bus=True
            ),
            "renewal_round": renewal(cluster, 10_000),
        }
    finally:
        cluster_servers.stop()
        single_server.stop()
    u = result["uncontended"]
    print("uncontended acquire+release:")
    for target in ("single", "cluster", "node"):
        print(f"  {target:8} p50 {u[target]['p50_ms']:.3f} ms  p99 {u[target]['p99_ms']:.3f} ms")
    print(f"  cluster/single p50: {u['ratio_p50']}x  node/single p50: {u['node_ratio_p50']}x")
    for key, label in (("handoff_cluster", ""), ("handoff_cluster_via_bus", ", via the bus")):
        h = result[key]
        w = h["reply_to_wake"]
        print(f"hand-off across nodes{label}: p50 {h['p50_ms']:.3f} ms  p99 {h['p99_ms']:.3f} ms")
        print(
            f"  release's reply -> waiter awake: p50 {w['p50_ms']:.3f} ms"
            f"  p99 {w['p99_ms']:.3f} ms  max {w['max_ms']:.3f} ms"
            f"  >20 ms: {w['over_20ms']} of {h['n']}"
        )
    r = result["renewal_round"]
    print(f"renewal of {r['locks']} locks over {r['primaries']} primaries: {r['rounds_ms']} ms")
    out = write_result("cluster", result)
    print(f"({time.time() - started:.0f} s; written to {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
