"""``manage.py check`` finds the lock keys that import time does not: E005 / W008.

What import already refuses (``@single_instance`` on a function naming a missing
argument) is not repeated here; these are the cases that pass import and fail
every request or every task run (or the worker's start).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery import _state as celery_state
from django.test import Client

from django_redislock.celery import SingleInstanceTask
from django_redislock.guards.key_checks import task_key_problems, view_key_problems
from tests import keycheck_views

ROOT = Path(__file__).resolve().parent.parent

#: The routes of tests/keycheck_views.py whose key fails every request.
BAD_ROUTES = {"bad-invoice/<int:id>/", "export-none/", "order-by-id/<int:id>/"}


def _routes(messages: list[Any]) -> set[str]:
    return {m.msg.split("'")[1] for m in messages}


def test_manage_py_check_reports_views_and_tasks_and_exits_1() -> None:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings_keycheck")
    done = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output
    assert output.count("(django_redislock.E005)") == 4, output
    for route in BAD_ROUTES:
        assert f"URL {route!r}" in output
    # The shared task's class is only built when the app is finalized: a worker's start.
    assert "Celery app 'keycheck'" in output and "{acount_id}" in output


def test_only_the_views_that_fail_every_request_are_reported() -> None:
    messages = view_key_problems(keycheck_views.urlpatterns)
    assert {m.id for m in messages} == {"django_redislock.E005"}
    assert _routes(messages) == BAD_ROUTES
    [cbv] = [m for m in messages if "bad-invoice" in m.msg]
    assert "BadInvoiceView.post() has no argument called 'pk'" in cbv.msg
    assert "(its arguments: request, id)" in cbv.msg


@pytest.mark.urls("tests.keycheck_views")
@pytest.mark.parametrize(
    ("method", "url"),
    [("post", "/bad-invoice/1/"), ("get", "/export-none/"), ("get", "/order-by-id/1/")],
)
def test_what_the_check_reports_really_fails_the_request(method: str, url: str) -> None:
    with pytest.raises(ValueError, match="lock key"):
        getattr(Client(), method)(url)


@pytest.mark.urls("tests.keycheck_views")
@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("post", "/good-invoice/1/"),
        ("get", "/order/1/"),
        ("get", "/export/monthly/"),
        ("get", "/export-all/"),
        ("get", "/account/acme/export/"),
        ("get", "/legacy/4/"),
    ],
)
def test_what_the_check_passes_really_runs(method: str, url: str) -> None:
    assert getattr(Client(), method)(url).status_code == 200


def test_the_view_check_never_raises() -> None:
    [message] = view_key_problems([object()])
    assert message.id == "django_redislock.W008"
    assert "the views of the URLconf" in message.msg


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    """A Celery app of this test only (not current, no Django fixup, no shared tasks).

    Every ``@shared_task`` defined in this process joins each app when it is
    finalized; other test modules define some with invalid options on purpose, so
    this app finalizes with Celery's list of them emptied (isolation, not a mock).
    """
    monkeypatch.setattr(celery_state, "_on_app_finalizers", set())
    celery_app = Celery("keycheck-test", set_as_current=False, fixups=[])
    celery_app.conf.broker_url = "memory://"
    yield celery_app
    celery_app.close()


def test_a_task_whose_options_fail_at_finalize_is_e005(app: Celery) -> None:
    @app.task(shared=False, base=SingleInstanceTask, lock_key="sync:{acount_id}")
    def sync(account_id: int) -> None: ...

    [message] = task_key_problems(app)
    assert message.id == "django_redislock.E005"
    assert "has no argument called 'acount_id'" in message.msg


def test_a_subclass_that_changes_lock_key_is_e005(app: Celery) -> None:
    class Base(SingleInstanceTask):
        name = "keycheck.base"

        def run(self, account_id: int) -> None: ...

    class Child(Base):
        name = "keycheck.child"
        lock_key = "sync:{acount_id}"  # its config is built at its first run

    app.register_task(Base())
    app.register_task(Child())
    [message] = task_key_problems(app)
    assert message.id == "django_redislock.E005"
    assert message.msg.startswith("Celery task 'keycheck.child'")
    with pytest.raises(ValueError, match="acount_id"):
        app.tasks["keycheck.child"]._lock_config()  # what its first run would do


def test_a_task_module_refused_at_import_is_e005(app: Celery) -> None:
    app.conf.imports = ("tests.keycheck_bad_module",)
    [message] = task_key_problems(app)
    assert message.id == "django_redislock.E005"
    assert "'report:{acount_id}'" in message.msg


def test_a_task_module_that_fails_otherwise_is_w008(app: Celery) -> None:
    app.conf.imports = ("tests.keycheck_no_such_module",)
    [message] = task_key_problems(app)
    assert message.id == "django_redislock.W008"
    assert "ModuleNotFoundError" in message.msg


def test_good_tasks_pass(app: Celery) -> None:
    @app.task(shared=False, base=SingleInstanceTask, lock_key="sync:{account_id}")
    def sync(account_id: int) -> None: ...

    @app.task(shared=False, base=SingleInstanceTask, lock_key=lambda n: f"n:{n}")
    def by_callable(n: int) -> None: ...

    assert task_key_problems(app) == []
    assert "tests.keycheck_tasks" not in sys.modules  # its shared task would join every app
