"""The admin lock viewer on semaphores and read-write locks, through Django's test
client against the real test redis-server.

Covers: what the list shows per primitive (permits taken, readers, the writer, the
other holders) and its filter by primitive; the detail page's table of holders;
releasing and extending one holder with its own owner and token (the other
holders keep theirs; a holder that changed since the page was shown is left alone
and named); a list row's release of every holder seen (a holder that arrived since
is left alone); a freed permit going to the waiter; permissions, CSRF, malformed
targets and escaping on the new forms.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import User
from django.test import Client

from django_redislock import Lock, locks
from django_redislock.engine.info import LockInfo
from tests.test_admin import EXTEND, LIST, RELEASE, rows, target_of, user_with

pytestmark = pytest.mark.django_db


@pytest.fixture
def su(client: Client) -> Client:
    """A client logged in as a superuser."""
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.fixture
def take() -> Iterator[Any]:
    """Factory: acquire a lock object (explicit owner, no watchdog); released after the test."""
    taken: list[Lock] = []

    def acquire(lk: Lock) -> Lock:
        assert lk.acquire(blocking=False)
        taken.append(lk)
        return lk

    yield acquire
    for lk in reversed(taken):
        if lk.owned():
            lk.release()


def permit(take: Any, name: str, owner: str, limit: int = 3, **options: Any) -> Lock:
    """One permit of the semaphore *name*, held by *owner*."""
    return take(locks.semaphore(name, limit, owner=owner, ttl=60, auto_renew=False, **options))


def reading(take: Any, name: str, owner: str, **options: Any) -> Lock:
    """A read of the read-write lock *name*, held by *owner*."""
    rw = locks.rw_lock(name, owner=owner, ttl=60, auto_renew=False, **options)
    return take(rw.read())


def writing(take: Any, name: str, owner: str) -> Lock:
    """The write of the read-write lock *name*, held by *owner*."""
    return take(locks.rw_lock(name, owner=owner, ttl=60, auto_renew=False).write())


def owners(name: str) -> list[str | None]:
    """The owners holding *name* now (writer first, then by token)."""
    info = locks.get(name)
    return [h.owner for h in info.holders] if info else []


def lease_of(name: str, owner: str) -> float:
    """The remaining lease of *owner*'s hold of *name*, by Redis's clock (a semaphore's or
    read-write lock's object answers ``ttl()`` for the whole lock: its longest lease)."""
    info = locks.get(name)
    assert info is not None
    (ttl,) = [h.ttl for h in info.holders if h.owner == owner]
    assert ttl is not None
    return ttl


def detail(su: Client, name: str) -> Any:
    response = su.get(f"{LIST}{name.replace(':', '_3A')}/change/")
    assert response.status_code == 200
    return response


def holder_target(response: Any, owner: str, mode: str | None = None) -> str:
    """The action payload of the holder *owner* on a detail page."""
    for row in response.context["holders"]:
        if row.holder.owner == owner and (mode is None or row.holder.mode == mode):
            return str(row.target)
    raise AssertionError(f"no holder {owner!r} on the page")


def messages_of(client: Client) -> list[str]:
    return [str(m) for m in client.get(LIST).context["messages"]]


# --- the list -----------------------------------------------------------------------------


def test_list_shows_the_primitive_and_how_it_is_held(su: Client, take: Any) -> None:
    take(locks.lock("plain", owner="m", ttl=60, auto_renew=False))
    permit(take, "sem", "a", purpose="export")
    permit(take, "sem", "b")
    for owner in ("r1", "r2", "r3"):
        reading(take, "reads", owner)
    writing(take, "writes", "w1")
    response = su.get(LIST)
    assert rows(response) == ["plain", "reads", "sem", "writes"]
    by_name = {row.info.name: row for row in response.context["rows"]}
    assert (by_name["plain"].primitive, by_name["plain"].held_as) == ("mutex", "")
    assert (by_name["sem"].primitive, by_name["sem"].held_as) == ("semaphore", "2 of 3 permits")
    assert by_name["reads"].held_as == "3 readers" and by_name["writes"].held_as == "write"
    assert by_name["sem"].more_holders == 1 and by_name["reads"].more_holders == 2
    assert by_name["plain"].more_holders == 0 and by_name["writes"].more_holders == 0
    html = response.content.decode()
    expected = ("2 of 3 permits", "3 readers", "read-write lock", "+ 1 more holder",
                "+ 2 more holders", "By primitive", "?primitive=semaphore",
                "?primitive=rwlock")  # fmt: skip
    for text in expected:
        assert text in html, text
    assert rows(su.get(LIST, {"primitive": "semaphore"})) == ["sem"]
    assert rows(su.get(LIST, {"primitive": "rwlock"})) == ["reads", "writes"]
    assert rows(su.get(LIST, {"primitive": "mutex"})) == ["plain"]
    assert rows(su.get(LIST, {"primitive": "rwlock", "q": "wri"})) == ["writes"]
    filtered = su.get(LIST, {"primitive": "semaphore", "q": "nothing"}).content.decode()
    assert "No locks are held that match" in filtered


def test_a_write_with_readers_after_a_downgrade(su: Client, take: Any) -> None:
    rw = locks.rw_lock("down", owner="w", ttl=60, auto_renew=False)
    take(rw.write())
    take(rw.read())  # the writer downgrades: it holds both until it releases the write
    (row,) = su.get(LIST).context["rows"]
    assert row.held_as == "write + 1 reader"
    holders = detail(su, "down").context["holders"]
    assert [(h.holder.mode, h.holder.owner) for h in holders] == [("write", "w"), ("read", "w")]


def test_host_filter_matches_any_holder(su: Client, take: Any, redis_client: Any) -> None:
    permit(take, "sem", "a")
    permit(take, "sem", "b")
    info = locks.get("sem")
    assert info is not None and info.holders[1].host
    assert rows(su.get(LIST, {"host": info.holders[1].host})) == ["sem"]
    assert rows(su.get(LIST, {"host": "elsewhere"})) == []


# --- the detail page ----------------------------------------------------------------------


def test_detail_page_lists_every_holder(su: Client, take: Any) -> None:
    a = permit(take, "sem:1", "owner-a", purpose="nightly export", extra={"tenant": 7})
    b = permit(take, "sem:1", "owner-b")
    response = detail(su, "sem:1")
    holders = response.context["holders"]
    assert [h.holder.owner for h in holders] == ["owner-a", "owner-b"]
    assert [h.holder.fencing_token for h in holders] == [a.fencing_token, b.fencing_token]
    assert all(h.holder.mode == "permit" and 0 < h.lease <= 60 for h in holders)
    html = response.content.decode()
    for text in ("semaphore: 2 of 3 permits", "3 holders at most", "Holders (2)", "owner-a",
                 "owner-b", str(a.fencing_token), str(b.fencing_token), "nightly export",
                 "tenant=7", f"pid {holders[0].holder.pid}", "of 60 s", " ago",
                 "Release every holder", "Extend every lease"):  # fmt: skip
        assert text in html, text
    assert html.count("redislock-release-holder") == 2
    assert html.count("redislock-extend-holder") == 2
    assert html.count('name="return_to" value="detail"') == 3


def test_detail_page_is_read_only_without_action_permissions(client: Client, take: Any) -> None:
    a = permit(take, "sem:ro", "a")
    client.force_login(user_with("view_heldlock"))
    response = detail(client, "sem:ro")
    html = response.content.decode()
    assert "Holders (1)" in html and "redislock-release-holder" not in html
    assert "redislock-extend-holder" not in html and 'name="target"' not in html
    payload = {"target": holder_target(response, "a"), "confirm": "yes", "seconds": "30"}
    assert client.post(RELEASE, payload).status_code == 403
    assert client.post(EXTEND, payload).status_code == 403
    assert a.owned() and a.ttl() <= 60


def test_detail_page_escapes_holder_fields(su: Client, take: Any) -> None:
    evil = "<script>x()</script>"
    permit(take, "sem:x", f"own{evil}", purpose=f"p{evil}", extra={f"k{evil}": evil})
    response = detail(su, "sem:x")
    pages = [response, su.post(RELEASE, {"target": holder_target(response, f"own{evil}")})]
    for page in pages:
        assert page.status_code == 200
        html = page.content.decode()
        assert "<script>x()" not in html and "&lt;script&gt;x()" in html


# --- per-holder actions -------------------------------------------------------------------


def test_release_one_permit_from_the_detail_page(su: Client, take: Any) -> None:
    a = permit(take, "sem:2", "a")
    b = permit(take, "sem:2", "b")
    target = holder_target(detail(su, "sem:2"), "a")
    assert json.loads(target) == {"n": "sem:2", "o": "a", "f": a.fencing_token, "m": "permit"}
    confirm = su.post(RELEASE, {"target": target, "return_to": "detail"})
    assert confirm.status_code == 200 and a.owned()
    html = confirm.content.decode()
    assert "Release 1 holder?" in html and "permit" in html and str(a.fencing_token) in html
    assert 'name="return_to" value="detail"' in html and "sem_3A2/change/" in html
    done = su.post(RELEASE, {"target": target, "confirm": "yes", "return_to": "detail"})
    assert done.status_code == 302 and done["Location"] == LIST + "sem_3A2/change/"
    assert owners("sem:2") == ["b"] and b.owned() and not a.owned()
    entry = LogEntry.objects.get()
    assert entry.action_flag == DELETION and entry.object_id == "sem:2"
    assert "the permit of semaphore 'sem:2' held by owner a" in entry.change_message
    assert str(a.fencing_token) in entry.change_message
    page = su.get(done["Location"])
    assert [str(m) for m in page.context["messages"]] == [
        f"Released 1 holder: sem:2 (permit of owner a, fencing token {a.fencing_token})"
    ]
    assert [h.holder.owner for h in page.context["holders"]] == ["b"]


def test_release_one_reader_and_the_writer(su: Client, take: Any) -> None:
    readers = [reading(take, "rw:1", f"r{i}") for i in range(3)]
    response = detail(su, "rw:1")
    su.post(RELEASE, {"target": holder_target(response, "r1"), "confirm": "yes"})
    assert owners("rw:1") == ["r0", "r2"] and readers[0].owned() and readers[2].owned()
    assert not readers[1].owned()
    for r in (readers[0], readers[2]):
        r.release()
    w = writing(take, "rw:1", "w")
    down = take(locks.rw_lock("rw:1", owner="w", ttl=60, auto_renew=False).read())
    response = detail(su, "rw:1")
    su.post(RELEASE, {"target": holder_target(response, "w", "write"), "confirm": "yes"})
    info = locks.get("rw:1")
    assert info is not None and info.writer is None and [h.owner for h in info.readers] == ["w"]
    assert down.owned() and not w.owned()


def test_a_holder_that_changed_since_is_left_alone(su: Client, take: Any) -> None:
    a = permit(take, "sem:3", "a")
    permit(take, "sem:3", "b")
    target = holder_target(detail(su, "sem:3"), "a")
    token = a.fencing_token
    a.release()
    again = permit(take, "sem:3", "a")  # same owner, a new grant with a new token
    assert again.fencing_token != token
    confirm = su.post(RELEASE, {"target": target, "return_to": "detail"})
    assert "no longer holds it" in confirm.content.decode()
    done = su.post(RELEASE, {"target": target, "confirm": "yes", "return_to": "detail"})
    su.post(EXTEND, {"target": target, "confirm": "yes", "seconds": "300"})
    assert again.owned() and again.ttl() <= 60 and sorted(owners("sem:3")) == ["a", "b"]
    assert not LogEntry.objects.exists()
    messages = [str(m) for m in su.get(done["Location"]).context["messages"]]
    assert len(messages) == 2, messages
    assert all("because the holder no longer holds the lock" in m for m in messages), messages
    assert all(f"sem:3 (permit of owner a, fencing token {token})" in m for m in messages)


def test_extend_one_holder(su: Client, take: Any) -> None:
    a = permit(take, "sem:4", "a")
    b = permit(take, "sem:4", "b")
    target = holder_target(detail(su, "sem:4"), "b")
    confirm = su.post(EXTEND, {"target": target, "return_to": "detail"})
    assert confirm.status_code == 200 and 'name="seconds"' in confirm.content.decode()
    bad = su.post(EXTEND, {"target": target, "confirm": "yes", "seconds": "-1"})
    assert "Enter a number of seconds" in bad.content.decode()
    payload = {"target": target, "confirm": "yes", "seconds": "300", "return_to": "detail"}
    done = su.post(EXTEND, payload)
    assert done["Location"] == LIST + "sem_3A4/change/"
    assert 300 < lease_of("sem:4", "b") <= 360 and lease_of("sem:4", "a") <= 60 and a.owned()
    entry = LogEntry.objects.get()
    assert entry.action_flag == CHANGE and "the permit of semaphore 'sem:4'" in entry.change_message
    messages = [str(m) for m in su.get(done["Location"]).context["messages"]]
    assert messages == [
        f"Extended 1 holder by 300 s: sem:4 (permit of owner b, fencing token {b.fencing_token})"
    ]


def test_a_freed_permit_goes_to_the_waiter(su: Client, take: Any) -> None:
    permit(take, "sem:5", "a", limit=1)
    waiter = locks.semaphore("sem:5", 1, owner="waiter", ttl=60, auto_renew=False)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=10)))
    thread.start()
    try:
        target = holder_target(detail(su, "sem:5"), "a")
        done = su.post(RELEASE, {"target": target, "confirm": "yes", "return_to": "detail"})
        thread.join(10)
        assert got == [True] and owners("sem:5") == ["waiter"]
        assert done["Location"] == LIST + "sem_3A5/change/"  # still held (by the waiter)
    finally:
        thread.join(10)
        if waiter.owned():
            waiter.release()


