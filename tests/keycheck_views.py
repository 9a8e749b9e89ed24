"""Guarded views, good and bad, for the lock key checks (tests/test_key_checks.py)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import include, path, re_path
from django.utils.decorators import method_decorator
from django.views import View

from django_redislock import single_instance


@method_decorator(single_instance("invoice:{pk}"), name="post")
class BadInvoiceView(View):
    """The key names {pk}, the method takes ``id``: every POST would fail."""

    def post(self, request: HttpRequest, id: int) -> HttpResponse:
        return HttpResponse("ran")


@method_decorator(single_instance("invoice:{pk}:{request.user.pk}"), name="post")
class GoodInvoiceView(View):
    def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        return HttpResponse("ran")


@method_decorator(single_instance("order:{pk}"), name="dispatch")
class DispatchView(View):
    """Guarded on ``dispatch(request, *args, **kwargs)``: {pk} must come from the URL."""

    def get(self, request: HttpRequest, **kwargs: Any) -> HttpResponse:
        return HttpResponse("ran")


@single_instance("export:{slug}")
def export(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    return HttpResponse("ran")


@single_instance(lambda request, **kwargs: "anything")
def by_callable(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    return HttpResponse("ran")


@single_instance(single_instance.ARGS)
def by_args(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    return HttpResponse("ran")


@single_instance("legacy:{year}")
def legacy(request: HttpRequest, year: str) -> HttpResponse:
    return HttpResponse("ran")


account_urls = [path("export/", export)]

urlpatterns = [
    path("bad-invoice/<int:id>/", BadInvoiceView.as_view()),
    path("good-invoice/<int:pk>/", GoodInvoiceView.as_view()),
    path("order/<int:pk>/", DispatchView.as_view()),
    path("order-by-id/<int:id>/", DispatchView.as_view()),
    path("export/<slug:slug>/", export),
    path("export-all/", export, {"slug": "all"}),
    path("export-none/", export),
    path("account/<slug:slug>/", include(account_urls)),
    re_path(r"^legacy/(\d+)/$", legacy),  # passed by position: the URL is not compared
    path("callable/", by_callable),
    path("args/", by_args),
]
