"""Starts a real, throw-away PostgreSQL cluster on a free loopback port for the tests.

``initdb`` makes a cluster in a temporary directory (trust authentication, superuser
``postgres``) and ``postgres`` serves it on 127.0.0.1 only, its socket in the same
directory. PostgreSQL refuses to run as root, so under root both run as ``nobody``,
who owns the directory. The binaries are found on ``PATH``, else in Debian's
``/usr/lib/postgresql/<version>/bin``; :func:`postgres_binaries` is None when there
are none (the tests that need them skip, saying so).
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from glob import glob
from pathlib import Path

from django_redislock.testing import free_port

__all__ = ["PostgresServer", "postgres_binaries"]

#: How long initdb, the start and the stop may take, each.
STEP_TIMEOUT = 60.0


def postgres_binaries() -> Path | None:
    """The directory holding ``initdb`` and ``postgres``, or None when neither place has them."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("postgres"):
        return Path(on_path).parent
    found = sorted(glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    return Path(found[-1]).parent if found else None


def _version(initdb: str) -> tuple[int, ...]:
    part = Path(initdb).parent.parent.name
    return tuple(int(p) for p in part.split(".") if p.isdigit())


class PostgresServer:
    """One PostgreSQL cluster and its postmaster, on 127.0.0.1; :meth:`stop` removes it."""

    def __init__(self, bindir: Path) -> None:
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="redislock-pg-"))
        self._user = _unprivileged_user()
        if self._user is not None:
            os.chown(self.directory, self._user.pw_uid, self._user.pw_gid)
        data = self.directory / "data"
        self._run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"])
        self.log = self.directory / "postgres.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    str(bindir / "postgres"),
                    *("-D", str(data), "-p", str(self.port), "-k", str(self.directory)),
                    *("-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                **self._as_user(),
            )
        atexit.register(self.stop)  # also when the run is interrupted
        self._wait_ready()

    def settings(self, **extra: object) -> dict[str, object]:
        """A Django ``DATABASES`` entry for the cluster's ``postgres`` database."""
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "postgres",
            "USER": "postgres",
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            **extra,
        }

    def connect(self):  # type: ignore[no-untyped-def]
        """A psycopg connection (autocommit) to the ``postgres`` database."""
        import psycopg

        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
            autocommit=True, connect_timeout=5,
        )  # fmt: skip

    def stop(self) -> None:
        """Stop the postmaster (fast shutdown, bounded) and delete the cluster; again: nothing."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # fast shutdown: open sessions are ended
            try:
                self.process.wait(STEP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STEP_TIMEOUT)
        shutil.rmtree(self.directory, ignore_errors=True)

    def _as_user(self) -> dict[str, object]:
        if self._user is None:
            return {}
        return {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}

    def _run(self, command: list[str]) -> None:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=STEP_TIMEOUT, **self._as_user()
        )
        if done.returncode:
            raise RuntimeError(f"{command[0]} failed ({done.returncode}): {done.stderr}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STEP_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited: {self.log.read_text()[-2000:]}")
            try:
                self.connect().close()
                return
            except Exception:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
            time.sleep(0.05)


def _unprivileged_user() -> pwd.struct_passwd | None:
    """``nobody`` when running as root (postgres refuses root), else None (run as we are)."""
    if os.geteuid() != 0:
        return None
    return pwd.getpwnam("nobody")
