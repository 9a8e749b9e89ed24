"""Lock metrics for Prometheus and OpenTelemetry, fed by the lock signals.

Off by default, and then never imported: a lock's hot path only checks whether
its signals have receivers. :func:`enable` (which ``RedisLockConfig.ready()``
calls with ``REDISLOCK_METRICS``) connects receivers to the signals of
:mod:`django_redislock.signals` and hands each event, labelled, to the enabled
exporters' recorders (:mod:`.prometheus`, :mod:`.otel`).

Every event is labelled by ``kind`` (``mutex``, ``semaphore``, ``read``,
``write``) and ``group``, a bounded name for the lock: :attr:`Lock.metrics_group
<django_redislock.Lock.metrics_group>` (a ``@single_instance`` or task lock's key
template), else the ``REDISLOCK_METRICS_GROUPS`` rule applied to the lock name
(:func:`group_for_name`); never the raw name. docs/metrics.md lists the metrics.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from django.core.exceptions import ImproperlyConfigured

from .. import signals
from ..conf import setting
from ..settings_spec import validate_metrics

if TYPE_CHECKING:
    from ..primitives.lock import Lock

__all__ = ["OTHER", "Recorder", "disable", "enable", "enabled", "group_for_name", "labels_of"]

logger = logging.getLogger("django_redislock")

#: The group of a lock name no rule names: ``"other"``.
OTHER = "other"

#: ``kind`` of a semaphore's or read-write lock's hold, by its mode (a mutex: "mutex").
_KINDS = {"s": "semaphore", "r": "read", "w": "write"}

#: Each exporter's module and recorder class, the package it imports and its pip requirement.
_EXPORTERS = {
    "prometheus": (".prometheus", "PrometheusRecorder", "prometheus_client", "prometheus_client"),
    "opentelemetry": (".otel", "OpenTelemetryRecorder", "opentelemetry", "opentelemetry-api"),
}  # fmt: skip

#: Whether the running acquire (this thread's, or asyncio task's) found the lock held.
_contended: ContextVar[bool] = ContextVar("redislock_contended", default=False)


class Recorder(Protocol):
    """What an exporter does with each lock event; *labels* is ``(kind, group)``."""

    def acquired(self, labels: tuple[str, str], name: str, waited: float, contended: bool) -> None:
        """An acquire call got the lock after *waited* seconds."""

    def not_acquired(
        self, labels: tuple[str, str], name: str, waited: float, blocking: bool, contended: bool
    ) -> None:
        """An acquire call gave up (*blocking*: at its timeout; else one attempt)."""

    def released(self, labels: tuple[str, str], held: float) -> None:
        """A release ended a hold that lasted *held* seconds."""

    def lost(self, labels: tuple[str, str]) -> None:
        """A hold was lost while held."""

    def renewed(self, labels: tuple[str, str], ok: bool) -> None:
        """The watchdog renewed a hold (*ok*), or failed to and will retry."""

    def backend_error(self, labels: tuple[str, str], operation: str) -> None:
        """Redis failed an ``acquire``, ``release`` or ``renew``."""

    def watchdog_overloaded(self, reason: str) -> None:
        """The watchdog warned it may not keep up (*reason*: ``ceiling``, ``behind``)."""


#: The enabled exporters' recorders.
_recorders: dict[str, Recorder] = {}
#: Every recorder made in this process: one per exporter, whose instruments are
#: registered once (a second Prometheus counter of the same name is refused).
_made: dict[str, Recorder] = {}


def enable(*exporters: str) -> None:
    """Export lock metrics through *exporters* (``"prometheus"``, ``"opentelemetry"``).

    Idempotent; each exporter's instruments are made once per process (in the
    default Prometheus registry, or the global OpenTelemetry meter provider).
    Raises ValueError for an unknown exporter and ImproperlyConfigured when its
    package is not installed.
    """
    for exporter in validate_metrics(list(exporters), "enable()"):
        if exporter in _recorders:
            continue
        if exporter not in _made:
            _made[exporter] = _make_recorder(exporter)
        _recorders[exporter] = _made[exporter]
    if _recorders:
        _connect()


def _make_recorder(exporter: str) -> Recorder:
    """A new recorder of *exporter* (its instruments on the global registry/provider)."""
    module_name, class_name, package, requirement = _EXPORTERS[exporter]
    try:
        module = importlib.import_module(module_name, __name__)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"redislock metrics: {exporter!r} needs the {package} package "
            f"(pip install {requirement}, or django-redislock's [{exporter}] extra): {exc}"
        ) from exc
    recorder: Recorder = getattr(module, class_name)()
    return recorder


def disable() -> None:
    """Stop exporting lock metrics (what was counted so far stays in the registry)."""
    _recorders.clear()
    for signal, receiver in _RECEIVERS:
        signal.disconnect(receiver, dispatch_uid=_uid(receiver))


def enabled() -> tuple[str, ...]:
    """The exporters metrics go to now, in the order they were enabled."""
    return tuple(_recorders)


def enable_from_settings() -> None:
    """:func:`enable` the exporters of ``REDISLOCK_METRICS`` (none: nothing happens)."""
    exporters = setting("REDISLOCK_METRICS")
    if exporters:
        enable(*exporters)


def group_for_name(name: str) -> str:
    """The ``group`` label of a lock *name* without a template of its own.

    With ``REDISLOCK_METRICS_GROUPS`` (a list of prefixes): the longest prefix
    *name* starts with; without it: the part of *name* before its first ``:``.
    Otherwise ``"other"``.
    """
    prefixes = setting("REDISLOCK_METRICS_GROUPS")
    if prefixes is None:
        head, colon, _ = name.partition(":")
        return head if colon and head else OTHER
    for prefix in prefixes:
        if name.startswith(prefix):
            return str(prefix)
    return OTHER


def labels_of(lock: Lock) -> tuple[str, str]:
    """``(kind, group)`` of *lock*'s events."""
    shared = lock._shared
    kind = "mutex" if shared is None else _KINDS[shared.mode]
    group = lock.metrics_group
    return kind, group if group is not None else group_for_name(lock.name)


