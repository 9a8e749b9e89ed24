"""@single_instance on async def functions: many waiting calls at once, no thread each."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from django_redislock import LockManager, single_instance


def _guarded(manager: LockManager, **options: object):  # type: ignore[no-untyped-def]
    inside = {"now": 0, "max": 0, "done": 0}

    @single_instance("guard:{key}", manager=manager, **options)  # type: ignore[arg-type]
    async def guarded(key: str, hold: float) -> str:
        inside["now"] += 1
        inside["max"] = max(inside["max"], inside["now"])
        await asyncio.sleep(hold)
        inside["now"] -= 1
        inside["done"] += 1
        return key

    return guarded, inside


@pytest.mark.slow
def test_sixty_waiting_calls_all_run_one_at_a_time(manager: LockManager, name: str) -> None:
    """More waiting calls than the event loop's default thread pool has threads:
    with a thread per waiting call this deadlocked; natively it cannot."""
    guarded, inside = _guarded(manager, on_locked="wait")
    threads_before = threading.active_count()

    async def scenario() -> list[str]:
        calls = [guarded(name, 0.002) for _ in range(60)]
        return await asyncio.wait_for(asyncio.gather(*calls), 30)

    assert asyncio.run(scenario()) == [name] * 60
    assert inside["done"] == 60 and inside["max"] == 1
    assert threading.active_count() <= threads_before + 3, "no thread per waiting call"


@pytest.mark.slow
def test_fifty_calls_with_a_timeout_all_succeed_when_the_lock_is_mostly_free(
    manager: LockManager, name: str
) -> None:
    guarded, inside = _guarded(manager, timeout=8)

    async def scenario() -> tuple[list[str], float]:
        started = time.monotonic()
        results = await asyncio.wait_for(
            asyncio.gather(*(guarded(name, 0.02) for _ in range(50))), 30
        )
        return results, time.monotonic() - started

    results, took = asyncio.run(scenario())
    assert results == [name] * 50, "every call got the lock within its timeout"
    assert inside["max"] == 1
    assert took < 8, f"50 calls of 20 ms took {took:.1f} s"
