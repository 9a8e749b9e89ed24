"""A Lock's manners in a running event loop.

A blocking wait is refused there (it would freeze the loop), and what a cancelled
``aacquire`` / ``arelease`` left in flight is finished in a background task that a second
cancellation does not stop.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio.events import _get_running_loop
from collections.abc import Coroutine
from typing import Any

from ..exceptions import BlockingCallInEventLoop

__all__ = ["finish_in_background", "refuse_in_event_loop"]

logger = logging.getLogger("django_redislock")

#: Tasks finishing what a cancelled ``aacquire``/``arelease`` left in flight.
_background: set[asyncio.Task[Any]] = set()


def refuse_in_event_loop(name: str, call: str, instead: str) -> None:
    """Raise BlockingCallInEventLoop when a blocking wait would freeze a running loop."""
    if _get_running_loop() is None:
        return
    raise BlockingCallInEventLoop(
        f"lock {name!r}: {call} would block the running event loop while it waits; "
        f"use 'await lock.{instead}' or 'async with lock:' in async code "
        "(or acquire(blocking=False) for one attempt)",
        name=name,
    )


async def finish_in_background(coro: Coroutine[Any, Any, None]) -> None:
    """Run *coro* to its end even if the caller is cancelled again meanwhile."""
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)
    task.add_done_callback(_log_failure)
    try:
        await asyncio.shield(task)
    except BaseException:  # cancelled again, or it failed (logged): the caller's error wins
        pass


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("redislock: finishing a cancelled lock call failed: %s", task.exception())