def test_releasing_the_last_holder_returns_to_the_list(su: Client, take: Any) -> None:
    permit(take, "sem:6", "a")
    target = holder_target(detail(su, "sem:6"), "a")
    done = su.post(RELEASE, {"target": target, "confirm": "yes", "return_to": "detail"})
    assert done["Location"] == LIST and locks.get("sem:6") is None


# --- the whole lock from a list row ---------------------------------------------------------


def test_list_row_releases_every_holder_seen(su: Client, take: Any) -> None:
    a = permit(take, "sem:7", "a")
    b = permit(take, "sem:7", "b")
    target = target_of(su.get(LIST), "sem:7")
    seen = json.loads(target)["h"]
    assert seen == [["a", a.fencing_token, "permit"], ["b", b.fencing_token, "permit"]]
    late = permit(take, "sem:7", "late")  # arrives after the page was shown
    confirm = su.post(RELEASE, {"target": target, "list_qs": "q=sem"})
    html = confirm.content.decode()
    assert "Release 1 lock?" in html and str(a.fencing_token) in html
    assert str(b.fencing_token) in html and "1 more holder arrived since you looked" in html
    assert "Each holder of a semaphore or read-write lock is released on its own" in html
    done = su.post(RELEASE, {"target": target, "confirm": "yes", "list_qs": "q=sem"})
    assert done["Location"] == LIST + "?q=sem"
    assert owners("sem:7") == ["late"] and late.owned() and not a.owned() and not b.owned()
    assert LogEntry.objects.filter(action_flag=DELETION).count() == 2
    (message,) = messages_of(su)
    assert message.startswith("Released 2 holders: sem:7 (permit of owner a")


