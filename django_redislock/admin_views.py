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
from dataclasses import dataclass, field
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

from .admin_contention import contention_page, history_context
from .admin_listing import scan_window
from .admin_query import REFRESH_CHOICES, filter_choices, params_of, qs, query_from, sort_links
from .admin_targets import Target, describe_primitive
from .conf import setting
from .describe import (
    Liveness,
    ago_text,
    describe_holder,
    describe_process,
    describe_task,
    liveness,
    queue_text,
    waiter_lines,
)
from .engine.info import HolderInfo, LockInfo
from .engine.validate import validate_name
from .exceptions import LockBackendError
from .manager import LockManager
from .models import HeldLock

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
        lease=_seconds(info.ttl),
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
            lease=_seconds(holder.ttl),
            extra=_extra(holder.extra),
            task_result_url=_task_result_url(model_admin, holder.task_id),
            liveness=liveness(holder),
        )
        for holder in info.holders
    ]


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
    context = {**_context(model_admin, request, "Redis is unavailable"), "error": str(exc)}
    return TemplateResponse(request, "django_redislock/admin/lock_error.html", context, status=503)


def _require_view(model_admin: ViewerAdmin, request: HttpRequest) -> None:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied


def changelist_view(model_admin: ViewerAdmin, request: HttpRequest) -> HttpResponse:
    """The list of held locks: search, filters, ordering, SCAN-windowed pages."""
    _require_view(model_admin, request)
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
        **_context(model_admin, request, "Locks held in Redis"),
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
    _require_view(model_admin, request)
    name = unquote(object_id)
    try:
        info = _current(model_admin, [validate_name(name)]).get(name)
    except (TypeError, ValueError):
        info = None
    mutex = info if info is not None and info.primitive == "mutex" else None
    context = {
        **_context(model_admin, request, f"Lock {name}"),
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
        **history_context(model_admin, name),
    }
    return TemplateResponse(
        request, "django_redislock/admin/lock_detail.html", context, status=200 if info else 404
    )


def contention_view(model_admin: ViewerAdmin, request: HttpRequest) -> HttpResponse:
    """Which lock groups cost most waiting lately (see :mod:`.admin_contention`)."""
    _require_view(model_admin, request)
    return contention_page(model_admin, request, _context(model_admin, request, "Lock contention"))


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
        return _back(model_admin, request, [])
    return targets


def _targets(request: HttpRequest) -> list[Target]:
    """The distinct targets posted, at most :data:`MAX_TARGETS` locks and holders in all."""
    targets: list[Target] = []
    seen: set[Target] = set()
    parts = 0
    for value in request.POST.getlist("target")[:MAX_TARGETS]:
        target = Target.decode(value)
        if target is None or target in seen:
            continue
        parts += len(target.parts())
        if parts > MAX_TARGETS:
            break
        seen.add(target)
        targets.append(target)
    return targets


def _current(model_admin: ViewerAdmin, names: list[str]) -> dict[str, LockInfo]:
    return {info.name: info for info in model_admin.lock_manager.get_many(names)}


def _back_url(model_admin: ViewerAdmin, request: HttpRequest, targets: list[Target]) -> str:
    """Where an action returns: the lock's detail page when it was started there (one
    lock), else the list with the query string it was started from."""
    if request.POST.get("return_to") == "detail" and len({t.name for t in targets}) == 1:
        return model_admin.url("change", quote(targets[0].name))
    # Only a query string is carried over, so the redirect cannot leave the list page.
    query = request.POST.get("list_qs", "").lstrip("?")
    return model_admin.url("changelist") + ("?" + query if query else "")


def _back(
    model_admin: ViewerAdmin, request: HttpRequest, targets: list[Target]
) -> HttpResponseRedirect:
    url = _back_url(model_admin, request, targets)
    if url != _back_url(model_admin, request, []) and not _current(model_admin, [targets[0].name]):
        url = _back_url(model_admin, request, [])  # the lock is gone: its page would be a 404
    return HttpResponseRedirect(url)


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


def _confirm_item(part: Target, now: LockInfo | None, first: bool) -> dict[str, Any]:
    """One row of the confirmation page: a lock, or one holder of one."""
    status = part.status(now)
    holder = part.holder_in(now)
    if part.shared:
        held_as = describe_primitive(now)[1] if now else ""
        description = describe_holder(holder) if holder else f"now {held_as}"
        lease = _seconds(holder.ttl) if holder else None
    else:
        description = describe_holder(now)
        lease = _seconds(now.ttl) if now else None
    return {
        "target": part,
        "first": first,
        "mode": part.mode or "lock",
        "holder": description,
        "info": now,
        "lease": lease,
        "changed": status == "changed",
    }


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
        for index, part in enumerate(target.parts()):
            items.append(_confirm_item(part, now, index == 0))
        if target.holders and now is not None:
            seen = {(owner, fence) for owner, fence, _ in target.holders}
            new = sum(1 for h in now.holders if (h.owner, h.fencing_token) not in seen)
            if new:
                items.append({"target": target, "arrived": new})
    verb = "Release" if action == "release" else "Extend"
    count = len(targets)
    what = "holder" if all(t.mode for t in targets) else "lock"
    context = {
        **_context(model_admin, request, f"{verb} {count} {what}{'s' * (count != 1)}?"),
        "action": action,
        "action_url": model_admin.url(action),
        "items": items,
        "values": [t.encode() for t in targets],
        "shared": any(t.shared for t in targets),
        "seconds": seconds,
        "error": error,
        "list_qs": request.POST.get("list_qs", ""),
        "return_to": "detail" if request.POST.get("return_to") == "detail" else "",
        "back_url": _back_url(model_admin, request, targets),
    }
    return TemplateResponse(request, "django_redislock/admin/lock_confirm.html", context)


