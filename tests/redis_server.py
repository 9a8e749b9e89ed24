"""Starts a real, throw-away ``redis-server`` on a free loopback port for the tests.

The server binary is found like the example project finds it (system
``redis-server`` on PATH, else one ``scripts/test`` installed next to the
venv's Python). The URL is exported as ``REDISLOCK_TEST_REDIS_URL`` so child
processes reuse the same server.

Under pytest-xdist each worker starts a server of its own (every test flushes
its server): ``REDISLOCK_TEST_REDIS_OWNER`` names the worker (``""`` for a run
without workers) that started the exported one, and a process of another worker
does not reuse it. A URL set from outside (no owner) is used by every process
as it is, so give it only to runs without ``-n``.

The test matrix (``noxfile.py``) picks the Redis to test on with two variables:
``REDISLOCK_TEST_REDIS_SERVER`` names the ``redis-server`` binary every server of
the run is started from (its directory goes first on ``PATH``, so child processes
and every launcher find it), and ``REDISLOCK_TEST_REDIS_VERSION`` (say ``6.2``,
or ``valkey-8.1`` for a Valkey) makes the run stop at once if the test server is
another version. Valkey answers ``redis_version:7.2.4`` whatever its own version,
so a Valkey is named by its ``valkey_version``, and a plain number asks for Redis.
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path

import redis

from example_project.embedded_redis import EmbeddedRedis, free_port, redis_server_binary

__all__ = [
    "BINARY_ENV_VAR",
    "ENV_VAR",
    "VERSION_ENV_VAR",
    "RedisServer",
    "ensure_server",
    "free_port",
    "redis_server_binary",
    "server_version",
]

ENV_VAR = "REDISLOCK_TEST_REDIS_URL"
BINARY_ENV_VAR = "REDISLOCK_TEST_REDIS_SERVER"
VERSION_ENV_VAR = "REDISLOCK_TEST_REDIS_VERSION"
OWNER_ENV_VAR = "REDISLOCK_TEST_REDIS_OWNER"


def _put_named_binary_first_on_path() -> None:
    """Make the binary named by ``REDISLOCK_TEST_REDIS_SERVER`` the ``redis-server`` found."""
    named = os.environ.get(BINARY_ENV_VAR)
    if not named:
        return
    binary = Path(named).absolute()
    if binary.name != "redis-server" or not binary.is_file() or not os.access(binary, os.X_OK):
        raise RuntimeError(
            f"{BINARY_ENV_VAR}={named!r}: expected the path of an executable file named "
            "redis-server (e.g. .nox/redis-6.2/redis-server)"
        )
    directories = os.environ.get("PATH", "").split(os.pathsep)
    if directories[0] != str(binary.parent):
        os.environ["PATH"] = os.pathsep.join([str(binary.parent), *directories])


_put_named_binary_first_on_path()


class RedisServer(EmbeddedRedis):
    """One redis-server process on 127.0.0.1, ready when constructed, stopped at exit."""

    def __init__(self, *extra_args: str) -> None:
        super().__init__(extra_args=extra_args)
        atexit.register(self.stop)
        self.wait_ready()


def server_version(url: str) -> str:
    """The version of the server at *url*: ``7.0.15`` for Redis, ``valkey-8.1.8`` for Valkey.

    Valkey reports a fixed ``redis_version`` (7.2.4) and its own in ``valkey_version``.
    """
    with redis.Redis.from_url(url, socket_timeout=5) as client:
        info = client.info("server")
    if "valkey_version" in info:
        return f"valkey-{info['valkey_version']}"
    return str(info["redis_version"])


def _check_version(url: str) -> None:
    """Raise RuntimeError if the server is not the version ``REDISLOCK_TEST_REDIS_VERSION`` asks.

    ``7`` matches Redis 7.0.15 but not a Valkey; ``valkey-8.1`` matches Valkey 8.1.8.
    """
    wanted = os.environ.get(VERSION_ENV_VAR)
    if not wanted:
        return
    found = server_version(url)
    if found != wanted and not found.startswith(wanted + "."):
        raise RuntimeError(
            f"{VERSION_ENV_VAR}={wanted} but the test server at {url} is {found} "
            f"(binary {redis_server_binary()}; {BINARY_ENV_VAR} picks another)"
        )


_server: RedisServer | None = None


def ensure_server() -> str:
    """The test Redis URL: from the environment, or a server started now."""
    global _server
    url = os.environ.get(ENV_VAR)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if url and os.environ.get(OWNER_ENV_VAR, worker) != worker:
        url = None  # the xdist controller's or another worker's server
    if not url:
        _server = RedisServer()
        url = os.environ[ENV_VAR] = _server.url
        os.environ[OWNER_ENV_VAR] = worker
    _check_version(url)
    return url
