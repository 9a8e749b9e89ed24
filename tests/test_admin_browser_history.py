"""The contention overview and a lock's history in a real Chromium (Playwright): from
the lock list to the Contention page, the worst key template first, and from its
lock name to that lock's history with the hold and wait spread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from django_redislock import locks
from tests.test_admin_browser import CHROMIUM, _admin_page
from tests.test_admin_history import _contend

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is not installed"),
]


def test_from_the_contention_page_to_a_locks_history(
    transactional_db: None, admin_user: Any, live_server: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    _contend(4)
    holder = locks.lock("sync:4", owner="holding-now", ttl=60, auto_renew=False)
    assert holder.acquire(blocking=False)
    try:
        with _admin_page(live_server, 800) as page:
            page.click("a.redislock-contention-link")
            first = page.locator("#contention_list tbody tr").first
            expect(first).to_have_attribute("data-group", "sync:{account}")
            expect(first.locator(".field-waits")).to_have_text("1")
            page.select_option("#id_window", "600")  # submits itself
            page.wait_for_url("**/contention/?window=600")
            expect(page.locator("#contention_list tbody tr")).to_have_count(1)
            first.locator(".field-group a", has_text="sync:4").click()
            history = page.locator("#redislock-history")
            expect(history.locator("tr.redislock-event")).to_have_count(1)
            expect(history.locator("tr.redislock-event .field-what")).to_have_text(
                "handed to the next waiter"
            )
            expect(history.locator(".redislock-spread-waited")).to_contain_text("Waits: median")
            page.screenshot(path=str(tmp_path / "history.png"), full_page=True)
    finally:
        holder.release()
