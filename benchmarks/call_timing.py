"""What the per-call benchmarks share (bench_fencing.py, bench_shaping.py): settings for a
throw-away redis-server, timing each call, a percentile, and the CPU model to name."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def configure(url: str, *, sqlite: bool = False) -> None:
    """Django settings with the package on *url* (and an in-memory SQLite with *sqlite*)."""
    import django
    from django.conf import settings

    databases = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django_redislock"],
        DATABASES=databases if sqlite else {},
        REDISLOCK_URL=url,
        USE_TZ=True,
    )
    django.setup()


def timed(call: Callable[[], Any], ops: int) -> list[float]:
    """Microseconds of each of *ops* calls."""
    out = []
    for _ in range(ops):
        start = time.perf_counter_ns()
        call()
        out.append((time.perf_counter_ns() - start) / 1000)
    return out


def percentile(values: list[float], q: float) -> float:
    """The *q* quantile (0-1) of *values*, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_model() -> str:
    """The CPU model (ratios compare across machines, microseconds do not)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
