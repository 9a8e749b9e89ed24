"""Locks released when the database transaction ends, not before it commits.

Guarded views under ``ATOMIC_REQUESTS`` and ``locks.atomic()``: on real databases
(SQLite, and a PostgreSQL cluster the tests start), with commits made slow, in
several processes, the next holder must see the previous holder's committed rows.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View

from django_redislock import LockNotAcquired, locks, single_instance
from django_redislock.guards.shaping import shaping_state
from tests.postgres_server import PostgresServer
from tests.test_multiprocess import _expect_line

ROOT = Path(__file__).resolve().parent.parent

#: How long each commit takes in the slow-commit tests (s).
COMMIT_DELAY = 0.15
#: Child processes, and guarded requests each, in the slow-commit tests.
PROCESSES, REQUESTS = 3, 4

# -- views for the in-process tests --------------------------------------------

#: For each commit of a guarded request: was its lock still held?
held_at_commit: list[bool] = []


def _work(request: HttpRequest, name: str) -> HttpResponse:
    transaction.on_commit(lambda: held_at_commit.append(locks.get(name) is not None))
    if request.GET.get("fail"):
        raise RuntimeError("the view failed")
    if request.GET.get("rollback"):
        transaction.set_rollback(True)
    return HttpResponse("ran")


@single_instance("tx:view", ttl=30)
def guarded(request: HttpRequest) -> HttpResponse:
    return _work(request, "tx:view")


@method_decorator(single_instance("tx:cbv", ttl=30), name="post")
class GuardedView(View):
    def post(self, request: HttpRequest) -> HttpResponse:
        return _work(request, "tx:cbv")


@single_instance("tx:async", ttl=30)
async def guarded_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ran")


#: For each commit of a request to ``cooled``: (its lock still held, its cooldown left).
cool_at_commit: list[tuple[bool, float]] = []


@single_instance("tx:cool", ttl=30, cooldown=30)
def cooled(request: HttpRequest) -> HttpResponse:
    transaction.on_commit(
        lambda: cool_at_commit.append(
            (locks.get("tx:cool") is not None, shaping_state(cooled, "tx:cool").cooldown_left)
        )
    )
    return HttpResponse("ran")


@single_instance("tx:acool", ttl=30, cooldown=30)
async def acooled(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ran")


urlpatterns = [
    path("view/", guarded),
    path("cbv/", GuardedView.as_view()),
    path("async/", guarded_async),
    path("cool/", cooled),
    path("acool/", acooled),
]


@pytest.fixture
def atomic_requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``ATOMIC_REQUESTS = True`` on the default database for one test."""
    monkeypatch.setitem(connections.settings["default"], "ATOMIC_REQUESTS", True)
    held_at_commit.clear()
    yield


# -- guarded views, in this process --------------------------------------------


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("url", "name"), [("/view/", "tx:view"), ("/cbv/", "tx:cbv")])
def test_a_guarded_view_keeps_its_lock_until_the_request_commits(
    atomic_requests: None, url: str, name: str
) -> None:
    assert Client().post(url).status_code == 200
    assert held_at_commit == [True]
    assert locks.get(name) is None


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("query", ["fail=1", "rollback=1"])
@pytest.mark.parametrize(("url", "name"), [("/view/", "tx:view"), ("/cbv/", "tx:cbv")])
def test_a_guarded_view_whose_transaction_rolls_back_frees_its_lock_then(
    atomic_requests: None, url: str, name: str, query: str
) -> None:
    response = Client(raise_request_exception=False).post(f"{url}?{query}")
    assert response.status_code == (500 if query == "fail=1" else 200)
    assert held_at_commit == []  # rolled back
    assert locks.get(name) is None  # freed at the rollback, not when its 30 s lease ends


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_an_async_view_called_inside_a_transaction_waits_for_it() -> None:
    # The sync test client runs an async view with async_to_sync: its sync work (and
    # the release decision) runs in this thread, inside this transaction.
    with transaction.atomic():
        assert Client().post("/async/").status_code == 200
        assert locks.get("tx:async") is not None
    assert locks.get("tx:async") is None


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_a_views_cooldown_starts_when_it_returns_and_its_lock_frees_at_the_commit(
    atomic_requests: None,
) -> None:
    """The release waits for the commit; the cooldown does not wait with it (it is sent
    alone when the view returns, not in the release's round trip)."""
    cool_at_commit.clear()
    assert Client().post("/cool/").status_code == 200
    [(held, left)] = cool_at_commit
    assert held and left > 25
    assert locks.get("tx:cool") is None
    assert Client().post("/cool/").status_code == 429  # in its cooldown


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_an_async_views_cooldown_starts_before_the_transaction_it_waits_for_ends() -> None:
    with transaction.atomic():
        assert Client().post("/acool/").status_code == 200
        assert locks.get("tx:acool") is not None
        assert shaping_state(acooled, "tx:acool").cooldown_left > 25
    assert locks.get("tx:acool") is None


