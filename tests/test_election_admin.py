"""An election in the admin's lock viewer: the leader (kind, purpose, term) and the
standbys waiting in order, as operators see them."""

from __future__ import annotations

import os
import threading
import time

import pytest
from django.contrib.auth.models import User
from django.test import Client

from django_redislock import LockNotAcquired, locks

LIST = "/admin/django_redislock/heldlock/"

pytestmark = pytest.mark.django_db


def test_the_admin_shows_the_leader_and_its_standbys(client: Client, name: str) -> None:
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    leader = locks.election(name, ttl=10, purpose="celery beat")
    standbys = [locks.election(name, ttl=10, purpose=f"standby {i}") for i in (1, 2)]
    term = leader.campaign()
    threads = []
    for number, standby in enumerate(standbys, 1):
        thread = threading.Thread(target=_campaign, args=(standby,), daemon=True)
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 5
        while len((leader.leader() or _fail()).standbys) < number:  # bounded
            assert time.monotonic() < deadline, "a standby never queued"
            time.sleep(0.02)
    try:
        (row,) = client.get(LIST, {"q": name}).context["rows"]
        html = client.get(row.detail_url).content.decode()
        assert "election" in html and "celery beat" in html and str(term) in html
        assert html.index("standby 1") < html.index("standby 2"), "standbys in queue order"
        assert str(os.getpid()) in html
    finally:
        leader.resign()  # each standby leads in turn, and resigns
        for thread, standby in zip(threads, standbys, strict=True):
            thread.join(15)
            assert standby.resign()


def _campaign(election: object) -> None:
    try:
        election.campaign(timeout=10)  # type: ignore[attr-defined]
    except LockNotAcquired:
        pass


def _fail() -> object:
    raise AssertionError("nobody leads")
