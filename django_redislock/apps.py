"""The Django app configuration."""

import importlib.util

from django.apps import AppConfig


class RedisLockConfig(AppConfig):
    """Registers the system checks of django-redislock, and its Celery integration."""

    name = "django_redislock"
    verbose_name = "Redis locks"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the checks)

        if _celery_installed():
            # Registers the task hooks of @single_instance and connects the worker's
            # revoke handler, in every process that may send or run tasks.
            from . import celery  # noqa: F401


def _celery_installed() -> bool:
    try:
        return importlib.util.find_spec("celery") is not None
    except (ImportError, ValueError):  # a stub in sys.modules without a spec
        return False
