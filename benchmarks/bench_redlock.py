#!/usr/bin/env python
"""Redlock over five masters against one master and against pottery's Redlock.

One run, five throw-away redis-servers on loopback (plus the first of them as
"one master"), the contenders interleaved in batches of 50 operations:

1. ``uncontended``: acquire + release of a free lock: our lock on one master, our
   Redlock over the five (also with monotonic fencing, a second round per grant),
   pottery's ``Redlock`` over the same five. Targets: ours at most 2x one master,
   and faster than pottery.
2. ``two paused``: the same for our Redlock with 2 of the 5 masters SIGSTOPped
   (target: no more than a few ms added).
3. ``handoff``: a waiting thread is woken by the release (a poke from the
   masters); the time from ``release()`` being called to the waiter's
   ``acquire()`` returning.

Run from the repository root::

    .venv/bin/python benchmarks/bench_redlock.py            # ~1 min
    .venv/bin/python benchmarks/bench_redlock.py --quick    # ~15 s

Results: a table on stdout and JSON in ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import redis  # noqa: E402
from scaleout_common import machine, setup, summary, write_result  # noqa: E402

setup()

from pottery import Redlock as PotteryRedlock  # noqa: E402

from django_redislock import LockManager  # noqa: E402
from tests.redlock_servers import Master  # noqa: E402

#: Operations per contender in a row before the next takes over (switching after
#: every operation mostly measures cold caches).
BATCH = 50


def timed(op: Callable[[], None]) -> float:
    """One run of *op*, in ms."""
    started = time.perf_counter()
    op()
    return (time.perf_counter() - started) * 1000


def pair(lock: Any) -> Callable[[], None]:
    """acquire + release of *lock*."""

    def run() -> None:
        assert lock.acquire()
        lock.release()

    return run


def uncontended(masters: list[Master], rounds: int) -> dict[str, Any]:
    """Interleaved acquire+release: one master, our Redlock, pottery's Redlock."""
    single = LockManager(url=masters[0].url).lock("bench:single", auto_renew=False)
    ours = LockManager(redlock_caches=[m.url for m in masters]).lock(
        "bench:redlock", auto_renew=False
    )
    clients = [redis.Redis(port=m.port) for m in masters]
    theirs = PotteryRedlock(key="bench:pottery", masters=clients, auto_release_time=30)
    monotonic_manager = LockManager(redlock_caches=[m.url for m in masters])
    monotonic_manager.backend().features = dataclasses.replace(
        monotonic_manager.backend().features, monotonic_fencing=True
    )  # as REDISLOCK_REDLOCK_MONOTONIC_FENCING = True does
    monotonic = monotonic_manager.lock("bench:monotonic", auto_renew=False)
    contenders = {"one master": pair(single), "redlock (ours)": pair(ours)}
    contenders["redlock, monotonic"] = pair(monotonic)
    contenders["redlock (pottery)"] = pair(theirs)
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for op in contenders.values():
        for _ in range(100):
            op()
    names = list(contenders)
    for i in range(rounds // BATCH):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            samples[name] += [timed(contenders[name]) for _ in range(BATCH)]
    return {name: summary(values) for name, values in samples.items()}


def two_paused(masters: list[Master], rounds: int) -> dict[str, Any]:
    """Our Redlock with 2 of 5 masters paused."""
    ours = LockManager(redlock_caches=[m.url for m in masters]).lock(
        "bench:paused", auto_renew=False
    )
    op = pair(ours)
    for _ in range(50):
        op()
    masters[1].pause()
    masters[3].pause()
    try:
        samples = [timed(op) for _ in range(rounds)]
    finally:
        masters[1].resume()
        masters[3].resume()
    return summary(samples)


def handoff(masters: list[Master], rounds: int) -> dict[str, Any]:
    """release() called → the waiting thread's acquire() returned, over 5 masters."""
    manager = LockManager(redlock_caches=[m.url for m in masters])
    samples: list[float] = []
    for i in range(rounds):
        name = f"bench:handoff:{i}"
        holder = manager.lock(name, owner="holder", auto_renew=False)
        assert holder.acquire()
        got: list[float] = []
        waiter = threading.Thread(
            target=lambda n=name, out=got: (
                manager.lock(n, owner="waiter", auto_renew=False).acquire(timeout=10),
                out.append(time.perf_counter()),
            )
        )
        waiter.start()
        time.sleep(0.02)  # the waiter has asked and is parked
        released = time.perf_counter()
        holder.release()
        waiter.join(10)
        samples.append((got[0] - released) * 1000)
        manager.force_release(name)
    return summary(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    rounds, paused_rounds, handoffs = (1000, 300, 50) if args.quick else (5000, 1000, 200)
    masters = [Master() for _ in range(5)]
    started = time.time()
    try:
        result = {
            "machine": machine(),
            "uncontended": uncontended(masters, rounds),
            "two_of_five_paused": two_paused(masters, paused_rounds),
            "handoff": handoff(masters, handoffs),
        }
    finally:
        for master in masters:
            master.stop()
    print("acquire+release, uncontended (interleaved):")
    for name, row in result["uncontended"].items():
        print(f"  {name:20} p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms")
    row = result["two_of_five_paused"]
    print(f"  {'redlock, 2/5 paused':20} p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms")
    row = result["handoff"]
    print(f"release -> waiter's acquire: p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms")
    out = write_result("redlock", result)
    print(f"({time.time() - started:.0f} s; written to {out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
