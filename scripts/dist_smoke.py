"""Checks of the built distributions, run by scripts/check-dist.

``dist_smoke.py contents DIST_DIR`` (from the checkout): the wheel holds every file
of ``django_redislock/`` that git tracks (templates, static files, migrations,
``py.typed``), and the sdist every tracked file of the paths pyproject.toml
includes.

``dist_smoke.py smoke WORKDIR``, with a clean venv's Python and from a directory
outside the checkout (so the package comes from the venv, not from the source
tree), is the smoke test of an installed django-redislock. In WORKDIR it writes
a minimal Django project (``manage.py``, ``smoke_settings.py``) with
``django_redislock`` installed and the admin on, starts a throw-away
``redis-server`` with the package's own :class:`django_redislock.testing.RedisServer`,
and checks: ``manage.py check`` passes with no warning, ``migrate`` and
``collectstatic`` work and collect the admin's static files, a lock is taken,
seen (``locks.get`` and ``manage.py redislock list``), shown on the admin page
(the package's templates) and released. Exits non-zero on the first failure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: build's own dependency, in the tools venv
    import tomli as tomllib

MANAGE_PY = """\
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "smoke_settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
"""

SETTINGS = """\
REDIS_URL = {url!r}
SECRET_KEY = "dist-smoke-test-only"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redislock",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "smoke_urls"
TEMPLATES = [
    {{
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {{
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        }},
    }}
]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {db!r}}}}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
CACHES = {{
    "default": {{
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {{"socket_timeout": 5, "socket_connect_timeout": 2}},
    }}
}}
STATIC_URL = "/static/"
STATIC_ROOT = {static!r}
"""

URLS = """\
from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
"""

#: Files the admin needs at run time, relative to the installed package.
PACKAGE_DATA = [
    "py.typed",
    "templates/django_redislock/admin/lock_list.html",
    "templates/django_redislock/admin/lock_detail.html",
    "static/django_redislock/admin/locks.css",
    "static/django_redislock/admin/locks.js",
]

LOCK_NAME = "dist-smoke:1"


def step(message: str) -> None:
    """Print what is being checked."""
    print(f"dist smoke: {message}", flush=True)


def manage(workdir: Path, *args: str) -> str:
    """Run ``manage.py`` with *args* in *workdir*; its output, or exit on failure."""
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=workdir, capture_output=True, text=True
    )
    if result.returncode != 0:
        sys.exit(f"manage.py {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result.stdout + result.stderr


def check_installed_copy() -> Path:
    """The package imports from this venv's site-packages, with its data files."""
    import django_redislock

    package = Path(django_redislock.__file__).parent
    site_packages = Path(sysconfig.get_paths()["purelib"])
    if site_packages not in package.parents:
        sys.exit(f"django_redislock comes from {package}, not from {site_packages}")
    missing = [name for name in PACKAGE_DATA if not (package / name).is_file()]
    if missing:
        sys.exit(f"missing from the installed package: {', '.join(missing)}")
    step(f"django_redislock {django_redislock.__version__} imported from {package}")
    return package


def write_project(workdir: Path, url: str) -> None:
    """A minimal project using django_redislock, with the admin."""
    (workdir / "manage.py").write_text(MANAGE_PY)
    (workdir / "smoke_urls.py").write_text(URLS)
    (workdir / "smoke_settings.py").write_text(
        SETTINGS.format(url=url, db=str(workdir / "db.sqlite3"), static=str(workdir / "static"))
    )


def check_lock_and_admin(workdir: Path) -> None:
    """Take a lock, see it in the API, the CLI and the admin page, release it."""
    sys.path.insert(0, str(workdir))
    os.environ["DJANGO_SETTINGS_MODULE"] = "smoke_settings"
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.test import Client

    from django_redislock import locks

    with locks.lock(LOCK_NAME, ttl=30, timeout=5, purpose="dist smoke") as held:
        info = locks.get(LOCK_NAME)
        if info is None or held.fencing_token < 1:
            sys.exit(f"the lock is held but locks.get() says {info!r}")
        listed = manage(workdir, "redislock", "list")
        if LOCK_NAME not in listed:
            sys.exit(f"manage.py redislock list does not show {LOCK_NAME}:\n{listed}")
        step("lock taken; locks.get() and manage.py redislock list show it")
        user = get_user_model().objects.create_superuser("smoke", "smoke@example.invalid", "x")
        client = Client()
        client.force_login(user)
        response = client.get("/admin/django_redislock/heldlock/")
        page = response.content.decode()
        if response.status_code != 200 or LOCK_NAME not in page:
            sys.exit(
                f"admin lock list: status {response.status_code}, lock shown: {LOCK_NAME in page}"
            )
        if "django_redislock/admin/locks.css" not in page:
            sys.exit("the admin lock list does not link the package's stylesheet")
        step("the admin lock list (the package's templates) shows the lock")
    if locks.get(LOCK_NAME) is not None:
        sys.exit("the lock is still there after the with block")
    step("lock released")


def tracked(checkout: Path, *paths: str) -> set[str]:
    """The files git tracks under *paths* of *checkout* (compiled files left out)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *paths],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    return {name for name in listed if name and (checkout / name).is_file()}


def check_contents(dist: Path) -> None:
    """Every tracked file that belongs in the wheel and in the sdist is there."""
    checkout = Path(__file__).resolve().parent.parent
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
    missing = sorted(tracked(checkout, "django_redislock") - in_wheel)
    if missing:
        sys.exit(f"{wheel.name} lacks tracked files: {', '.join(missing)}")
    step(f"{wheel.name}: all {len(in_wheel)} files, every tracked file of django_redislock/")
    config = tomllib.loads((checkout / "pyproject.toml").read_text())
    included = config["tool"]["hatch"]["build"]["targets"]["sdist"]["include"]
    with tarfile.open(sdist) as archive:
        # Members are "<name>-<version>/<path>".
        in_sdist = {member.split("/", 1)[1] for member in archive.getnames() if "/" in member}
    wanted = tracked(checkout, *(path.lstrip("/") for path in included)) | {"pyproject.toml"}
    missing = sorted(wanted - in_sdist)
    if missing:
        sys.exit(f"{sdist.name} lacks tracked files: {', '.join(missing)}")
    step(f"{sdist.name}: every tracked file of {', '.join(included)}")


def smoke(workdir: Path) -> None:
    """Run every check of an installed package in *workdir*."""
    workdir.mkdir(parents=True, exist_ok=True)
    check_installed_copy()
    from django_redislock.testing import RedisServer

    with RedisServer() as server:
        step(f"redis-server on {server.url}")
        write_project(workdir, server.url)
        output = manage(workdir, "check", "--fail-level", "WARNING")
        step(f"manage.py check: {output.strip()}")
        manage(workdir, "migrate", "--verbosity", "0")
        manage(workdir, "collectstatic", "--noinput", "--verbosity", "0")
        collected = workdir / "static" / "django_redislock" / "admin" / "locks.css"
        if not collected.is_file():
            sys.exit(f"collectstatic did not collect {collected}")
        step("migrate and collectstatic (the admin's static files collected)")
        check_lock_and_admin(workdir)
    step("all checks passed")


def main() -> None:
    """``contents DIST_DIR`` or ``smoke WORKDIR``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=["contents", "smoke"])
    parser.add_argument("directory", type=Path)
    args = parser.parse_args()
    if args.check == "contents":
        check_contents(args.directory.resolve())
    else:
        smoke(args.directory.resolve())


if __name__ == "__main__":
    main()
