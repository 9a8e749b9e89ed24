"""The admin lock viewer in a real Chromium (Playwright) against a live server.

A separate Python process holds a lock through the package; the test logs in,
sees that lock with the other process's pid, watches the lease count down,
sees the page auto-refresh without losing its search, searches for the lock,
releases it through the confirmation page and sees it gone.
Another process holds two permits of a semaphore and two reads of a read-write
lock: the test releases one holder of each from their detail pages and checks the
other holder still holds.
It also checks the dark theme applies, and saves a screenshot of the page (the
docs' screenshots come from the example project: ``docs/images/make_screenshots.py``).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from django_redislock import locks

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parent.parent
LOCK_NAME = "billing:account-17"
LIST_PATH = "/admin/django_redislock/heldlock/"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is not installed"),
]

HOLDER = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
import django
django.setup()
from django_redislock import locks
lk = locks.lock(sys.argv[1], ttl=30, purpose="nightly billing run", extra={"batch": 17})
assert lk.acquire(blocking=False)
print(lk.fencing_token, flush=True)
sys.stdin.readline()  # hold until the test closes our stdin
"""


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The first stdout line of *proc*, waiting at most *timeout* seconds."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise AssertionError(f"the lock holder printed nothing within {timeout} s")
    return proc.stdout.readline().strip()


