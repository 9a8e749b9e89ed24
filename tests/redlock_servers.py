"""Five independent redis-server masters on loopback, for the Redlock tests.

Started once per test run (``shared_masters()``) and stopped at exit. Each master
can be paused (SIGSTOP), continued, killed or restarted empty on its own port.
"""

from __future__ import annotations

import atexit
import os
import signal

import redis

from example_project.embedded_redis import EmbeddedRedis, free_port

MASTERS = 5


class Master:
    """One redis-server that can be paused, killed and restarted on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.server = self._start()

    def _start(self) -> EmbeddedRedis:
        server = EmbeddedRedis(port=self.port)
        server.wait_ready()
        return server

    @property
    def url(self) -> str:
        """The master's redis:// URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A plain client for looking at this master directly."""
        return redis.Redis(port=self.port, socket_timeout=2)

    def pause(self) -> None:
        """SIGSTOP: the master keeps its connections but answers nothing."""
        os.kill(self.server.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        if self.server.process.poll() is None:
            os.kill(self.server.process.pid, signal.SIGCONT)

    def restart_empty(self) -> None:
        """SIGKILL and start again on the same port with no data (no persistence)."""
        self.resume()
        self.server.process.send_signal(signal.SIGKILL)
        self.server.process.wait(5)
        self.server.stop()
        self.server = self._start()

    def stop(self) -> None:
        """Stop for good."""
        self.resume()
        self.server.stop()


_masters: list[Master] = []


def shared_masters() -> list[Master]:
    """The run's five masters (started on first use), all running and empty."""
    if not _masters:
        _masters.extend(Master() for _ in range(MASTERS))
        atexit.register(lambda: [m.stop() for m in _masters])
    for master in _masters:
        master.resume()
        if master.server.process.poll() is not None:
            master.server = master._start()
        master.client().flushall()
    return _masters