@pytest.mark.urls(__name__)
@pytest.mark.django_db
def test_a_test_cases_own_transaction_does_not_hold_a_views_lock() -> None:
    # Django's TestCase (and pytest-django's db) wraps each test in an atomic block that
    # never commits; the view's lock is released when the view returns, as without it.
    assert Client().post("/view/").status_code == 200
    assert locks.get("tx:view") is None


@pytest.mark.urls(__name__)
@pytest.mark.django_db
def test_under_a_test_case_atomic_requests_hold_until_the_callbacks_run(
    atomic_requests: None, django_capture_on_commit_callbacks: Any
) -> None:
    # The request's block is a savepoint of the test's transaction: no real commit.
    assert Client().post("/view/").status_code == 200
    assert locks.get("tx:view") is not None
    locks.force_release("tx:view")
    with django_capture_on_commit_callbacks(execute=True):  # as docs/views.md says
        assert Client().post("/view/").status_code == 200
    assert held_at_commit == [True]
    assert locks.get("tx:view") is None


# -- locks.atomic ----------------------------------------------------------------


def _seen_at_commit(name: str) -> list[bool]:
    seen: list[bool] = []
    transaction.on_commit(lambda: seen.append(locks.get(name) is not None))
    return seen


@pytest.mark.django_db(transaction=True)
def test_atomic_releases_after_the_commit(name: str) -> None:
    with locks.atomic(name) as lock:
        assert lock.owned() and connections["default"].in_atomic_block
        seen = _seen_at_commit(name)
    assert seen == [True]
    assert locks.get(name) is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["raise", "set_rollback"])
def test_atomic_releases_after_a_rollback(name: str, how: str) -> None:
    with pytest.raises(KeyError) if how == "raise" else _nothing():
        with locks.atomic(name):
            seen = _seen_at_commit(name)
            if how == "raise":
                raise KeyError("rolled back")
            transaction.set_rollback(True)
    assert seen == []
    assert locks.get(name) is None


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_atomic_inside_an_outer_transaction_waits_for_the_outermost(
    name: str, outcome: str
) -> None:
    with pytest.raises(KeyError) if outcome == "rollback" else _nothing():
        with transaction.atomic():
            seen = _seen_at_commit(name)
            with locks.atomic(name):
                pass
            assert locks.get(name) is not None  # the outer transaction has not committed
            if outcome == "rollback":
                raise KeyError("the outer transaction rolls back")
    assert seen == ([True] if outcome == "commit" else [])
    assert locks.get(name) is None


@pytest.mark.django_db(transaction=True)
def test_atomic_in_a_savepoint_that_rolls_back_is_freed_then(name: str) -> None:
    # The block's writes are gone with the savepoint: nothing of them can commit later.
    with transaction.atomic():
        with pytest.raises(KeyError):
            with transaction.atomic():
                with locks.atomic(name):
                    pass
                assert locks.get(name) is not None
                raise KeyError("the savepoint rolls back")
        assert locks.get(name) is None


@pytest.mark.django_db(transaction=True)
def test_a_lock_waiting_for_a_commit_is_renewed(name: str) -> None:
    with transaction.atomic():
        with locks.atomic(name, ttl=1) as lock:
            pass
        time.sleep(1.6)  # longer than the lease: only renewals keep it
        assert lock.owned()
    assert locks.get(name) is None


