"""Store-enforced fencing: each guarded write against the same plain write, side by side.

One process, one throw-away redis-server (tests/redis_server.py), a lock held for the
whole run. Per round and per pair, ``--ops`` calls of the plain write then ``--ops`` of
its guarded twin (alternating, so drift hits both alike); reported as p50/p99 µs per
call and the ratio of the p50s:

* ``SET`` / ``held.guarded().set``, ``INCRBY`` / ``guarded().incrby``,
  ``HSET`` / ``guarded().hset`` (one script that checks the hold, then writes);
* ``GET`` of the lock's key / ``held.check()`` (the question alone);
* on an in-memory SQLite table: ``QuerySet.update`` / ``fenced_update(token=...)``
  (the conditional ``UPDATE`` in a transaction).

::

    .venv/bin/python benchmarks/bench_fencing.py             # 5 rounds of 2,000 calls
    .venv/bin/python benchmarks/bench_fencing.py --quick     # smoke test
    .venv/bin/python benchmarks/bench_fencing.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from call_timing import configure, cpu_model, percentile, timed  # noqa: E402

from tests.redis_server import RedisServer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 300 calls")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.ops = 2, 300

    server = RedisServer()
    try:
        configure(server.url, sqlite=True)
        from django.db import connection, models

        from django_redislock import locks
        from django_redislock.fencing import FencedManager, FencingTokenField

        class Row(models.Model):
            total = models.IntegerField(default=0)
            fence = FencingTokenField()
            objects = FencedManager()

            class Meta:
                app_label = "bench_fencing"

        with connection.schema_editor() as editor:
            editor.create_model(Row)
        Row.objects.create(pk=1)

        plain = redis.Redis.from_url(server.url)
        name = "bench:fencing"
        with locks.lock(name, ttl=600) as held:
            token = held.fencing_token
            assert token is not None
            guarded = held.guarded()
            lock_key = held.key
            value_key = f"value:{{{name}}}"
            count_key = f"count:{{{name}}}"
            hash_key = f"hash:{{{name}}}"
            pairs: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
                "set": (
                    lambda: plain.set(value_key, "v"),
                    lambda: guarded.set(value_key, "v"),
                ),
                "incrby": (
                    lambda: plain.incrby(count_key, 1),
                    lambda: guarded.incrby(count_key, 1),
                ),
                "hset": (
                    lambda: plain.hset(hash_key, mapping={"a": "1"}),
                    lambda: guarded.hset(hash_key, {"a": "1"}),
                ),
                "check": (lambda: plain.hget(lock_key, "fence"), held.check),
                "db update": (
                    lambda: Row.objects.filter(pk=1).update(total=models.F("total") + 1),
                    lambda: Row.objects.filter(pk=1).fenced_update(
                        token=token, total=models.F("total") + 1
                    ),
                ),
            }
            samples: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in pairs}
            for pair in pairs.values():  # warm-up: scripts loaded, connections made
                for call in pair:
                    timed(call, 50)
            for _ in range(args.rounds):
                for key, (base, fenced) in pairs.items():
                    samples[key][0].extend(timed(base, args.ops))
                    samples[key][1].extend(timed(fenced, args.ops))
        rows = []
        print(f"{cpu_model()}, Python {platform.python_version()}, "
              f"redis-py {redis.__version__}, {args.rounds} rounds x {args.ops} calls")  # fmt: skip
        print(f"{'write':<10} {'plain p50':>10} {'p99':>8} {'guarded p50':>12} {'p99':>8} "
              f"{'p50 ratio':>10}")  # fmt: skip
        for key, (base, fenced) in samples.items():
            row = {
                "write": key,
                "plain_p50_us": statistics.median(base),
                "plain_p99_us": percentile(base, 0.99),
                "guarded_p50_us": statistics.median(fenced),
                "guarded_p99_us": percentile(fenced, 0.99),
            }
            row["ratio_p50"] = row["guarded_p50_us"] / row["plain_p50_us"]
            rows.append(row)
            print(f"{key:<10} {row['plain_p50_us']:>10.1f} {row['plain_p99_us']:>8.1f} "
                  f"{row['guarded_p50_us']:>12.1f} {row['guarded_p99_us']:>8.1f} "
                  f"{row['ratio_p50']:>9.2f}x")  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps({"rows": rows, "args": vars(args) | {"json": None}}))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
