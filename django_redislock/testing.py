"""Helpers for your own test suites: a throw-away ``redis-server`` and lock assertions.

* :class:`RedisServer` starts a real ``redis-server`` on a free port of
  127.0.0.1, with no persistence and its files in a temporary directory; use it
  as a context manager, or through the pytest fixtures of
  :mod:`django_redislock.pytest_plugin` (``redislock_server``, ...).
* :func:`assert_takes_lock` checks that a code path takes the locks you expect,
  by listening to the :data:`~django_redislock.signals.lock_acquired` signal.

Importing this module needs neither pytest nor Django settings. See
``docs/testing.md``.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from . import signals

__all__ = [
    "LocksTaken",
    "RedisServer",
    "answers_ping",
    "assert_takes_lock",
    "free_port",
    "redis_server_binary",
]


def redis_server_binary() -> str:
    """The path of a ``redis-server`` binary, or raise RuntimeError saying how to get one.

    Looked for on ``PATH``, then next to the running Python (a virtualenv's
    ``bin/``), then in the ``redis_server`` package if it is installed.
    """
    found = shutil.which("redis-server")
    if found:
        return found
    beside_python = Path(sys.executable).parent / "redis-server"
    if beside_python.exists():
        return str(beside_python)
    try:
        import redis_server
    except ImportError:
        raise RuntimeError(
            "no redis-server binary found: install one (e.g. `apt-get install redis-server`) "
            f"so it is on PATH, put it at {beside_python}, or pass binary= to RedisServer"
        ) from None
    return str(redis_server.REDIS_SERVER_PATH)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers_ping(port: int) -> bool:
    """Whether a Redis on 127.0.0.1:*port* answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1, started when constructed.

    As a context manager it waits until the server answers ``PING`` and stops it
    (deleting its directory) when the block ends::

        with RedisServer() as server:
            client = redis.Redis.from_url(server.url)

    :param port: the port to listen on (default: a free one).
    :param extra_args: more ``redis-server`` command-line arguments, e.g.
        ``("--maxmemory-policy", "noeviction")``.
    :param binary: the ``redis-server`` to run (default: :func:`redis_server_binary`).
    """

    def __init__(
        self,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        *,
        binary: str | None = None,
    ) -> None:
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="redislock-")
        self.process = subprocess.Popen(
            [
                binary or redis_server_binary(),
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", self.dir,
                "--logfile", str(Path(self.dir) / "redis.log"),
                *extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own session: a Ctrl-C in the terminal reaches its owner, which stops it.
            start_new_session=True,
        )  # fmt: skip

    @property
    def url(self) -> str:
        """The server's ``redis://`` URL (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until the server answers PING, or raise RuntimeError."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with status {self.process.returncode}")
            if answers_ping(self.port):
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout} s")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s) and delete its directory."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class LocksTaken:
    """What :func:`assert_takes_lock` saw: every lock acquired while its block ran."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        #: The names acquired, in order, one entry per acquire call (re-entries included).
        self.names: list[str] = []
        #: ``(name, owner, fencing_token)`` for each acquire call, in order.
        self.acquisitions: list[tuple[str, str, int]] = []

    def record(self, name: str, owner: str, fencing_token: int) -> None:
        """Add one acquisition (called from the signal receiver, from any thread)."""
        with self._guard:
            self.names.append(name)
            self.acquisitions.append((name, owner, fencing_token))


@contextmanager
def assert_takes_lock(*names: str) -> Iterator[LocksTaken]:
    """Fail unless the block acquires a lock on each of *names* (exact lock names).

    Every successful acquire in this process counts while the block runs, from
    any thread: ``locks.lock()``, semaphores, read-write locks,
    ``@single_instance`` on functions, views and eagerly run Celery tasks.
    Yields a :class:`LocksTaken`, so the block can look at what was taken::

        with assert_takes_lock("sync:42") as taken:
            sync_account(42)
        assert taken.names.count("sync:42") == 1

    Raises AssertionError naming the missing locks and listing those taken
    instead; an exception raised by the block propagates unchanged. Locks taken
    in other processes (a real Celery worker) are not seen: assert on
    ``locks.get(name)`` there. Called with no names, it only records.
    """
    taken = LocksTaken()

    def on_acquired(name: str, owner: str, fencing_token: int, **kwargs: Any) -> None:
        taken.record(name, owner, fencing_token)

    signals.lock_acquired.connect(on_acquired, weak=False)
    try:
        yield taken
    finally:
        signals.lock_acquired.disconnect(on_acquired)
    missing = [name for name in names if name not in taken.names]
    if missing:
        seen = ", ".join(repr(n) for n in dict.fromkeys(taken.names)) or "none"
        raise AssertionError(
            f"expected the code to take lock(s) {', '.join(repr(n) for n in missing)}; "
            f"locks taken meanwhile: {seen}"
        )
