"""Asyncio child-process programs for the async tests: ``python -m tests.aproc COMMAND ...``.

Like tests/proc.py: each child sets up Django with ``tests.settings`` (reusing the
parent's Redis through ``REDISLOCK_TEST_REDIS_URL``) and reports on stdout, one
line per event. Everything runs on one event loop started with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import os
import sys


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def _say(*parts: object) -> None:
    print(*parts, flush=True)


def count(name: str, tasks: str, sections: str, counter_key: str, inside_key: str) -> None:
    """*tasks* tasks each do *sections* non-atomic read-modify-writes of *counter_key*
    under the lock; overlaps are counted with *inside_key* (shared by every process)."""
    import redis.asyncio
    from django.conf import settings

    from django_redislock import locks

    async def main() -> int:
        r = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        lock = locks.lock(name, timeout=120)  # one object: each task is its own owner
        overlaps = 0

        async def work() -> None:
            nonlocal overlaps
            for _ in range(int(sections)):
                async with lock:
                    if await r.incr(inside_key) != 1:
                        overlaps += 1
                    value = int(await r.get(counter_key) or 0)
                    await asyncio.sleep(0)
                    await r.set(counter_key, value + 1)
                    await r.decr(inside_key)

        try:
            await asyncio.gather(*(work() for _ in range(int(tasks))))
        finally:
            await r.aclose()
        return overlaps

    _say("done", asyncio.run(main()))


def hold(name: str, ttl: str) -> None:
    """Acquire *name* with ``async with`` (lease *ttl*, renewed), report, wait to be killed."""
    from django_redislock import locks

    async def main() -> None:
        async with locks.lock(name, ttl=float(ttl)) as lock:
            _say("acquired", lock.fencing_token)
            await asyncio.sleep(600)

    asyncio.run(main())


if __name__ == "__main__":
    _setup()
    command, *args = sys.argv[1:]
    {"count": count, "hold": hold}[command](*args)
