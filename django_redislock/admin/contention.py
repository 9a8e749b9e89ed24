"""The admin's contention overview page: which lock groups cost most waiting.

Built on :meth:`LockManager.contention` (the locks' histories summed per key
template or name over a recent window); see docs/admin.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from django.contrib.admin.utils import quote
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ..describe.history import history_lines, spreads
from ..describe.snapshot import seconds_text
from ..engine.contention import Contention
from ..exceptions import LockBackendError

if TYPE_CHECKING:
    from ..primitives.manager import LockManager


class ViewerAdmin(Protocol):
    """What these pages use of the viewer's ``ModelAdmin``."""

    @property
    def lock_manager(self) -> LockManager:
        """The manager whose locks the viewer shows."""

    def url(self, page: str, *args: Any) -> str:
        """The URL of one of the viewer's pages."""


#: The windows the page offers (seconds, label); the first is the default.
WINDOWS = ((3600, "hour"), (600, "10 minutes"), (86400, "day"))
#: How many names' histories one page view reads at most.
MAX_LOCKS = 20_000


@dataclass(frozen=True)
class _Named:
    name: str
    url: str


@dataclass(frozen=True)
class _Group:
    entry: Contention
    waited: str
    longest: str
    names: list[_Named]


def contention_page(
    model_admin: ViewerAdmin, request: HttpRequest, base: dict[str, Any]
) -> HttpResponse:
    """The worst lock groups over the chosen window (``?window=<seconds>``); *base* is
    the admin page context (see ``admin_views.contention_view``)."""
    try:
        window = int(request.GET.get("window", WINDOWS[0][0]))
    except ValueError:
        window = WINDOWS[0][0]
    if window not in {w for w, _ in WINDOWS}:
        window = WINDOWS[0][0]
    error, complete, groups = "", True, []
    try:
        found, complete = model_admin.lock_manager.contention(window, max_locks=MAX_LOCKS)
    except LockBackendError as exc:
        error, found = str(exc), []
    for entry in found:
        names = [_Named(n, model_admin.url("change", quote(n))) for n in entry.names]
        groups.append(
            _Group(entry, seconds_text(entry.waited), seconds_text(entry.longest_wait), names)
        )
    context = {
        **base,
        "window": window,
        "windows": [(w, label) for w, label in WINDOWS],
        "groups": groups,
        "complete": complete,
        "max_locks": MAX_LOCKS,
        "error": error,
    }
    return TemplateResponse(request, "django_redislock/admin/lock_contention.html", context)


def history_context(model_admin: ViewerAdmin, name: str) -> dict[str, Any]:
    """The detail page's history section: the lock's recent events and their spread."""
    try:
        events = model_admin.lock_manager.history(name)
    except (LockBackendError, TypeError, ValueError):
        events = []
    return {"history": history_lines(events), "spreads": spreads(events)}
