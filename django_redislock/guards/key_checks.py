"""System checks of the lock keys of guarded views and Celery tasks (``manage.py check``).

A key template naming an argument the function does not have is a ValueError
when ``@single_instance`` decorates the function, at import. These checks find
what import time does not:

* **views reachable from the URLconf** -- a class-based view decorated through
  ``method_decorator`` (Django applies the decorator at each request, so a bad
  template fails every request and nothing at import), and a template field the
  view only gets through ``**kwargs`` that its URL pattern never captures;
* **Celery tasks** of the process's Celery apps -- their task modules are
  imported the way a worker imports them (``app.loader.import_default_modules()``:
  a module the web process never imports, with a bad ``@single_instance``
  template, fails only when a worker starts), the app is finalized (a
  ``SingleInstanceTask`` configured through task options, ``@shared_task(base=
  SingleInstanceTask, lock_key=...)``, is built then), and each registered
  ``SingleInstanceTask`` builds its lock options (a subclass that changes
  ``lock_key`` without a new ``run`` builds them at its first run).

Key callables and ``single_instance.ARGS`` keys cannot be checked before a call;
attribute and index lookups (``{user.pk}``) are checked by their argument name.

* ``django_redislock.E005`` -- a lock key or lock option of a view or task that
  fails every call.
* ``django_redislock.W008`` -- the Celery task modules could not be loaded for
  another reason, so their keys were not checked.

The checks never raise: anything unexpected while looking is a W008.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.core import checks

from .guard import GuardConfig, task_hooks
from .keys_template import ARGS, KeySpec, template_fields

_PACKAGE_DIR = str(Path(__file__).resolve().parent)


@checks.register("django_redislock")
def check_lock_keys(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E005/W008 for the views of the URLconf and the tasks of the Celery apps."""
    from django.urls import get_resolver

    problems: list[checks.CheckMessage] = []
    try:
        patterns = get_resolver().url_patterns
    except Exception:  # a broken URLconf: Django's own URL checks report it
        patterns = []
    problems += view_key_problems(patterns)
    for app in _celery_apps():
        problems += task_key_problems(app)
    return problems


# -- views -----------------------------------------------------------------------


def view_key_problems(patterns: Any) -> list[checks.CheckMessage]:
    """E005 for each guarded view under *patterns* (a URLconf's ``urlpatterns``)."""
    problems: list[checks.CheckMessage] = []
    try:
        for route, callback, captured in _walk(patterns, "", frozenset()):
            for where, config, func, is_method in _guards_of(callback):
                problems += _view_problems(route, where, config, func, is_method, captured)
    except Exception as exc:  # never crash the checks
        problems.append(_could_not_check("the views of the URLconf", exc))
    return problems


#: A URL's captured keyword names, or None when it passes positional arguments.
_Captured = frozenset[str] | None


def _walk(patterns: Any, prefix: str, captured: _Captured) -> Iterator[tuple[str, Any, _Captured]]:
    """(route, view callable, names the route passes as keyword arguments) of each URL."""
    for entry in patterns:
        regex = entry.pattern.regex
        names = frozenset(regex.groupindex)
        here: _Captured = None
        if captured is not None and regex.groups == len(names):  # no unnamed groups
            here = captured | names | frozenset(getattr(entry, "default_args", None) or ())
        route = prefix + str(entry.pattern)
        if hasattr(entry, "url_patterns"):  # an include()
            if here is not None:
                here = here | frozenset(getattr(entry, "default_kwargs", None) or ())
            try:
                children = entry.url_patterns
            except Exception:  # an include() that cannot be imported: Django reports it
                continue
            yield from _walk(children, route, here)
        else:
            yield route, entry.callback, here


def _guards_of(callback: Any) -> Iterator[tuple[str, GuardConfig, Callable[..., Any], bool]]:
    """(name, guard config, the function the key's arguments come from, whether that
    is a method whose ``self`` requests do not pass) of each guard of a URL's view."""
    view_class = getattr(callback, "view_class", None)
    if view_class is None:
        config = getattr(callback, "_redislock_config", None)
        if isinstance(config, GuardConfig):
            yield config.spec.base, config, inspect.unwrap(callback), False
        return
    # (as_view() copies dispatch's attributes onto the view function: look at the class)
    for method_name in ("dispatch", *getattr(view_class, "http_method_names", ())):
        method: Any = getattr(view_class, method_name, None)
        config = getattr(method, "_redislock_config", None)
        if isinstance(config, GuardConfig):
            # method_decorator gave the config a stand-in's signature: check the method's own.
            where = f"{view_class.__module__}.{view_class.__qualname__}.{method_name}"
            yield where, config, inspect.unwrap(method), True


