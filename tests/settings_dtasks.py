"""Settings for a real ``django.tasks`` worker (django-tasks-db's ``db_worker``): the
test settings, a SQLite file shared by the test and the worker, and the database
task backend (tests/test_django_tasks_worker.py)."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("REDISLOCK_TEST_DTASKS_DB", "dtasks.sqlite3"),
    }
}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
