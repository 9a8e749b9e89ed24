"""Settings for a process without Django settings: a script, a Celery app with no Django.

The engine, ``Lock``, ``LockManager``, ``@single_instance`` on functions and the
Celery integration need Redis, not Django. When ``django.conf.settings`` is not
configured, each ``REDISLOCK_*`` setting is looked up, in order:

1. what :func:`configure` was given;
2. the current Celery app's configuration (``app.conf.REDISLOCK_URL = ...``, or the
   lowercase ``redislock_url`` that Celery's own settings use), when Celery is
   imported;
3. the default (``django_redislock.conf.DEFAULTS``).

Without Django there is no cache alias to borrow a client from: set
``REDISLOCK_URL``, or give ``LockManager(client=...)`` a redis-py client.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .settings_spec import SPECS, suggest_setting

_configured: dict[str, Any] = {}
#: Called after each configure() (conf drops its cache of setting values).
_on_change: list[Callable[[], None]] = []


def on_change(listener: Callable[[], None]) -> None:
    """Call *listener* whenever :func:`configure` changes a setting."""
    _on_change.append(listener)


def configure(**settings: Any) -> None:
    """Set ``REDISLOCK_*`` settings for a process whose Django settings are not configured.

    ``configure(REDISLOCK_URL="redis://127.0.0.1:6379/0", REDISLOCK_DEFAULT_TTL=60)``.
    Later calls add to (and override) earlier ones. With Django settings
    configured, Django's settings are used and these are ignored.

    Raises ValueError for a name that is not a setting of this package (with the
    closest known name).
    """
    for name in settings:
        if name not in SPECS:
            close = suggest_setting(name)
            hint = f"; did you mean {close}?" if close else ""
            raise ValueError(f"{name} is not a django-redislock setting{hint}")
    _configured.update(settings)
    for listener in _on_change:
        listener()


def lookup(name: str, default: Any) -> Any:
    """The value of setting *name* from :func:`configure` or the Celery app, else *default*."""
    if name in _configured:
        return _configured[name]
    celery = sys.modules.get("celery")
    if celery is not None:
        conf = celery.current_app.conf
        for key in (name, name.lower()):
            if key in conf:
                return conf[key]
    return default
