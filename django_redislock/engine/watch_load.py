"""The watchdog's warnings that it may not keep up (pure: the package gives it its
ceiling and turns a warning into the ``watchdog_overloaded`` signal).

``"ceiling"``: the holds need more renewals a second than the ceiling, known when
they are taken, before any renewal is late. ``"behind"``: a renewal went out more
than halfway from when it was due to when its hold would count as lost (measured,
whatever the ceiling). Each at most once per :data:`WARN_INTERVAL_SECONDS`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("django_redislock")

#: How many renewals a second the process's holds may need before the watchdog
#: warns, by default (``REDISLOCK_WATCHDOG_CEILING``). Measured on a 2-core machine
#: (docs/architecture.md, "The watchdog"): 30,000 holds at a ttl of 3 s (30,000 a
#: second) lost none, 40,000 none on a quiet machine and most on a busy one, 50,000 most.
DEFAULT_CEILING = 25_000.0
#: At most one "falling behind" and one "over the ceiling" warning per this long.
WARN_INTERVAL_SECONDS = 60.0


@dataclass(frozen=True)
class Overload:
    """Why the watchdog warned: ``reason`` is ``"ceiling"`` (the holds need more
    renewals a second than the ceiling) or ``"behind"`` (a renewal went out late:
    more than halfway from when it was due to when its hold counts as lost)."""

    reason: str
    #: Renewals a second the holds need (each is renewed every third of its ttl).
    renewals_per_second: float
    #: The ceiling, in renewals a second.
    ceiling: float
    #: How many holds are renewed.
    held: int
    #: How late the latest renewal went out (seconds; 0.0 for ``"ceiling"``).
    lag: float = 0.0


class LoadWarnings:
    """When the watchdog warns (its state; the watchdog's lock guards it)."""

    def __init__(self) -> None:
        self._over = False
        self._warned_at = {"ceiling": float("-inf"), "behind": float("-inf")}
        #: The worst lag of a renewal sent since the last check (the watchdog sets it).
        self.late = 0.0

    def idle(self) -> None:
        """Nothing is held: below any ceiling."""
        self._over = False

    def check(
        self, now: float, per_second: float, held: int, ceiling: Callable[[], float]
    ) -> list[Overload]:
        """The warnings due at *now*, for holds needing *per_second* renewals."""
        found: list[Overload] = []
        try:
            limit = float(ceiling())
        except Exception:  # a bad setting must not stop the renewals
            logger.exception("redislock watchdog: could not read its ceiling")
            limit = DEFAULT_CEILING
        if per_second > limit:
            if not self._over and now - self._warned_at["ceiling"] >= WARN_INTERVAL_SECONDS:
                self._over = True
                self._warned_at["ceiling"] = now
                found.append(Overload("ceiling", per_second, limit, held))
        elif per_second < 0.9 * limit:
            self._over = False
        if self.late and now - self._warned_at["behind"] >= WARN_INTERVAL_SECONDS:
            self._warned_at["behind"] = now
            found.append(Overload("behind", per_second, limit, held, self.late))
        self.late = 0.0
        return found


def tell(overloads: list[Overload], hook: Callable[[Overload], None] | None) -> None:
    """Log each of *overloads* and hand it to *hook* (its failure is logged)."""
    for overload in overloads:
        if overload.reason == "ceiling":
            logger.warning(
                "redislock watchdog: %d held locks need %.0f renewals a second, over "
                "its ceiling of %.0f (REDISLOCK_WATCHDOG_CEILING): beyond it renewals "
                "may fall behind and holds be lost",
                overload.held, overload.renewals_per_second, overload.ceiling,
            )  # fmt: skip
        else:
            logger.warning(
                "redislock watchdog: falling behind: a renewal went out %.3f s late "
                "(%d held locks, %.0f renewals a second; ceiling %.0f)",
                overload.lag, overload.held, overload.renewals_per_second, overload.ceiling,
            )  # fmt: skip
        try:
            if hook is not None:
                hook(overload)
        except Exception:
            logger.exception("redislock watchdog: a watchdog_overloaded receiver failed")
