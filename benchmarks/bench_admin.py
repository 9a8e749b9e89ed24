#!/usr/bin/env python
"""How long the admin lock list takes to render with many held locks.

Starts its own throw-away redis-server (``tests/redis_server.RedisServer``), writes
N locks directly in the engine's hash layout (pipelined HSET + PEXPIRE, as if
N holders had them), and times the admin list view through Django's test client
(full request: session, permission checks, SCAN window, template). Each case is
requested once to warm up, then ``--reps`` times; the median is reported.

Cases per N: the first page (default sort by name), page 5, sort by remaining
lease, a literal search that matches one lock, and a search that matches
nothing (the worst case: the per-request scan budget is used up).

Run from the repository root::

    .venv/bin/python benchmarks/bench_admin.py                 # N = 100 and 100000
    .venv/bin/python benchmarks/bench_admin.py --sizes 100 1000000 --reps 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.redis_server import ENV_VAR, RedisServer  # noqa: E402

LIST = "/admin/django_redislock/heldlock/"


def populate(client: object, n: int) -> None:
    """Write *n* lock hashes named ``job:<i>`` in the engine's layout."""
    import redis

    assert isinstance(client, redis.Redis)
    now = int(time.time() * 1000)
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        key = f"redislock:{{job:{i:07}}}"
        pipe.hset(
            key,
            mapping={
                "owner": f"proc{i % 50}:thread{i}",
                "count": 1,
                "fence": 1_700_000_000_000_000 + i,
                "since": now - (i * 37) % 600_000,
                "ttl": 600_000,
                "op": "n",
                "meta": json.dumps(
                    {
                        "host": f"web-{i % 8}",
                        "pid": 1000 + i % 50,
                        "thread": "MainThread",
                        "purpose": "benchmark",
                    }
                ),
            },
        )
        pipe.pexpire(key, 600_000 - (i * 13) % 300_000)
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def time_request(client: object, url: str, reps: int) -> tuple[float, int]:
    """Median seconds of GET *url* over *reps* requests (after one warm-up), and rows shown."""
    from django.test import Client

    assert isinstance(client, Client)
    response = client.get(url)
    assert response.status_code == 200, response.status_code
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        response = client.get(url)
        samples.append(time.perf_counter() - start)
        assert response.status_code == 200
    return statistics.median(samples), len(response.context["rows"])


def main() -> None:
    """Parse arguments, run every case for every size, print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 100_000])
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()

    server = RedisServer()
    os.environ[ENV_VAR] = server.url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()
    import redis
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client
    from django.test.utils import setup_test_environment

    setup_test_environment()  # so responses carry their template context
    call_command("migrate", verbosity=0)
    client = Client()
    client.force_login(User.objects.create_superuser("bench", "b@example.com", "pw"))
    raw = redis.Redis.from_url(server.url)
    cases = [
        ("first page", LIST),
        ("page 5", LIST + "?p=5"),
        ("sort by lease left", LIST + "?o=ttl"),
        ("search, 1 match", LIST + "?q=job%3A0000042"),
        ("search, no match", LIST + "?q=nothing-matches"),
    ]
    print(f"{'locks':>8}  {'case':<20} {'median ms':>10} {'rows':>5}")
    try:
        for n in args.sizes:
            raw.flushdb()
            populate(raw, n)
            assert raw.dbsize() == n
            for label, url in cases:
                median, shown = time_request(client, url, args.reps)
                print(f"{n:>8}  {label:<20} {median * 1000:>10.1f} {shown:>5}", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