def test_list_row_extends_every_holder_seen(su: Client, take: Any) -> None:
    readers = [reading(take, "rw:2", f"r{i}") for i in range(2)]
    target = target_of(su.get(LIST), "rw:2")
    su.post(EXTEND, {"target": target, "confirm": "yes", "seconds": "120"})
    assert all(r.owned() and 120 < lease_of("rw:2", f"r{i}") <= 180 for i, r in enumerate(readers))


def test_a_lock_gone_since_is_reported_once(su: Client, take: Any) -> None:
    a = permit(take, "sem:8", "a")
    b = permit(take, "sem:8", "b")
    target = target_of(su.get(LIST), "sem:8")
    a.release()
    b.release()
    su.post(RELEASE, {"target": target, "confirm": "yes"})
    assert messages_of(su) == ["1 lock was already released."]


# --- safety of the new payloads -------------------------------------------------------------


def test_csrf_is_enforced_on_holder_actions(take: Any) -> None:
    a = permit(take, "sem:9", "a")
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("csrf", "c@example.com", "pw"))
    response = detail(client, "sem:9")
    payload = {"target": holder_target(response, "a"), "confirm": "yes"}
    assert client.post(RELEASE, payload).status_code == 403
    assert client.post(EXTEND, {**payload, "seconds": "300"}).status_code == 403
    assert a.owned() and a.ttl() <= 60
    payload["csrfmiddlewaretoken"] = response.context["csrf_token"]
    assert client.post(RELEASE, payload).status_code == 302 and not a.owned()


