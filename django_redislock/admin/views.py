"""The pages of the admin lock viewer: list, detail and contention (the release and
extend actions are in :mod:`.admin_actions`).

Each function takes the ``ModelAdmin`` that serves it (:class:`ViewerAdmin`
declares what they use of it; :class:`~django_redislock.admin.HeldLockAdmin`
provides it) and checks permissions itself, so a URL reached without a link is
no way around them. Lock names are user data: templates autoescape them, URLs use
the admin's ``quote()``, and action payloads are JSON in form fields.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

import django
from django.apps import apps
from django.contrib.admin import AdminSite
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Model
from django.db.models.options import Options
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.text import Truncator

from ..conf import setting
from ..describe.shaping import shaping_lines
from ..describe.snapshot import (
    Liveness,
    ago_text,
    describe_holder,
    describe_process,
    describe_task,
    liveness,
    queue_text,
    waiter_lines,
)
from ..engine.info import HolderInfo, LockInfo
from ..engine.validate import validate_name
from ..exceptions import LockBackendError
from ..primitives.manager import LockManager
from .contention import contention_page, history_context
from .listing import scan_window
from .query import REFRESH_CHOICES, filter_choices, params_of, qs, query_from, sort_links
from .targets import Target, describe_primitive


class ViewerAdmin(Protocol):
    """What the views use of the ``ModelAdmin`` that serves them (``HeldLockAdmin``).

    The views only read these members, so a class attribute, an instance
    attribute or a property provides each of them.
    """

    @property
    def lock_manager(self) -> LockManager:
        """The manager whose locks are listed and acted on."""
        ...

    @property
    def list_per_page(self) -> int:
        """Rows per page."""
        ...

    @property
    def scan_window(self) -> int:
        """Rows one list request collects."""
        ...

    @property
    def scan_budget(self) -> int:
        """Most lock keys one list request loads."""
        ...

    @property
    def scan_batch(self) -> int:
        """The SCAN ``COUNT`` hint."""
        ...

    @property
    def admin_site(self) -> AdminSite:
        """The admin site serving the pages."""
        ...

    @property
    def model(self) -> type[Model]:
        """The placeholder model that names the pages (``HeldLock``)."""
        ...

    def url(self, page: str, *args: Any) -> str:
        """The URL of one of the viewer's pages ("changelist", "change", ...)."""
        ...

    def has_view_permission(self, request: HttpRequest) -> bool:
        """Whether the user may see the lock pages."""
        ...

    def has_release_permission(self, request: HttpRequest) -> bool:
        """Whether the user may force-release locks."""
        ...

    def has_extend_permission(self, request: HttpRequest) -> bool:
        """Whether the user may extend other holders' leases."""
        ...


def lease_seconds(value: float | None) -> float | None:
    """A lease for the template's countdown: None when unknown, -1 for no expiry."""
    if value is None:
        return None
    return -1.0 if math.isinf(value) else round(value, 3)


@dataclass
class Row:
    """One lock as the list and confirmation pages display it."""

    info: LockInfo
    detail_url: str
    holder: str
    task: str
    process: str
    age: str
    target: str
    lease: float | None
    extra: str
    #: Whether its holders keep their leases renewed ("renewed 2.0 s ago").
    liveness: Liveness
    #: The primitive ("mutex", "semaphore", "read-write lock") and how it is held
    #: ("2 of 3 permits", "write", "3 readers"; "" for a mutex).
    primitive: str = "mutex"
    held_as: str = ""
    #: Holders besides the one whose fields the row shows.
    more_holders: int = 0


def _extra(extra: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in extra.items())


def _row(model_admin: ViewerAdmin, info: LockInfo) -> Row:
    primitive, held_as = describe_primitive(info)
    return Row(
        info=info,
        detail_url=model_admin.url("change", quote(info.name)),
        holder=describe_holder(info),
        task=describe_task(info),
        process=describe_process(info),
        age=ago_text(info.age),
        target=Target.from_info(info).encode(),
        lease=lease_seconds(info.ttl),
        extra=_extra(info.extra),
        primitive=primitive,
        held_as=held_as,
        more_holders=max(0, len(info.holders) - 1),
        liveness=liveness(info),
    )


@dataclass
class HolderRow:
    """One holder of a semaphore or read-write lock on its detail page."""

    holder: HolderInfo
    target: str
    process: str
    task: str
    age: str
    lease: float | None
    extra: str
    task_result_url: str | None
    liveness: Liveness


