"""URLs of the example project."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from . import views

urlpatterns = [
    path("", views.home, name="home"),
    path("counter/", views.counter, name="counter"),
    path("hold/", views.hold, name="hold"),
    path("locks.json", views.locks_json, name="locks_json"),
    path("report/", views.report, name="report"),
    path("admin/", admin.site.urls),
]
