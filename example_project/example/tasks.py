"""The example's Celery task: one report build per account at a time."""

from __future__ import annotations

import time
from typing import Any

from django_redislock import single_instance

from .celery_app import app

#: Longest report the demo builds, in seconds.
MAX_REPORT_SECONDS = 120


@app.task(bind=True)
@single_instance("report:{account_id}", ttl=10)
def build_report(self: Any, account_id: int, seconds: float = 20) -> dict[str, Any]:
    """Pretend to build account *account_id*'s report for *seconds*.

    The lock ``report:<account_id>`` is held by this task's id while it runs
    (its 10 s lease renewed by the watchdog). A second run for the same account
    that starts meanwhile is skipped: its result says so and names the holder.
    """
    seconds = min(max(float(seconds), 0.0), MAX_REPORT_SECONDS)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(1.0, deadline - time.monotonic()))  # the "work"
    return {"account_id": account_id, "seconds": seconds, "task_id": self.request.id}