def _holder_rows(model_admin: ViewerAdmin, info: LockInfo) -> list[HolderRow]:
    """Every holder of *info* (a semaphore's or read-write lock's), writer first."""
    return [
        HolderRow(
            holder=holder,
            target=Target.from_holder(info, holder).encode(),
            process=describe_process(holder),
            task=describe_task(holder),
            age=ago_text(info.observed_at - holder.acquired_at if holder.acquired_at else None),
            lease=lease_seconds(holder.ttl),
            extra=_extra(holder.extra),
            task_result_url=_task_result_url(model_admin, holder.task_id),
            liveness=liveness(holder),
        )
        for holder in info.holders
    ]


@dataclass(frozen=True)
class StockChangeList:
    """What Django's ``admin/change_list.html`` reads of its ``cl`` outside the content
    block our list page replaces: the model's options, for its breadcrumbs."""

    opts: Options[Any]


def page_context(
    model_admin: ViewerAdmin, request: HttpRequest, title: str, crumb: str | None = None
) -> dict[str, Any]:
    """What every viewer page's template needs: the admin's own context, the page
    title, the viewer's URLs and the user's permissions.

    *crumb* is the page's last breadcrumb, after Home › Redis locks › Locks: a page
    without one (the list, the error page) extends Django's ``admin/change_list.html``,
    a page with one (a lock, a confirmation, the contention overview) Django's
    ``admin/change_form.html``, so the breadcrumb bar is the installed Django's own
    markup (``django_redislock/admin/base.html``).
    """
    request.current_app = model_admin.admin_site.name
    opts = model_admin.model._meta
    if crumb is None:
        stock = {
            "stock_template": "admin/change_list.html",
            "cl": StockChangeList(opts),
            # Our action buttons are above the list (the stock page otherwise widens
            # its first column).
            "actions_on_top": True,
        }
    else:
        stock = {
            "stock_template": "admin/change_form.html",
            "original": Truncator(crumb).chars(80),
            # The stock trail links "Locks" for a user who may see the list.
            "has_view_permission": model_admin.has_view_permission(request),
        }
    return {
        **model_admin.admin_site.each_context(request),
        **stock,
        "title": title,
        "opts": opts,
        "app_label": opts.app_label,
        "list_url": model_admin.url("changelist"),
        "release_url": model_admin.url("release"),
        "extend_url": model_admin.url("extend"),
        "contention_url": model_admin.url("contention"),
        "has_release_permission": model_admin.has_release_permission(request),
        "has_extend_permission": model_admin.has_extend_permission(request),
        "key_prefix": _key_prefix(model_admin),
    }


def _key_prefix(model_admin: ViewerAdmin) -> str:
    """The manager's key prefix, also when its Redis cannot be reached (the error page)."""
    manager = model_admin.lock_manager
    try:
        return manager.backend().keyspace.prefix
    except LockBackendError:
        return str(manager.key_prefix or setting("REDISLOCK_KEY_PREFIX"))


def backend_unavailable(
    model_admin: ViewerAdmin, request: HttpRequest, exc: LockBackendError
) -> HttpResponse:
    """The page shown (503) when Redis cannot be reached or answers with an error."""
    context = {**page_context(model_admin, request, "Redis is unavailable"), "error": str(exc)}
    return TemplateResponse(request, "django_redislock/admin/lock_error.html", context, status=503)


def current_locks(model_admin: ViewerAdmin, names: list[str]) -> dict[str, LockInfo]:
    """The locks among *names* held now, by name (one round trip)."""
    return {info.name: info for info in model_admin.lock_manager.get_many(names)}