# -- the signal receivers ---------------------------------------------------------


def _guarded(receiver: Callable[..., None]) -> Callable[..., None]:
    """*receiver*, with its failures logged: a metric must never fail a lock call."""

    def guarded(sender: Any, **kwargs: Any) -> None:
        try:
            receiver(**kwargs)
        except Exception:
            logger.exception("redislock metrics: recording %s failed", receiver.__name__)

    guarded.__name__ = receiver.__name__
    return guarded


def _took_contention() -> bool:
    """Whether the acquire ending now found the lock held (and forget it)."""
    if _contended.get():
        _contended.set(False)
        return True
    return False


@_guarded
def _on_contended(**_: Any) -> None:
    _contended.set(True)


@_guarded
def _on_acquired(lock: Lock, name: str, waited: float, **_: Any) -> None:
    labels, contended = labels_of(lock), _took_contention()
    for recorder in _recorders.values():
        recorder.acquired(labels, name, waited, contended)


@_guarded
def _on_not_acquired(lock: Lock, name: str, waited: float, blocking: bool, **_: Any) -> None:
    labels, contended = labels_of(lock), _took_contention()
    for recorder in _recorders.values():
        recorder.not_acquired(labels, name, waited, blocking, contended)


@_guarded
def _on_released(lock: Lock, held: float | None, **_: Any) -> None:
    if held is None:
        return
    labels = labels_of(lock)
    for recorder in _recorders.values():
        recorder.released(labels, held)


@_guarded
def _on_lost(lock: Lock, **_: Any) -> None:
    labels = labels_of(lock)
    for recorder in _recorders.values():
        recorder.lost(labels)


@_guarded
def _on_renewed(lock: Lock, error: BaseException | None, **_: Any) -> None:
    labels = labels_of(lock)
    for recorder in _recorders.values():
        recorder.renewed(labels, error is None)
        if error is not None:
            recorder.backend_error(labels, "renew")


@_guarded
def _on_backend_error(lock: Lock, operation: str, **_: Any) -> None:
    if operation == "acquire":
        _took_contention()  # this acquire is over
    labels = labels_of(lock)
    for recorder in _recorders.values():
        recorder.backend_error(labels, operation)


@_guarded
def _on_watchdog_overloaded(reason: str, **_: Any) -> None:
    for recorder in _recorders.values():
        recorder.watchdog_overloaded(reason)


_RECEIVERS = (
    (signals.lock_contended, _on_contended),
    (signals.lock_acquired, _on_acquired),
    (signals.lock_not_acquired, _on_not_acquired),
    (signals.lock_released, _on_released),
    (signals.lock_lost, _on_lost),
    (signals.lock_renewed, _on_renewed),
    (signals.lock_backend_error, _on_backend_error),
    (signals.watchdog_overloaded, _on_watchdog_overloaded),
)


def _uid(receiver: Callable[..., None]) -> str:
    return f"django_redislock.metrics.{receiver.__name__}"


def _connect() -> None:
    for signal, receiver in _RECEIVERS:
        signal.connect(receiver, weak=False, dispatch_uid=_uid(receiver))