@contextmanager
def _holding(script: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Run *script* in another Python process until the block ends (its stdin is closed):
    (process, the first line it printed)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc, _read_line(proc, 30)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextmanager
def _admin_page(live_server: Any, height: int) -> Iterator[Page]:
    """A Chromium page logged in to the admin as "admin", on the lock list."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": height})
            page.set_default_timeout(15_000)
            page.goto(f"{live_server.url}/admin/login/?next={LIST_PATH}")
            page.fill("#id_username", "admin")
            page.fill("#id_password", "password")
            page.click("input[type=submit]")
            page.wait_for_url(f"{live_server.url}{LIST_PATH}")
            yield page
        finally:
            browser.close()


@pytest.fixture
def holder() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """Another Python process holding LOCK_NAME (renewed by its watchdog): (process, token)."""
    with _holding(HOLDER, LOCK_NAME) as (proc, line):
        yield proc, int(line)


@pytest.fixture
def neighbours(redis_client: redis.Redis) -> Iterator[None]:
    """A few more locks so the page (and its screenshot) looks like a real incident."""
    held = [
        locks.lock(
            "report:2024-06",
            ttl=600,
            auto_renew=False,
            owner="web-req-1",
            purpose="monthly sales report",
        ),
        locks.lock(
            "invoice:1042",
            ttl=120,
            auto_renew=False,
            owner="web-req-2",
            purpose="generate invoice",
            extra={"customer": 88},
        ),
        # A semaphore with two of its three permits taken (the list shows "2 of 3 permits").
        *(
            locks.semaphore(
                "export:tenant-3",
                3,
                ttl=300,
                auto_renew=False,
                owner=f"web-req-{n}",
                purpose="tenant export",
            )  # fmt: skip
            for n in (3, 4)
        ),
    ]
    for lk in held:
        assert lk.acquire(blocking=False)
    # A lock taken by a Celery task on another machine, written as that worker would.
    redis_client.hset(
        "redislock:{sync:account-9}",
        mapping={
            "owner": "celery-task-5b1d",
            "count": 1,
            "fence": 1718000000000001,
            "since": int(time.time() * 1000) - 95_000,
            "ttl": 300_000,
            "meta": json.dumps(
                {
                    "host": "worker-2",
                    "pid": 4242,
                    "thread": "MainThread",
                    "task_id": "5b1d0c1e-77aa-4c1b-9f0e-2a1b3c4d5e6f",
                    "task_name": "accounts.tasks.sync_account",
                    "purpose": "accounts.tasks.sync_account",
                    "extra": {"account_id": 9},
                }
            ),
        },
    )
    redis_client.pexpire("redislock:{sync:account-9}", 300_000)
    yield
    for lk in held:
        if lk.owned():
            lk.release()


def test_release_a_lock_held_by_another_process(
    transactional_db: None,
    admin_user: Any,
    live_server: Any,
    holder: tuple[subprocess.Popen[str], int],
    neighbours: None,
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    proc, token = holder
    list_url = f"{live_server.url}{LIST_PATH}"
    shot = tmp_path / "admin-locks.png"
    row = f'tr[data-lock-name="{LOCK_NAME}"]'

    with _admin_page(live_server, 560) as page:
        # The other process's lock, with its pid and fencing token.
        expect(page.locator(row)).to_be_visible()
        expect(page.locator(f"{row} .field-owner")).to_contain_text(f"pid {proc.pid}")
        expect(page.locator(f"{row} .field-fence")).to_have_text(str(token))
        expect(page.locator(f"{row} .field-purpose")).to_contain_text("nightly billing run")
        expect(page.locator("#redislock-count")).to_contain_text("5 locks")

        # The lease counts down in the page (JS), without a reload.
        lease = page.locator('tr[data-lock-name="report:2024-06"] .redislock-lease')
        first = lease.inner_text()
        page.wait_for_function(
            "([sel, before]) => document.querySelector(sel).textContent !== before",
            arg=['tr[data-lock-name="report:2024-06"] .redislock-lease', first],
            timeout=5_000,
        )
        # More room for the columns in the screenshot: fold the admin's nav sidebar.
        page.click("#toggle-nav-sidebar")
        expect(page.locator("#nav-sidebar")).to_be_hidden()
        page.screenshot(path=str(shot), full_page=True)

        # Dark mode uses the admin's dark palette.
        page.emulate_media(color_scheme="dark")
        dark_bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
        page.emulate_media(color_scheme="light")
        light_bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert dark_bg != light_bg

        # Auto-refresh reloads the page by itself and keeps the search.
        page.goto(f"{list_url}?q=report&refresh=5")
        before = page.evaluate("performance.timeOrigin")
        with page.expect_navigation(timeout=12_000):
            pass
        assert page.evaluate("performance.timeOrigin") > before
        assert "q=report" in page.url and "refresh=5" in page.url
        expect(page.locator("#result_list tbody tr")).to_have_count(1)
        page.goto(list_url)

        # Search (literal), then release through the confirmation page.
        page.fill("#searchbar", "account-17")
        page.press("#searchbar", "Enter")
        page.wait_for_url("**q=account-17**")
        expect(page.locator("#result_list tbody tr")).to_have_count(1)
        page.check(f"{row} input.action-select")
        page.click("text=Release selected locks…")
        expect(page.locator("#content-main")).to_contain_text(str(token))
        page.click("#confirm-action")
        page.wait_for_url("**q=account-17**")
        expect(page.locator(".messagelist")).to_contain_text("Released 1 lock.")
        expect(page.locator(row)).to_have_count(0)
        expect(page.locator("#result_list")).to_contain_text("No locks are held that match")

    assert locks.get(LOCK_NAME) is None
    assert locks.get("report:2024-06") is not None
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


SHARED_HOLDER = """
import json, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
import django
django.setup()
from django_redislock import LockError, locks
sem_name, rw_name = sys.argv[1], sys.argv[2]
held = []
for owner in ("sem-a", "sem-b"):
    lk = locks.semaphore(sem_name, 3, owner=owner, ttl=30, purpose="export for " + owner)
    assert lk.acquire(blocking=False)
    held.append(lk)
for owner in ("reader-1", "reader-2"):
    lk = locks.rw_lock(rw_name, owner=owner, ttl=30, purpose="report page").read()
    assert lk.acquire(blocking=False)
    held.append(lk)
print(json.dumps({lk.owner: lk.fencing_token for lk in held}), flush=True)
sys.stdin.readline()  # hold until the test closes our stdin
for lk in held:
    try:
        lk.release()
    except LockError:
        pass  # the operator released this one
"""
SEM_NAME = "export:tenant-9"
RW_NAME = "report:2024-06"


@pytest.fixture
def shared_holder() -> Iterator[tuple[subprocess.Popen[str], dict[str, int]]]:
    """Another Python process holding two permits of SEM_NAME and two reads of RW_NAME
    (renewed by its watchdog): (process, {owner: fencing token})."""
    with _holding(SHARED_HOLDER, SEM_NAME, RW_NAME) as (proc, line):
        yield proc, json.loads(line)


def _holders(name: str) -> list[tuple[str, str | None]]:
    info = locks.get(name)
    return [(h.mode, h.owner) for h in info.holders] if info else []


def test_release_one_holder_of_a_semaphore_and_of_a_rw_lock(
    transactional_db: None,
    admin_user: Any,
    live_server: Any,
    shared_holder: tuple[subprocess.Popen[str], dict[str, int]],
    tmp_path: Path,
) -> None:
    from django.contrib.admin.utils import quote
    from playwright.sync_api import expect

    proc, tokens = shared_holder
    list_url = f"{live_server.url}{LIST_PATH}"
    shot = tmp_path / "admin-holders.png"

    def holder_row(owner: str) -> str:
        return f'tr.redislock-holder[data-holder-owner="{owner}"]'

    def release_one(page: Page, url: str, owner: str, other: str) -> None:
        """Release *owner* from the detail page at *url*: its confirmation names it and
        not *other*, then back to the page, where *other* alone still holds."""
        page.click(f"{holder_row(owner)} .redislock-release-holder")
        expect(page.locator("#content-main")).to_contain_text(str(tokens[owner]))
        expect(page.locator("#content-main")).not_to_contain_text(str(tokens[other]))
        page.click("#confirm-action")
        page.wait_for_url(url)
        expect(page.locator(".messagelist")).to_contain_text("Released 1 holder")
        expect(page.locator("tr.redislock-holder")).to_have_count(1)
        expect(page.locator(holder_row(other))).to_be_visible()

    with _admin_page(live_server, 640) as page:
        # The list: the primitive and how it is held, the other holders counted.
        sem_row = f'tr[data-lock-name="{SEM_NAME}"]'
        rw_row = f'tr[data-lock-name="{RW_NAME}"]'
        expect(page.locator(f"{sem_row} .field-primitive")).to_contain_text("2 of 3 permits")
        expect(page.locator(f"{rw_row} .field-primitive")).to_contain_text("2 readers")
        expect(page.locator(f"{sem_row} .field-owner")).to_contain_text("+ 1 more holder")

        # The semaphore's page: both holders, each with its own buttons.
        sem_url = f"{list_url}{quote(SEM_NAME)}/change/"
        page.click(f"{sem_row} .field-name a")
        page.wait_for_url(sem_url)
        expect(page.locator("tr.redislock-holder")).to_have_count(2)
        for owner in ("sem-a", "sem-b"):
            row = page.locator(holder_row(owner))
            expect(row.locator(".field-fence")).to_have_text(str(tokens[owner]))
            expect(row.locator(".field-process")).to_contain_text(f"pid {proc.pid}")
            expect(row.locator(".field-purpose")).to_contain_text(f"export for {owner}")
        page.click("#toggle-nav-sidebar")
        page.screenshot(path=str(shot), full_page=True)

        # Release sem-a alone: sem-b keeps its permit.
        release_one(page, sem_url, "sem-a", "sem-b")
        assert _holders(SEM_NAME) == [("permit", "sem-b")]

        # The read-write lock's page: release reader-1, reader-2 keeps reading.
        rw_url = f"{list_url}{quote(RW_NAME)}/change/"
        page.goto(rw_url)
        expect(page.locator('tr.redislock-holder[data-holder-mode="read"]')).to_have_count(2)
        release_one(page, rw_url, "reader-1", "reader-2")

    assert _holders(RW_NAME) == [("read", "reader-2")]
    assert _holders(SEM_NAME) == [("permit", "sem-b")]  # the holder's watchdog did not undo it
    assert proc.poll() is None
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
