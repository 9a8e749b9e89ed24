"""What the package adds to the engine's watchdog (which knows nothing of Django):
its ceiling, read from ``REDISLOCK_WATCHDOG_CEILING``, and its warnings, sent as
the ``watchdog_overloaded`` signal (which :mod:`django_redislock.metrics` counts)."""

from __future__ import annotations

from .. import signals
from ..conf import setting
from ..engine.watch_load import Overload
from ..engine.watchdog import Watchdog, watchdog


def ceiling() -> float:
    """The watchdog's ceiling: renewals a second before it warns."""
    return float(setting("REDISLOCK_WATCHDOG_CEILING"))


def overloaded(overload: Overload) -> None:
    """Send ``watchdog_overloaded`` about *overload* (when it has receivers)."""
    if signals.watchdog_overloaded.receivers:
        signals.watchdog_overloaded.send(
            sender=Watchdog,
            reason=overload.reason,
            renewals_per_second=overload.renewals_per_second,
            ceiling=overload.ceiling,
            held=overload.held,
            lag=overload.lag,
        )


watchdog.ceiling = ceiling
watchdog.on_overload = overloaded
