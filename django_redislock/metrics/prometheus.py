"""Lock metrics as ``prometheus_client`` counters and histograms.

Made once per process in the default registry, so django-prometheus's
``/metrics`` view (and ``prometheus_client.generate_latest``) export them with
everything else. Only counters and histograms: both are summed correctly by
``prometheus_client``'s multiprocess collector (``PROMETHEUS_MULTIPROC_DIR``, set
before ``prometheus_client`` is first imported, as gunicorn and Celery prefork
children need). docs/metrics.md lists the metrics.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram

__all__ = ["HOLD_BUCKETS", "WAIT_BUCKETS", "PrometheusRecorder"]

#: Buckets of ``redislock_acquire_wait_seconds``: a fast grant to a long wait.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
#: Buckets of ``redislock_hold_seconds``: a short critical section to a long task.
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)

_LABELS = ("kind", "group")


class PrometheusRecorder:
    """The ``redislock_*`` metrics, recording lock events (a :class:`~.Recorder`)."""

    def __init__(self, registry: Any = REGISTRY) -> None:
        def counter(name: str, doc: str, *extra: str) -> Counter:
            return Counter(name, doc, (*_LABELS, *extra), registry=registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...], *extra: str) -> Histogram:
            return Histogram(name, doc, (*_LABELS, *extra), buckets=buckets, registry=registry)

        self.acquires = counter(
            "redislock_acquires",
            "Acquire calls by outcome: acquired, timeout (a wait gave up), busy "
            "(one attempt found the lock held).",
            "outcome",
        )
        self.wait = histogram(
            "redislock_acquire_wait_seconds",
            "How long acquire calls took, waiting included, by outcome (acquired, timeout).",
            WAIT_BUCKETS,
            "outcome",
        )
        self.hold = histogram(
            "redislock_hold_seconds",
            "How long holds lasted, from the grant to the release that ended them.",
            HOLD_BUCKETS,
        )
        self.losses = counter(
            "redislock_lost", "Holds lost while held (lease ran out, released by another)."
        )
        self.renewals = counter(
            "redislock_renewals",
            "Watchdog renewals by outcome: renewed, failed (Redis error, retried).",
            "outcome",
        )
        self.backend_errors = counter(
            "redislock_backend_errors",
            "Redis failures of lock calls, by operation: acquire, release, renew.",
            "operation",
        )
        self.overloads = Counter(
            "redislock_watchdog_overloads",
            "The watchdog's warnings that it may not keep up, by reason: ceiling (the "
            "held locks need more renewals a second than REDISLOCK_WATCHDOG_CEILING), "
            "behind (a renewal went out late).",
            ("reason",),
            registry=registry,
        )
        self._children: dict[tuple[int, str, str, str], Any] = {}

    def _child(self, metric: Any, labels: tuple[str, str], extra: str = "") -> Any:
        """*metric*'s child for *labels* (and *extra*), looked up once."""
        key = (id(metric), labels[0], labels[1], extra)
        child = self._children.get(key)
        if child is None:
            values = (*labels, extra) if extra else labels
            child = self._children[key] = metric.labels(*values)
        return child

    def acquired(self, labels: tuple[str, str], name: str, waited: float, contended: bool) -> None:
        """Count an acquire that got the lock; observe its wait."""
        self._child(self.acquires, labels, "acquired").inc()
        self._child(self.wait, labels, "acquired").observe(waited)

    def not_acquired(
        self, labels: tuple[str, str], name: str, waited: float, blocking: bool, contended: bool
    ) -> None:
        """Count a timeout (observing its wait) or a busy one-attempt acquire."""
        if blocking:
            self._child(self.acquires, labels, "timeout").inc()
            self._child(self.wait, labels, "timeout").observe(waited)
        else:
            self._child(self.acquires, labels, "busy").inc()

    def released(self, labels: tuple[str, str], held: float) -> None:
        """Observe a hold's duration."""
        self._child(self.hold, labels).observe(held)

    def lost(self, labels: tuple[str, str]) -> None:
        """Count a lost hold."""
        self._child(self.losses, labels).inc()

    def renewed(self, labels: tuple[str, str], ok: bool) -> None:
        """Count a renewal, confirmed or failed."""
        self._child(self.renewals, labels, "renewed" if ok else "failed").inc()

    def backend_error(self, labels: tuple[str, str], operation: str) -> None:
        """Count a Redis failure of *operation*."""
        self._child(self.backend_errors, labels, operation).inc()

    def watchdog_overloaded(self, reason: str) -> None:
        """Count a warning of the watchdog."""
        self.overloads.labels(reason).inc()
