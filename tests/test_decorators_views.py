"""``@single_instance`` on Django views: 409 + Retry-After through the real test clients."""

from __future__ import annotations

import threading
import time
from typing import Any

import django
import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import AsyncClient, Client
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt

from django_redislock import LockInfo, LockNotAcquired, locks, single_instance

pytestmark = pytest.mark.urls(__name__)


def _seen(name: str) -> HttpResponse:
    info = locks.get(name)
    return JsonResponse(
        {"kind": info.kind if info else None, "purpose": info.purpose if info else None}
    )


@csrf_exempt
@single_instance("invoice:{pk}", ttl=30)
def invoice(request: HttpRequest, pk: int) -> HttpResponse:
    return _seen(f"invoice:{pk}")


# No csrf_exempt on the async views: Django's test clients do not enforce CSRF,
# and before Django 5.0 csrf_exempt/login_required turn an async view into a
# sync one that returns an unawaited coroutine.
@single_instance("invoice:{pk}", ttl=30)
async def invoice_async(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("async ran")


@method_decorator(csrf_exempt, name="dispatch")
@method_decorator(single_instance("invoice:{pk}"), name="post")
class InvoiceView(View):
    def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        return HttpResponse("cbv ran")


@method_decorator(single_instance("invoice:{pk}"), name="post")
class AsyncInvoiceView(View):
    async def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        return HttpResponse("async cbv ran")


@login_required
@single_instance("report:{request.user.pk}")
def outer_login(request: HttpRequest) -> HttpResponse:
    return HttpResponse("report ran")


@single_instance("report:{request.user.pk}")
@login_required
def inner_login(request: HttpRequest) -> HttpResponse:
    return HttpResponse("report ran")


@login_required
@single_instance("report:{request.user.pk}")
async def outer_login_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("report ran")


def _busy(request: HttpRequest, info: LockInfo | None) -> HttpResponse:
    return HttpResponse(f"busy, held by {info.owner if info else '?'}", status=423)


@csrf_exempt
@single_instance("invoice:{pk}", on_locked=_busy)
def custom(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("ran")


@csrf_exempt
@single_instance("invoice:{pk}", on_locked=HttpResponse("come back later", status=503))
def fixed(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("ran")


@csrf_exempt
@single_instance("invoice:{pk}", on_locked="raise")
def raising(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("ran")


@csrf_exempt
@single_instance("export:{tenant}", limit=2, ttl=30)
def export(request: HttpRequest, tenant: int) -> HttpResponse:
    return _seen(f"export:{tenant}")


urlpatterns = [
    path("export/<int:tenant>/", export),
    path("invoice/<int:pk>/", invoice),
    path("invoice-async/<int:pk>/", invoice_async),
    path("invoice-cbv/<int:pk>/", InvoiceView.as_view()),
    path("invoice-acbv/<int:pk>/", AsyncInvoiceView.as_view()),
    path("outer/", outer_login),
    path("inner/", inner_login),
    path("outer-async/", outer_login_async),
    path("custom/<int:pk>/", custom),
    path("raising/<int:pk>/", raising),
    path("fixed/<int:pk>/", fixed),
]


@pytest.fixture
def held() -> Any:
    """invoice:17 held by someone else with a 20 s lease."""
    lock = locks.lock("invoice:17", ttl=20, owner="other-request")
    assert lock.acquire(blocking=False)
    yield lock
    if lock.owned():
        lock.release()


def _assert_409(response: Any) -> None:
    assert response.status_code == 409
    assert 18 <= int(response["Retry-After"]) <= 20  # from the holder's remaining lease
    assert "already running" in response.content.decode()


def test_sync_view_runs_under_the_lock() -> None:
    response = Client().post("/invoice/17/")
    assert response.status_code == 200
    assert response.json() == {"kind": "view", "purpose": "POST /invoice/17/"}
    assert locks.get("invoice:17") is None


@pytest.mark.parametrize("url", ["/invoice/17/", "/invoice-cbv/17/"])
def test_sync_views_answer_409_when_held(held: Any, url: str) -> None:
    _assert_409(Client().post(url))
    assert Client().post(url.replace("17", "18")).status_code == 200


@pytest.mark.parametrize(
    "url",
    [
        "/invoice-async/17/",
        pytest.param(
            "/invoice-acbv/17/",
            marks=pytest.mark.skipif(
                django.VERSION < (5, 0),
                reason="Django < 5.0's method_decorator does not keep async methods async",
            ),
        ),
    ],
)
def test_async_views_answer_409_when_held(held: Any, url: str) -> None:
    client = AsyncClient()
    _assert_409(async_to_sync(client.post)(url))
    ok = async_to_sync(client.post)(url.replace("17", "18"))
    assert ok.status_code == 200 and b"ran" in ok.content
    held.release()
    assert async_to_sync(client.post)(url).status_code == 200
    assert locks.get("invoice:17") is None


def test_on_locked_callable_and_raise(held: Any) -> None:
    response = Client().post("/custom/17/")
    assert response.status_code == 423 and response.content == b"busy, held by other-request"
    fixed = Client().post("/fixed/17/")
    assert fixed.status_code == 503 and fixed.content == b"come back later"
    with pytest.raises(LockNotAcquired):
        Client(raise_request_exception=True).post("/raising/17/")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        "/outer/",
        "/inner/",
        pytest.param(
            "/outer-async/",
            marks=pytest.mark.skipif(
                django.VERSION < (5, 0),
                reason="Django < 5.0's login_required does not support async views",
            ),
        ),
    ],
)
def test_works_with_login_required_in_either_order(url: str) -> None:
    client = Client()
    assert client.get(url).status_code == 302  # anonymous: redirected to log in
    user = User.objects.create_user("alice", password="x")
    client.force_login(user)
    assert client.get(url).content == b"report ran"
    lock = locks.lock(f"report:{user.pk}", owner="elsewhere")
    assert lock.acquire(blocking=False)
    try:
        assert client.get(url).status_code == 409
    finally:
        lock.release()


def test_a_limited_view_answers_409_only_when_every_place_is_taken() -> None:
    first = locks.semaphore("export:3", 2, ttl=30, owner="first")
    assert first.acquire(blocking=False)
    assert Client().post("/export/3/").status_code == 200  # the second place
    second = locks.semaphore("export:3", 2, ttl=8, owner="second", auto_renew=False)
    assert second.acquire(blocking=False)
    response = Client().post("/export/3/")
    assert response.status_code == 409
    # A place frees when the first lease ends: the shorter one, not the longest.
    assert 1 <= int(response["Retry-After"]) <= 8
    first.release()
    second.release()


def _handed_over_after(name: str, hold: float) -> None:
    """One real hand-off of *name* after a hold of about *hold* seconds (its history)."""
    first = locks.lock(name, owner="earlier request", ttl=30)
    assert first.acquire(blocking=False)
    thread = threading.Thread(
        target=lambda: locks.lock(name, owner="next request", ttl=30).acquire(timeout=10)
    )
    thread.start()
    for _ in range(500):
        info = locks.get(name)
        if info is not None and info.queue_length == 1:
            break
        time.sleep(0.01)
    time.sleep(hold)  # (the hold the history records)
    first.release()
    thread.join(10)
    locks.force_release(name, owner="next request")


@pytest.mark.parametrize("url", ["/invoice/17/", "/invoice-async/17/"])
def test_retry_after_follows_recent_holds_not_the_whole_lease(url: str) -> None:
    _handed_over_after("invoice:17", 1.2)  # recent holds took ~1.2 s
    lock = locks.lock("invoice:17", ttl=30, owner="other-request")
    assert lock.acquire(blocking=False)
    try:
        client = Client() if "async" not in url else None
        response = client.post(url) if client else async_to_sync(AsyncClient().post)(url)
        assert response.status_code == 409
        assert response["Retry-After"] == "2"  # ceil(1.2 s - its age), not its 30 s lease
        assert "try again in 2 s" in response.content.decode()
    finally:
        lock.release()


def test_retry_after_is_never_more_than_the_remaining_lease() -> None:
    _handed_over_after("invoice:17", 1.2)
    lock = locks.lock("invoice:17", ttl=1, owner="other-request", auto_renew=False)
    assert lock.acquire(blocking=False)
    try:
        response = Client().post("/invoice/17/")
        assert response.status_code == 409
        assert response["Retry-After"] == "1"  # its lease ends before recent holds did
    finally:
        if lock.owned():
            lock.release()
