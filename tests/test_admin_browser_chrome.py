"""The lock viewer's pages wear the installed Django's admin chrome, in a real Chromium.

Each of our pages is compared with a stock admin page of the same site (the auth user
changelist for the list level, a user's change form for the pages below it): the
breadcrumb bar (its element, where it sits, its computed colours, padding and font, the
first link's place in it), the header and the navigation sidebar. Django 6.1 changed
the breadcrumbs from ``<div class="breadcrumbs">`` to ``<ol class="breadcrumbs">`` (and
styles only the latter), so a page that writes its own bar loses it on one version or
the other; this runs under whichever Django the cell has (CI: 5.2 and 6.1).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.admin.utils import quote
from django.test import override_settings

from django_redislock import locks
from tests.redis_server import free_port
from tests.test_admin_browser import CHROMIUM, LIST_PATH, _admin_page

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is not installed"),
]

HELD = "chrome:report-7"
TRAIL = ["Home", "Redis locks", "Locks"]

#: The chrome of the page in the browser: the breadcrumb bar, the header, the sidebar.
CHROME = """() => {
  const crumbs = document.querySelector(".breadcrumbs");
  const header = document.querySelector("#header");
  if (!crumbs || !header) return {crumbs: !!crumbs, header: !!header};
  const box = crumbs.getBoundingClientRect();
  const link = crumbs.querySelector("a");
  const linkBox = link.getBoundingClientRect();
  const bar = getComputedStyle(crumbs);
  const linkStyle = getComputedStyle(link);
  const head = getComputedStyle(header);
  const items = [...crumbs.children].filter((c) => c.tagName === "LI");
  const trail = items.length
    ? items.map((li) => li.textContent.trim())
    : crumbs.textContent.split("\\u203a").map((t) => t.trim());
  const current = document.querySelector("#nav-sidebar .current-model th");
  const tools = document.querySelector(".object-tools li")?.closest(".object-tools");
  const title = document.querySelector("#content h1").getBoundingClientRect();
  const toolsBox = tools?.getBoundingClientRect();
  return {
    trail: trail.map((t) => t.replace(/\\s+/g, " ")),
    chrome: {
      crumbs_tag: crumbs.tagName,
      crumbs_in: [crumbs.parentElement.tagName, crumbs.parentElement.getAttribute("aria-label")],
      crumbs_children: [...new Set([...crumbs.children].map((c) => c.tagName))].sort(),
      crumbs_background: bar.backgroundColor,
      crumbs_color: bar.color,
      crumbs_padding: bar.padding,
      crumbs_margin: bar.margin,
      crumbs_height: Math.round(box.height),
      crumbs_left: Math.round(box.left),
      crumbs_width: Math.round(box.width),
      link_color: linkStyle.color,
      link_font_size: linkStyle.fontSize,
      link_offset: [Math.round(linkBox.left - box.left), Math.round(linkBox.top - box.top)],
      header_background: head.backgroundColor,
      header_height: Math.round(header.getBoundingClientRect().height),
      branding: document.querySelector("#site-name").textContent.trim(),
      user_tools: !!document.querySelector("#user-tools #logout-form"),
      sidebar: !!document.querySelector("#nav-sidebar"),
      sidebar_toggle: !!document.querySelector("#toggle-nav-sidebar"),
      crumbs_before_main: !!(crumbs.compareDocumentPosition(document.querySelector("#main"))
        & Node.DOCUMENT_POSITION_FOLLOWING),
    },
    current_model: current ? current.textContent.trim() : null,
    // The object tools (the list's Contention, the stock list's Add): beside the title,
    // at the right of the content.
    tools: tools && {
      beside_title: toolsBox.top < title.bottom && toolsBox.bottom > title.top,
      from_the_right: Math.round(
        document.querySelector("#content").getBoundingClientRect().right - toolsBox.right),
    },
  };
}"""


def _chrome(page: Page, url: str | None = None) -> dict[str, Any]:
    """The chrome of the page at *url* (the page already open when None)."""
    if url is not None:
        page.goto(url)
    result: dict[str, Any] = page.evaluate(CHROME)
    assert result.get("crumbs") is not False, f"no breadcrumb bar on {page.url}"
    assert result.get("header") is not False, f"no header on {page.url}"
    return result


def test_every_viewer_page_has_the_stock_admin_chrome(
    transactional_db: None, admin_user: Any, live_server: Any, tmp_path: Path
) -> None:
    holder = locks.lock(HELD, ttl=120, auto_renew=False, owner="chrome-holder")
    assert holder.acquire(blocking=False)
    base = live_server.url
    list_url = f"{base}{LIST_PATH}"
    try:
        with _admin_page(live_server, 800) as page:
            stock_list = _chrome(page, f"{base}/admin/auth/user/")
            stock_form = _chrome(page, f"{base}/admin/auth/user/{admin_user.pk}/change/")
            assert stock_list["trail"] == ["Home", "Authentication and Authorization", "Users"]
            assert stock_form["trail"][:3] == ["Home", "Authentication and Authorization", "Users"]

            ours: dict[str, tuple[dict[str, Any], dict[str, Any], list[str]]] = {}
            ours["list"] = (_chrome(page, list_url), stock_list, TRAIL)
            assert ours["list"][0]["tools"] == stock_list["tools"]
            page.screenshot(path=str(tmp_path / "list.png"))
            ours["detail"] = (
                _chrome(page, f"{list_url}{quote(HELD)}/change/"),
                stock_form,
                [*TRAIL, HELD],
            )
            ours["detail, not held"] = (
                _chrome(page, f"{list_url}{quote('chrome:gone')}/change/"),
                stock_form,
                [*TRAIL, "chrome:gone"],
            )
            ours["contention"] = (
                _chrome(page, f"{list_url}contention/"),
                stock_form,
                [*TRAIL, "Contention"],
            )
            page.goto(list_url)
            page.check(f'tr[data-lock-name="{HELD}"] input.action-select')
            page.click("text=Release selected locks…")
            page.wait_for_selector("#confirm-action")
            ours["release confirmation"] = (_chrome(page), stock_form, [*TRAIL, "Release"])
            page.screenshot(path=str(tmp_path / "confirm.png"))
            page.goto(list_url)
            page.check(f'tr[data-lock-name="{HELD}"] input.action-select')
            page.click("text=Extend selected leases…")
            page.wait_for_selector("#confirm-action")
            ours["extend confirmation"] = (_chrome(page), stock_form, [*TRAIL, "Extend"])
            # Redis that cannot be reached (nothing listens on the port): the error page.
            with override_settings(REDISLOCK_URL=f"redis://127.0.0.1:{free_port()}/0"):
                response = page.goto(f"{list_url}{quote(HELD)}/change/")
                assert response is not None and response.status == 503
                ours["Redis unavailable"] = (_chrome(page), stock_list, TRAIL)

        for what, (mine, stock, trail) in ours.items():
            assert mine["trail"] == trail, what
            assert mine["chrome"] == stock["chrome"], what
            assert mine["current_model"] == "Locks", what
    finally:
        if holder.owned():
            holder.release()
