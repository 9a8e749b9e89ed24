"""The operator's actions in the admin lock viewer: force release and extend.

Each action is a POST by staff with the action's permission, naming the locks
(or single holders of a semaphore or read-write lock) as they were seen on the
list or detail page. It shows a confirmation page first, then acts only on what
still has the owner and fencing token the operator saw, records what it did in
the admin's LogEntry ("Recent actions"), and returns to the page it came from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.contrib import messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse

from ..describe.snapshot import describe_holder
from ..engine.info import HolderInfo, LockInfo
from ..exceptions import LockBackendError
from ..models import HeldLock
from .targets import Target, describe_primitive
from .views import ViewerAdmin, current_locks, lease_seconds, page_context, require_view

#: Most locks one action request may act on.
MAX_TARGETS = 1000
#: Longest lease extension an operator may grant at once (seconds).
MAX_EXTEND_SECONDS = 7 * 86400


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
    require_view(model_admin, request)
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
    if url != _back_url(model_admin, request, []) and not current_locks(
        model_admin, [targets[0].name]
    ):
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
    seen = _acted_on(part, now)
    if seen is None and part.shared:
        description = f"now {describe_primitive(now)[1] if now else ''}"
    else:
        description = describe_holder(seen)
    return {
        "target": part,
        "first": first,
        "mode": part.mode or "lock",
        "holder": description,
        "info": now,
        "lease": lease_seconds(seen.ttl) if seen else None,
        "changed": part.status(now) == "changed",
    }


def _acted_on(part: Target, info: LockInfo | None) -> LockInfo | HolderInfo | None:
    """What *part* acts on in *info*: the holder it names (semaphore, read-write
    lock), or the lock itself (a mutex, whoever holds it now)."""
    return part.holder_in(info) if part.shared else info


def _confirm_page(
    model_admin: ViewerAdmin,
    request: HttpRequest,
    action: str,
    targets: list[Target],
    seconds: str,
    error: str | None = None,
) -> HttpResponse:
    current = current_locks(model_admin, [t.name for t in targets])
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
        **page_context(model_admin, request, f"{verb} {count} {what}{'s' * (count != 1)}?", verb),
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
    before = current_locks(model_admin, [t.name for t in targets])
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
        elif part.name in current_locks(model_admin, [part.name]):
            outcome.changed(part)
        else:
            outcome.gone.add(part.name)
    outcome.report(request, "release", "released")
    return _back(model_admin, request, targets)


def _release_message(part: Target, before: LockInfo | None) -> str:
    return (
        f"Force-released {part.subject()} held by owner {part.owner or '?'} "
        f"({describe_holder(_acted_on(part, before))}), fencing token {part.token_text}."
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
            _log(
                request,
                part.name,
                CHANGE,
                f"Extended the lease of {part.subject()} by {seconds:g} s to {result.ttl:.1f} s "
                f"(owner {part.owner or '?'}, fencing token {part.token_text}).",
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
