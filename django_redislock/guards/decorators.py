"""``@single_instance``: one running call at a time, for functions, views and Celery tasks.

One decorator, three behaviours chosen per call:

* a **Celery task** (the decorator stacked under ``@app.task``/``@shared_task``):
  the lock's owner is the task id; see :mod:`django_redislock.celery`;
* a **Django view** (the first argument is an ``HttpRequest``): when the lock is
  held, answer ``409 Conflict`` with ``Retry-After``; when Redis cannot be
  reached, answer ``503`` or run the view unguarded (``on_redis_error``);
* any other **function**, sync or ``async def``: when the lock is held, raise
  :class:`~django_redislock.LockNotAcquired` (or what ``on_locked`` says).

``async def`` functions and views use the asyncio lock (``aacquire``,
``async with``): a waiting call costs no thread. Each call has its own owner.
"""

from __future__ import annotations

import functools
import inspect
import logging
import secrets
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse

from ..conf import setting
from ..engine.guarding import guarding
from ..engine.history import HistoryEvent
from ..engine.info import LockInfo
from ..exceptions import LockBackendError
from ..primitives import at_once
from ..primitives.semaphore import validate_limit
from ..primitives.transactions import release_after_transactions
from ..settings_spec import validate_view_redis_error
from .guard import DEFAULT, GuardConfig, holder_text, not_acquired, retry_after, task_hooks
from .keys_template import ARGS, KeySpec
from .shaping import (
    Shaping,
    aacquire_admitted,
    acquire_admitted,
    check_coalesce,
    check_debounce,
    cooling,
    limited,
)

if TYPE_CHECKING:
    from ..primitives.lock import Lock
    from ..primitives.manager import LockManager

logger = logging.getLogger("django_redislock")

F = TypeVar("F", bound=Callable[..., Any])


