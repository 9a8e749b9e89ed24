"""The URLconf of tests/tx_proc.py's children: a guarded read-modify-write per database."""

from __future__ import annotations

from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path

from django_redislock import single_instance


@single_instance("tx:counter", timeout=60)
def count(request: HttpRequest) -> HttpResponse:
    """Read each counted database's counter and write it back one higher (not atomic by
    itself: ``ATOMIC_REQUESTS`` and the lock make it so); answer what was read."""
    seen = {}
    for alias in settings.TX_COUNTED:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT n FROM counter WHERE id = 1")
            (value,) = cursor.fetchone()
            cursor.execute("UPDATE counter SET n = %s WHERE id = 1", [value + 1])
        seen[alias] = value
    return JsonResponse(seen)


urlpatterns = [path("count/", count)]
