"""The admin lock viewer through Django's test client, against the real test redis-server.

Covers: index entry and permission rows, permissions inside every view
(anonymous, staff without view permission, read-only staff), CSRF, literal
search, host/kind filters, ordering, SCAN windows and pages over many locks,
XSS in lock names, foreign keys under the prefix, the token check on release
and extend, LogEntry audit, a custom admin site with a custom key prefix, and
the operator extend script.
"""

from __future__ import annotations

import json
import time
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import redis
from django.contrib import admin as django_admin
from django.contrib.admin import AdminSite
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client, override_settings
from django.urls import path

from django_redislock import LockManager, locks
from django_redislock.admin import HeldLockAdmin
from django_redislock.engine.keys import KeySpace
from django_redislock.models import HeldLock

pytestmark = pytest.mark.django_db

LIST = "/admin/django_redislock/heldlock/"
RELEASE = LIST + "release/"
EXTEND = LIST + "extend/"

# A second admin site, served when a test sets ROOT_URLCONF to this module.
ops_site = AdminSite(name="opsadmin")
ops_site.register(HeldLock, HeldLockAdmin)
urlpatterns = [path("ops/", ops_site.urls)]


def put_lock(
    client: redis.Redis,
    name: str,
    *,
    prefix: str = "redislock",
    owner: str = "someone",
    fence: int = 1,
    since_ms: int | None = None,
    ttl_ms: int = 60_000,
    meta: dict[str, Any] | None = None,
) -> str:
    """Write a lock hash in the engine's layout directly, as another process would."""
    key = KeySpace(prefix).keys(name).lock
    client.hset(
        key,
        mapping={
            "owner": owner,
            "count": 1,
            "fence": fence,
            "since": since_ms if since_ms is not None else int(time.time() * 1000),
            "ttl": ttl_ms,
            "op": "x",
            "meta": json.dumps(meta if meta is not None else {"host": "h1", "pid": 1}),
        },
    )
    client.pexpire(key, ttl_ms)
    return key


def rows(response: Any) -> list[str]:
    """The lock names on a list page, in display order."""
    return [row.info.name for row in response.context["rows"]]


def user_with(*codenames: str, staff: bool = True) -> User:
    """A staff user holding the given django_redislock permissions."""
    user = User.objects.create_user(f"u{User.objects.count()}", password="pw", is_staff=staff)
    perms = Permission.objects.filter(
        content_type__app_label="django_redislock", codename__in=codenames
    )
    assert perms.count() == len(codenames)
    user.user_permissions.add(*perms)
    return user


@pytest.fixture
def su(client: Client) -> Client:
    """A client logged in as a superuser."""
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return client


@pytest.fixture
def held() -> Any:
    """Factory: a lock held by an explicit owner (no watchdog), released after the test."""
    taken = []

    def take(name: str, owner: str = "owner-1", **options: Any) -> Any:
        lk = locks.lock(name, ttl=60, auto_renew=False, owner=owner, **options)
        assert lk.acquire(blocking=False)
        taken.append(lk)
        return lk

    yield take
    for lk in taken:
        if lk.owned():
            lk.release()


def target_of(response: Any, name: str) -> str:
    """The action payload a list page offers for the lock *name*."""
    for row in response.context["rows"]:
        if row.info.name == name:
            return str(row.target)
    raise AssertionError(f"{name!r} not on the page")


# --- mounting and permissions -------------------------------------------------------------


def test_permission_rows_exist() -> None:
    codenames = set(
        Permission.objects.filter(content_type__app_label="django_redislock").values_list(
            "codename", flat=True
        )
    )
    assert codenames == {"view_heldlock", "release_lock", "extend_lock"}


def test_migration_matches_the_model() -> None:
    # The permission rows come from migrations/0001_initial.py: no drift from the model.
    call_command("makemigrations", "django_redislock", "--check", "--dry-run", verbosity=0)


def test_the_wheel_ships_the_migrations() -> None:
    # Without the migration, users' `makemigrations --check` reports django_redislock
    # as changed and `makemigrations` writes a migration into site-packages.
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    wheel = config["tool"]["hatch"]["build"]["targets"]["wheel"]
    shipped = "django_redislock/migrations/0001_initial.py"
    assert any(shipped.startswith(p.rstrip("/") + "/") for p in wheel["packages"])
    for pattern in wheel.get("exclude", []):
        p = pattern.strip("/")
        assert not (fnmatch(shipped, p) or shipped.startswith(p + "/")), pattern


