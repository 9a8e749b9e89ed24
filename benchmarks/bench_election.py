"""Leader election and the runner: failover time and the cost of ``is_current``.

1. **failover**: a leader runner (``python -m django_redislock run NAME --wait --ttl
   LEASE -- sleep``) and a standby runner whose command records the time it started;
   the leader's runner is SIGKILLed (its command dies with it) and the time from the
   kill to the standby's command start is measured, ``--rounds`` times. Reported as
   p50/p99/max in seconds and against the lease (the bound is about one lease, plus
   the standby's poll and the command's start-up).
2. **is_current**: ``--calls`` calls of ``Election.is_current(term)`` (one ``HGET``
   script, one round trip) from one process: p50/p99 µs per call, which is what a
   beat under ``LeaderScheduler`` pays per due entry.

Starts its own throw-away redis-server (tests/redis_server.py)::

    .venv/bin/python benchmarks/bench_election.py                 # 20 failovers, 20,000 calls
    .venv/bin/python benchmarks/bench_election.py --quick         # smoke test
    .venv/bin/python benchmarks/bench_election.py --ttl 5 --rounds 50
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from django_redislock import LockManager  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402

PY = sys.executable
STARTED = "import os, time, redis; redis.Redis.from_url(os.environ['B_URL']).rpush(os.environ['B_KEY'], repr(time.time()))"  # noqa: E501


def _env(url: str, key: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}
    env.update(B_URL=url, B_KEY=key)
    return env


def _runner(
    url: str, name: str, ttl: float, command: list[str], env: dict[str, str]
) -> subprocess.Popen[bytes]:  # noqa: E501
    argv = [PY, "-m", "django_redislock", "run", name, "--url", url, "--wait", "--ttl", str(ttl),
            "--grace", str(ttl / 4), "--", *command]  # fmt: skip
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stderr=subprocess.DEVNULL, start_new_session=True
    )


def _queued(manager: LockManager, name: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        info = manager.get(name)
        if info is not None and info.waiters:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the standby never queued")
        time.sleep(0.02)


def failover(url: str, ttl: float, rounds: int) -> list[float]:
    """Seconds from the SIGKILL of the leader's runner to the standby's command start."""
    client = redis.Redis.from_url(url)
    manager = LockManager(url=url)
    took = []
    for _ in range(rounds):
        name, key = f"bench:{uuid.uuid4().hex[:8]}", f"bench:started:{uuid.uuid4().hex[:8]}"
        env = _env(url, key)
        leader = _runner(url, name, ttl, [PY, "-c", STARTED + "; time.sleep(600)"], env)
        try:
            if client.blpop([key], timeout=30) is None:
                raise RuntimeError("the leader's command never started")
            standby = _runner(url, name, ttl, [PY, "-c", STARTED], env)
            try:
                _queued(manager, name)
                killed = time.time()
                os.kill(leader.pid, signal.SIGKILL)
                popped = client.blpop([key], timeout=ttl + 30)
                if popped is None:
                    raise RuntimeError("the standby's command never started")
                took.append(float(popped[1]) - killed)
                standby.wait(30)
            finally:
                _kill_group(standby)
        finally:
            _kill_group(leader)
    return took


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def is_current_cost(url: str, calls: int) -> list[float]:
    """Microseconds per ``is_current`` call (a leader checking its own term)."""
    manager = LockManager(url=url)
    election = manager.election(f"bench:{uuid.uuid4().hex[:8]}", ttl=30)
    term = election.campaign()
    for _ in range(200):  # warm up: connection, script load
        election.is_current(term)
    costs = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        election.is_current(term)
        costs.append((time.perf_counter_ns() - started) / 1000)
    election.resign()
    return costs


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    """Run both experiments and print the figures (``--json`` for one JSON object)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ttl", type=float, default=2.0, help="the lease (s), default 2")
    parser.add_argument("--rounds", type=int, default=20, help="failovers measured")
    parser.add_argument("--calls", type=int, default=20000, help="is_current calls measured")
    parser.add_argument("--quick", action="store_true", help="3 failovers, 1,000 calls")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rounds, calls = (3, 1000) if args.quick else (args.rounds, args.calls)
    server = RedisServer()
    try:
        took = failover(server.url, args.ttl, rounds)
        costs = is_current_cost(server.url, calls)
    finally:
        server.stop()
    result = {
        "lease_s": args.ttl,
        "failover_rounds": rounds,
        "failover_p50_s": statistics.median(took),
        "failover_p99_s": _percentile(took, 0.99),
        "failover_max_s": max(took),
        "is_current_calls": calls,
        "is_current_p50_us": statistics.median(costs),
        "is_current_p99_us": _percentile(costs, 0.99),
    }
    if args.json:
        print(json.dumps(result))
        return
    p50 = result["failover_p50_s"]
    print(f"failover (lease {args.ttl:g} s, {rounds} rounds): p50 {p50:.2f} s, "
          f"p99 {result['failover_p99_s']:.2f} s, max {result['failover_max_s']:.2f} s "
          f"({p50 / args.ttl:.2f} leases at p50)")  # fmt: skip
    print(f"is_current ({calls} calls): p50 {result['is_current_p50_us']:.0f} µs, "
          f"p99 {result['is_current_p99_us']:.0f} µs per call (one round trip)")  # fmt: skip


if __name__ == "__main__":
    main()
