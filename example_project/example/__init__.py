"""A small Django site that shows django-redislock at work.

The project's Celery app is imported here, as Celery's Django guide does (see
docs/celery.md, "Wiring Celery into your Django project"): every process that loads
the settings creates it, so ``manage.py check`` checks its tasks' lock keys
(django_redislock.E005). Without Celery installed the site runs, without the
report demo.
"""

from __future__ import annotations

from importlib.util import find_spec

if find_spec("celery") is not None:
    from .celery_app import app as celery_app

    __all__ = ["celery_app"]
