"""The admin's Shaping section in a real Chromium (Playwright): another process runs a
body guarded with ``rate=`` and ``cooldown=``; the detail page shows the window's count
with the guard's limit while it runs, and the cooldown once it has ended."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.utils import quote

from tests.test_admin_browser import CHROMIUM, LIST_PATH, _admin_page, _holding

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is not installed"),
]

NAME = "reindex:catalog"

SHAPED = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
import django
django.setup()
from django_redislock import single_instance

@single_instance(sys.argv[1], rate=(3, 60), cooldown=20)
def reindex():
    print("running", flush=True)
    sys.stdin.readline()  # run until the test closes our stdin

reindex()
"""


def test_the_detail_page_shows_the_rate_then_the_cooldown(
    transactional_db: None, admin_user: Any, live_server: Any
) -> None:
    from playwright.sync_api import expect

    url = f"{live_server.url}{LIST_PATH}{quote(NAME)}/change/"
    with _admin_page(live_server, 900) as page:
        with _holding(SHAPED, NAME) as (_proc, line):
            assert line == "running"
            page.goto(url)
            section = page.locator("#redislock-shaping")
            expect(section).to_be_visible()
            expect(section).to_contain_text("Rate: 1 of 3 starts in the last 1 min 0 s")
            expect(section).not_to_contain_text("Cooldown")
        page.goto(url)  # the run ended (the holder's stdin was closed and it exited)
        expect(page.locator("text=is not held")).to_be_visible()
        section = page.locator("#redislock-shaping")
        expect(section).to_contain_text("Rate: 1 start in the last 1 min")
        expect(section).to_contain_text("Cooldown: no start for another 1")
