"""The Django app configuration."""

import importlib.util

from django.apps import AppConfig


class RedisLockConfig(AppConfig):
    """Registers the system checks of django-redislock, its Celery integration, and
    its metrics when ``REDISLOCK_METRICS`` names an exporter."""

    name = "django_redislock"
    verbose_name = "Redis locks"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the checks)

        if _celery_installed():
            # Registers the task hooks of @single_instance and connects the worker's
            # revoke handler, in every process that may send or run tasks.
            from . import celery  # noqa: F401

        from .conf import setting

        if setting("REDISLOCK_METRICS"):  # else the metrics package is not even imported
            from .metrics import enable_from_settings

            enable_from_settings()


def _celery_installed() -> bool:
    try:
        return importlib.util.find_spec("celery") is not None
    except (ImportError, ValueError):  # a stub in sys.modules without a spec
        return False
