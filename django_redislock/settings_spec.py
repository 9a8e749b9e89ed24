"""Every ``REDISLOCK_*`` setting in one table: name, default, validator, meaning.

The table is the single source of the settings' rules:

* :data:`django_redislock.conf.DEFAULTS` is built from it;
* :func:`django_redislock.conf.setting`, which the code reads settings with where
  they are used, validates each value with its entry's ``clean``;
* the system checks (:mod:`django_redislock.checks`) run the same ``clean`` over
  every setting (``django_redislock.E002``) and warn about ``REDISLOCK_`` names
  that are not in the table (``django_redislock.W007``, with the closest known
  name from :func:`suggest_setting`).

Each ``clean(value, name)`` returns the value as the code uses it, or raises
TypeError/ValueError with a message that names the setting and says what it
takes. This module is pure: it imports neither Django nor redis-py.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .engine.keys import KeySpace
from .engine.validate import to_millis, validate_replicas, validate_seconds

#: The URL schemes redis-py's ``from_url`` accepts.
REDIS_URL_SCHEMES = ("redis://", "rediss://", "unix://")

#: What a guarded view does when Redis cannot be reached (see docs/views.md).
VIEW_REDIS_ERROR_MODES = ("closed", "open")

#: The part every setting name starts with.
PREFIX = "REDISLOCK_"


@dataclass(frozen=True)
class SettingSpec:
    """One setting: its name, default, validator and what it means."""

    name: str
    default: Any
    #: ``clean(value, name)``: the value as used, or TypeError/ValueError naming *name*.
    clean: Callable[[Any, str], Any]
    #: One line on what the setting does (docs/settings.md has the long version).
    meaning: str


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return value


def _optional_bool(value: Any, name: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name} must be None (ask the server), True or False, not {value!r}")
    return value


def _alias(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be the name of a cache in CACHES (a str), not {value!r}")
    return value


def _url(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a Redis URL (a str) or None, not {type(value).__name__}")
    if not value.startswith(REDIS_URL_SCHEMES):
        raise ValueError(
            f"{name} must start with {', '.join(REDIS_URL_SCHEMES)}; got {value!r} "
            "(for a cache alias use REDISLOCK_CACHE)"
        )
    return value


def _prefix(value: Any, name: str) -> str:
    return KeySpace(value).prefix  # the key layout's own rule


def _seconds(value: Any, name: str) -> float:
    """Positive finite seconds that Redis can take as whole milliseconds."""
    seconds = validate_seconds(value, name)
    to_millis(seconds, name)
    return seconds


def _renewal_rate(value: Any, name: str) -> float:
    """A positive finite number of renewals a second."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of renewals a second, not {type(value).__name__}")
    if not (0 < value < float("inf")):
        raise ValueError(f"{name} must be a positive, finite number of renewals a second")
    return float(value)


def validate_redis_targets(value: Any, name: str) -> list[str]:
    """A list (or tuple) of cache aliases or Redis URLs (Redlock's masters).

    Raises TypeError for anything else, including one string (a common slip:
    ``"redis://a,redis://b"``), and ValueError for an empty entry.
    """
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise TypeError(
            f"{name} must be a list of cache aliases or Redis URLs, not {type(value).__name__}"
        )
    for entry in value:
        if not isinstance(entry, str) or not entry:
            raise ValueError(f"{name} entries are cache aliases or Redis URLs; got {entry!r}")
    return list(value)


def validate_view_redis_error(value: Any, name: str) -> str:
    """``"closed"`` or ``"open"``: what a guarded view does when Redis is unreachable."""
    if value not in VIEW_REDIS_ERROR_MODES:
        raise ValueError(
            f"{name} must be 'closed' (answer 503) or 'open' (run the view unguarded), "
            f"not {value!r}"
        )
    return str(value)


#: The level names a log-level setting takes (or their numbers).
LOG_LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}


def validate_log_level(value: Any, name: str) -> int:
    """A logging level: one of :data:`LOG_LEVELS` by name, or a number from 0 to 50."""
    if isinstance(value, str) and value.upper() in LOG_LEVELS:
        return LOG_LEVELS[value.upper()]
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 50:
        return value
    raise ValueError(f"{name} must be one of {', '.join(LOG_LEVELS)} (or 0 to 50), not {value!r}")


#: The exporters ``REDISLOCK_METRICS`` may name (see docs/metrics.md).
METRICS_EXPORTERS = ("prometheus", "opentelemetry")