def test_malformed_holder_targets_are_ignored(su: Client, take: Any) -> None:
    a = permit(take, "sem:10", "a")
    b = permit(take, "sem:10", "b")
    bad_values = (
        # A holder with nothing to compare would act on every holder.
        '{"n": "sem:10", "o": null, "f": null, "m": "permit"}',
        '{"n": "sem:10", "o": "", "f": null, "m": "permit"}',
        '{"n": "sem:10", "o": "a", "f": 1, "m": "exclusive"}',
        '{"n": "sem:10", "o": null, "f": null, "h": [["", null, "permit"]]}',
        '{"n": "sem:10", "o": null, "f": null, "h": [["a", null]]}',
        '{"n": "sem:10", "o": null, "f": null, "h": [["a", true, "permit"]]}',
        '{"n": "sem:10", "o": null, "f": null, "h": "a"}',
        '{"n": "sem:10", "o": "a", "f": null, "h": [["b", null, "permit"]]}',
        '["sem:10"]',
    )
    for bad in bad_values:
        assert su.post(RELEASE, {"target": bad, "confirm": "yes"}).status_code == 302, bad
        assert (
            su.post(EXTEND, {"target": bad, "confirm": "yes", "seconds": "99"}).status_code == 302
        )
    assert a.owned() and b.owned() and a.ttl() <= 60 and b.ttl() <= 60
    assert not LogEntry.objects.exists()


