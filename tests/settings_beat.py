"""Settings of the beat processes that use django-celery-beat's DatabaseScheduler
(tests/test_beat.py): the test settings plus ``django_celery_beat``, with the database
in the SQLite file ``BEAT_TEST_DB`` that the beats of one test share."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "django_celery_beat"]
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["BEAT_TEST_DB"]}
}
