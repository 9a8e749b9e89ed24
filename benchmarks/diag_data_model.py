#!/usr/bin/env python
"""What would a smaller data model save? (diagnostic, not a comparison)

Replays, interleaved in one process against one Redis, three uncontended
acquire + release pairs:

* ``floor``: ``SET NX PX`` and a compare-and-delete script (the least any lock does);
* ``ours``: the two ``EVALSHA`` calls our Lock sends, recorded with their exact
  arguments (11 Redis commands with those inside the scripts);
* ``one_hash``: a prototype of the "smaller data model" -- the fencing counter and
  the release nonce kept in the lock hash, a released lock's hash kept without an
  owner for the retention -- whose acquire is ``HMGET``, ``TIME``, ``HSET``,
  ``PEXPIRE`` and whose release is ``HMGET`` and three writes (the prototype keeps
  only what a free lock's pair needs; it is not a lock to use).

It prints each pair's p50 and its ratio to the floor's (of the p50s, and the
median of per-round ratios), and the Redis commands and script time per pair.

    .venv/bin/python benchmarks/diag_data_model.py --rounds 400
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_locks as B  # noqa: E402

ONE_HASH_ACQUIRE = r"""
local L = KEYS[1]
local owner, nonce, ttl, meta = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local h = redis.call('HMGET', L, 'owner', 'op', 'fence', 'count', 'type', 'q')
if h[5] then return 'TYPE ' .. h[5] end
if h[1] == owner then return {h[3], h[4]} end
if h[1] or h[6] then return -2 end
local t = redis.call('TIME')
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local fence = (tonumber(h[3]) or 0) + 1
if us > fence then fence = us end
fence = string.format('%.0f', fence)
redis.call('HSET', L, 'owner', owner, 'count', '1', 'fence', fence,
           'since', string.format('%.0f', math.floor(us / 1000)), 'ttl', ttl, 'op', nonce,
           'meta', meta)
redis.call('PEXPIRE', L, ttl)
return tonumber(fence)
"""

ONE_HASH_RELEASE = r"""
local L = KEYS[1]
local h = redis.call('HMGET', L, 'owner', 'rel', 'count', 'q')
if h[1] ~= ARGV[1] then return -1 end
if h[2] == ARGV[2] then return tonumber(h[3]) end
redis.call('HDEL', L, 'owner', 'count', 'since', 'ttl', 'op', 'meta')
redis.call('HSET', L, 'rel', ARGV[2])
redis.call('PEXPIRE', L, ARGV[3])
return 0
"""

COMPARE_AND_DELETE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    from tests.redis_server import RedisServer

    server = RedisServer()
    try:
        B.configure(server.url)
        import redis

        recorded = B.OursRawScripts("diag:model:ours")  # our two calls, as the Lock sends them
        acquire_args, release_args = recorded.acq_args, recorded.rel_args
        r = redis.Redis.from_url(server.url)
        cad = r.register_script(COMPARE_AND_DELETE)
        acquire = r.script_load(ONE_HASH_ACQUIRE)
        release = r.script_load(ONE_HASH_RELEASE)
        # (sha, numkeys, keys..., owner, nonce, ttl, meta, ...): our metadata, same size.
        meta = acquire_args[2 + int(acquire_args[1]) + 3]
        nonces = iter(range(1, 1 << 62))

        def floor() -> None:
            r.set("diag:model:floor", "x", nx=True, px=30000)
            cad(keys=["diag:model:floor"], args=["x"])

        def ours() -> None:
            r.evalsha(*acquire_args)
            r.evalsha(*release_args)

        def one_hash() -> None:
            nonce = str(next(nonces))
            r.evalsha(acquire, 1, "diag:model:{one}", "owner", nonce, "30000", meta)
            r.evalsha(release, 1, "diag:model:{one}", "owner", nonce, "86400000")

        pairs: dict[str, Callable[[], None]] = {
            "floor": floor,
            "ours": ours,
            "one_hash": one_hash,
        }
        for pair in pairs.values():
            for _ in range(200):
                pair()
        samples: dict[str, list[float]] = {k: [] for k in pairs}
        per_round: dict[str, list[float]] = {k: [] for k in pairs}
        order = list(pairs)
        for _ in range(args.rounds):
            random.shuffle(order)
            for k in order:
                got = []
                for _ in range(args.batch):
                    t0 = time.perf_counter()
                    pairs[k]()
                    got.append((time.perf_counter() - t0) * 1e6)
                samples[k] += got
                per_round[k].append(statistics.median(got))
        floor_p50 = statistics.median(samples["floor"])
        print(
            f"{'pair':<9} {'p50 µs':>7} {'÷ floor':>8} {'paired':>7} {'cmds':>5} {'script µs':>10}"
        )
        for k, pair in pairs.items():
            r.config_resetstat()
            for _ in range(1000):
                pair()
            stats = r.info("commandstats")
            commands = sum(
                v["calls"]
                for name, v in stats.items()
                if "info" not in name and "reset" not in name
            )
            scripts = stats.get("cmdstat_evalsha", {}).get("usec", 0)
            p50 = statistics.median(samples[k])
            paired = statistics.median(
                a / b for a, b in zip(per_round[k], per_round["floor"], strict=True)
            )
            print(
                f"{k:<9} {p50:7.1f} {p50 / floor_p50:8.3f} {paired:7.3f} "
                f"{commands / 1000:5.1f} {scripts / 1000:10.1f}"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
