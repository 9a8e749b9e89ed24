"""Smoke test of example_project/: its dev server, on its own port, against the test Redis."""

from __future__ import annotations

import http.cookiejar
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from django_redislock import LockManager, locks
from tests.holding import QueuedWaiters
from tests.redis_server import free_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "example_project"
START_TIMEOUT = 10.0


class Browser:
    """Just enough of a browser: cookies, CSRF token, redirects followed."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def get(self, path: str) -> tuple[int, bytes]:
        with self.opener.open(self.base + path, timeout=10) as response:
            return response.status, response.read()

    def post(self, path: str, data: dict[str, str]) -> tuple[int, bytes]:
        token = next(c.value for c in self.jar if c.name == "csrftoken")
        body = urllib.parse.urlencode({**data, "csrfmiddlewaretoken": token}).encode()
        with self.opener.open(self.base + path, data=body, timeout=30) as response:
            return response.status, response.read()


@pytest.fixture
def example_server(tmp_path: Path) -> Iterator[str]:
    """The example project's dev server on a free port; yields its base URL."""
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example.settings",
        "REDIS_URL": settings.REDIS_URL,
        "EXAMPLE_DATABASE": str(tmp_path / "db.sqlite3"),
    }
    process = subprocess.Popen(
        [
            sys.executable,
            str(EXAMPLE / "manage.py"),
            "runserver",
            "--noreload",
            f"127.0.0.1:{port}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                output = process.stdout.read().decode() if process.stdout else ""
                pytest.fail(f"the example server exited with {process.returncode}:\n{output}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the example server did not listen within {START_TIMEOUT} s")
                time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _locks(browser: Browser) -> list[dict[str, Any]]:
    status, body = browser.get("/locks.json")
    assert status == 200
    rows: list[dict[str, Any]] = json.loads(body)["locks"]
    return rows


def test_example_pages_and_actions(example_server: str, redis_client: redis.Redis) -> None:
    browser = Browser(example_server)
    status, body = browser.get("/")
    assert status == 200
    assert b"Critical section" in body
    assert _locks(browser) == []

    status, body = browser.post("/counter/", {})
    assert status == 200  # after the redirect home
    assert int(redis_client.get("example:counter") or 0) == 100
    assert b"0 update(s) lost" in body

    status, body = browser.post("/hold/", {"name": "smoke:held", "seconds": "3"})
    assert status == 200
    assert b"Holding lock" in body
    rows = _locks(browser)
    assert [row["name"] for row in rows] == ["smoke:held"]
    assert rows[0]["purpose"] == "held for 3 s from the example home page"
    assert rows[0]["owner"].startswith("example-hold:")
    assert rows[0]["fencing_token"] > 0

    status, body = browser.post("/hold/", {"name": "smoke:held", "seconds": "3"})
    assert b"is already held" in body


def test_locks_json_shows_waiters_and_liveness(example_server: str) -> None:
    browser = Browser(example_server)
    browser.get("/")
    browser.post("/hold/", {"name": "smoke:queued", "seconds": "4"})
    waiters = QueuedWaiters("smoke:queued")
    try:
        waiters.add(locks.lock("smoke:queued", owner="json-waiter", purpose="next in line"), 15)
        (row,) = _locks(browser)
        assert row["queue_length"] == 1
        (waiter,) = row["waiters"]
        assert (waiter["position"], waiter["owner"], waiter["mode"]) == (
            1,
            "json-waiter",
            "exclusive",
        )
        assert waiter["purpose"] == "next in line" and waiter["pid"] == os.getpid()
        assert waiter["deadline"] is not None and waiter["waited"] >= 0
        # The example's hold is renewed by its watchdog (ttl 10 s): renewed moments ago.
        assert row["renewing"] is True and row["overdue"] is False
        assert 0 <= row["renewed_ago"] < 5
        (holder,) = row["holders"]
        assert holder["renewing"] is True and holder["renewed_ago"] == row["renewed_ago"]
    finally:
        waiters.close()


def test_embedded_redis_stops_with_its_keeper(tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    keeper = subprocess.Popen(
        [sys.executable, str(EXAMPLE / "embedded_redis.py"), "--url-file", str(url_file)],
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not url_file.exists():
            assert keeper.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        url = url_file.read_text().strip()
        client = redis.Redis.from_url(url, socket_timeout=2)
        assert client.ping()
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(10) == 0
        assert not url_file.exists()
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    finally:
        if keeper.poll() is None:
            keeper.kill()
            keeper.wait(5)


def _example_env(tmp_path: Path) -> dict[str, str]:
    """The environment the example's processes run in: the test Redis, a fresh database."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example.settings",
        "REDIS_URL": settings.REDIS_URL,
        "EXAMPLE_DATABASE": str(tmp_path / "db.sqlite3"),
    }


def test_loading_the_settings_creates_the_celery_app_whose_task_keys_are_checked(
    tmp_path: Path,
) -> None:
    """The project package imports its Celery app (docs/celery.md, "Wiring Celery into
    your Django project"), so the lock-key check (E005) of a process that only loads the
    settings, as ``manage.py check`` does, reaches the example's tasks."""
    code = (
        "import django\n"
        "django.setup()\n"
        "from celery import _state\n"
        "from django_redislock.guards.key_checks import check_lock_keys\n"
        "print('problems', check_lock_keys())\n"
        "apps = [a for a in _state._get_active_apps() if a.main == 'example']\n"
        "print('tasks', sorted(n for a in apps for n in a.tasks if n.startswith('example.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=EXAMPLE,
        env=_example_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "problems []" in done.stdout
    assert "tasks ['example.tasks.build_report']" in done.stdout, done.stdout


def test_the_example_worker_prints_each_log_line_once(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    """Celery's worker hijacks the root logger; the example's ``django_redislock`` logger
    has its own handler, so a propagated record was printed a second time."""
    from celery import Celery

    worker = subprocess.Popen(
        [
            sys.executable, "-m", "celery", "--workdir", str(EXAMPLE), "-A",
            "example.celery_app", "worker", "--pool=solo", "-l", "info",
            "--without-mingle", "--without-gossip", "--without-heartbeat",
        ],
        env=_example_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        client = Celery(
            "sender", broker=settings.REDIS_URL, backend=settings.REDIS_URL, set_as_current=False
        )
        with LockManager(client=redis_client).lock("report:7", owner="test-holder", ttl=60):
            result = client.send_task("example.tasks.build_report", args=[7, 0])
            assert result.get(timeout=30)["redislock"] == "skipped"
        client.close()
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            output, _ = worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            output, _ = worker.communicate(timeout=10)
    text = output.decode()
    lines = [line for line in text.splitlines() if "found lock 'report:7' held" in line]
    assert len(lines) == 1, text
