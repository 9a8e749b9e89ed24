"""What operators see of a guarded key's shaping: ``locks.shaping(name)`` (the rate
window read from Redis, the cooldown, pending and debounced calls), the guard's options
in the held lock's metadata, the admin's detail page and ``manage.py redislock show``,
on the real Redis."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from io import StringIO

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from django_redislock import LockManager, locks, single_instance
from django_redislock.describe.shaping import shaping_lines
from django_redislock.engine.shaping_state import ShapingState
from django_redislock.exceptions import ShapingUnsupported
from tests.redis_server import RedisServer

pytestmark = pytest.mark.django_db

LIST = "/admin/django_redislock/heldlock/"


def detail(name: str) -> str:
    return f"{LIST}{quote(name)}/change/"


@pytest.fixture
def su(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


class Holding:
    """A guarded body kept running in a thread until :meth:`finish` (bounded waits)."""

    def __init__(self, func: object) -> None:
        self.entered = threading.Event()
        self.leave = threading.Event()
        self.thread = threading.Thread(target=func, args=(self,))  # type: ignore[arg-type]

    def body(self) -> None:
        self.entered.set()
        assert self.leave.wait(10), "the test never let the body finish"

    def __enter__(self) -> Holding:
        self.thread.start()
        assert self.entered.wait(10), "the guarded body never started"
        return self

    def __exit__(self, *exc: object) -> None:
        self.leave.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


def test_the_rate_window_is_read_from_redis_without_the_guard(name: str) -> None:
    @single_instance(name, rate="3/10s")
    def work() -> None:
        pass

    assert locks.shaping(name) == ShapingState(0, 0.0, 0.0)  # nothing yet
    work()
    work()
    state = locks.shaping(name)
    assert state.count == 2
    # From the log's expiry: the time since the newest start plus the log's PTTL, each in
    # whole milliseconds, so the sum may read one millisecond over (CI met 10.001).
    assert state.window is not None and 9.9 <= state.window <= 10.001 + 1e-9
    assert 0 < state.window_frees_in <= 10.0
    assert state.active
    (line,) = shaping_lines(state)
    # The window is read to the millisecond (9.999 s shows as "9.9 s", tenths below 10 s).
    assert re.fullmatch(
        r"Rate: 2 starts in the last (10|9\.9) s; the oldest leaves the window in \d+(\.\d)? s\.",
        line,
    ), line


def test_a_cooldown_after_the_run_is_seen_by_name(name: str) -> None:
    @single_instance(name, cooldown=30)
    def work() -> None:
        pass

    work()
    state = locks.shaping(name)
    assert 29 < state.cooldown_left <= 30
    assert state.count == 0 and state.window is None
    (line,) = shaping_lines(state)
    assert re.fullmatch(
        r"Cooldown: no start for another (29|30) s \(the last run ended less than a "
        r"cooldown ago\)\.",
        line,
    ), line


def test_the_held_lock_records_the_guards_options(name: str) -> None:
    seen: dict[str, object] = {}

    @single_instance(name, rate=(5, 60), cooldown=2)
    def work(holding: Holding) -> None:
        info = locks.get(name)
        assert info is not None
        seen.update(info.meta["shaping"])
        holding.body()

    with Holding(work):
        pass
    assert seen == {"rate": [5, 60.0], "cooldown": 2.0}


def test_a_plain_guard_records_nothing_of_shaping(name: str) -> None:
    seen = {}

    @single_instance(name)
    def work() -> None:
        info = locks.get(name)
        assert info is not None
        seen.update(info.meta)

    work()
    assert seen and "shaping" not in seen
    assert not locks.shaping(name).active


def test_the_admin_detail_page_shows_the_shaping_held_and_not_held(su: Client, name: str) -> None:
    @single_instance(name, rate=(3, 60), cooldown=20)
    def work(holding: Holding) -> None:
        holding.body()

    with Holding(work):
        page = su.get(detail(name))
        assert page.status_code == 200
        html = page.content.decode()
        assert 'id="redislock-shaping"' in html
        assert "Rate: 1 of 3 starts in the last 1 min 0 s" in html  # the limit from the meta
    gone = su.get(detail(name))
    assert gone.status_code == 404
    html = gone.content.decode()
    assert "is not held" in html and 'id="redislock-shaping"' in html
    assert "Rate: 1 start in the last 1 min" in html  # the window read from Redis
    assert "Cooldown: no start for another" in html


def test_the_admin_detail_page_of_an_unshaped_lock_has_no_shaping(su: Client, name: str) -> None:
    holder = locks.lock(name, ttl=30, owner="plain")
    assert holder.acquire()
    try:
        html = su.get(detail(name)).content.decode()
        assert "is not held" not in html and 'id="redislock-shaping"' not in html
    finally:
        holder.release()


def test_manage_py_redislock_show_tells_the_shaping(name: str) -> None:
    @single_instance(name, rate=(4, 30))
    def work(holding: Holding) -> None:
        holding.body()

    with Holding(work):
        out = StringIO()
        call_command("redislock", "show", name, stdout=out)
        assert "shaping: Rate: 1 of 4 starts in the last 30 s" in out.getvalue()
        out = StringIO()
        call_command("redislock", "show", name, "--json", stdout=out)
        shaping = json.loads(out.getvalue())["shaping"]
        assert shaping["starts_in_window"] == 1 and shaping["limit"] == 4
        assert shaping["window"] == 30.0 and shaping["options"] == {"rate": [4, 30.0]}


def test_manage_py_redislock_show_of_a_key_in_cooldown(name: str) -> None:
    @single_instance(name, cooldown=15)
    def work() -> None:
        pass

    work()
    with pytest.raises(CommandError, match=r"is not held\. Cooldown: no start for another 1[45] s"):
        call_command("redislock", "show", name)


def test_redlock_has_no_shaping_to_read(masters: list[RedisServer], name: str) -> None:
    manager = LockManager(redlock_caches=[s.url for s in masters])
    with pytest.raises(ShapingUnsupported, match="Redlock"):
        manager.shaping(name)


def test_ashaping_reads_the_same(name: str) -> None:
    @single_instance(name, rate="2/5s", cooldown=10)
    async def work() -> None:
        pass

    async def main() -> tuple[ShapingState, ShapingState]:
        await work()
        return await locks.ashaping(name), locks.shaping(name)

    state, same = asyncio.run(main())
    assert state.count == same.count == 1
    # The window is read as the time since the newest start plus the log's PTTL, each
    # in whole milliseconds: two reads a moment apart may differ by one.
    assert state.window is not None and same.window is not None
    assert abs(state.window - same.window) <= 0.001 + 1e-9
    assert 9 < state.cooldown_left <= 10