def _view_problems(
    route: str,
    where: str,
    config: GuardConfig,
    func: Callable[..., Any],
    is_method: bool,
    captured: _Captured,
) -> list[checks.CheckMessage]:
    key = config.spec.key
    if not isinstance(key, str) or key == ARGS:
        return []  # a callable, ARGS or None: nothing to check before a call
    try:
        spec = KeySpec(key, func, base=where, skip_self=is_method)
    except (TypeError, ValueError) as exc:
        return [
            _error(
                f"URL {route!r}: {exc}; every request to it fails.",
                "Name one of the view's arguments in the key template (for a class-based "
                "view: the method's arguments after self), or pass a key callable.",
            )
        ]
    if captured is None or spec.signature is None:
        return []
    params = spec.signature.parameters
    named = {name for name, p in params.items() if p.kind is not p.VAR_KEYWORD}
    missing = [field for field in template_fields(key) if field not in named | captured]
    if not missing:
        return []
    fields = ", ".join(f"{{{field}}}" for field in missing)
    return [
        _error(
            f"URL {route!r}: the lock key {key!r} of {where} names {fields}, which the view "
            "would only get through **kwargs, and this URL does not pass it: every request "
            "to it fails (ValueError: cannot render lock key).",
            "Capture it in the URL pattern (e.g. <int:pk>), pass it in the pattern's "
            "kwargs, or name an argument the URL passes.",
        )
    ]


# -- Celery tasks ----------------------------------------------------------------


def _celery_apps() -> list[Any]:
    """The Celery apps this process made (none when it did not import Celery); not
    Celery's fallback app (made, without fixups, when ``current_app`` is asked for
    before any app exists), which no project configured."""
    if "celery" not in sys.modules:
        return []
    try:
        from celery import _state

        fallback = getattr(_state, "default_app", None)
        if fallback is not None and fallback.fixups:
            fallback = None  # a project's app that became the default, not Celery's own
        return [app for app in _state._get_active_apps() if app is not fallback]
    except Exception:  # a Celery without these internals: nothing to check
        return []


def task_key_problems(app: Any) -> list[checks.CheckMessage]:
    """E005/W008 for the tasks of the Celery *app*: imports its task modules as a
    worker does, finalizes it, and builds each single-instance task's lock options."""
    what = f"the tasks of Celery app {app.main!r}"
    if _loading:
        return []  # called again from inside the import below (Celery's Django fixup)
    _loading.append(app)
    try:
        _import_task_modules(app)
        if not app.finalized and not app.autofinalize:
            return []  # the app forbids finalizing here; its worker will
        tasks = dict(app.tasks)
    except Exception as exc:
        return [_load_problem(what, exc)]
    finally:
        _loading.clear()
    # The Celery integration's hook (registered when django_redislock.celery is imported,
    # as the app's ready() does whenever Celery is installed).
    options_of = [h.lock_options_of for h in task_hooks() if h.lock_options_of is not None]
    problems: list[checks.CheckMessage] = []
    for name, task in sorted(tasks.items()):
        try:
            for lock_options_of in options_of:
                lock_options_of(task)
        except (TypeError, ValueError) as exc:
            problems.append(
                _error(
                    f"Celery task {name!r}: {exc}; every run of it fails.",
                    "Correct the task's lock options (lock_key names one of run()'s arguments).",
                )
            )
        except Exception as exc:
            problems.append(_could_not_check(f"Celery task {name!r}", exc))
    return problems


#: The app whose task modules are being imported (Celery's Django fixup runs the
#: system checks again when task modules are imported: they must not recurse).
_loading: list[Any] = []


def _import_task_modules(app: Any) -> None:
    """Import *app*'s task modules as its worker does at start-up (autodiscovered
    ``tasks`` modules, ``imports``, ``include``), without the system checks that
    Celery's Django fixup runs before them (these checks are already running)."""
    skip = os.environ.get("CELERY_SKIP_CHECKS")
    os.environ["CELERY_SKIP_CHECKS"] = "1"
    try:
        app.loader.import_default_modules()
    finally:
        if skip is None:
            del os.environ["CELERY_SKIP_CHECKS"]
        else:
            os.environ["CELERY_SKIP_CHECKS"] = skip


def _load_problem(what: str, exc: BaseException) -> checks.CheckMessage:
    """E005 when loading the tasks failed on a lock option (raised by this package's
    validation), else W008."""
    if isinstance(exc, (TypeError, ValueError)) and _raised_here(exc):
        return _error(
            f"Loading {what} failed: {exc}. A worker fails the same way when it starts "
            "(and the first task sent from this process too).",
            "Correct the lock key or option named above.",
        )
    return _could_not_check(what, exc)


def _raised_here(exc: BaseException) -> bool:
    """Whether *exc* was raised by code of this package (its innermost frame)."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR)


def _error(msg: str, hint: str) -> checks.CheckMessage:
    return checks.Error(msg, hint=hint, id="django_redislock.E005")


def _could_not_check(what: str, exc: BaseException) -> checks.CheckMessage:
    return checks.Warning(
        f"The lock keys of {what} could not be checked: {type(exc).__name__}: {exc}",
        hint="A worker would stop on the same error; run the import yourself "
        "(python -c 'import <module>') to see the traceback.",
        id="django_redislock.W008",
    )
