#!/usr/bin/env python
"""Several locks at once, uncontended: ``locks.lock_many`` vs the ways to do it without.

One throw-away local redis-server, one process, every library's ``with`` block over the
same number of free locks, interleaved in a shuffled order per round (the method of
``bench_locks.py``'s uncontended experiment, whose set-up this script reuses):

- ``floor``: one pipeline of ``SET NX PX`` for every name, one pipeline of the
  compare-and-delete script (two round trips, nothing else: no order, no queue);
- ``ours``: ``with locks.lock_many(names, ttl=30)`` (one batch of attempts, one batch
  of releases: primitives/at_once.py);
- ``ours_one_by_one``: the same locks, ``with locks.lock(name)`` for each name in
  sorted order (what ``lock_many`` did before it batched: two round trips per lock);
- ``redispy`` / ``prl``: redis-py's ``Lock`` / python-redis-lock, one per name in
  sorted order (neither has a way to take several at once).

Reported per set size (``--sizes``): p50 and p90 of the ``with`` block (µs), p50 ÷
floor, the client's CPU per block, and the round trips the block started (requests
the client sent before waiting for a reply: redis-py's ``send_packed_command`` calls,
counted for one block).

Run from the repository root::

    .venv/bin/python benchmarks/bench_lock_many.py                 # ~1 min
    .venv/bin/python benchmarks/bench_lock_many.py --sizes 2 --rounds 100   # smoke test

Before/after across commits: run the same script in a ``git worktree`` of the older
commit (copy it there): its ``ours`` row is that commit's ``lock_many``.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_locks as B  # noqa: E402

RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)

LIBS = ("floor", "ours", "ours_one_by_one", "redispy", "prl")


def floor_block(names: list[str]) -> Callable[[], None]:
    """Two pipelines: ``SET NX PX`` for every name, then the compare-and-delete script."""
    r = B.client()
    sha = r.script_load(RELEASE)

    def block() -> None:
        token = str(time.monotonic_ns())
        pipe = r.pipeline(transaction=False)
        for n in names:
            pipe.set(n, token, nx=True, px=30000)
        if not all(pipe.execute()):
            raise RuntimeError("floor: a free lock was not granted")
        pipe = r.pipeline(transaction=False)
        for n in names:
            pipe.evalsha(sha, 1, n, token)
        pipe.execute()

    return block


def ours_block(names: list[str]) -> Callable[[], None]:
    locks = B.manager()

    def block() -> None:
        with locks.lock_many(names, ttl=30):
            pass

    return block


def one_by_one(make: Callable[[str], Any], names: list[str]) -> Callable[[], None]:
    """Each name's lock entered in sorted order, left in reverse (an ExitStack)."""
    ordered = sorted(names)

    def block() -> None:
        with contextlib.ExitStack() as stack:
            for n in ordered:
                lock = make(n)
                if not lock.acquire():
                    raise RuntimeError(f"{n}: a free lock was not granted")
                stack.callback(lock.release)

    return block


def make_blocks(names: list[str], prefix: str) -> dict[str, Callable[[], None]]:
    import redis_lock

    locks = B.manager()
    keyed = {lib: [f"{prefix}:{lib}:{n}" for n in names] for lib in LIBS}
    return {
        "floor": floor_block(keyed["floor"]),
        "ours": ours_block(keyed["ours"]),
        "ours_one_by_one": one_by_one(lambda n: locks.lock(n, ttl=30), keyed["ours_one_by_one"]),
        "redispy": one_by_one(lambda n: B.client().lock(n, timeout=30), keyed["redispy"]),
        "prl": one_by_one(lambda n: redis_lock.Lock(B.client(), n, expire=30), keyed["prl"]),
    }


@contextlib.contextmanager
def counting_sends() -> Iterator[list[int]]:
    """Count redis-py's ``send_packed_command`` calls (one per request burst)."""
    from redis.connection import AbstractConnection

    sent = [0]
    original = AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        sent[0] += 1
        original(self, command, check_health)

    AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        AbstractConnection.send_packed_command = original  # type: ignore[method-assign]


def measure(size: int, rounds: int, batch: int, seed: int) -> dict[str, Any]:
    names = [f"n{i}" for i in range(size)]
    blocks = make_blocks(names, f"many{size}")
    for block in blocks.values():  # warm: connections, scripts, caches
        for _ in range(30):
            block()
    trips = {}
    for lib, block in blocks.items():
        with counting_sends() as sent:
            block()
        trips[lib] = sent[0]
    wall: dict[str, list[float]] = {lib: [] for lib in blocks}
    cpu: dict[str, list[float]] = {lib: [] for lib in blocks}
    order = list(blocks)
    rng = random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(order)
        for lib in order:
            block = blocks[lib]
            for _ in range(batch):
                c0, w0 = time.process_time_ns(), time.perf_counter_ns()
                block()
                w1, c1 = time.perf_counter_ns(), time.process_time_ns()
                wall[lib].append((w1 - w0) / 1000)
                cpu[lib].append((c1 - c0) / 1000)
    rows = {}
    floor = statistics.median(wall["floor"])
    for lib in blocks:
        p50 = statistics.median(wall[lib])
        rows[lib] = {
            "p50_us": p50,
            "p90_us": B.pct(wall[lib], 90),
            "per_floor": p50 / floor,
            "cpu_us": statistics.median(cpu[lib]),
            "round_trips": trips[lib],
            "n": len(wall[lib]),
        }
    return rows


def report(results: dict[str, Any]) -> str:
    lines = []
    for size, rows in results["sizes"].items():
        lines.append(f"\n{size} locks per with-block")
        head = ["library", "p50 µs", "p90 µs", "p50 ÷ floor", "client CPU µs", "round trips"]
        body = [
            [
                lib,
                f"{r['p50_us']:.0f}",
                f"{r['p90_us']:.0f}",
                f"{r['per_floor']:.2f}",
                f"{r['cpu_us']:.0f}",
                str(r["round_trips"]),
            ]
            for lib, r in rows.items()
        ]
        lines.append(B.table(head, body))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2,4,8", help="locks per set (default 2,4,8)")
    ap.add_argument("--rounds", type=int, default=300, help="rounds (default 300)")
    ap.add_argument("--batch", type=int, default=2, help="blocks per library per round")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--redis-url", default=None, help="use this Redis instead of starting one")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/...)")
    ap.add_argument("--no-json", action="store_true")
    args = ap.parse_args(argv)
    server, url = B.redis_server(args.redis_url)
    try:
        B.configure(url)
        results: dict[str, Any] = {"machine": B.machine_info(), "args": vars(args), "sizes": {}}
        for size in (int(s) for s in args.sizes.split(",")):
            results["sizes"][str(size)] = measure(size, args.rounds, args.batch, args.seed)
        print(report(results))
        if not args.no_json:
            B.write_json(results, args.out, "lock-many-%Y-%m-%d-%H%M%S.json")
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
