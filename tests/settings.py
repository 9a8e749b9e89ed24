"""Django settings for the test suite: a real redis-server behind both cache backends."""

import os

from tests.redis_server import ensure_server

REDIS_URL = ensure_server()

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # Serves the admin's CSS/JS to the browser tests' live server.
    "django.contrib.staticfiles",
    "django_redislock",
]
STATIC_URL = "/static/"
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
CACHES = {
    # Django's built-in Redis cache backend.
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"socket_timeout": 5, "socket_connect_timeout": 2},
    },
    # django-redis.
    "djredis": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"SOCKET_TIMEOUT": 5, "SOCKET_CONNECT_TIMEOUT": 2},
    },
    "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
}
REDISLOCK_CACHE = "default"
# Django 6's task framework (tests/test_django_tasks.py; unused before Django 6).
TASKS = {
    "default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
    "dummy": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    # Workers of the redelivery tests log at INFO (the tests read what a copy did).
    "loggers": {
        "django_redislock": {
            "handlers": ["console"],
            "level": os.environ.get("REDISLOCK_TEST_LOG_LEVEL", "WARNING"),
        }
    },
}

# Child processes of the Redlock tests lock over the parent's masters.
if os.environ.get("REDISLOCK_TEST_REDLOCK"):
    REDISLOCK_REDLOCK_CACHES = os.environ["REDISLOCK_TEST_REDLOCK"].split(",")
