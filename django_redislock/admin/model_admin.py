"""The admin lock viewer: "Locks" under "Redis locks" in the Django admin.

Registered on ``django.contrib.admin.site`` automatically (admin autodiscovery
imports this module), so no ``urls.py`` change is needed. To show it on another
admin site::

    from django_redislock.admin import HeldLockAdmin
    from django_redislock.models import HeldLock

    my_site.register(HeldLock, HeldLockAdmin)

Permissions: ``django_redislock.view_heldlock`` to see the pages,
``django_redislock.release_lock`` to force-release and
``django_redislock.extend_lock`` to extend leases. Each view checks them itself.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import update_wrapper
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse

from ..exceptions import LockBackendError
from ..models import HeldLock
from ..primitives.manager import LockManager, locks
from . import actions as admin_actions
from . import views as admin_views


class HeldLockAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Serves the lock list, detail and action pages through :meth:`get_urls`."""

    #: The manager whose Redis and key prefix are shown.
    lock_manager: LockManager = locks
    #: Rows per page.
    list_per_page = 100
    #: Rows one request collects (sorting and paging apply within this window).
    scan_window = 1000
    #: Most lock keys one request loads while searching/filtering.
    scan_budget = 20000
    #: SCAN ``COUNT`` hint; whole batches are kept, so a window may exceed scan_window by this.
    scan_batch = 1000

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Locks are taken by code, never added in the admin."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Locks are not edited as forms (see release/extend permissions)."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Deleting is the release action, guarded by ``release_lock``."""
        return False

    def has_release_permission(self, request: HttpRequest) -> bool:
        """Whether the user may force-release locks."""
        return self._has_perm(request, "release_lock")

    def has_extend_permission(self, request: HttpRequest) -> bool:
        """Whether the user may extend the lease of other holders' locks."""
        return self._has_perm(request, "extend_lock")

    def _has_perm(self, request: HttpRequest, codename: str) -> bool:
        user: Any = request.user
        return bool(user.has_perm(f"{self.opts.app_label}.{codename}"))

    def url(self, page: str, *args: Any) -> str:
        """The URL of one of this admin's pages on its admin site."""
        opts = self.opts
        return reverse(
            f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_{page}", args=args
        )

    def _wrap(self, view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                return view(request, *args, **kwargs)
            except LockBackendError as exc:
                return admin_views.backend_unavailable(self, request, exc)

        def wrapper(*args: Any, **kwargs: Any) -> HttpResponse:
            return self.admin_site.admin_view(guarded)(*args, **kwargs)

        return update_wrapper(wrapper, view)

    def get_urls(self) -> list[URLPattern]:
        """The list, detail, release, extend and contention pages (no add/change/delete
        forms)."""
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", self._wrap(self.changelist_view), name=f"{name}_changelist"),
            path("release/", self._wrap(self.release_view), name=f"{name}_release"),
            path("extend/", self._wrap(self.extend_view), name=f"{name}_extend"),
            path("contention/", self._wrap(self.contention_view), name=f"{name}_contention"),
            path("<path:object_id>/change/", self._wrap(self.change_view), name=f"{name}_change"),
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The list of held locks."""
        return admin_views.changelist_view(self, request)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """The detail page of one lock (read-only; actions are buttons)."""
        return admin_views.change_view(self, request, object_id)

    def release_view(self, request: HttpRequest) -> HttpResponse:
        """Confirm, then force-release the selected locks."""
        return admin_actions.release_view(self, request)

    def extend_view(self, request: HttpRequest) -> HttpResponse:
        """Confirm, then extend the leases of the selected locks."""
        return admin_actions.extend_view(self, request)

    def contention_view(self, request: HttpRequest) -> HttpResponse:
        """Which lock groups cost most waiting lately (the contention overview)."""
        return admin_views.contention_view(self, request)


admin.site.register(HeldLock, HeldLockAdmin)
