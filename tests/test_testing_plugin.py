"""The helpers for users' test suites: ``django_redislock.testing`` and the pytest plugin.

The plugin is tested the way users meet it: a separate ``pytest`` process
(``python -m pytest`` in a temporary project with its own ``pytest.ini``) that
loads it through the ``pytest11`` entry point and starts its own real
redis-server. ``assert_takes_lock`` is also tested here, in this suite's Django
settings and Redis.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from django_redislock import locks, single_instance
from django_redislock.testing import RedisServer, answers_ping, assert_takes_lock

ROOT = Path(__file__).resolve().parent.parent
TESTING_DOC = ROOT / "docs" / "testing.md"

#: Settings of the users' project in the sub-pytest: no Redis cache at all.
SUB_SETTINGS = """
SECRET_KEY = "sub-pytest"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_redislock"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
"""


def _sub_pytest(
    project: Path, *args: str, settings: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m pytest`` in *project*, as a user's suite would (bounded: 120 s)."""
    ini = "[pytest]\naddopts = -p no:cacheprovider -p no:randomly\n"
    if settings:
        (project / "sub_settings.py").write_text(SUB_SETTINGS)
        ini += "DJANGO_SETTINGS_MODULE = sub_settings\n"
    (project / "pytest.ini").write_text(ini)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "REDISLOCK_"))}
    env["PYTHONPATH"] = str(project)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _outcome(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def test_the_plugin_is_loaded_but_starts_nothing_unasked(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text(
        textwrap.dedent(
            """
            import os
            from pathlib import Path

            def test_no_server_and_no_django(pytestconfig):
                assert pytestconfig.pluginmanager.has_plugin("django_redislock")
                from django.conf import settings
                assert not settings.configured
                children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
                assert children.read_text().split() == []
            """
        )
    )
    # No Django settings at all and no pytest-django: loading the plugin needs neither.
    proc = _sub_pytest(tmp_path, "-p", "no:django", settings=False)
    assert proc.returncode == 0, _outcome(proc)
    assert "1 passed" in proc.stdout

    listed = _sub_pytest(tmp_path, "--fixtures", "-p", "no:django", settings=False)
    for fixture in ("redislock_server", "redislock_url", "redislock_settings"):
        assert fixture in listed.stdout, _outcome(listed)


def test_the_server_fixture_is_real_emptied_per_test_and_stopped(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    (tmp_path / "test_server.py").write_text(
        textwrap.dedent(
            f"""
            import redis

            def test_first(redislock_server, redislock_url):
                assert redislock_url == f"redis://127.0.0.1:{{redislock_server.port}}/0"
                client = redis.Redis.from_url(redislock_url)
                assert client.ping()
                client.set("left-over", "1")
                open({str(port_file)!r}, "w").write(str(redislock_server.port))

            def test_second_starts_empty_on_the_same_server(redislock_server, redislock_url):
                assert open({str(port_file)!r}).read() == str(redislock_server.port)
                assert redis.Redis.from_url(redislock_url).dbsize() == 0
            """
        )
    )
    proc = _sub_pytest(tmp_path, "-p", "no:django", settings=False)
    assert proc.returncode == 0, _outcome(proc)
    assert "2 passed" in proc.stdout
    # The session is over: its server is gone.
    assert not answers_ping(int(port_file.read_text()))


def test_the_documented_example_passes_on_a_real_server(tmp_path: Path) -> None:
    """docs/testing.md's complete example, run as a user's test file."""
    blocks = re.findall(r"```python\n(# tests/test_sync.py\n.*?)```", TESTING_DOC.read_text(), re.S)
    assert len(blocks) == 1, "docs/testing.md lost its example"
    (tmp_path / "test_sync.py").write_text(blocks[0])
    proc = _sub_pytest(tmp_path)
    assert proc.returncode == 0, _outcome(proc)
    assert "4 passed" in proc.stdout


def test_redislock_settings_moves_the_locks_and_restores_them(tmp_path: Path) -> None:
    (tmp_path / "test_settings.py").write_text(
        textwrap.dedent(
            """
            import redis
            from django.conf import settings
            from django_redislock import locks

            def test_locks_use_the_test_server(redislock_settings, redislock_url):
                assert settings.REDISLOCK_URL == redislock_url
                with locks.lock("job:1"):
                    assert redis.Redis.from_url(redislock_url).exists("redislock:{job:1}")

            def test_restored_afterwards():
                assert not hasattr(settings, "REDISLOCK_URL")
            """
        )
    )
    proc = _sub_pytest(tmp_path)
    assert proc.returncode == 0, _outcome(proc)
    assert "2 passed" in proc.stdout


def test_redislock_settings_without_pytest_django_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "test_needs_django.py").write_text("def test_it(redislock_settings):\n    pass\n")
    proc = _sub_pytest(tmp_path, "-p", "no:django", settings=False)
    assert proc.returncode == 1, _outcome(proc)
    assert "redislock_settings needs pytest-django" in proc.stdout


def test_redis_server_context_manager_starts_and_stops_a_server() -> None:
    with RedisServer(extra_args=("--maxmemory-policy", "noeviction")) as server:
        assert answers_ping(server.port)
        directory = Path(server.dir)
        assert directory.is_dir()
    assert not answers_ping(server.port)
    assert not directory.exists()


def test_redis_server_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="redis-server exited with status"):
        with RedisServer(extra_args=("--no-such-option", "1")):
            pass


# -- assert_takes_lock (in this suite's Django settings and Redis) ------------------


@single_instance("sync:{account_id}")
def _sync_account(account_id: int) -> str:
    return f"synced {account_id}"


def test_assert_takes_lock_passes_when_the_lock_is_taken() -> None:
    with assert_takes_lock("sync:42") as taken:
        assert _sync_account(42) == "synced 42"
    assert taken.names == ["sync:42"]
    name, owner, token = taken.acquisitions[0]
    assert name == "sync:42" and owner and token > 0


def test_assert_takes_lock_fails_naming_what_was_taken_instead() -> None:
    with pytest.raises(AssertionError) as excinfo:
        with assert_takes_lock("sync:43", "other:1"):
            _sync_account(42)
            with locks.semaphore("export:7", limit=2):
                pass
    assert str(excinfo.value) == (
        "expected the code to take lock(s) 'sync:43', 'other:1'; "
        "locks taken meanwhile: 'sync:42', 'export:7'"
    )


def test_assert_takes_lock_with_nothing_taken_says_none() -> None:
    with pytest.raises(AssertionError, match="locks taken meanwhile: none$"):
        with assert_takes_lock("sync:42"):
            pass


def test_assert_takes_lock_sees_other_threads_and_lets_errors_through(name: str) -> None:
    def worker() -> None:
        with locks.rw_lock(name).read():
            pass

    with pytest.raises(ZeroDivisionError):
        with assert_takes_lock("never:taken"):
            thread = threading.Thread(target=worker)
            thread.start()
            thread.join(10)
            assert not thread.is_alive()
            1 / 0  # noqa: B018
    with assert_takes_lock(name) as taken:
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join(10)
    assert taken.names == [name]


def test_assert_takes_lock_stops_listening_after_the_block(name: str) -> None:
    with assert_takes_lock() as taken:
        pass
    with locks.lock(name):
        pass
    assert taken.names == []
