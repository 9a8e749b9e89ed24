"""A lock's history on its detail page, the contention overview page, and
``manage.py redislock history`` / ``contention``: through Django's test client and
call_command, on real contention between threads against the real test Redis."""

from __future__ import annotations

import json
import time
from io import StringIO

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from django_redislock import locks, single_instance
from tests.holding import contend
from tests.test_contention import contention_scenario

LIST = "/admin/django_redislock/heldlock/"
pytestmark = pytest.mark.django_db


@pytest.fixture
def su(client: Client) -> Client:
    """A client logged in as a superuser."""
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


@single_instance("sync:{account}", timeout=10)
def sync(account: int, hold: float) -> None:
    """Holds its lock for *hold* seconds."""
    time.sleep(hold)  # (the work the next call waits for)


def _contend(account: int) -> None:
    """One hand-off of sync:<account> between two calls."""
    contend(lambda hold: sync(account, hold), f"sync:{account}")


def _run(*args: str) -> str:
    out = StringIO()
    call_command("redislock", *args, stdout=out)
    return out.getvalue()


def test_the_detail_page_shows_the_history_with_its_spread(su: Client) -> None:
    _contend(7)
    holder = locks.lock("sync:7", owner="now-holding", ttl=60, auto_renew=False)
    assert holder.acquire(blocking=False)
    try:
        page = su.get(f"{LIST}{quote('sync:7')}/change/").content.decode()
    finally:
        holder.release()
    assert 'id="redislock-history"' in page and "Recent history (1)" in page
    assert 'data-event="handoff"' in page and "handed to the next waiter" in page
    assert "Holds: median 0." in page and "Waits: median 0." in page
    # Released now: the page says so, and still shows what happened.
    gone = su.get(f"{LIST}{quote('sync:7')}/change/")
    assert gone.status_code == 404 and 'data-event="handoff"' in gone.content.decode()


def test_a_task_lock_shows_the_arguments_its_key_was_made_from(su: Client) -> None:
    task = locks.lock(
        "sync:9",
        owner="task-9",
        ttl=60,
        auto_renew=False,
        meta={"kind": "task", "task_id": "t-9", "task_name": "app.sync", "args": {"account": 9}},
    )
    assert task.acquire(blocking=False)
    try:
        page = su.get(f"{LIST}{quote('sync:9')}/change/").content.decode()
    finally:
        task.release()
    args = page.split('class="readonly redislock-task-args"><pre>', 1)[1].split("</pre>")[0]
    assert json.loads(args.replace("&quot;", '"')) == {"account": 9}


def test_the_contention_page_ranks_key_templates(su: Client) -> None:
    contention_scenario(_contend)
    listing = su.get(LIST).content.decode()
    assert 'href="/admin/django_redislock/heldlock/contention/"' in listing
    page = su.get(f"{LIST}contention/").content.decode()
    rows = page.split('class="redislock-group" data-group="')[1:]
    assert [r.split('"', 1)[0] for r in rows] == ["sync:{account}", "plain:x"]
    sync_row = rows[0]
    assert '<td class="field-locks">2</td>' in sync_row
    assert '<td class="field-waits">2</td>' in sync_row
    assert f'href="{LIST}{quote("sync:1")}/change/"' in sync_row
    assert '<td class="field-timeouts">1</td>' in rows[1]
    # Another window; an unknown one falls back to the hour.
    assert su.get(f"{LIST}contention/?window=600").status_code == 200
    assert 'value="3600" selected' in su.get(f"{LIST}contention/?window=5").content.decode()


def test_the_contention_page_needs_the_view_permission(client: Client) -> None:
    client.force_login(User.objects.create_user("nobody", password="pw", is_staff=True))
    assert client.get(f"{LIST}contention/").status_code == 403


def test_the_command_prints_the_history_and_the_contention() -> None:
    _contend(3)
    text = _run("history", "sync:3")
    assert "held: median" in text and "\thandoff\t" in text
    (event,) = json.loads(_run("history", "sync:3", "--json"))
    assert event["event"] == "handoff" and event["waited"] > 0.15
    assert _run("history", "never:used") == "nothing recorded for 'never:used'\n"
    (group,) = [json.loads(line) for line in _run("contention", "--json").splitlines()]
    assert (group["group"], group["locks"], group["waits"]) == ("sync:{account}", 1, 1)
    assert _run("contention").startswith("sync:{account}\tlocks=1\twaits=1\t")