@pytest.mark.django_db
def test_atomic_under_a_test_cases_transaction_releases_at_its_end(name: str) -> None:
    with locks.atomic(name):
        pass
    assert locks.get(name) is None


@pytest.mark.django_db(transaction=True)
def test_atomic_opens_no_transaction_when_the_lock_is_busy(name: str) -> None:
    other = locks.lock(name, owner="someone else")
    assert other.acquire(blocking=False)
    try:
        with pytest.raises(LockNotAcquired):
            with locks.atomic(name, blocking=False):
                pytest.fail("ran without the lock")
        assert not connections["default"].in_atomic_block
    finally:
        other.release()


@pytest.mark.django_db(transaction=True)
def test_a_durable_atomic_refused_inside_a_transaction_releases_the_lock(name: str) -> None:
    with transaction.atomic():
        with pytest.raises(RuntimeError, match="durable"):
            with locks.atomic(name, durable=True):
                pytest.fail("a durable block nested in another")
        assert locks.get(name) is None


# -- slow commits, several processes -------------------------------------------


def _sqlite_counter(tmp_path: Path) -> dict[str, Any]:
    """A SQLite file with the counter (WAL: readers do not wait for a writer), its commits slow."""
    file = tmp_path / "counter.sqlite3"
    with sqlite3.connect(file) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
        db.execute("INSERT INTO counter VALUES (1, 0)")
    db.close()
    return {
        "ENGINE": "tests.slow_sqlite",
        "NAME": str(file),
        "ATOMIC_REQUESTS": True,
        "TEST_COMMIT_DELAY": COMMIT_DELAY,
    }


def _postgres_counter(server: PostgresServer) -> dict[str, Any]:
    """The counter in PostgreSQL, its commits slow: a deferred constraint trigger sleeps."""
    with server.connect() as db:
        db.execute("DROP TABLE IF EXISTS counter")
        db.execute("CREATE TABLE counter (id integer PRIMARY KEY, n integer NOT NULL)")
        db.execute("INSERT INTO counter VALUES (1, 0)")
        db.execute(
            "CREATE OR REPLACE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN PERFORM pg_sleep({COMMIT_DELAY}); RETURN NULL; END $$"
        )
        db.execute(
            "CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON counter "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()"
        )
    return server.settings(ATOMIC_REQUESTS=True)


def _counted(databases: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """Run PROCESSES children posting REQUESTS guarded increments each, all at once;
    every child's answers."""
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        TX_DATABASES=json.dumps(
            {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}, **databases}
        ),
        TX_COUNTED=",".join(databases),
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.tx_proc", str(REQUESTS)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    try:
        for child in children:
            _expect_line(child, "ready", 60)
        for child in children:  # all at once: they contend for the lock
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        return [json.loads(_expect_line(child, "done", 120)[1]) for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait(10)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "both"])
def test_guarded_increments_under_atomic_requests_lose_nothing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Each guarded request reads a counter and writes it back one higher inside its
    ``ATOMIC_REQUESTS`` transaction, whose commit is slow. Whoever gets the lock next
    must read what the previous holder committed: PROCESSES x REQUESTS increments, each
    reading a different value, none failing. ("both": the view counts in SQLite and in
    PostgreSQL, two transactions; the lock waits for both.)"""
    make: dict[str, Callable[[], dict[str, Any]]] = {
        "sqlite": lambda: _sqlite_counter(tmp_path),
        "postgresql": lambda: _postgres_counter(request.getfixturevalue("postgres")),
    }
    databases = {k: make[k]() for k in (["sqlite", "postgresql"] if kind == "both" else [kind])}
    answers = [answer for child in _counted(databases) for answer in child]
    failed = [status for status, _body in answers if status != 200]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed: {failed}"
    for alias in databases:
        read = sorted(body[alias] for _status, body in answers)
        assert read == list(range(PROCESSES * REQUESTS)), (
            f"{alias}: requests read stale counters (lost updates): {read}"
        )
