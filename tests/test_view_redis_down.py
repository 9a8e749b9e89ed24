"""A guarded view when Redis is down: 503 (fail closed, the default) or run unguarded (open).

Redis is really unreachable here: the locks go through the loopback TCP proxy of
tests/tcp_proxy.py in front of the test redis-server, and the proxy is set down
(every connection cut, new ones refused) -- no mock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path

from django_redislock import LockBackendError, locks, single_instance
from django_redislock.guards.decorators import REDIS_DOWN_RETRY_AFTER
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.urls(__name__)

#: Each view appends its name when its body runs.
ran: list[str] = []
#: The proxy of the running test (the views that cut Redis mid-request use it).
current: dict[str, TcpProxy] = {}


def _body(label: str, key: str | None = None) -> HttpResponse:
    """Record the run; with *key*, say whether that lock is held (Redis must be up)."""
    ran.append(label)
    if key is None:
        return HttpResponse(f"{label} ran")
    return HttpResponse(f"{label} ran; held={locks.get(key) is not None}")


@single_instance("report:{pk}")
def closed_view(request: HttpRequest, pk: int) -> HttpResponse:
    return _body("closed", f"report:{pk}")


@single_instance("report:{pk}", on_redis_error="open")
def open_view(request: HttpRequest, pk: int) -> HttpResponse:
    return _body("open")


@single_instance("report:{pk}", on_redis_error="closed")
def explicit_closed_view(request: HttpRequest, pk: int) -> HttpResponse:
    return _body("explicit-closed")


@single_instance("report:{pk}")
def default_view(request: HttpRequest, pk: int) -> HttpResponse:
    return _body("default")


def _custom(request: HttpRequest, error: LockBackendError) -> HttpResponse:
    return HttpResponse(f"custom: {type(error).__name__}", status=502)


@single_instance("report:{pk}", on_redis_error=_custom)
def custom_view(request: HttpRequest, pk: int) -> HttpResponse:
    return _body("custom")


@single_instance("report:{pk}")
async def closed_async(request: HttpRequest, pk: int) -> HttpResponse:
    ran.append("closed-async")
    return HttpResponse("closed-async ran")


@single_instance("report:{pk}", on_redis_error="open")
async def open_async(request: HttpRequest, pk: int) -> HttpResponse:
    ran.append("open-async")
    return HttpResponse("open-async ran")


async def _acustom(request: HttpRequest, error: LockBackendError) -> HttpResponse:
    return HttpResponse("async custom", status=502)


@single_instance("report:{pk}", on_redis_error=_acustom)
async def custom_async(request: HttpRequest, pk: int) -> HttpResponse:
    ran.append("custom-async")
    return HttpResponse("custom-async ran")


@single_instance("cut:{pk}", ttl=1)
def cut_view(request: HttpRequest, pk: int) -> HttpResponse:
    current["proxy"].set_down(True)  # Redis goes away while the view runs
    return _body("cut")


@single_instance("cut:{pk}", ttl=1)
async def cut_async(request: HttpRequest, pk: int) -> HttpResponse:
    current["proxy"].set_down(True)
    ran.append("cut-async")
    return HttpResponse("cut-async ran")


urlpatterns = [
    path("closed/<int:pk>/", closed_view),
    path("open/<int:pk>/", open_view),
    path("explicit-closed/<int:pk>/", explicit_closed_view),
    path("default/<int:pk>/", default_view),
    path("custom/<int:pk>/", custom_view),
    path("closed-async/<int:pk>/", closed_async),
    path("open-async/<int:pk>/", open_async),
    path("custom-async/<int:pk>/", custom_async),
    path("cut/<int:pk>/", cut_view),
    path("cut-async/<int:pk>/", cut_async),
]


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    """The locks' Redis behind a proxy the test can set down."""
    port = int(settings.REDIS_URL.rsplit(":", 1)[1].split("/")[0])
    tcp = TcpProxy(port)
    current["proxy"] = tcp
    ran.clear()
    url = f"{tcp.url}?socket_timeout=2&socket_connect_timeout=1"
    try:
        with override_settings(REDISLOCK_URL=url, REDISLOCK_CLUSTER=False):
            yield tcp
    finally:
        tcp.close()
        current.clear()


def _get(url: str) -> Any:
    """GET *url* through the async test client for the async views, else the sync one."""
    if "async" in url:
        return async_to_sync(AsyncClient().get)(url)
    return Client().get(url)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "django_redislock" and r.levelno == logging.WARNING
    ]


def test_while_redis_is_up_the_views_run_under_their_lock(proxy: TcpProxy) -> None:
    response = Client().get("/closed/1/")
    assert (response.status_code, response.content) == (200, b"closed ran; held=True")


