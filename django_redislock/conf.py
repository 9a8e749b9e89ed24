"""The ``REDISLOCK_*`` settings, their defaults, and lazy access to them.

Settings are read from ``django.conf.settings`` every time they are needed, so
``override_settings`` works in tests. Each one's default and validator are in the
table of :mod:`django_redislock.settings_spec`; :func:`setting` validates a value
where it is used and the system checks in :mod:`django_redislock.checks` validate
them all.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed

from .settings_spec import SETTINGS, SPECS
from .standalone import lookup, on_change

#: Every setting this package reads, with its default (from the table in
#: :mod:`django_redislock.settings_spec`, which also says what each one means).
DEFAULTS: dict[str, Any] = {spec.name: spec.default for spec in SETTINGS}

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


_clean: dict[str, Any] = {}


def setting(name: str) -> Any:
    """The ``REDISLOCK_*`` setting *name* as the code uses it: :func:`get_setting`'s
    value checked (and converted) by the setting's entry in
    :data:`~django_redislock.settings_spec.SETTINGS`.

    Raises TypeError/ValueError naming the setting when its value is invalid
    (the system check ``django_redislock.E002`` reports the same problem). A valid
    value is cached like :func:`get_setting`'s, and dropped with it.
    """
    try:
        return _clean[name]
    except KeyError:
        value = _clean[name] = SPECS[name].clean(get_setting(name), name)
        return value


def clear_cache(**kwargs: Any) -> None:
    """Forget the cached setting values (on ``setting_changed`` and ``configure()``)."""
    _cache.clear()
    _clean.clear()


setting_changed.connect(clear_cache, dispatch_uid="django_redislock.conf")
on_change(clear_cache)
