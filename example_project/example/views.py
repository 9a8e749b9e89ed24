"""Views of the example project: plain Django, the lock code lives in :mod:`.demos`."""

from __future__ import annotations

import math

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from django_redislock import locks
from django_redislock.describe.snapshot import lock_as_dict, with_waiters

from . import demos

MAX_HOLD_SECONDS = 600


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """The page listing what the example shows."""
    return render(
        request,
        "example/home.html",
        {"counter": demos.read_counter(), "held": list(locks.active())},
    )


@require_POST
def counter(request: HttpRequest) -> HttpResponse:
    """Run the critical-section demo, then go back home with the result."""
    use_lock = request.POST.get("without_lock") != "on"
    result = demos.count_in_threads(use_lock=use_lock)
    how = "inside locks.lock()" if use_lock else "WITHOUT a lock"
    text = (
        f"{result.threads} threads x {result.per_thread} increments {how} "
        f"in {result.seconds * 1000:.0f} ms: counter {result.before} -> {result.after}, "
        f"{result.lost} update(s) lost."
    )
    if result.fences:
        text += f" Fencing tokens {min(result.fences)} ... {max(result.fences)}."
    level = messages.SUCCESS if result.lost == 0 and not result.errors else messages.WARNING
    messages.add_message(request, level, text)
    return redirect("home")


@require_POST
def hold(request: HttpRequest) -> HttpResponse:
    """Hold a named lock for N seconds in a background thread."""
    name = request.POST.get("name", "").strip() or "demo:report"
    try:
        seconds = float(request.POST.get("seconds", "30"))
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_HOLD_SECONDS:
        messages.error(request, f"Seconds must be between 0 and {MAX_HOLD_SECONDS}.")
    elif len(name) > 200:
        messages.error(request, "That name is too long for this demo.")
    elif demos.hold_in_background(name, seconds):
        messages.success(request, f"Holding lock {name!r} for {seconds:g} s.")
    else:
        messages.warning(request, f"Lock {name!r} is already held.")
    return redirect("home")


@require_GET
def locks_json(request: HttpRequest) -> JsonResponse:
    """The held locks (``locks.active()``), optionally filtered by ``?prefix=``: each as
    ``manage.py redislock show NAME --json`` prints it, with its holders, liveness
    (``renewed_ago``, ``renewing``, ``overdue``), ``waiters`` in order and ``queue_length``."""
    prefix = request.GET.get("prefix", "")
    infos = with_waiters(locks, list(locks.active(prefix)))
    rows = sorted((lock_as_dict(info) for info in infos), key=lambda r: r["name"])
    return JsonResponse({"locks": rows})


@require_POST
def report(request: HttpRequest) -> HttpResponse:
    """Queue the ``build_report`` Celery task (single instance per account)."""
    from .tasks import build_report  # Celery is only needed for this demo

    try:
        account_id = int(request.POST.get("account_id", "1"))
        seconds = float(request.POST.get("seconds", "20"))
    except ValueError:
        messages.error(request, "Account and seconds must be numbers.")
        return redirect("home")
    result = build_report.delay(account_id, seconds)
    held = locks.get(f"report:{account_id}")
    if held is not None and held.task_id:
        messages.warning(
            request,
            f"Queued task {result.id}, but report:{account_id} is already held by task "
            f"{held.task_id}: the new task will be skipped unless that one finishes first.",
        )
    else:
        messages.success(request, f"Queued task {result.id} for account {account_id}.")
    return redirect("home")
