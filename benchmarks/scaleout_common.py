"""What the scale-out benchmarks share: a minimal Django set-up, percentiles, and
where results go. Import it first: it puts the repository on ``sys.path`` and
configures Django (``REDISLOCK_*`` settings as keyword arguments of :func:`setup`)."""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def setup(**redislock_settings: Any) -> None:
    """Configure Django with no apps and the given settings, once."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(USE_TZ=True, INSTALLED_APPS=[], **redislock_settings)
        django.setup()


def percentile(values: list[float], q: float) -> float:
    """The *q*-th percentile (0-100) of *values*, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summary(samples: list[float]) -> dict[str, Any]:
    """p50/p99 in ms of *samples* (ms), and how many."""
    return {
        "p50_ms": round(statistics.median(samples), 4),
        "p99_ms": round(percentile(samples, 99), 4),
        "n": len(samples),
    }


def machine() -> dict[str, str]:
    """The Python and platform a result was measured on."""
    import redis

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "redis_py": redis.__version__,
    }


def write_result(kind: str, result: dict[str, Any]) -> Path:
    """Write *result* as ``benchmarks/results/<kind>-<date>.json``; return the path."""
    out = ROOT / "benchmarks" / "results" / f"{kind}-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    return out.relative_to(ROOT)
