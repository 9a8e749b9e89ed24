"""The ``REDISLOCK_*`` settings, their defaults, and lazy access to them.

Settings are read from ``django.conf.settings`` every time they are needed, so
``override_settings`` works in tests. Values are validated where they are used
and by the system checks in :mod:`django_redislock.checks`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed

from .standalone import lookup

#: Every setting this package reads, with its default.
DEFAULTS: dict[str, Any] = {
    # Which Django cache alias's Redis client to reuse.
    "REDISLOCK_CACHE": "default",
    # A redis:// URL to use instead of a cache alias (the escape hatch).
    "REDISLOCK_URL": None,
    # Whether REDISLOCK_URL is a node of a Redis Cluster: None = ask the server
    # once (INFO cluster: cluster_enabled), True = it is, False = it is not.
    "REDISLOCK_CLUSTER": None,
    # First component of every Redis key this package writes.
    "REDISLOCK_KEY_PREFIX": "redislock",
    # Default lease, in seconds.
    "REDISLOCK_DEFAULT_TTL": 30.0,
    # Whether held locks are renewed by the per-process watchdog by default.
    "REDISLOCK_AUTO_RENEW": True,
    # Whether leaving a ``with`` block whose lock was lost raises LockLost.
    "REDISLOCK_RAISE_ON_LOST": True,
    # How long (seconds) the per-name fencing counter lives after its last use;
    # tokens are never below the Redis clock in microseconds, so they keep
    # increasing after it expired.
    "REDISLOCK_FENCE_RETENTION": 86400,
    # How many replicas must acknowledge a grant, hand-off, renewal or extension
    # (Redis WAIT) before it counts; 0 = do not wait. Per lock: wait_replicas=.
    "REDISLOCK_WAIT_REPLICAS": 0,
    # How long (seconds) to wait for those acknowledgements.
    "REDISLOCK_WAIT_TIMEOUT": 0.5,
    # Cache aliases (or redis:// URLs) of independent Redis masters: when set, the
    # default manager makes Redlock quorum locks over them.
    "REDISLOCK_REDLOCK_CACHES": [],
    # Redlock: a second round per fresh grant makes fencing tokens strictly
    # increasing whatever the masters' clocks do (else they are per master).
    "REDISLOCK_REDLOCK_MONOTONIC_FENCING": False,
}

_cache: dict[str, Any] = {}


def get_setting(name: str) -> Any:
    """Return the current value of the ``REDISLOCK_*`` setting *name*, or its default.

    Values are cached (Lock() reads several on every construction) and the
    cache is dropped whenever Django reports a changed setting, so
    ``override_settings`` keeps working.
    """
    try:
        return _cache[name]
    except KeyError:
        pass
    if django_settings.configured:
        value = getattr(django_settings, name, DEFAULTS[name])
    else:  # a script or a Celery app without Django (see django_redislock.standalone)
        value = lookup(name, DEFAULTS[name])
    _cache[name] = value
    return value


def clear_cache(**kwargs: Any) -> None:
    """Forget the cached setting values (on ``setting_changed`` and ``configure()``)."""
    _cache.clear()


setting_changed.connect(clear_cache, dispatch_uid="django_redislock.conf")
