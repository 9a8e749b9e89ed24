"""Starts a real, throw-away ``redis-server`` on a free loopback port for the tests.

The server binary is found like the example project finds it (system
``redis-server`` on PATH, else one ``scripts/test`` installed next to the
venv's Python). The URL is exported as ``REDISLOCK_TEST_REDIS_URL`` so child
processes reuse the same server.
"""

from __future__ import annotations

import atexit
import os

from example_project.embedded_redis import EmbeddedRedis, free_port, redis_server_binary

__all__ = ["ENV_VAR", "RedisServer", "ensure_server", "free_port", "redis_server_binary"]

ENV_VAR = "REDISLOCK_TEST_REDIS_URL"


class RedisServer(EmbeddedRedis):
    """One redis-server process on 127.0.0.1, ready when constructed, stopped at exit."""

    def __init__(self, *extra_args: str) -> None:
        super().__init__(extra_args=extra_args)
        atexit.register(self.stop)
        self.wait_ready()


_server: RedisServer | None = None


def ensure_server() -> str:
    """The test Redis URL: from the environment, or a server started now."""
    global _server
    url = os.environ.get(ENV_VAR)
    if url:
        return url
    _server = RedisServer()
    os.environ[ENV_VAR] = _server.url
    return _server.url