def test_return_to_cannot_leave_the_admin(su: Client, take: Any) -> None:
    permit(take, "sem:11", "a")
    permit(take, "sem:11", "b")
    target = holder_target(detail(su, "sem:11"), "a")
    done = su.post(
        RELEASE,
        {
            "target": target,
            "confirm": "yes",
            "return_to": "https://evil.example/",
            "list_qs": "//x",
        },
    )
    assert done["Location"].startswith(LIST)


def test_mutex_targets_are_unchanged(su: Client, take: Any) -> None:
    lk = take(locks.lock("m:1", owner="o", ttl=60, auto_renew=False))
    target = json.loads(target_of(su.get(LIST), "m:1"))
    assert target == {"n": "m:1", "o": "o", "f": lk.fencing_token}
    info = locks.get("m:1")
    assert isinstance(info, LockInfo) and detail(su, "m:1").context["holders"] == []


def test_the_last_reader_released_admits_the_waiting_writer(su: Client, take: Any) -> None:
    reading(take, "rw:3", "r")
    writer = locks.rw_lock("rw:3", owner="w", ttl=60, auto_renew=False).write()
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(writer.acquire(timeout=10)))
    thread.start()
    try:
        target = holder_target(detail(su, "rw:3"), "r")
        su.post(RELEASE, {"target": target, "confirm": "yes", "return_to": "detail"})
        thread.join(10)
        assert got == [True]
        info = locks.get("rw:3")
        assert info is not None and info.writer is not None and info.writer.owner == "w"
    finally:
        thread.join(10)
        if writer.owned():
            writer.release()
