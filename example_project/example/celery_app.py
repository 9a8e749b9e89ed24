"""The example project's Celery app.

Run: ``celery --workdir example_project -A example.celery_app worker``.

Broker and result backend default to the same Redis as the cache and the locks
(``REDIS_URL``); set ``CELERY_BROKER_URL`` to use another one.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example.settings")

app = Celery("example")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
