#!/usr/bin/env python
"""What does a fair hand-off cost Redis? (diagnostic, not a comparison)

Replays, on one Redis and without any client library in the way, the two scripts a
fair hand-off runs: a release that hands the lock to the first waiter, and the
releaser's next acquire, which queues it behind the new holder (what a worker loop
and the contended benchmark do). Two holders, A and B, take turns for ever.

* ``--mode cpu`` (default): the cycle pipelined, Redis's own CPU (``INFO cpu``) per
  hand-off (one release + one re-queue), the scripts warm.
* ``--mode cold``: one call at a time with ``--gap`` ms of idle between hand-offs, as
  a critical section leaves Redis idle; each script's p50 from ``SLOWLOG`` (its
  threshold at 5 µs, so that the commands inside the scripts are not logged and do
  not slow them), and python-redis-lock's unlock script beside them.

``--baseline PATH`` (a ``git worktree`` of an older commit) runs that tree's scripts
too, interleaved with this tree's, for a before/after in one run. Only the script
texts are loaded from a tree (``django_redislock/engine/scripts.py``).

    .venv/bin/python benchmarks/diag_handoff_scripts.py --runs 3 --baseline /tmp/redislock-baseline
    .venv/bin/python benchmarks/diag_handoff_scripts.py --mode cold --gap 1 --baseline ...
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KEYS = ["diag:{h}", "diag:fence:{h}", "diag:queue:{h}", "diag:waiters:{h}"]
#: A holder's metadata as the Lock writes it (same size).
META = '{"host":"bench-host","pid":12345,"thread":"MainThread"}'
RETENTION = "86400000"


def scripts_of(tree: Path) -> ModuleType:
    """``django_redislock/engine/scripts.py`` of *tree*, loaded on its own."""
    path = tree / "django_redislock" / "engine" / "scripts.py"
    spec = importlib.util.spec_from_file_location(f"scripts_{abs(hash(tree))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Cycle:
    """The two holders' hand-off cycle with one tree's scripts, on its own keys."""

    def __init__(self, r: Any, scripts: ModuleType, tag: str) -> None:
        self.r = r
        self.release_sha = r.script_load(scripts.RELEASE)
        self.acquire_sha = r.script_load(scripts.ACQUIRE)
        self.keys = [k.replace("{h}", "{" + tag + "}") for k in KEYS]
        self.seq = 0
        self.turn = 0  # A holds first
        r.delete(*self.keys)
        assert r.execute_command(*self.acquire("A")) > 0
        assert r.execute_command(*self.acquire("B")) < 0  # queued behind A

    def acquire(self, owner: str) -> tuple[Any, ...]:
        self.seq += 1
        return (
            "EVALSHA", self.acquire_sha, 4, *self.keys,
            owner, f"{owner}{self.seq}", "30000", META, "", RETENTION, f"ch{owner}", "", "", "",
        )  # fmt: skip

    def release(self, owner: str) -> tuple[Any, ...]:
        self.seq += 1
        return ("EVALSHA", self.release_sha, 4, *self.keys, owner, f"r{self.seq}", RETENTION)

    def hand_offs(self, count: int) -> list[tuple[Any, ...]]:
        """*count* hand-offs (A to B, B to A, ...), each a release and the re-queue."""
        commands = []
        for _ in range(count):
            giver = "AB"[self.turn % 2]
            self.turn += 1
            commands += [self.release(giver), self.acquire(giver)]
        return commands


def redis_cpu(r: Any) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def cpu_per_hand_off(r: Any, cycle: Cycle, count: int) -> float:
    """Redis CPU µs per hand-off, *count* hand-offs pipelined in batches of 400."""
    before = redis_cpu(r)
    for _ in range(count // 400):
        pipe = r.pipeline(transaction=False)
        for command in cycle.hand_offs(400):
            pipe.execute_command(*command)
        replies = pipe.execute()
        if replies[0] != 0 or replies[1] >= 0:  # a hand-off, then a queued re-acquire
            raise RuntimeError(f"the cycle went wrong: {replies[:2]}")
    return (redis_cpu(r) - before) / (count // 400 * 400) * 1e6


def cold_p50s(r: Any, cycles: dict[str, Cycle], count: int, gap: float) -> dict[str, float]:
    """Each script's p50 (µs, SLOWLOG) when called alone after *gap* seconds of idle."""
    import redis_lock  # python-redis-lock (the bench group): its own unlock script

    prl = r.script_load(redis_lock.UNLOCK_SCRIPT)
    r.slowlog_reset()
    for _ in range(count):
        for cycle in cycles.values():
            release, acquire = cycle.hand_offs(1)
            time.sleep(gap)
            if r.execute_command(*release) != 0 or r.execute_command(*acquire) >= 0:
                raise RuntimeError("the cycle went wrong")
        time.sleep(gap)
        r.set("diag:prl", "token")
        r.evalsha(prl, 2, "diag:prl", "diag:prl:signal", "token", "1000")
    names = {prl: "python-redis-lock unlock"}
    for label, cycle in cycles.items():
        names[cycle.release_sha] = f"{label} release (hand-off)"
        names[cycle.acquire_sha] = f"{label} acquire (queued)"
    durations: dict[str, list[int]] = {}
    for entry in r.slowlog_get(1_000_000):
        command = entry["command"].split()
        if command[0].upper() == b"EVALSHA" and command[1].decode() in names:
            durations.setdefault(names[command[1].decode()], []).append(entry["duration"])
    return {name: statistics.median(d) for name, d in sorted(durations.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["cpu", "cold"], default="cpu")
    ap.add_argument("--runs", type=int, default=3, help="cpu: runs of each tree")
    ap.add_argument("--hand-offs", type=int, default=8000, help="hand-offs per run (cold: 600)")
    ap.add_argument("--gap", type=float, default=1.0, help="cold: idle ms before each call")
    ap.add_argument("--baseline", type=Path, default=None, help="an older tree to compare")
    args = ap.parse_args()
    import redis

    from tests.redis_server import RedisServer

    # Cold mode logs calls of 5 µs and more (the commands inside a script are faster).
    threshold = "5" if args.mode == "cold" else "-1"
    server = RedisServer("--slowlog-log-slower-than", threshold, "--slowlog-max-len", "1000000")
    try:
        r = redis.Redis.from_url(server.url)
        trees = {"current": ROOT}
        if args.baseline is not None:
            trees = {"baseline": args.baseline, **trees}
        cycles = {label: Cycle(r, scripts_of(tree), label) for label, tree in trees.items()}
        print(f"redis-server {r.info('server')['redis_version']}")
        if args.mode == "cpu":
            for cycle in cycles.values():
                cpu_per_hand_off(r, cycle, 800)  # warm
            for run in range(1, args.runs + 1):
                figures = {k: cpu_per_hand_off(r, c, args.hand_offs) for k, c in cycles.items()}
                line = "  ".join(f"{k} {v:5.1f} µs" for k, v in figures.items())
                ratio = (
                    f"  current ÷ baseline {figures['current'] / figures['baseline']:.3f}"
                    if "baseline" in figures
                    else ""
                )
                print(f"run {run}: Redis CPU per hand-off (release + re-queue): {line}{ratio}")
        else:
            count = min(args.hand_offs, 600)
            p50s = cold_p50s(r, cycles, count, args.gap / 1000)
            print(f"one call at a time, {args.gap:g} ms idle before each, {count} of each:")
            for name, p50 in p50s.items():
                print(f"  {name:<34} p50 {p50:5.0f} µs")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
