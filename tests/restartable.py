"""A redis-server the tests SIGKILL and start again on the same port, data lost or kept."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from django_redislock.testing import answers_ping
from example_project.embedded_redis import free_port, redis_server_binary


class RestartableRedis:
    """A redis-server on a fixed port of 127.0.0.1 that can be SIGKILLed and started again.

    With *persistent*, every write is fsynced to an AOF before it is answered, so
    a SIGKILLed server comes back with all its data (the locks and their queues).
    """

    def __init__(self, persistent: bool) -> None:
        self.persistent = persistent
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redislock-restart-")
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if persistent else [
            "--appendonly", "no"
        ]  # fmt: skip
        self.args = [
            redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--dir", self.dir, "--logfile", str(Path(self.dir) / "redis.log"),
            *persistence,
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while not answers_ping(self.port):
            assert self.process.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.005)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(5)

    def restart(self) -> float:
        """SIGKILL the server and start it on the same port; when it answered again."""
        self.kill()
        self.start()
        return time.monotonic()

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
