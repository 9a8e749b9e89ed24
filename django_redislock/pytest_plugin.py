"""pytest fixtures for your own test suite: a real ``redis-server``, and settings using it.

Installed with the package and registered through the ``pytest11`` entry point
``django_redislock``, so the fixtures are there without a ``conftest.py``
import. They are opt-in: nothing starts until a test asks for one of them, and
importing this module needs no Django settings.

* ``redislock_server`` (session): a :class:`~django_redislock.testing.RedisServer`
  on a free port of 127.0.0.1, started on first use, stopped at the end of the
  session.
* ``redislock_url`` (function): that server's URL, with the server emptied
  (``FLUSHALL``) before the test.
* ``redislock_settings`` (function, needs pytest-django): pytest-django's
  ``settings`` with ``REDISLOCK_URL`` pointing at that server, so
  ``django_redislock.locks``, ``@single_instance`` and the admin use it.

``-p no:django_redislock`` turns the plugin off. See ``docs/testing.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .testing import RedisServer

__all__ = ["redislock_server", "redislock_settings", "redislock_url"]


@pytest.fixture(scope="session")
def redislock_server() -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port, for the whole test session."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redislock_url(redislock_server: RedisServer) -> str:
    """The session server's ``redis://`` URL, emptied (``FLUSHALL``) before this test."""
    import redis

    client = redis.Redis.from_url(redislock_server.url)
    try:
        client.flushall()
    finally:
        client.close()
    return redislock_server.url


@pytest.fixture
def redislock_settings(request: pytest.FixtureRequest, redislock_url: str) -> Any:
    """pytest-django's ``settings`` with ``REDISLOCK_URL`` set to the test server.

    Restored after the test, like every change made through ``settings``.
    """
    try:
        settings = request.getfixturevalue("settings")
    except pytest.FixtureLookupError:
        pytest.fail(
            "redislock_settings needs pytest-django's `settings` fixture: "
            "`pip install pytest-django`, or use redislock_url and set "
            "REDISLOCK_URL yourself",
            pytrace=False,
        )
    settings.REDISLOCK_URL = redislock_url
    return settings
