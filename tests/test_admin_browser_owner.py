"""Owner tokens in the admin lock viewer, in a real Chromium: an operator reads who
holds or waits (task, host, pid, thread), not a random token.

A default owner token is random hex (``<process token>:<thread token>``); the pages
name the holder and the waiter by their process, with the token folded away under
"owner token" for whoever needs it. Checked on what the browser shows (``innerText``:
the content of a closed ``<details>`` is not shown) of a mutex's detail page (its
holder and a waiter), a semaphore's holders and the release confirmation.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.utils import quote

from django_redislock import locks
from tests.holding import QueuedWaiters
from tests.test_admin_browser import CHROMIUM, LIST_PATH, _admin_page

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is not installed"),
]

MUTEX = "owners:nightly-import"
SEMAPHORE = "owners:exports"


def test_pages_name_holders_and_waiters_not_their_owner_tokens(
    transactional_db: None, admin_user: Any, live_server: Any
) -> None:
    from playwright.sync_api import expect

    mutex = locks.lock(MUTEX, ttl=120, auto_renew=False)
    permit = locks.semaphore(SEMAPHORE, 3, ttl=120, auto_renew=False)
    assert mutex.acquire(blocking=False) and permit.acquire(blocking=False)
    waiting = QueuedWaiters(MUTEX)
    try:
        waiting.add(locks.lock(MUTEX, ttl=30), 60)
        (waiter,) = waiting.listed()
        # This thread's token holds both locks; the waiter's thread has its own.
        tokens = {"holder": mutex.owner, "permit": permit.owner, "waiter": waiter}
        assert tokens["holder"] != tokens["waiter"]
        pid = f"pid {os.getpid()}"
        list_url = f"{live_server.url}{LIST_PATH}"

        with _admin_page(live_server, 900) as page:

            def shown() -> str:
                return page.inner_text("#content-main")

            # The mutex: its holder and its waiter are named by their process.
            page.goto(f"{list_url}{quote(MUTEX)}/change/")
            text = shown()
            assert pid in text and "Owner token" not in text
            for token in tokens.values():
                assert token not in text, token
            expect(page.locator("#waiter_list .field-who")).to_contain_text(pid)
            # ... and each token is one click away.
            page.click("#content-main fieldset details.redislock-owner-token summary")
            assert tokens["holder"] in shown()
            page.click("#waiter_list details.redislock-owner-token summary")
            assert tokens["waiter"] in shown()

            # The semaphore's holders table: the process, not the token.
            page.goto(f"{list_url}{quote(SEMAPHORE)}/change/")
            expect(page.locator("#holder_list .field-process")).to_contain_text(pid)
            assert tokens["permit"] not in shown()
            assert "Owner" not in page.inner_text("#holder_list thead")

            # The release confirmation: the holder and its fencing token, no token column.
            page.goto(list_url)
            page.check(f'tr[data-lock-name="{MUTEX}"] input.action-select')
            page.click("text=Release selected locks…")
            page.wait_for_selector("#confirm-action")
            text = shown()
            assert "Owner seen" not in text
            assert tokens["holder"] not in text
            row = page.locator(f'#result_list tr[data-lock-name="{MUTEX}"]')
            expect(row.locator(".field-holder")).to_contain_text(pid)
            expect(row.locator(".field-fence")).to_have_text(str(mutex.fencing_token))
    finally:
        permit.release()
        if mutex.owned():
            mutex.release()
        waiting.close()