def single_instance(
    key: str | Callable[..., str] | None = None,
    *,
    ttl: float | None = None,
    timeout: float | None = 0,
    on_locked: Any = DEFAULT,
    owner: str | Callable[..., str] | None = None,
    lock_on_retry: str = "keep",
    manager: LockManager | None = None,
    limit: int | None = None,
    on_redis_error: Any = DEFAULT,
    rate: str | tuple[int, float] | None = None,
    cooldown: float | None = None,
    on_limited: Any = None,
    coalesce: bool = False,
    debounce: float | None = None,
) -> Callable[[F], F]:
    """Let only one call of the decorated function run at a time, per lock key
    (or at most *limit* calls).

    :param key: the lock name: a ``str.format`` template over the function's
        arguments (``"sync:{account_id}"``, ``"{user.pk}"``), a callable
        receiving the call's arguments and returning the name, ``None`` (the
        function's dotted name: one call at a time, whatever the arguments) or
        :data:`single_instance.ARGS` (the dotted name plus a digest of all the
        arguments). Positional and keyword spellings give the same name.
    :param ttl: the lease in seconds (default ``REDISLOCK_DEFAULT_TTL``); the
        watchdog renews it while the call runs.
    :param timeout: how long to wait for a held lock before ``on_locked``
        applies (0 = do not wait, None = no limit).
    :param on_locked: what a call that finds the lock held does. Functions:
        raise ``LockNotAcquired`` (default), ``"skip"`` (return None), a
        callable ``(lock_info, *args, **kwargs)`` whose result is returned, or
        any other value to return. Views: a 409 response with ``Retry-After``
        (default), an ``HttpResponse``, a callable ``(request, lock_info)``, or
        ``"raise"``. Celery tasks: ``"skip"`` (default), ``"retry"``,
        ``"wait"``, ``"raise"`` or a callable ``(lock_info, *args, **kwargs)``.
    :param owner: an explicit owner string, or a callable receiving the call's
        arguments and returning one (default: the current thread for sync
        functions, a fresh token per call for views and async functions, the
        task id for Celery tasks).
    :param lock_on_retry: Celery tasks only: ``"keep"`` (default) holds the
        lock across ``self.retry()``, ``"release"`` frees it.
    :param manager: the LockManager to use (default ``django_redislock.locks``).
    :param limit: let up to this many calls run at once per lock key (a
        semaphore, see ``locks.semaphore``) instead of one; ``on_locked`` and
        ``timeout`` apply when all *limit* places are taken. Every user of a
        key must pass the same limit.
    :param on_redis_error: views only: what a request does when Redis cannot be
        reached (``LockBackendError``): ``"closed"`` answers ``503 Service
        Unavailable`` with ``Retry-After``, ``"open"`` runs the view without the
        lock (logged at WARNING), a callable ``(request, error)`` returns the
        response (may be async). Default: ``REDISLOCK_VIEW_ON_REDIS_ERROR``
        (``"closed"``). Plain functions and Celery tasks raise
        ``LockBackendError`` whatever this says.
    :param rate: at most this many starts per sliding window per lock key, by
        Redis's clock: ``"10/m"`` (per ``s``, ``m``, ``h``, ``d``, or ``"3/30s"``)
        or ``(count, seconds)``. See :mod:`django_redislock.guards.shaping`.
    :param cooldown: seconds the key stays taken after each run ends: at most one
        start per *cooldown* seconds, runs never overlap. Not with ``limit``.
    :param on_limited: what a start refused by ``rate`` or ``cooldown`` does.
        Functions: raise :class:`~django_redislock.RunLimited` (default),
        ``"skip"`` (return None), a callable ``(refusal, *args, **kwargs)``, or any
        other value to return. Views: ``429 Too Many Requests`` with
        ``Retry-After`` (default), an ``HttpResponse``, a callable ``(request,
        refusal)`` or ``"raise"``. Celery tasks: ``"defer"`` (default: the message
        comes back when a start can be admitted), ``"retry"``, ``"skip"``,
        ``"raise"`` or a callable ``(refusal, *args, **kwargs)``.
    :param coalesce: Celery tasks only: a call that finds the key held becomes the
        one pending run (the latest call's arguments), which starts when the running
        one ends; see :mod:`django_redislock.celery.coalesce`.
    :param debounce: Celery tasks only: run once the key has been quiet for this many
        seconds, with the last call's arguments; each call postpones the run. See
        :mod:`django_redislock.celery.debounce`.

    Raises ValueError at decoration time when a template names an argument the
    function does not have, or options do not combine (``cooldown`` with
    ``limit``, ``on_limited`` without ``rate`` or ``cooldown``), and TypeError when
    stacked above a Celery task decorator or applied to a class.
    """
    if lock_on_retry not in ("keep", "release"):
        raise ValueError(f"lock_on_retry must be 'keep' or 'release', not {lock_on_retry!r}")
    if limit is not None:
        validate_limit(limit)
    if not (on_redis_error is DEFAULT or callable(on_redis_error)):
        validate_view_redis_error(on_redis_error, "on_redis_error")
    shaping = Shaping.build(rate, cooldown, on_limited, limit=limit)
    coalescing = check_coalesce(
        coalesce,
        limit=limit,
        shaping=shaping,
        on_locked=None if on_locked is DEFAULT else on_locked,
        timeout=timeout,
    )
    quiet = check_debounce(
        debounce,
        coalesce=coalescing,
        limit=limit,
        shaping=shaping,
        on_locked=None if on_locked is DEFAULT else on_locked,
        timeout=timeout,
    )

    def decorate(func: F) -> F:
        _check_decoratable(func)
        config = GuardConfig(
            spec=KeySpec(key, func),
            ttl=ttl,
            timeout=timeout,
            on_locked=on_locked,
            owner=owner,
            lock_on_retry=lock_on_retry,
            manager=manager,
            limit=limit,
            on_redis_error=on_redis_error,
            shaping=shaping,
            coalesce=coalescing,
            debounce=quiet,
        )
        if inspect.iscoroutinefunction(func):
            wrapper = _async_wrapper(func, config)
        else:
            wrapper = _sync_wrapper(func, config)
        wrapper._redislock_config = config  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


single_instance.ARGS = ARGS  # type: ignore[attr-defined]


def _check_decoratable(func: Any) -> None:
    if isinstance(func, type):
        raise TypeError(
            f"@single_instance cannot decorate the class {func.__name__}; for a class-based "
            "view use @method_decorator(single_instance(...), name='dispatch') "
            "(or name='post'), for a Celery task class use SingleInstanceTask"
        )
    for hooks in task_hooks():
        hooks.check_decoratable(func)  # refuses a decorator stacked above @app.task
    if not callable(func):
        raise TypeError(f"@single_instance needs a function, not {type(func).__name__}")


