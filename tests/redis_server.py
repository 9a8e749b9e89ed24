"""Starts a real, throw-away ``redis-server`` on a free loopback port for the tests.

The server binary is found like the example project finds it (system
``redis-server`` on PATH, else one ``scripts/test`` installed next to the
venv's Python). The URL is exported as ``REDISLOCK_TEST_REDIS_URL`` so child
processes reuse the same server.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from example_project.embedded_redis import free_port, redis_server_binary

__all__ = ["ENV_VAR", "RedisServer", "ensure_server", "free_port", "redis_server_binary"]

ENV_VAR = "REDISLOCK_TEST_REDIS_URL"


class RedisServer:
    """One redis-server process on 127.0.0.1, stopped at exit."""

    def __init__(self, *extra_args: str) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redislock-test-")
        self.process = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
                "--logfile",
                str(Path(self.dir) / "redis.log"),
                *extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        atexit.register(self.stop)
        self._wait_ready()

    @property
    def url(self) -> str:
        """The server's redis:// URL (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def _wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout} s")

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


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
