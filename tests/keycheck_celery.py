"""The Celery app of the ``manage.py check`` run of tests/test_key_checks.py: it
autodiscovers tests/keycheck_tasks.py, which only a worker (or the check) imports."""

from __future__ import annotations

from celery import Celery

app = Celery("keycheck")
app.conf.broker_url = "memory://"
app.autodiscover_tasks(lambda: ["tests.keycheck_tasks"], related_name=None)
