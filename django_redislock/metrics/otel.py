"""Lock metrics and wait spans through the OpenTelemetry API.

Only ``opentelemetry-api`` is needed: the instruments come from the global meter
provider, so they record nothing until the application configures an SDK (and
then record into it, even if it is configured later). An acquire that found the
lock held also leaves a span, ``redislock.acquire``, covering its wait, as a
child of the current span. docs/metrics.md lists the instruments.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import metrics, trace

from .. import __version__

__all__ = ["OpenTelemetryRecorder"]

_SCOPE = "django_redislock"


class OpenTelemetryRecorder:
    """The ``redislock.*`` instruments, recording lock events (a :class:`~.Recorder`).

    :param meter_provider: default: the global one.
    :param tracer_provider: default: the global one.
    """

    def __init__(self, meter_provider: Any = None, tracer_provider: Any = None) -> None:
        meter = metrics.get_meter(_SCOPE, __version__, meter_provider)
        self.acquires = meter.create_counter(
            "redislock.acquires",
            unit="{acquire}",
            description="Acquire calls by outcome: acquired, timeout, busy.",
        )
        self.wait = meter.create_histogram(
            "redislock.acquire.wait",
            unit="s",
            description="How long acquire calls took, waiting included (acquired, timeout).",
        )
        self.hold = meter.create_histogram(
            "redislock.hold", unit="s", description="How long holds lasted."
        )
        self.losses = meter.create_counter(
            "redislock.lost", unit="{hold}", description="Holds lost while held."
        )
        self.renewals = meter.create_counter(
            "redislock.renewals", unit="{renewal}", description="Renewals: renewed, failed."
        )
        self.backend_errors = meter.create_counter(
            "redislock.backend_errors",
            unit="{error}",
            description="Redis failures by operation: acquire, release, renew.",
        )
        self.overloads = meter.create_counter(
            "redislock.watchdog.overloads",
            unit="{warning}",
            description="The watchdog's warnings that it may not keep up: ceiling, behind.",
        )
        self.tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider)
        self._attributes: dict[tuple[str, str, str, str], dict[str, str]] = {}

    def _attrs(self, labels: tuple[str, str], key: str = "", value: str = "") -> dict[str, str]:
        """The attributes of *labels* (plus ``redislock.<key>``), made once."""
        cache_key = (labels[0], labels[1], key, value)
        attrs = self._attributes.get(cache_key)
        if attrs is None:
            attrs = {"redislock.kind": labels[0], "redislock.group": labels[1]}
            if key:
                attrs[f"redislock.{key}"] = value
            self._attributes[cache_key] = attrs
        return attrs

    def _wait_span(self, labels: tuple[str, str], name: str, waited: float, outcome: str) -> None:
        """A span over an acquire's wait, ended now (its start is *waited* ago)."""
        end = time.time_ns()
        attributes = {**self._attrs(labels, "outcome", outcome), "redislock.name": name}
        span = self.tracer.start_span(
            "redislock.acquire", start_time=end - int(waited * 1e9), attributes=attributes
        )
        span.end(end_time=end)

    def acquired(self, labels: tuple[str, str], name: str, waited: float, contended: bool) -> None:
        """Count an acquire that got the lock; record its wait (and span it if it waited)."""
        attrs = self._attrs(labels, "outcome", "acquired")
        self.acquires.add(1, attrs)
        self.wait.record(waited, attrs)
        if contended:
            self._wait_span(labels, name, waited, "acquired")

    def not_acquired(
        self, labels: tuple[str, str], name: str, waited: float, blocking: bool, contended: bool
    ) -> None:
        """Count a timeout (recording and spanning its wait) or a busy one-attempt acquire."""
        outcome = "timeout" if blocking else "busy"
        attrs = self._attrs(labels, "outcome", outcome)
        self.acquires.add(1, attrs)
        if blocking:
            self.wait.record(waited, attrs)
            self._wait_span(labels, name, waited, outcome)

    def released(self, labels: tuple[str, str], held: float) -> None:
        """Record a hold's duration."""
        self.hold.record(held, self._attrs(labels))

    def lost(self, labels: tuple[str, str]) -> None:
        """Count a lost hold."""
        self.losses.add(1, self._attrs(labels))

    def renewed(self, labels: tuple[str, str], ok: bool) -> None:
        """Count a renewal, confirmed or failed."""
        self.renewals.add(1, self._attrs(labels, "outcome", "renewed" if ok else "failed"))

    def backend_error(self, labels: tuple[str, str], operation: str) -> None:
        """Count a Redis failure of *operation*."""
        self.backend_errors.add(1, self._attrs(labels, "operation", operation))

    def watchdog_overloaded(self, reason: str) -> None:
        """Count a warning of the watchdog."""
        self.overloads.add(1, {"redislock.reason": reason})