def test_admin_index_has_locks_entry(su: Client) -> None:
    response = su.get("/admin/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "Redis locks" in html
    assert f'href="{LIST}"' in html


def test_anonymous_is_sent_to_login(client: Client, held: Any, redis_client: redis.Redis) -> None:
    lk = held("anon:1")
    for url in (LIST, LIST + "anon%3A1/change/"):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")
    target = json.dumps({"n": "anon:1", "o": None, "f": None})
    response = client.post(RELEASE, {"target": target, "confirm": "yes"})
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert lk.locked()


def test_staff_without_view_permission_gets_403(client: Client, held: Any) -> None:
    held("secret:1")
    client.force_login(user_with())
    assert client.get(LIST).status_code == 403
    assert client.get(LIST + "secret%3A1/change/").status_code == 403
    assert f'href="{LIST}"' not in client.get("/admin/").content.decode()


def test_viewer_is_read_only(client: Client, held: Any) -> None:
    lk = held("ro:1")
    client.force_login(user_with("view_heldlock"))
    assert f'href="{LIST}"' in client.get("/admin/").content.decode()
    response = client.get(LIST)
    assert response.status_code == 200
    assert rows(response) == ["ro:1"]
    html = response.content.decode()
    assert 'name="target"' not in html and "Release selected" not in html
    payload = {"target": target_of(response, "ro:1"), "confirm": "yes", "seconds": "30"}
    assert client.post(RELEASE, payload).status_code == 403
    assert client.post(EXTEND, payload).status_code == 403
    assert lk.owned() and lk.ttl() <= 60


def test_release_permission_alone_does_not_allow_extend(client: Client, held: Any) -> None:
    lk = held("rel:1")
    client.force_login(user_with("view_heldlock", "release_lock"))
    response = client.get(LIST)
    html = response.content.decode()
    assert "Release selected" in html and "Extend selected" not in html
    payload = {"target": target_of(response, "rel:1"), "confirm": "yes", "seconds": "30"}
    assert client.post(EXTEND, payload).status_code == 403
    assert client.post(RELEASE, payload).status_code == 302
    assert not lk.locked()


def test_actions_refuse_get(su: Client) -> None:
    assert su.get(RELEASE).status_code == 405
    assert su.get(EXTEND).status_code == 405


# --- what the list shows ------------------------------------------------------------------


def test_list_shows_owner_metadata(su: Client, held: Any) -> None:
    lk = held("report:42", purpose="nightly report", extra={"account": 7})
    response = su.get(LIST)
    assert response.status_code == 200
    html = response.content.decode()
    (row,) = response.context["rows"]
    info = row.info
    assert info.name == "report:42" and info.owner == "owner-1"
    assert info.fencing_token == lk.fencing_token and info.hold_count == 1
    assert info.host and info.pid and info.thread
    for text in (
        "report:42",
        "nightly report",
        "account=7",
        str(lk.fencing_token),
        f"pid {info.pid}",
        f"host {info.host}",
        " ago",
        'data-lease="',
    ):
        assert text in html, text
    assert "1 lock" in html


def test_celery_task_owner_is_described(su: Client, redis_client: redis.Redis) -> None:
    put_lock(
        redis_client,
        "sync:1",
        meta={
            "host": "w1",
            "pid": 9,
            "task_id": "abc-123",
            "task_name": "app.tasks.sync",
            "kind": "lock",
        },
    )
    html = su.get(LIST).content.decode()
    assert "task app.tasks.sync [abc-123]" in html


def test_foreign_keys_under_the_prefix_never_crash(su: Client, redis_client: redis.Redis) -> None:
    redis_client.hset("redislock:{bare}", "foo", "bar")
    redis_client.set("redislock:{stringkey}", "token")
    redis_client.hset(
        "redislock:{weird}",
        mapping={"since": "99999999999999999999", "count": "x", "meta": "{not json"},
    )
    redis_client.hset("redislock:{metalist}", mapping={"meta": "[1, 2]", "fence": "5"})
    response = su.get(LIST)
    assert response.status_code == 200
    assert sorted(rows(response)) == ["bare", "metalist", "stringkey", "weird"]
    for name in ("bare", "stringkey", "weird", "metalist"):
        assert su.get(f"{LIST}{name}/change/").status_code == 200, name
    # Without an owner or token recorded the release is unconditional.
    done = su.post(RELEASE, {"target": target_of(response, "bare"), "confirm": "yes"})
    assert done.status_code == 302 and not redis_client.exists("redislock:{bare}")
    # Another tool's non-hash key is shown as "foreign" and can be released too.
    done = su.post(RELEASE, {"target": target_of(response, "stringkey"), "confirm": "yes"})
    assert done.status_code == 302 and not redis_client.exists("redislock:{stringkey}")


def test_detail_page(su: Client, held: Any) -> None:
    lk = held("path/with_under_score", purpose="p", extra={"k": "v"})
    response = su.get(LIST)
    (row,) = response.context["rows"]
    detail = su.get(row.detail_url)
    assert detail.status_code == 200
    html = detail.content.decode()
    assert "path/with_under_score" in html and "owner-1" in html and str(lk.fencing_token) in html
    assert "&quot;k&quot;: &quot;v&quot;" in html
    lk.release()
    gone = su.get(row.detail_url)
    assert gone.status_code == 404 and "is not held" in gone.content.decode()


# --- search, filters, ordering, auto-refresh -----------------------------------------------


def test_search_is_literal(su: Client, held: Any) -> None:
    for name in ("a*b", "axb", "a?c", "abc", "[x]y", "xy", "}odd", "\\back", "job:1"):
        held(name)
    assert rows(su.get(LIST, {"q": "a*b"})) == ["a*b"]
    assert rows(su.get(LIST, {"q": "[x]"})) == ["[x]y"]
    assert rows(su.get(LIST, {"q": "a?", "match": "prefix"})) == ["a?c"]
    assert rows(su.get(LIST, {"q": "a", "match": "prefix"})) == ["a*b", "a?c", "abc", "axb"]
    assert rows(su.get(LIST, {"q": "}", "match": "prefix"})) == ["}odd"]
    assert rows(su.get(LIST, {"q": "\\"})) == ["\\back"]
    assert rows(su.get(LIST, {"q": "b"})) == ["\\back", "a*b", "abc", "axb", "job:1"]
    assert rows(su.get(LIST, {"q": "zzz"})) == []


def test_filter_by_host_and_kind(su: Client, redis_client: redis.Redis) -> None:
    put_lock(redis_client, "one", meta={"host": "web-1"})
    put_lock(redis_client, "two", meta={"host": "web-2"})
    put_lock(redis_client, "three", meta={"host": "web-1", "kind": "semaphore"})
    response = su.get(LIST)
    html = response.content.decode()
    assert "?host=web-1" in html and "?host=web-2" in html and "?kind=semaphore" in html
    assert rows(su.get(LIST, {"host": "web-1"})) == ["one", "three"]
    assert rows(su.get(LIST, {"kind": "semaphore"})) == ["three"]
    assert rows(su.get(LIST, {"kind": "lock", "host": "web-1"})) == ["one"]
    assert rows(su.get(LIST, {"host": "web-1", "q": "thr"})) == ["three"]


def test_ordering_by_name_age_and_lease(su: Client, redis_client: redis.Redis) -> None:
    now = int(time.time() * 1000)
    put_lock(redis_client, "b", since_ms=now - 3000, ttl_ms=50_000)
    put_lock(redis_client, "a", since_ms=now - 1000, ttl_ms=90_000)
    put_lock(redis_client, "c", since_ms=now - 2000, ttl_ms=20_000)
    assert rows(su.get(LIST)) == ["a", "b", "c"]
    assert rows(su.get(LIST, {"o": "-name"})) == ["c", "b", "a"]
    assert rows(su.get(LIST, {"o": "age"})) == ["b", "c", "a"]
    assert rows(su.get(LIST, {"o": "-age"})) == ["a", "c", "b"]
    assert rows(su.get(LIST, {"o": "ttl"})) == ["c", "b", "a"]
    assert rows(su.get(LIST, {"o": "-ttl"})) == ["a", "b", "c"]
    assert rows(su.get(LIST, {"o": "bogus"})) == ["a", "b", "c"]


def test_refresh_links_keep_search_filter_and_page(su: Client, redis_client: redis.Redis) -> None:
    pipe = redis_client.pipeline()
    for i in range(150):
        put_lock(pipe, f"job:{i:03}", meta={"host": "web-1"})  # type: ignore[arg-type]
    pipe.execute()
    response = su.get(LIST, {"q": "job:", "host": "web-1", "p": "2"})
    assert len(rows(response)) == 50
    links = {link["seconds"]: link["url"] for link in response.context["refresh_links"]}
    assert links[5] == "?q=job%3A&host=web-1&p=2&refresh=5"
    page = su.get(LIST + links[5])
    assert 'data-refresh="5"' in page.content.decode()
    assert len(rows(page)) == 50


# --- scale: pages and SCAN windows ---------------------------------------------------------


def test_pages_over_many_locks(su: Client, redis_client: redis.Redis) -> None:
    pipe = redis_client.pipeline(transaction=False)
    for i in range(250):
        put_lock(pipe, f"bulk:{i:04}")  # type: ignore[arg-type]
    pipe.execute()
    first = su.get(LIST)
    assert len(rows(first)) == 100 and rows(first)[0] == "bulk:0000"
    assert "250 locks" in first.content.decode()
    last = su.get(LIST, {"p": "3"})
    assert rows(last) == [f"bulk:{i:04}" for i in range(200, 250)]


def test_scan_windows_reach_every_lock(
    su: Client, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_admin = django_admin.site._registry[HeldLock]
    monkeypatch.setattr(model_admin, "scan_window", 150)
    monkeypatch.setattr(model_admin, "scan_batch", 100)
    pipe = redis_client.pipeline(transaction=False)
    for i in range(1000):
        put_lock(pipe, f"w:{i}")  # type: ignore[arg-type]
    pipe.execute()
    seen: set[str] = set()
    url = LIST
    windows = 0
    for _ in range(100):  # bounded: 1000 locks in windows of >= 150 rows
        windows += 1
        response = su.get(url)
        window = response.context["window"]
        for page in range(1, response.context["page"].paginator.num_pages + 1):
            paged = url + ("&" if "?" in url else "?") + f"p={page}"
            seen.update(rows(su.get(paged) if page > 1 else response))
        if window.complete:
            break
        assert "more than" in response.content.decode()
        url = LIST + response.context["next_window_url"]
    else:
        raise AssertionError("the scan never completed")
    assert seen == {f"w:{i}" for i in range(1000)}
    assert 2 <= windows <= 8


def test_out_of_range_cursor_starts_over(su: Client, held: Any) -> None:
    held("c:1")
    for cursor in (str(2**64), str(10**30), "-5", "x"):
        response = su.get(LIST, {"cursor": cursor})
        assert response.context["error"] is None, cursor
        assert rows(response) == ["c:1"]


def test_scan_budget_bounds_a_search(
    su: Client, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_admin = django_admin.site._registry[HeldLock]
    monkeypatch.setattr(model_admin, "scan_budget", 200)
    monkeypatch.setattr(model_admin, "scan_batch", 100)
    pipe = redis_client.pipeline(transaction=False)
    for i in range(1000):
        put_lock(pipe, f"s:{i}", meta={"host": "web-1"})  # type: ignore[arg-type]
    put_lock(pipe, "needle", meta={"host": "web-2"})  # type: ignore[arg-type]
    pipe.execute()
    response = su.get(LIST, {"host": "web-3"})
    assert rows(response) == [] and not response.context["window"].complete
    assert 200 <= response.context["window"].examined < 400
    assert "among the first" in response.content.decode()
    found = set()
    url = LIST + "?host=web-2"
    for _ in range(20):  # bounded: 1001 keys, >= 200 per request
        response = su.get(url)
        found.update(rows(response))
        if response.context["window"].complete:
            break
        url = LIST + response.context["next_window_url"]
    assert found == {"needle"}


# --- escaping ------------------------------------------------------------------------------


XSS = ['<script>alert("x")</script>', '"><img src=x onerror=alert(1)>']


def test_names_are_escaped_everywhere(su: Client, held: Any) -> None:
    for name in XSS:
        held(name, purpose="<b>bold</b>", extra={"<i>": "<u>"})
    response = su.get(LIST)
    assert sorted(rows(response)) == sorted(XSS)
    pages = [response, *(su.get(row.detail_url) for row in response.context["rows"])]
    pages.append(su.post(RELEASE, {"target": [target_of(response, n) for n in XSS]}))
    pages.append(su.get(LIST, {"q": XSS[0]}))
    for page in pages:
        assert page.status_code == 200
        html = page.content.decode()
        assert "<script>alert" not in html and "<img src=x" not in html and "<b>bold" not in html
        assert "<i>" not in html
    assert "&lt;script&gt;alert" in response.content.decode()


def test_holder_metadata_is_escaped_everywhere(su: Client, redis_client: redis.Redis) -> None:
    evil = "<script>x()</script>"
    put_lock(
        redis_client,
        "meta:1",
        owner=f"own{evil}",
        meta={
            "host": f"h{evil}",
            "pid": 1,
            "thread": f"t{evil}",
            "purpose": f"p{evil}",
            "task_id": f"id{evil}",
            "task_name": f"n{evil}",
            "kind": f"k{evil}",
            "extra": {f"e{evil}": f"v{evil}"},
            "other": f"o{evil}",
        },
    )
    listing = su.get(LIST)
    (row,) = listing.context["rows"]
    pages = [
        listing,
        su.get(row.detail_url),
        su.post(RELEASE, {"target": row.target}),
        su.get(LIST, {"host": f"h{evil}"}),
        su.get(LIST, {"kind": f"k{evil}"}),
    ]
    for page in pages:
        assert page.status_code == 200
        html = page.content.decode()
        assert "<script>x()" not in html
        assert "&lt;script&gt;x()" in html
    su.post(RELEASE, {"target": row.target, "confirm": "yes"})
    index = su.get("/admin/").content.decode()  # "Recent actions" shows the LogEntry
    assert "meta:1" in index and "<script>x()" not in index


# --- actions -------------------------------------------------------------------------------


def test_csrf_is_enforced(held: Any) -> None:
    lk = held("csrf:1")
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("csrf", "c@example.com", "pw"))
    response = client.get(LIST)
    payload = {"target": target_of(response, "csrf:1"), "confirm": "yes"}
    assert client.post(RELEASE, payload).status_code == 403
    assert lk.locked()
    assert client.post(EXTEND, {**payload, "seconds": "300"}).status_code == 403
    assert lk.ttl() <= 60
    payload["csrfmiddlewaretoken"] = response.context["csrf_token"]
    assert client.post(RELEASE, payload).status_code == 302
    assert not lk.locked()


def test_release_with_confirmation_and_audit(su: Client, held: Any) -> None:
    lk = held("stuck:1", owner="worker-7")
    keep = held("other:1")
    response = su.get(LIST, {"q": "stuck"})
    target = target_of(response, "stuck:1")
    confirm = su.post(RELEASE, {"target": target, "list_qs": "q=stuck"})
    assert confirm.status_code == 200 and lk.locked()
    html = confirm.content.decode()
    assert "worker-7" in html and str(lk.fencing_token) in html and 'name="confirm"' in html
    done = su.post(RELEASE, {"target": target, "confirm": "yes", "list_qs": "q=stuck"})
    assert done.status_code == 302 and done["Location"] == LIST + "?q=stuck"
    assert locks.get("stuck:1") is None and keep.locked()
    entry = LogEntry.objects.get()
    assert entry.action_flag == DELETION and entry.object_id == "stuck:1"
    assert entry.user.username == "root"
    assert "worker-7" in entry.change_message and str(lk.fencing_token) in entry.change_message
    assert "Released 1 lock." in [str(m) for m in su.get(LIST).context["messages"]]


def test_bulk_release(su: Client, held: Any) -> None:
    for i in range(3):
        held(f"bulk:{i}")
    response = su.get(LIST)
    targets = [target_of(response, f"bulk:{i}") for i in range(3)]
    assert su.post(RELEASE, {"target": targets, "confirm": "yes"}).status_code == 302
    assert list(locks.active()) == []
    assert LogEntry.objects.filter(action_flag=DELETION).count() == 3


def test_release_leaves_a_lock_that_changed_owner(su: Client, held: Any) -> None:
    first = held("handover:1", owner="old-owner")
    target = target_of(su.get(LIST), "handover:1")
    first.release()
    second = held("handover:1", owner="new-owner")
    confirm = su.post(RELEASE, {"target": target})
    assert "changed owner since you looked" in confirm.content.decode()
    su.post(RELEASE, {"target": target, "confirm": "yes"})
    assert second.owned() and locks.get("handover:1").owner == "new-owner"
    assert not LogEntry.objects.exists()
    messages = [str(m) for m in su.get(LIST).context["messages"]]
    assert any("changed owner" in m and "handover:1" in m for m in messages)


def test_release_leaves_a_lock_reacquired_by_the_same_owner(su: Client, held: Any) -> None:
    # Same owner string (e.g. a Celery task id retried, an explicit owner): the token differs.
    first = held("again:1", owner="same-owner")
    target = target_of(su.get(LIST), "again:1")
    first.release()
    second = held("again:1", owner="same-owner")
    assert second.fencing_token != first.fencing_token
    su.post(RELEASE, {"target": target, "confirm": "yes"})
    assert second.owned()
    su.post(EXTEND, {"target": target, "confirm": "yes", "seconds": "300"})
    assert second.ttl() <= 60
    assert not LogEntry.objects.exists()


def test_unowned_key_taken_over_by_a_holder_is_left_alone(
    su: Client, held: Any, redis_client: redis.Redis
) -> None:
    # Another tool's key records no owner or token, so the operator's target has none;
    # it expires and one of our holders takes the name before the operator confirms.
    redis_client.set("redislock:{shared:1}", "other tool", px=60_000)
    target = target_of(su.get(LIST), "shared:1")
    assert json.loads(target)["o"] is None and json.loads(target)["f"] is None
    redis_client.delete("redislock:{shared:1}")
    taker = held("shared:1", owner="new-holder")
    confirm = su.post(RELEASE, {"target": target})
    assert "changed owner since you looked" in confirm.content.decode()
    su.post(RELEASE, {"target": target, "confirm": "yes"})
    su.post(EXTEND, {"target": target, "confirm": "yes", "seconds": "300"})
    assert taker.owned() and taker.ttl() <= 60
    assert not LogEntry.objects.exists()
    messages = [str(m) for m in su.get(LIST).context["messages"]]
    assert any("Not released because the lock changed owner" in m for m in messages), messages
    assert any("Not extended because the lock changed owner" in m for m in messages), messages


def test_release_of_a_lock_already_gone(su: Client, held: Any) -> None:
    lk = held("gone:1")
    target = target_of(su.get(LIST), "gone:1")
    lk.release()
    su.post(RELEASE, {"target": target, "confirm": "yes"})
    assert [str(m) for m in su.get(LIST).context["messages"]] == ["1 lock was already released."]


def test_extend_with_confirmation_and_audit(su: Client, held: Any) -> None:
    lk = held("long:1")
    target = target_of(su.get(LIST), "long:1")
    confirm = su.post(EXTEND, {"target": target})
    assert confirm.status_code == 200 and 'name="seconds"' in confirm.content.decode()
    for value in ("-5", "0.0001", "nan", "inf", "1e400", "abc", str(8 * 86400)):
        bad = su.post(EXTEND, {"target": target, "confirm": "yes", "seconds": value})
        assert bad.status_code == 200 and "Enter a number of seconds" in bad.content.decode()
    assert lk.ttl() <= 60
    su.post(EXTEND, {"target": target, "confirm": "yes", "seconds": "300"})
    assert 300 < lk.ttl() <= 360
    entry = LogEntry.objects.get()
    assert entry.action_flag == CHANGE and "owner-1" in entry.change_message
    assert entry.get_admin_url() == LIST + "long_3A1/change/"  # the admin's quote()


def test_extend_leaves_a_lock_that_changed_owner(su: Client, held: Any) -> None:
    first = held("ext:1", owner="a")
    target = target_of(su.get(LIST), "ext:1")
    first.release()
    second = held("ext:1", owner="b")
    su.post(EXTEND, {"target": target, "confirm": "yes", "seconds": "300"})
    assert second.ttl() <= 60
    assert not LogEntry.objects.exists()


def test_malformed_targets_are_ignored(su: Client, held: Any) -> None:
    lk = held("safe:1")
    bad_values = (
        "not json",
        "{}",
        '{"n": "", "o": null, "f": null}',
        '{"n": "safe:1", "o": 5, "f": null}',
        '{"n": "safe:1", "o": null, "f": true}',
    )
    for bad in bad_values:
        response = su.post(RELEASE, {"target": bad, "confirm": "yes"})
        assert response.status_code == 302
    assert lk.locked()


# --- custom admin site, key prefix and cache backend ---------------------------------------


@override_settings(ROOT_URLCONF="tests.test_admin", REDISLOCK_KEY_PREFIX="opslocks")
def test_custom_admin_site_and_key_prefix(su: Client, held: Any, redis_client: redis.Redis) -> None:
    put_lock(redis_client, "default-prefix-lock")  # under "redislock": must not show
    lk = held("ops:1")
    assert redis_client.exists("opslocks:{ops:1}")
    response = su.get("/ops/django_redislock/heldlock/")
    assert response.status_code == 200
    assert rows(response) == ["ops:1"]
    html = response.content.decode()
    assert 'href="/ops/django_redislock/heldlock/ops_3A1/change/"' in html
    assert 'action="/ops/django_redislock/heldlock/release/"' in html
    assert su.get(response.context["rows"][0].detail_url).status_code == 200
    done = su.post(
        "/ops/django_redislock/heldlock/release/",
        {"target": target_of(response, "ops:1"), "confirm": "yes"},
    )
    assert done["Location"] == "/ops/django_redislock/heldlock/"
    assert not lk.locked()


@override_settings(REDISLOCK_CACHE="djredis")
def test_list_on_django_redis(su: Client, held: Any) -> None:
    held("djr:1")
    assert rows(su.get(LIST)) == ["djr:1"]


# --- the operator extend script ------------------------------------------------------------


def test_force_extend(manager: LockManager, name: str) -> None:
    lk = manager.lock(name, ttl=10, auto_renew=False, owner="o")
    assert manager.force_extend(name, 5).status == "gone"
    lk.acquire()
    assert manager.force_extend(name, 5, owner="other").status == "changed"
    assert manager.force_extend(name, 5, fencing_token=lk.fencing_token + 1).status == "changed"
    result = manager.force_extend(name, 20, owner="o", fencing_token=lk.fencing_token)
    assert result.extended and 25 < result.ttl <= 30 and 25 < lk.ttl() <= 30
    lk.release()
    forever = manager.lock(name, ttl=None, no_expiry=True, owner="o")
    forever.acquire()
    assert manager.force_extend(name, 5).status == "no-expiry"
    forever.release()
    with pytest.raises(ValueError):
        manager.force_extend(name, 0)


# --- Redis unreachable -----------------------------------------------------------------------


def test_redis_down_is_reported_not_a_crash(su: Client) -> None:
    # A real fault: nothing listens on this loopback port.
    from tests.redis_server import free_port

    with override_settings(REDISLOCK_URL=f"redis://127.0.0.1:{free_port()}/0"):
        listing = su.get(LIST)
        assert listing.status_code == 200
        assert "Cannot read the locks from Redis" in listing.content.decode()
        detail = su.get(LIST + "x/change/")
        assert detail.status_code == 503 and "Cannot reach the locks" in detail.content.decode()
        target = json.dumps({"n": "x", "o": "o", "f": 1})
        assert su.post(RELEASE, {"target": target}).status_code == 503
        assert su.post(RELEASE, {"target": target, "confirm": "yes"}).status_code == 503
        extend = {"target": target, "confirm": "yes", "seconds": "5"}
        assert su.post(EXTEND, extend).status_code == 503


# --- engine finding (the admin lists with its own SCAN and is not affected) ---------------------


def test_active_lists_foreign_non_hash_keys(redis_client: redis.Redis) -> None:
    redis_client.set("redislock:{strkey}", "another tool", px=60_000)
    info = locks.get("strkey")
    assert info is not None and info.kind == "foreign"
    assert [i.name for i in locks.active()] == ["strkey"]
