"""The pages of the admin lock viewer: list, detail, and the release/extend actions.

Each function takes the ``ModelAdmin`` that serves it (:class:`ViewerAdmin`
declares what they use of it; :class:`~django_redislock.admin.HeldLockAdmin`
provides it) and checks permissions itself, so a URL reached without a link is
no way around them. Lock names are user data: templates autoescape them, URLs use
the admin's ``quote()``, and action payloads are JSON in form fields.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

from django.apps import apps
from django.contrib import messages
from django.contrib.admin import AdminSite
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.admin.utils import quote, unquote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Model
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse

from .admin_listing import ORDERINGS, ListQuery, scan_window
from .conf import get_setting
from .engine.info import LockInfo
from .engine.validate import validate_name
from .exceptions import LockBackendError
from .manager import LockManager
from .models import HeldLock

#: Auto-refresh periods (seconds) offered on the list page; 0 = off.
REFRESH_CHOICES = (0, 5, 30)
#: Most locks one action request may act on.
MAX_TARGETS = 1000
#: Longest lease extension an operator may grant at once (seconds).
MAX_EXTEND_SECONDS = 7 * 86400


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


@dataclass(frozen=True)
class Target:
    """A lock an operator selected, with the owner and fencing token they saw."""

    name: str
    owner: str | None
    fence: int | None

    @property
    def unowned(self) -> bool:
        """Seen with neither owner nor token (another tool's key): act only if still so."""
        return self.owner is None and self.fence is None

    @classmethod
    def from_info(cls, info: LockInfo) -> Target:
        """The target for the lock *info* describes."""
        return cls(info.name, info.owner, info.fencing_token)

    def encode(self) -> str:
        """The value carried in a form field."""
        return json.dumps({"n": self.name, "o": self.owner, "f": self.fence})

    @classmethod
    def decode(cls, value: str) -> Target | None:
        """Parse a form value from :meth:`encode`; None if it is malformed."""
        try:
            data = json.loads(value)
            name, owner, fence = data["n"], data["o"], data["f"]
            validate_name(name)
        except (ValueError, TypeError, KeyError):
            return None
        if owner is not None and not isinstance(owner, str):
            return None
        if fence is not None and (isinstance(fence, bool) or not isinstance(fence, int)):
            return None
        return cls(name, owner, fence)


def describe_task(info: LockInfo) -> str:
    """The Celery task holding *info*, or "" when a task did not take it."""
    if info.task_name or info.task_id:
        return f"task {info.task_name or '?'} [{info.task_id or '?'}]"
    return ""


def describe_process(info: LockInfo) -> str:
    """Where the holder of *info* runs: host, pid, thread (what is known of them)."""
    parts = []
    if info.host:
        parts.append(f"host {info.host}")
    if info.pid is not None:
        parts.append(f"pid {info.pid}")
    if info.thread:
        parts.append(f"thread {info.thread}")
    return ", ".join(parts)


def describe_holder(info: LockInfo | None) -> str:
    """A one-line description of who holds *info*: task, host, pid, thread."""
    if info is None:
        return "nobody"
    return ", ".join(p for p in (describe_task(info), describe_process(info)) if p) or (
        "unknown holder"
    )


def describe_age(info: LockInfo) -> str:
    """How long ago *info* was acquired, coarsely ("42 s ago", "3 h 5 min ago")."""
    age = info.age
    if age is None:
        return ""
    seconds = max(0, int(age.total_seconds()))
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min ago"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h ago"


def _query_from(request: HttpRequest) -> tuple[ListQuery, int, int]:
    """The list query, page number and refresh period from the query string."""
    get = request.GET
    order = get.get("o", "name")
    # Opaque to the admin; the backend starts over on a cursor it cannot read.
    cursor = get.get("cursor", "0")[:200] or "0"
    try:
        page = max(1, int(get.get("p", "1")))
    except ValueError:
        page = 1
    try:
        refresh = int(get.get("refresh", "0"))
    except ValueError:
        refresh = 0
    query = ListQuery(
        search=get.get("q", ""),
        mode="prefix" if get.get("match") == "prefix" else "contains",
        host=get.get("host", ""),
        kind=get.get("kind", ""),
        order=order if order in ORDERINGS else "name",
        cursor=cursor,
    )
    return query, page, refresh if refresh in REFRESH_CHOICES else 0


def _params(query: ListQuery, page: int, refresh: int) -> dict[str, Any]:
    params: dict[str, Any] = {
        "q": query.search,
        "match": "prefix" if query.mode == "prefix" else "",
        "host": query.host,
        "kind": query.kind,
        "o": "" if query.order == "name" else query.order,
        "cursor": "" if query.cursor == "0" else query.cursor,
        "p": "" if page == 1 else page,
        "refresh": refresh or "",
    }
    return params


def _qs(params: dict[str, Any], **changes: Any) -> str:
    """``?query`` from *params* with *changes*, dropping empty values."""
    merged = {**params, **changes}
    return "?" + urlencode({k: v for k, v in merged.items() if v not in ("", None, 0)})


def _seconds(value: float | None) -> float | None:
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


def _row(model_admin: ViewerAdmin, info: LockInfo) -> Row:
    return Row(
        info=info,
        detail_url=model_admin.url("change", quote(info.name)),
        holder=describe_holder(info),
        task=describe_task(info),
        process=describe_process(info),
        age=describe_age(info),
        target=Target.from_info(info).encode(),
        lease=_seconds(info.ttl),
        extra=", ".join(f"{k}={v}" for k, v in info.extra.items()),
    )


def _context(model_admin: ViewerAdmin, request: HttpRequest, title: str) -> dict[str, Any]:
    request.current_app = model_admin.admin_site.name
    opts = model_admin.model._meta
    return {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": opts,
        "app_label": opts.app_label,
        "app_url": reverse(
            f"{model_admin.admin_site.name}:app_list", kwargs={"app_label": opts.app_label}
        ),
        "list_url": model_admin.url("changelist"),
        "release_url": model_admin.url("release"),
        "extend_url": model_admin.url("extend"),
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
        return str(manager.key_prefix or get_setting("REDISLOCK_KEY_PREFIX"))


def backend_unavailable(
    model_admin: ViewerAdmin, request: HttpRequest, exc: LockBackendError
) -> HttpResponse:
    """The page shown (503) when Redis cannot be reached or answers with an error."""
    context = {**_context(model_admin, request, "Redis is unavailable"), "error": str(exc)}
    return TemplateResponse(request, "django_redislock/admin/lock_error.html", context, status=503)


def _require_view(model_admin: ViewerAdmin, request: HttpRequest) -> None:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied


def changelist_view(model_admin: ViewerAdmin, request: HttpRequest) -> HttpResponse:
    """The list of held locks: search, filters, ordering, SCAN-windowed pages."""
    _require_view(model_admin, request)
    query, page_number, refresh = _query_from(request)
    params = _params(query, page_number, refresh)
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
    sort_links = {}
    for column in ("name", "age", "ttl"):
        current = query.order.lstrip("-") == column
        descending = query.order.startswith("-")
        new = f"-{column}" if current and not descending else column
        sort_links[column] = {
            "url": _qs(params, o="" if new == "name" else new, p=""),
            "current": current,
            "descending": descending,
        }
    base = {k: v for k, v in params.items() if k not in ("host", "kind", "p", "cursor")}
    hosts = sorted((window.hosts if window else set()) | ({query.host} - {""}))
    kinds = sorted((window.kinds if window else set()) | {"lock"} | ({query.kind} - {""}))
    context = {
        **_context(model_admin, request, "Locks held in Redis"),
        "query": query,
        "error": error,
        "window": window,
        "page": page,
        "rows": [_row(model_admin, info) for info in page.object_list],
        "matched": len(rows),
        "window_full": len(rows) >= model_admin.scan_window,
        "params": params,
        "sort_links": sort_links,
        "refresh": refresh,
        "refresh_links": [
            {"seconds": s, "url": _qs(params, refresh=s), "current": s == refresh}
            for s in REFRESH_CHOICES
        ],
        "host_choices": _choices(hosts, query.host, lambda h: _qs(base, kind=query.kind, host=h)),
        "kind_choices": _choices(kinds, query.kind, lambda k: _qs(base, host=query.host, kind=k)),
        "prev_url": _qs(params, p=page.previous_page_number()) if page.has_previous() else None,
        "next_url": _qs(params, p=page.next_page_number()) if page.has_next() else None,
        "next_window_url": (
            _qs(params, cursor=window.next_cursor, p="") if window and not window.complete else None
        ),
        "first_window_url": _qs(params, cursor="", p="") if query.cursor != "0" else None,
        "list_qs": _qs(params)[1:],
    }
    return TemplateResponse(request, "django_redislock/admin/lock_list.html", context)


def _choices(values: list[str], current: str, url: Callable[[str], str]) -> list[dict[str, Any]]:
    """Filter links: "All" then one per value, marking the current one."""
    out = [{"label": "All", "url": url(""), "selected": not current}]
    out += [{"label": v, "url": url(v), "selected": v == current} for v in values]
    return out


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
    """Everything known about one lock, with the release and extend buttons."""
    _require_view(model_admin, request)
    name = unquote(object_id)
    try:
        info = _current(model_admin, [validate_name(name)]).get(name)
    except (TypeError, ValueError):
        info = None
    context = {
        **_context(model_admin, request, f"Lock {name}"),
        "name": name,
        "row": _row(model_admin, info) if info else None,
        "meta_json": _pretty(info.meta if info else None),
        "extra_json": _pretty(info.extra if info else None),
        "task_result_url": _task_result_url(model_admin, info.task_id if info else None),
    }
    return TemplateResponse(
        request, "django_redislock/admin/lock_detail.html", context, status=200 if info else 404
    )


def _action_targets(
    model_admin: ViewerAdmin,
    request: HttpRequest,
    has_permission: Callable[[HttpRequest], bool],
) -> list[Target] | HttpResponse:
    """The checks every action starts with: a POST, by staff allowed to view and to
    take this action, naming at least one lock. Returns the targets, or the response
    to send instead (405, or back to the list when nothing was selected)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    _require_view(model_admin, request)
    if not has_permission(request):
        raise PermissionDenied
    targets = _targets(request)
    if not targets:
        messages.warning(request, "No locks were selected.")
        return _back(model_admin, request)
    return targets


def _targets(request: HttpRequest) -> list[Target]:
    targets = []
    seen: set[str] = set()
    for value in request.POST.getlist("target")[:MAX_TARGETS]:
        target = Target.decode(value)
        if target is not None and target.name not in seen:
            seen.add(target.name)
            targets.append(target)
    return targets


def _current(model_admin: ViewerAdmin, names: list[str]) -> dict[str, LockInfo]:
    return {info.name: info for info in model_admin.lock_manager.get_many(names)}


def _back(model_admin: ViewerAdmin, request: HttpRequest) -> HttpResponseRedirect:
    # Only a query string is carried over, so the redirect cannot leave the list page.
    qs = request.POST.get("list_qs", "").lstrip("?")
    return HttpResponseRedirect(model_admin.url("changelist") + ("?" + qs if qs else ""))


def _log(request: HttpRequest, name: str, flag: int, message: str) -> None:
    """Record an operator action in Django's admin LogEntry (the "Recent actions" list)."""
    if hasattr(LogEntry.objects, "log_actions"):  # Django >= 5.1
        LogEntry.objects.log_actions(
            user_id=request.user.pk,
            queryset=[HeldLock(name=name)],
            action_flag=flag,
            change_message=message,
            single_object=True,
        )
    else:
        LogEntry.objects.log_action(
            user_id=request.user.pk,
            content_type_id=ContentType.objects.get_for_model(HeldLock).pk,
            object_id=name,
            object_repr=name[:200],
            action_flag=flag,
            change_message=message,
        )


def _confirm_page(
    model_admin: ViewerAdmin,
    request: HttpRequest,
    action: str,
    targets: list[Target],
    seconds: str,
    error: str | None = None,
) -> HttpResponse:
    current = _current(model_admin, [t.name for t in targets])
    items = []
    for target in targets:
        now = current.get(target.name)
        items.append(
            {
                "target": target,
                "value": target.encode(),
                "holder": describe_holder(now),
                "info": now,
                "lease": _seconds(now.ttl) if now else None,
                "changed": now is not None
                and (now.owner != target.owner or now.fencing_token != target.fence),
            }
        )
    verb = "Release" if action == "release" else "Extend"
    context = {
        **_context(model_admin, request, f"{verb} {len(targets)} lock{'s' * (len(targets) != 1)}?"),
        "action": action,
        "action_url": model_admin.url(action),
        "items": items,
        "seconds": seconds,
        "error": error,
        "list_qs": request.POST.get("list_qs", ""),
    }
    return TemplateResponse(request, "django_redislock/admin/lock_confirm.html", context)


def release_view(model_admin: ViewerAdmin, request: HttpRequest) -> HttpResponse:
    """Force-release the selected locks, after a confirmation page, comparing tokens."""
    targets = _action_targets(model_admin, request, model_admin.has_release_permission)
    if isinstance(targets, HttpResponse):
        return targets
    if request.POST.get("confirm") != "yes":
        return _confirm_page(model_admin, request, "release", targets, "")
    manager = model_admin.lock_manager
    before = _current(model_admin, [t.name for t in targets])
    released, refused, gone, failed = 0, [], 0, []
    for target in targets:
        try:
            ok = manager.force_release(
                target.name,
                owner=target.owner,
                fencing_token=target.fence,
                unowned_only=target.unowned,
            )
        except LockBackendError as exc:
            failed.append(f"{target.name} ({exc})")
            continue
        if ok:
            released += 1
            _log(
                request,
                target.name,
                DELETION,
                f"Force-released lock {target.name!r} held by owner {target.owner or '?'} "
                f"({describe_holder(before.get(target.name))}), fencing token "
                f"{target.fence if target.fence is not None else '?'}.",
            )
        elif target.name in _current(model_admin, [target.name]):
            refused.append(target.name)
        else:
            gone += 1
    if failed:
        messages.error(request, "Could not release: " + ", ".join(failed[:20]))
    if released:
        messages.success(request, f"Released {released} lock{'s' * (released != 1)}.")
    if gone:
        messages.info(request, f"{gone} lock{'s were' if gone != 1 else ' was'} already released.")
    if refused:
        messages.warning(
            request,
            "Not released because the lock changed owner since you looked: "
            + ", ".join(refused[:20])
            + (" …" if len(refused) > 20 else ""),
        )
    return _back(model_admin, request)


def extend_view(model_admin: ViewerAdmin, request: HttpRequest) -> HttpResponse:
    """Add time to the leases of the selected locks, after a confirmation page."""
    targets = _action_targets(model_admin, request, model_admin.has_extend_permission)
    if isinstance(targets, HttpResponse):
        return targets
    raw = request.POST.get("seconds", "60")
    if request.POST.get("confirm") != "yes":
        return _confirm_page(model_admin, request, "extend", targets, raw)
    try:
        seconds = float(raw)
        if not (1 <= seconds <= MAX_EXTEND_SECONDS):
            raise ValueError
    except ValueError:
        return _confirm_page(
            model_admin,
            request,
            "extend",
            targets,
            raw,
            error=f"Enter a number of seconds between 1 and {MAX_EXTEND_SECONDS}.",
        )
    done, refused, other = 0, [], []
    for target in targets:
        result = model_admin.lock_manager.force_extend(
            target.name,
            seconds,
            owner=target.owner,
            fencing_token=target.fence,
            unowned_only=target.unowned,
        )
        if result.extended:
            done += 1
            _log(
                request,
                target.name,
                CHANGE,
                f"Extended the lease of lock {target.name!r} by {seconds:g} s to "
                f"{result.ttl:.1f} s (owner {target.owner or '?'}, fencing token "
                f"{target.fence if target.fence is not None else '?'}).",
            )
        elif result.status == "changed":
            refused.append(target.name)
        else:
            why = "no expiry" if result.status == "no-expiry" else "gone"
            other.append(f"{target.name} ({why})")
    if done:
        messages.success(request, f"Extended {done} lock{'s' * (done != 1)} by {seconds:g} s.")
    if refused:
        messages.warning(
            request,
            "Not extended because the lock changed owner since you looked: "
            + ", ".join(refused[:20]),
        )
    if other:
        messages.info(request, "Not extended: " + ", ".join(other[:20]))
    return _back(model_admin, request)