@pytest.mark.parametrize("url", ["/closed/1/", "/closed-async/1/"])
def test_fail_closed_by_default_answers_503_without_running_the_view(
    proxy: TcpProxy, caplog: pytest.LogCaptureFixture, url: str
) -> None:
    proxy.set_down(True)
    with caplog.at_level(logging.WARNING, logger="django_redislock"):
        response = _get(url)
    assert response.status_code == 503
    assert response["Retry-After"] == str(REDIS_DOWN_RETRY_AFTER)
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert b"Try again in 5 s" in response.content
    assert ran == []
    [message] = _warnings(caplog)
    assert "'report:1'" in message and "refused" in message
    assert "Connection closed" in message or "Error" in message


@pytest.mark.parametrize(("url", "label"), [("/open/2/", "open"), ("/open-async/2/", "open-async")])
def test_fail_open_runs_the_view_unguarded_and_logs_a_warning(
    proxy: TcpProxy, caplog: pytest.LogCaptureFixture, url: str, label: str
) -> None:
    proxy.set_down(True)
    with caplog.at_level(logging.WARNING, logger="django_redislock"):
        response = _get(url)
    assert response.status_code == 200
    assert ran == [label]
    [message] = _warnings(caplog)
    assert "'report:2'" in message and "WITHOUT its lock" in message
    assert f"GET {url}" in message


def test_the_setting_picks_the_default_and_the_argument_wins(proxy: TcpProxy) -> None:
    proxy.set_down(True)
    with override_settings(REDISLOCK_VIEW_ON_REDIS_ERROR="open"):
        assert Client().get("/default/3/").status_code == 200
        assert Client().get("/explicit-closed/3/").status_code == 503
    assert Client().get("/default/3/").status_code == 503
    assert ran == ["default"]


def test_a_callable_makes_the_response(proxy: TcpProxy) -> None:
    proxy.set_down(True)
    response = Client().get("/custom/4/")
    assert (response.status_code, response.content) == (502, b"custom: LockBackendError")
    response = async_to_sync(AsyncClient().get)("/custom-async/4/")
    assert (response.status_code, response.content) == (502, b"async custom")
    assert ran == []


def test_views_are_guarded_again_once_redis_is_back(proxy: TcpProxy) -> None:
    proxy.set_down(True)
    assert Client().get("/closed/5/").status_code == 503
    proxy.set_down(False)
    response = Client().get("/closed/5/")
    assert (response.status_code, response.content) == (200, b"closed ran; held=True")


@pytest.mark.parametrize(("url", "name"), [("/cut/6/", "cut:6"), ("/cut-async/7/", "cut:7")])
def test_redis_lost_during_the_view_keeps_its_response_and_the_lease_runs_out(
    proxy: TcpProxy, redis_client: Any, caplog: pytest.LogCaptureFixture, url: str, name: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="django_redislock"):
        response = _get(url)
    assert response.status_code == 200  # the view ran; not a 500 for its release
    assert any(f"releasing lock {name!r} failed" in m for m in _warnings(caplog))
    # Not renewed any more: the 1 s lease ends (the test Redis is reached directly).
    deadline = time.monotonic() + 5
    while redis_client.exists(f"redislock:{{{name}}}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not redis_client.exists(f"redislock:{{{name}}}")


def test_a_bad_value_is_refused_at_decoration_and_in_the_setting(proxy: TcpProxy) -> None:
    with pytest.raises(ValueError, match="on_redis_error must be 'closed'"):
        single_instance("x", on_redis_error="sometimes")
    with pytest.raises(ValueError, match="on_redis_error must be 'closed'"):
        single_instance("x", on_redis_error=None)
    proxy.set_down(True)
    with override_settings(REDISLOCK_VIEW_ON_REDIS_ERROR="sometimes"):
        with pytest.raises(ValueError, match="REDISLOCK_VIEW_ON_REDIS_ERROR must be"):
            Client().get("/default/8/")
    assert ran == []


@single_instance("plain:{n}", on_redis_error="open")
def plain_function(n: int) -> int:
    ran.append("plain")
    return n


@single_instance("plain:{n}", on_redis_error="open")
async def plain_async(n: int) -> int:
    ran.append("plain-async")
    return n


def test_plain_functions_raise_lock_backend_error_whatever_the_option(proxy: TcpProxy) -> None:
    proxy.set_down(True)
    with override_settings(REDISLOCK_VIEW_ON_REDIS_ERROR="open"):
        with pytest.raises(LockBackendError):
            plain_function(1)
        with pytest.raises(LockBackendError):
            async_to_sync(plain_async)(1)
    assert ran == []