def _call_owner(config: GuardConfig, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    owner = config.owner
    if callable(owner):
        return owner(*args, **kwargs)
    return owner


def _sync_wrapper(func: Callable[..., Any], config: GuardConfig) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for hooks in task_hooks():
            task = hooks.running_task(wrapper)
            if task is not None:  # the body of a task running now: the task owns the lock
                return hooks.run_task(task, config, func, args, kwargs)
        request = args[0] if args and isinstance(args[0], HttpRequest) else None
        name = config.spec.render(args, kwargs)
        owner = _call_owner(config, args, kwargs)
        if owner is None and request is not None:
            owner = secrets.token_hex(16)
        lock = _call_lock(config, name, owner, request)
        try:
            acquired, refusal = acquire_admitted(config, lock, wait=config.on_locked == "wait")
            info = None if acquired else config.lock_manager().get(name)
        except LockBackendError as error:
            if request is None:
                raise
            answer = _view_redis_error(config, name, request, error)
            return func(*args, **kwargs) if answer is _RUN_UNGUARDED else answer
        if not acquired:
            if request is not None:
                history = _recent_holds(config, name, info)
                return _view_locked(config, name, info, request, history)
            return _function_locked(config, name, info, args, kwargs)
        if refusal is not None:  # the rate or the cooldown: the hold is given back
            return limited(config, refusal, request, args, kwargs)
        return _run_held(config, lock, func, args, kwargs, request)

    return wrapper


def _run_held(
    config: GuardConfig,
    lock: Lock,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    request: HttpRequest | None,
) -> Any:
    # Same exit semantics as ``with lock:`` (LockLost when the lease was lost). Code
    # the call runs is the guard's owner for its name: it re-enters, never waits on it.
    try:
        with guarding(lock.name, lock.owner):
            result = func(*args, **kwargs)
    except BaseException:
        _release(config, lock, sys.exc_info(), request)
        raise
    _release(config, lock, (None, None, None), request)
    return result


def _release(config: GuardConfig, lock: Lock, exc_info: Any, request: HttpRequest | None) -> None:
    """Leave the call's lock as ``with lock:`` does, its cooldown (if any) started just
    before, in the release's round trip; for a view whose release Redis could not
    confirm, log it and keep the view's outcome (the lease runs out unrenewed).
    A view's lock is released only once the transactions it ran in have ended
    (``ATOMIC_REQUESTS``; see :mod:`django_redislock.primitives.transactions`): its
    cooldown starts when the view returns, as the release is put off."""
    cool = cooling(config, lock)
    if request is not None and release_after_transactions(lock):
        if cool is not None:
            at_once.run_prior_sync(cool, config.lock_manager().backend())
        return
    try:
        lock._leave(*exc_info, prior=cool)
    except LockBackendError as error:
        if request is None:
            raise
        _log_release_failure(lock, request, error)


async def _arelease(
    config: GuardConfig, lock: Lock, exc_info: Any, request: HttpRequest | None
) -> None:
    """:func:`_release` for asyncio. The transactions are asked about in the thread the
    view's sync code (``sync_to_async``) runs in: where they would be open."""
    cool = cooling(config, lock, asyncio=True)
    if request is not None and await sync_to_async(release_after_transactions)(lock):
        if cool is not None:
            await at_once.run_prior_async(cool, config.lock_manager().source.abackend())
        return
    try:
        await lock._aleave(*exc_info, prior=cool)
    except LockBackendError as error:
        if request is None:
            raise
        _log_release_failure(lock, request, error)


def _log_release_failure(lock: Lock, request: HttpRequest, error: LockBackendError) -> None:
    logger.warning(
        "redislock: request %s %s ran, but releasing lock %r failed (%s); it frees when "
        "its lease runs out",
        request.method,
        request.path,
        lock.name,
        error,
    )


def _async_wrapper(func: Callable[..., Any], config: GuardConfig) -> Callable[..., Any]:
    @functools.wraps(func)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        request = args[0] if args and isinstance(args[0], HttpRequest) else None
        if config.spec.may_block:
            name = await sync_to_async(config.spec.render)(args, kwargs)
        else:
            name = config.spec.render(args, kwargs)
        # One owner per call: an async call is not re-entrant through its guard.
        owner = _call_owner(config, args, kwargs) or secrets.token_hex(16)
        lock = _call_lock(config, name, owner, request)
        try:
            wait = config.on_locked == "wait"
            acquired, refusal = await aacquire_admitted(config, lock, wait=wait)
            info = None if acquired else await config.lock_manager().aget(name)
        except LockBackendError as error:
            if request is None:
                raise
            answer = _view_redis_error(config, name, request, error)
            if answer is _RUN_UNGUARDED:
                return await func(*args, **kwargs)
            return (await answer) if inspect.isawaitable(answer) else answer
        if not acquired:
            if request is not None:
                history = await _arecent_holds(config, name, info)
                response = _view_locked(config, name, info, request, history)
            else:
                response = _function_locked(config, name, info, args, kwargs)
            if inspect.isawaitable(response):
                response = await response
            return response
        if refusal is not None:  # the rate or the cooldown: the hold is given back
            response = limited(config, refusal, request, args, kwargs)
            return (await response) if inspect.isawaitable(response) else response
        try:
            with guarding(lock.name, lock.owner):
                result = await func(*args, **kwargs)
        except BaseException:
            await _arelease(config, lock, sys.exc_info(), request)
            raise
        await _arelease(config, lock, (None, None, None), request)
        return result

    return wrapper


def _call_lock(
    config: GuardConfig, name: str, owner: str | None, request: HttpRequest | None
) -> Lock:
    """The lock guarding one call of a view (with *request*) or a plain function."""
    if config.coalesce or config.debounce:
        raise TypeError(f"{config.spec.base}: coalesce and debounce only work on Celery tasks")
    return config.make_lock(
        name,
        owner,
        meta={
            "kind": "view" if request is not None else "function",
            "template": config.spec.template,
        },
        purpose=_purpose(config, request),
    )


def _purpose(config: GuardConfig, request: HttpRequest | None) -> str:
    if request is not None:
        return f"{request.method} {request.path}"[:200]
    return config.spec.base


def _function_locked(
    config: GuardConfig,
    name: str,
    info: LockInfo | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    on_locked = config.on_locked
    if on_locked is DEFAULT or on_locked in ("raise", "wait"):
        raise not_acquired(name, info)
    if on_locked == "retry":
        raise TypeError("on_locked='retry' only works on Celery tasks")
    logger.info(
        "redislock: call of %s skipped: lock %r held by %s",
        config.spec.base,
        name,
        holder_text(info),
    )
    if on_locked == "skip":
        return None
    if callable(on_locked):
        return on_locked(info, *args, **kwargs)
    return on_locked


def _recent_holds(config: GuardConfig, name: str, info: LockInfo | None) -> list[HistoryEvent]:
    """The lock's recent history, for a refused request's ``Retry-After`` (none when the
    lock is already free, or the history cannot be read: the lease then decides)."""
    if info is None:
        return []
    try:
        return config.lock_manager().history(name)
    except LockBackendError:
        return []


async def _arecent_holds(
    config: GuardConfig, name: str, info: LockInfo | None
) -> list[HistoryEvent]:
    """:func:`_recent_holds` for asyncio."""
    if info is None:
        return []
    try:
        return await config.lock_manager().ahistory(name)
    except LockBackendError:
        return []


def _view_locked(
    config: GuardConfig,
    name: str,
    info: LockInfo | None,
    request: HttpRequest,
    history: Sequence[HistoryEvent] = (),
) -> Any:
    on_locked = config.on_locked
    logger.info(
        "redislock: request %s %s refused: lock %r held by %s",
        request.method,
        request.path,
        name,
        holder_text(info),
    )
    if on_locked == "raise":
        raise not_acquired(name, info)
    if isinstance(on_locked, HttpResponse):
        return on_locked
    if callable(on_locked):
        return on_locked(request, info)
    seconds = retry_after(info, config, history)
    response = HttpResponse(
        f"This action is already running; try again in {seconds} s.\n",
        status=409,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(seconds)
    return response


#: ``Retry-After`` (seconds) of the 503 a view answers when Redis cannot be reached.
REDIS_DOWN_RETRY_AFTER = 5

#: :func:`_view_redis_error`'s answer for "run the view without its lock".
_RUN_UNGUARDED: Any = object()


def _view_redis_error(
    config: GuardConfig, name: str, request: HttpRequest, error: LockBackendError
) -> Any:
    """What a view request does when Redis could not be reached for its lock: a
    response (503, or the ``on_redis_error`` callable's, which may be awaitable),
    or :data:`_RUN_UNGUARDED`. Logged at WARNING with the lock's name and the error."""
    mode = config.on_redis_error
    if mode is DEFAULT:
        mode = setting("REDISLOCK_VIEW_ON_REDIS_ERROR")
    if mode == "open":
        logger.warning(
            "redislock: Redis unreachable for lock %r, so request %s %s runs WITHOUT its "
            "lock (on_redis_error='open'): %s",
            name,
            request.method,
            request.path,
            error,
        )
        return _RUN_UNGUARDED
    logger.warning(
        "redislock: Redis unreachable for lock %r, so request %s %s is refused "
        "(on_redis_error=%s): %s",
        name,
        request.method,
        request.path,
        "'closed'" if mode == "closed" else "a callable",
        error,
    )
    if callable(mode):
        return mode(request, error)
    response = HttpResponse(
        "This action cannot be started right now: the service that makes sure it runs "
        f"only once is unavailable. Try again in {REDIS_DOWN_RETRY_AFTER} s.\n",
        status=503,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(REDIS_DOWN_RETRY_AFTER)
    return response
