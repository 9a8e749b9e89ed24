"""Waiters and liveness in the admin lock viewer, through Django's test client against
the real test redis-server.

Covers: the list's Waiting and Renewed columns (an overdue holder highlighted with the
exact seconds on hover, a lease meant to run out, Redis's count of waiters); the "only
overdue holders" filter and sorting by last renewal; the documented kinds and
primitives always offered as filters; case-insensitive search with trimmed input; the
detail page's waiters table, in order, and each holder's liveness.

A holder whose renewals stopped is written here as such a holder leaves its hash (a
lease of 60 s with 20 s left: renewed 40 s ago); a real holder process stopped with
SIGSTOP is in tests/test_admin_browser.py and tests/test_command.py. Waiters are
threads of this process, in the lock's real queue.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import Client

from django_redislock import locks
from tests.holding import QueuedWaiters, wait_until
from tests.holding import queued as queued_count
from tests.test_admin import LIST, put_lock, rows
from tests.test_multiprocess import _expect_line, _spawn

pytestmark = pytest.mark.django_db


@pytest.fixture
def su(admin_client: Client) -> Client:
    """A client logged in as a superuser (pytest-django's)."""
    return admin_client


@pytest.fixture
def waiting(name: str) -> Iterator[QueuedWaiters]:
    """Threads waiting for the lock *name*."""
    waiters = QueuedWaiters(name)
    yield waiters
    waiters.close()


def renewed_ago(client: redis.Redis, name: str, seconds: float, **options: Any) -> None:
    """A held lock whose 60 s lease was last renewed *seconds* ago (by Redis's clock)."""
    key = put_lock(client, name, ttl_ms=60_000, **options)
    client.pexpire(key, int((60 - seconds) * 1000))


def cell(html: str, name: str, field: str) -> str:
    """The inner HTML of the *field* cell of the row of lock *name* on a list page."""
    row = re.search(rf'<tr data-lock-name="{re.escape(name)}">(.*?)</tr>', html, re.S)
    assert row, f"no row for {name!r}"
    found = re.search(rf'<td class="field-{field}">(.*?)</td>', row.group(1), re.S)
    assert found, f"no {field} cell in the row of {name!r}"
    return found.group(1)


def test_list_shows_waiting_and_renewed(
    su: Client, redis_client: redis.Redis, name: str, waiting: QueuedWaiters
) -> None:
    renewed_ago(redis_client, "stuck", 40)
    queued = locks.lock("queued", owner="enqueue", ttl=60, auto_renew=False)
    assert queued.acquire()
    holder = locks.lock(name, owner="holder", ttl=30)
    assert holder.acquire()
    try:
        waiting.add(locks.lock(name, owner="w1", ttl=30), 30)
        waiting.add(locks.lock(name, owner="w2", ttl=30), None)
        html = su.get(LIST).content.decode()
        assert ">Waiting<" in html and ">Renewed</a>" in html
        stuck = cell(html, "stuck", "renewed")
        assert "redislock-overdue" in stuck and re.search(r">not renewed for 40 s<", stuck), stuck
        assert re.search(r'title="lease last set 40\.\d{3} s ago"', stuck), stuck
        live = cell(html, name, "renewed")
        assert "redislock-renewed" in live and re.search(r">renewed \d\.\d s ago<", live), live
        assert ">not renewed (runs out)<" in cell(html, "queued", "renewed")
        assert re.search(r">2</a>", cell(html, name, "waiting"))
        assert '<span class="quiet">0</span>' in cell(html, "stuck", "waiting")
    finally:
        holder.release()
        queued.release()


def test_only_overdue_holders_and_sort_by_last_renewal(
    su: Client, redis_client: redis.Redis
) -> None:
    renewed_ago(redis_client, "a-overdue", 40)
    renewed_ago(redis_client, "b-fine", 10)  # overdue after 30 s (half of 60)
    renewed_ago(redis_client, "c-overdue", 35, meta={"host": "web-2"})
    renewed_ago(redis_client, "d-runs-out", 50, meta={"renews": False})
    redis_client.set("redislock:{e-foreign}", "x")
    assert rows(su.get(LIST, {"overdue": "1"})) == ["a-overdue", "c-overdue"]
    assert rows(su.get(LIST, {"overdue": "1", "host": "web-2"})) == ["c-overdue"]
    order = ["d-runs-out", "a-overdue", "c-overdue", "b-fine", "e-foreign"]
    assert rows(su.get(LIST, {"o": "renewed"})) == order
    assert rows(su.get(LIST, {"o": "-renewed"})) == order[::-1]
    response = su.get(LIST, {"q": "over", "o": "renewed"})
    (link,) = [c for c in response.context["overdue_choices"] if c["label"] != "All"]
    assert link["label"] == "only overdue holders" and not link["selected"]
    assert "q=over" in link["url"] and "o=renewed" in link["url"] and "overdue=1" in link["url"]
    assert rows(su.get(LIST + link["url"])) == ["a-overdue", "c-overdue"]
    response = su.get(LIST, {"overdue": "1"})
    assert response.context["sort_links"]["renewed"]["url"] == "?overdue=1&o=renewed"
    assert [c["selected"] for c in response.context["overdue_choices"]] == [False, True]
    assert '<input type="hidden" name="overdue" value="1">' in response.content.decode()


def test_filters_offer_the_documented_kinds_and_primitives(
    su: Client, redis_client: redis.Redis
) -> None:
    def labels(response: Any, choices: str) -> list[str]:
        return [c["label"] for c in response.context[choices]]

    response = su.get(LIST)
    assert labels(response, "kind_choices") == [
        "All",
        "task",
        "view",
        "function",
        "lock",
        "foreign",
    ]
    assert labels(response, "primitive_choices") == ["All", "mutex", "semaphore", "read-write lock"]
    put_lock(redis_client, "own", meta={"kind": "nightly"})
    put_lock(redis_client, "job", meta={"kind": "task"})
    response = su.get(LIST)
    assert labels(response, "kind_choices")[-1] == "nightly"
    assert rows(su.get(LIST, {"kind": "task"})) == ["job"]
    assert rows(su.get(LIST, {"kind": "view"})) == []


def test_search_can_ignore_case_and_is_trimmed(su: Client, held: Any) -> None:
    for lock_name in ("Report:2024", "report:old", "monthly-REPORT", "other", "Ünïcode:É", "[A]b"):
        held(lock_name)
    assert rows(su.get(LIST, {"q": "  report "})) == ["report:old"]
    assert rows(su.get(LIST, {"q": " report", "i": "1"})) == [
        "Report:2024",
        "monthly-REPORT",
        "report:old",
    ]
    assert rows(su.get(LIST, {"q": "REP", "i": "1", "match": "prefix"})) == [
        "Report:2024",
        "report:old",
    ]
    assert rows(su.get(LIST, {"q": "üNÏ", "i": "1", "match": "prefix"})) == ["Ünïcode:É"]
    assert rows(su.get(LIST, {"q": ":é", "i": "1"})) == ["Ünïcode:É"]
    assert rows(su.get(LIST, {"q": "[a]", "i": "1"})) == ["[A]b"]
    response = su.get(LIST, {"q": " x ", "i": "1"})
    assert 'value="x"' in response.content.decode()
    assert 'name="i" value="1" checked' in response.content.decode()


@pytest.fixture
def held() -> Iterator[Any]:
    """Factory: a lock held by an explicit owner (no watchdog), released after the test."""
    taken = []

    def take(lock_name: str) -> None:
        lk = locks.lock(lock_name, ttl=60, auto_renew=False, owner="owner-1")
        assert lk.acquire(blocking=False)
        taken.append(lk)

    yield take
    for lk in taken:
        lk.release()


def detail(su: Client, lock_name: str) -> Any:
    response = su.get(f"{LIST}{lock_name.replace(':', '_3A')}/change/")
    assert response.status_code == 200
    return response


def test_detail_page_lists_the_waiters_in_order(
    su: Client, name: str, waiting: QueuedWaiters
) -> None:
    holder = locks.lock(name, owner="holder", ttl=30, purpose="nightly run")
    assert holder.acquire()
    try:
        response = detail(su, name)
        assert "Waiters (0)" in response.content.decode()
        assert "Nobody is waiting." in response.content.decode()
        waiting.add(locks.lock(name, owner="first", ttl=45, purpose="second run"), 30)
        waiting.add(locks.lock(name, owner="second", ttl=30), None)
        response = detail(su, name)
        html = response.content.decode()
        assert "Waiters (2)" in html
        assert re.findall(r'data-waiter-owner="([^"]+)"', html) == ["first", "second"]
        first, second = response.context["waiters"]
        assert first.position == 1 and first.waiter.purpose == "second run"
        assert first.deadline_text.startswith("in 2") and second.deadline_text == "no limit"
        assert re.search(r"for \d\.\d s", first.waited_text)
        rows_html = re.findall(r'<tr class="redislock-waiter".*?</tr>', html, re.S)
        assert f"pid {os.getpid()}" in rows_html[0]
        assert "second run" in rows_html[0] and ">45 s<" in rows_html[0]
        assert ">exclusive<" in rows_html[0] and "no limit" in rows_html[1]
        renewed = re.search(r'<div class="readonly field-renewed">(.*?)</div>', html, re.S)
        assert renewed and re.search(r">renewed \d\.\d s ago<", renewed.group(1))
    finally:
        holder.release()


def test_detail_page_shows_each_holders_liveness_and_permit_waiters(
    su: Client, name: str, waiting: QueuedWaiters
) -> None:
    renewing = locks.semaphore(name, 2, owner="renewing", ttl=60)
    runs_out = locks.semaphore(name, 2, owner="runs-out", ttl=60, auto_renew=False)
    assert renewing.acquire(blocking=False) and runs_out.acquire(blocking=False)
    try:
        waiting.add(locks.semaphore(name, 2, owner="next", ttl=60), 30)
        html = detail(su, name).content.decode()
        cells = dict(
            re.findall(
                r'data-holder-owner="([^"]+)".*?<td class="field-renewed">(.*?)</td>', html, re.S
            )
        )
        assert re.search(r"redislock-renewed[^>]*>renewed \d\.\d s ago<", cells["renewing"])
        assert (
            "redislock-runs-out" in cells["runs-out"]
            and "not renewed (runs out)" in cells["runs-out"]
        )
        assert re.findall(r'data-waiter-owner="([^"]+)"', html) == ["next"]
        assert '<td class="field-mode">permit</td>' in html.split('id="waiter_list"')[1]
    finally:
        renewing.release()
        runs_out.release()


def test_a_holder_just_handed_the_lock_is_not_overdue(
    su: Client, redis_client: redis.Redis, name: str, waiting: QueuedWaiters
) -> None:
    """Right after a release hands the lock on (to a thread of this process, and to a
    child process stopped before it could claim it), the new holder is shown as
    handed over, not as overdue, and the "only overdue holders" filter leaves it out."""
    holder = locks.lock(name, owner="holder", ttl=30)
    assert holder.acquire()
    waiting.add(locks.lock(name, owner="next", ttl=30), 30)
    holder.release()
    assert locks.get(name) is not None and locks.get(name).owner == "next"  # type: ignore[union-attr]
    assert name not in rows(su.get(LIST, {"overdue": "1"}))
    live = cell(su.get(LIST).content.decode(), name, "renewed")
    assert "redislock-overdue" not in live and "not renewed" not in live, live
    stopped = f"{name}:stopped"
    other = locks.lock(stopped, owner="holder", ttl=30)
    assert other.acquire()
    child = _spawn("wait_for", stopped, "30")
    try:
        _expect_line(child, "waiting")
        wait_until(lambda: queued_count(redis_client, stopped) == 1, timeout=20)
        os.kill(child.pid, signal.SIGSTOP)  # alive, but cannot claim what it is handed
        other.release()
        info = locks.get(stopped)
        assert info is not None and info.pid == child.pid and info.claiming, info
        assert rows(su.get(LIST, {"overdue": "1"})) == []
        handed = cell(su.get(LIST).content.decode(), stopped, "renewed")
        assert "redislock-handed" in handed, handed
        assert re.search(r">handed over \d\.\d s ago, claiming<", handed), handed
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait(10)