#: The primitive each holder mode belongs to, for the audit log.
_PRIMITIVE_OF_MODE = {"permit": "semaphore", "read": "read-write lock", "write": "read-write lock"}


def _holder_words(part: Target) -> str:
    """ "the read of read-write lock 'x'" for the audit log."""
    return f"the {part.mode} of {_PRIMITIVE_OF_MODE.get(part.mode, 'lock')} {part.name!r}"


@dataclass
class Outcome:
    """What one action did to the locks and holders it was given, for the messages."""

    #: Mutexes acted on, and holders of semaphores / read-write locks acted on.
    locks: int = 0
    holders: list[str] = field(default_factory=list)
    #: Mutexes now held by another owner or token; holders no longer holding.
    changed_locks: list[str] = field(default_factory=list)
    changed_holders: list[str] = field(default_factory=list)
    #: Locks no longer held at all.
    gone: set[str] = field(default_factory=set)
    #: "name (why)" for what could not be done.
    failed: list[str] = field(default_factory=list)

    def done(self, part: Target) -> None:
        """Count *part* as acted on."""
        if part.shared:
            self.holders.append(part.label())
        else:
            self.locks += 1

    def changed(self, part: Target) -> None:
        """Count *part* as left alone: the lock or holder changed since it was seen."""
        (self.changed_holders if part.shared else self.changed_locks).append(part.label())

    def report(self, request: HttpRequest, action: str, verb: str, by: str = "") -> None:
        """The messages for the operator: *action* "release", *verb* "released"."""
        if self.failed:
            messages.error(request, f"Could not {action}: " + _few(self.failed))
        n = self.locks
        if n:
            messages.success(request, f"{verb.capitalize()} {n} lock{'s' * (n != 1)}{by}.")
        n = len(self.holders)
        if n:
            messages.success(
                request, f"{verb.capitalize()} {n} holder{'s' * (n != 1)}{by}: {_few(self.holders)}"
            )
        n = len(self.gone)
        if n:
            messages.info(request, f"{n} lock{'s were' if n != 1 else ' was'} already released.")
        if self.changed_locks:
            messages.warning(
                request,
                f"Not {verb} because the lock changed owner since you looked: "
                + _few(self.changed_locks),
            )
        if self.changed_holders:
            messages.warning(
                request,
                f"Not {verb} because the holder no longer holds the lock (it was released, "
                "expired or taken again with a new fencing token since you looked): "
                + _few(self.changed_holders),
            )


def _few(labels: list[str], most: int = 20) -> str:
    return ", ".join(labels[:most]) + (" …" if len(labels) > most else "")


def release_view(model_admin: ViewerAdmin, request: HttpRequest) -> HttpResponse:
    """Force-release the selected locks or holders, after a confirmation page,
    comparing owners and tokens."""
    targets = _action_targets(model_admin, request, model_admin.has_release_permission)
    if isinstance(targets, HttpResponse):
        return targets
    if request.POST.get("confirm") != "yes":
        return _confirm_page(model_admin, request, "release", targets, "")
    manager = model_admin.lock_manager
    before = _current(model_admin, [t.name for t in targets])
    outcome = Outcome()
    for part in (part for target in targets for part in target.parts()):
        if part.name in outcome.gone or part.name not in before:
            outcome.gone.add(part.name)  # what was seen of it is gone too
            continue
        try:
            ok = manager.force_release(
                part.name, owner=part.owner, fencing_token=part.fence, unowned_only=part.unowned
            )
        except LockBackendError as exc:
            outcome.failed.append(f"{part.label()} ({exc})")
            continue
        if ok:
            outcome.done(part)
            _log(request, part.name, DELETION, _release_message(part, before.get(part.name)))
        elif part.name in _current(model_admin, [part.name]):
            outcome.changed(part)
        else:
            outcome.gone.add(part.name)
    outcome.report(request, "release", "released")
    return _back(model_admin, request, targets)


def _release_message(part: Target, before: LockInfo | None) -> str:
    token = part.fence if part.fence is not None else "?"
    if part.shared:
        holder = describe_holder(part.holder_in(before))
        return (
            f"Force-released {_holder_words(part)} held by owner {part.owner or '?'} "
            f"({holder}), fencing token {token}."
        )
    return (
        f"Force-released lock {part.name!r} held by owner {part.owner or '?'} "
        f"({describe_holder(before)}), fencing token {token}."
    )


def extend_view(model_admin: ViewerAdmin, request: HttpRequest) -> HttpResponse:
    """Add time to the leases of the selected locks or holders, after a confirmation page."""
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
    outcome = Outcome()
    other = []
    for part in (part for target in targets for part in target.parts()):
        result = model_admin.lock_manager.force_extend(
            part.name,
            seconds,
            owner=part.owner,
            fencing_token=part.fence,
            unowned_only=part.unowned,
        )
        if result.extended:
            outcome.done(part)
            token = part.fence if part.fence is not None else "?"
            what = _holder_words(part) if part.shared else f"lock {part.name!r}"
            _log(
                request,
                part.name,
                CHANGE,
                f"Extended the lease of {what} by {seconds:g} s to {result.ttl:.1f} s "
                f"(owner {part.owner or '?'}, fencing token {token}).",
            )
        elif result.status == "changed":
            outcome.changed(part)
        else:
            why = "no expiry" if result.status == "no-expiry" else "gone"
            other.append(f"{part.label()} ({why})")
    outcome.report(request, "extend", "extended", f" by {seconds:g} s")
    if other:
        messages.info(request, "Not extended: " + _few(other))
    return _back(model_admin, request, targets)
