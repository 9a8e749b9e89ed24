#!/usr/bin/env python
"""N uncontended create + acquire + release cycles in one process, to time it whole.

For a before/after of our lock that no in-process harness can skew: time this
script as a whole process from outside, alternating two source trees, and compare
the CPU (user + sys) and wall time of the pairs. The process's start (Python,
Django, redis-py) is the same in both; run once with ``--n 0`` to subtract it.

    redis-server --port 6391 --save '' --daemonize yes
    /usr/bin/time -f '%U %S %e' .venv/bin/python benchmarks/cycles.py --tree . \\
        --mode asyncio --n 15000 --url redis://127.0.0.1:6391/0
    /usr/bin/time -f '%U %S %e' .venv/bin/python benchmarks/cycles.py \\
        --tree /tmp/redislock-baseline --mode asyncio --n 15000 --url redis://127.0.0.1:6391/0

``--tree``: the source tree whose ``django_redislock`` is imported (a git worktree of
another commit for the "before"); ``--mode``: ``sync`` (``with locks.lock(...)``) or
``asyncio`` (``async with``, one event loop).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path


def main() -> int:
    """Run the cycles; a process exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--mode", choices=("sync", "asyncio"), default="sync")
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument(
        "--url", required=True, help="a Redis on loopback, e.g. redis://127.0.0.1:6391/0"
    )
    args = ap.parse_args()
    tree = str(Path(args.tree).resolve())
    sys.path.insert(0, tree)

    import django
    from django.conf import settings

    settings.configure(REDISLOCK_URL=args.url, INSTALLED_APPS=["django_redislock"])
    django.setup()
    import django_redislock
    from django_redislock import locks

    if not str(django_redislock.__file__).startswith(tree):
        print(f"imported {django_redislock.__file__}, not from {tree}", file=sys.stderr)
        return 2
    if args.mode == "sync":
        for _ in range(args.n):
            with locks.lock("bench:cycles:sync", ttl=30):
                pass
        return 0

    async def cycles() -> None:
        for _ in range(args.n):
            async with locks.lock("bench:cycles:asyncio", ttl=30):
                pass

    asyncio.run(cycles())
    return 0


if __name__ == "__main__":
    sys.exit(main())