def validate_metrics(value: Any, name: str) -> tuple[str, ...]:
    """None, one exporter name or a list of them: the exporters, without repeats."""
    if value is None:
        return ()
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)):
        raise TypeError(
            f"{name} must be None, 'prometheus', 'opentelemetry' or a list of those, "
            f"not {type(value).__name__}"
        )
    for entry in names:
        if entry not in METRICS_EXPORTERS:
            raise ValueError(
                f"{name}: unknown metrics exporter {entry!r}; "
                f"use {' or '.join(map(repr, METRICS_EXPORTERS))}"
            )
    return tuple(dict.fromkeys(names))


def validate_metrics_groups(value: Any, name: str) -> tuple[str, ...] | None:
    """None (a name's part before its first ``:``), or lock name prefixes: the
    prefixes, longest first (a name's group is the longest one it starts with)."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be None or a list of lock name prefixes, not {value!r}")
    for entry in value:
        if not isinstance(entry, str) or not entry:
            raise ValueError(f"{name} entries are non-empty lock name prefixes; got {entry!r}")
    return tuple(sorted(set(value), key=len, reverse=True))


#: Every setting this package reads, in the order docs/settings.md lists them.
SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec(
        "REDISLOCK_CACHE", "default", _alias, "which Django cache alias's Redis client to reuse"
    ),
    SettingSpec(
        "REDISLOCK_URL", None, _url, "a Redis URL to use instead of a cache alias (wins if set)"
    ),
    SettingSpec(
        "REDISLOCK_CLUSTER",
        None,
        _optional_bool,
        "whether REDISLOCK_URL is a Redis Cluster node (None: ask the server once)",
    ),
    SettingSpec(
        "REDISLOCK_KEY_PREFIX",
        "redislock",
        _prefix,
        "first component of every Redis key this package writes",
    ),
    SettingSpec("REDISLOCK_DEFAULT_TTL", 30.0, _seconds, "default lease, in seconds"),
    SettingSpec(
        "REDISLOCK_AUTO_RENEW", True, _bool, "whether the watchdog renews held locks by default"
    ),
    SettingSpec(
        "REDISLOCK_WATCHDOG_CEILING",
        25_000.0,
        _renewal_rate,
        "renewals a second the process's held locks may need before the watchdog warns",
    ),
    SettingSpec(
        "REDISLOCK_RAISE_ON_LOST",
        True,
        _bool,
        "whether leaving a with block whose lock was lost raises LockLost",
    ),
    SettingSpec(
        "REDISLOCK_FENCE_RETENTION",
        86400,
        _seconds,
        "seconds each hash slot's hash (last token, history) lives from its creation",
    ),
    SettingSpec(
        "REDISLOCK_WAIT_REPLICAS",
        0,
        validate_replicas,
        "replicas that must acknowledge each grant/renewal (Redis WAIT); 0: do not wait",
    ),
    SettingSpec(
        "REDISLOCK_WAIT_TIMEOUT", 0.5, _seconds, "seconds to wait for those acknowledgements"
    ),
    SettingSpec(
        "REDISLOCK_REDLOCK_CACHES",
        [],
        validate_redis_targets,
        "cache aliases or Redis URLs of independent masters: Redlock quorum locks",
    ),
    SettingSpec(
        "REDISLOCK_REDLOCK_MONOTONIC_FENCING",
        False,
        _bool,
        "Redlock: a second round per grant makes fencing tokens strictly increasing",
    ),
    SettingSpec(
        "REDISLOCK_VIEW_ON_REDIS_ERROR",
        "closed",
        validate_view_redis_error,
        "a guarded view when Redis is down: 'closed' (503) or 'open' (run unguarded)",
    ),
    SettingSpec(
        "REDISLOCK_TASK_SKIP_LOG_LEVEL",
        "WARNING",
        validate_log_level,
        "the level of the log line of a task run skipped because its lock was held",
    ),
    SettingSpec(
        "REDISLOCK_METRICS",
        None,
        validate_metrics,
        "export lock metrics: 'prometheus', 'opentelemetry', a list of both, or None (off)",
    ),
    SettingSpec(
        "REDISLOCK_METRICS_GROUPS",
        None,
        validate_metrics_groups,
        "lock name prefixes that label metrics (None: the name's part before its first ':')",
    ),
)

#: The table by name.
SPECS: dict[str, SettingSpec] = {spec.name: spec for spec in SETTINGS}


def suggest_setting(name: str) -> str | None:
    """The known setting closest to the unknown *name* (a likely misspelling), or None.

    Names are compared without their common ``REDISLOCK_`` part, which would
    otherwise make every name look alike.
    """
    tail = name.removeprefix(PREFIX)
    tails = {spec.name.removeprefix(PREFIX): spec.name for spec in SETTINGS}
    close = difflib.get_close_matches(tail, tails, n=1, cutoff=0.6)
    return tails[close[0]] if close else None