def require_view(model_admin: ViewerAdmin, request: HttpRequest) -> None:
    """Refuse (403) a user who may not see the lock pages."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied


def changelist_view(model_admin: ViewerAdmin, request: HttpRequest) -> HttpResponse:
    """The list of held locks: search, filters, ordering, SCAN-windowed pages."""
    require_view(model_admin, request)
    query, page_number, refresh = query_from(request)
    params = params_of(query, page_number, refresh)
    error = None
    try:
        window = scan_window(
            model_admin.lock_manager,
            query,
            window=model_admin.scan_window,
            budget=model_admin.scan_budget,
            batch=model_admin.scan_batch,
        )
    except LockBackendError as exc:
        window, error = None, str(exc)
    rows = window.rows if window else []
    paginator = Paginator(rows, model_admin.list_per_page)
    page = paginator.get_page(page_number)
    context = {
        **page_context(model_admin, request, "Locks held in Redis"),
        "query": query,
        "error": error,
        "window": window,
        "page": page,
        "rows": [_row(model_admin, info) for info in page.object_list],
        "matched": len(rows),
        "window_full": len(rows) >= model_admin.scan_window,
        "params": params,
        "sort_links": sort_links(query, params),
        "refresh": refresh,
        "refresh_links": [
            {"seconds": s, "url": qs(params, refresh=s), "current": s == refresh}
            for s in REFRESH_CHOICES
        ],
        **filter_choices(query, params, window),
        "filtered": bool(
            query.search or query.host or query.kind or query.primitive or query.overdue
        ),
        "prev_url": qs(params, p=page.previous_page_number()) if page.has_previous() else None,
        "next_url": qs(params, p=page.next_page_number()) if page.has_next() else None,
        "next_window_url": (
            qs(params, cursor=window.next_cursor, p="") if window and not window.complete else None
        ),
        "first_window_url": qs(params, cursor="", p="") if query.cursor != "0" else None,
        "list_qs": qs(params)[1:],
        # Django 6.1's admin/base.html places the object-tools block beside the title;
        # up to 6.0, admin/change_list.html places it inside the content block, which
        # this page replaces, so the page writes its tools there itself.
        "object_tools_in_content": django.VERSION < (6, 1),
    }
    return TemplateResponse(request, "django_redislock/admin/lock_list.html", context)


def _task_result_url(model_admin: ViewerAdmin, task_id: str | None) -> str | None:
    """A link to django_celery_results' admin for *task_id*, if this admin site has one."""
    if not task_id or not apps.is_installed("django_celery_results"):
        return None
    try:
        model = apps.get_model("django_celery_results", "TaskResult")
    except LookupError:
        return None
    if not model_admin.admin_site.is_registered(model):
        return None
    site = model_admin.admin_site.name
    try:
        pk = model.objects.filter(task_id=task_id).values_list("pk", flat=True).first()
        if pk is not None:
            return reverse(f"{site}:django_celery_results_taskresult_change", args=(pk,))
        return (
            reverse(f"{site}:django_celery_results_taskresult_changelist")
            + "?"
            + urlencode({"q": task_id})
        )
    except NoReverseMatch:
        return None


def _pretty(data: dict[str, Any] | None) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str) if data else ""


def change_view(model_admin: ViewerAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """Everything known about one lock, with the release and extend buttons (one
    pair per holder of a semaphore or read-write lock)."""
    require_view(model_admin, request)
    name = unquote(object_id)
    try:
        info = current_locks(model_admin, [validate_name(name)]).get(name)
    except (TypeError, ValueError):
        info = None
    mutex = info if info is not None and info.primitive == "mutex" else None
    context = {
        **page_context(model_admin, request, f"Lock {name}", name),
        "name": name,
        "row": _row(model_admin, info) if info else None,
        "holders": _holder_rows(model_admin, info) if info and not mutex else [],
        "meta_json": _pretty(
            {k: v for k, v in mutex.meta.items() if k != "args"} if mutex else None
        ),
        "extra_json": _pretty(mutex.extra if mutex else None),
        "task_result_url": _task_result_url(model_admin, mutex.task_id if mutex else None),
        "waiters": waiter_lines(info) if info else [],
        "waiting": queue_text(info) if info else "",
        "task_args_json": _pretty(mutex.meta.get("args") if mutex else None),
        "shaping": _shaping_lines(model_admin, name, info),
        **history_context(model_admin, name),
    }
    return TemplateResponse(
        request, "django_redislock/admin/lock_detail.html", context, status=200 if info else 404
    )


def _shaping_lines(model_admin: ViewerAdmin, name: str, info: LockInfo | None) -> list[str]:
    """What shapes the key's runs now, in words (empty when nothing does, and where the
    backend keeps no shaping: Redlock, or an unreadable name)."""
    try:
        state = model_admin.lock_manager.shaping(name)
    except (TypeError, ValueError, LockBackendError):  # ShapingUnsupported: Redlock
        return []
    options = info.meta.get("shaping") if info is not None else None
    return shaping_lines(state, options if isinstance(options, dict) else None)


def contention_view(model_admin: ViewerAdmin, request: HttpRequest) -> HttpResponse:
    """Which lock groups cost most waiting lately (see :mod:`.admin_contention`)."""
    require_view(model_admin, request)
    return contention_page(
        model_admin, request, page_context(model_admin, request, "Lock contention", "Contention")
    )
