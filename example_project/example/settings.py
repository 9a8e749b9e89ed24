"""Settings of the example project.

Read from the environment:

* ``REDIS_URL`` -- the Redis both the cache and the locks use
  (default ``redis://127.0.0.1:6379/0``; ``scripts/example`` starts a throw-away
  server and sets it for you).
* ``EXAMPLE_DATABASE`` -- path of the SQLite file (default ``db.sqlite3`` here).
* ``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG`` -- the usual.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-a-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redislock",
    "example",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example.urls"
WSGI_APPLICATION = "example.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("EXAMPLE_DATABASE", str(BASE_DIR / "db.sqlite3")),
    }
}

# Django's built-in Redis cache. django-redislock reuses its connection pool
# (REDISLOCK_CACHE defaults to "default"). Socket timeouts make an unreachable
# Redis an error within seconds instead of a hung request.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"socket_timeout": 5, "socket_connect_timeout": 2},
    }
}

# The defaults, spelled out so they are easy to play with.
REDISLOCK_CACHE = "default"
REDISLOCK_KEY_PREFIX = "redislock"
REDISLOCK_DEFAULT_TTL = 30
REDISLOCK_AUTO_RENEW = True

# Celery (example/celery_app.py): the broker and results on the same Redis by default.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", CELERY_BROKER_URL)
CELERY_TASK_SERIALIZER = "json"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"

# django_redislock's own lines (a skipped duplicate task, an operator's release, ...) on
# stderr, formatted as the Celery worker formats its lines. Not propagated to the root
# logger: the worker puts its own handler there (worker_hijack_root_logger), and a
# propagated record would be printed twice.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "worker": {"format": "[%(asctime)s: %(levelname)s/%(processName)s] %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "worker"}},
    "loggers": {
        "django_redislock": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
