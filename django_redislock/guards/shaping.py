"""Shaping the runs of a guarded key: a per-key rate limit and a cooldown.

``@single_instance(key, rate="10/m")`` admits at most 10 starts per sliding minute
per key; ``cooldown=60`` keeps the key taken for 60 s after each run ends. Both
are decided **after** the guard's lock is acquired, in one script
(:data:`~django_redislock.engine.lua.shaping.ADMIT`), and a run that ends
starts its cooldown **before** it releases the lock, in the release's round trip
(:data:`~django_redislock.engine.lua.shaping.COOL`, sent just before the release
script): whoever takes the lock next, even a waiter it is handed to, finds the
cooldown. A refused start releases
the lock at once and applies ``on_limited``.

This module holds the one implementation of each decision, shared by plain
functions (sync and async), views and Celery tasks:

* :class:`Shaping` (the validated options) and :func:`parse_rate`;
* :func:`admit` / :func:`aadmit`: may this start run (a :class:`Refusal` if not);
* :func:`attempt_admitted` / :func:`aattempt_admitted`: one attempt at the lock and
  its start's admission, in one round trip (:func:`acquire_admitted` for guards);
* :func:`cooling`: a run ended: the cooldown's start, sent with its release;
* :func:`function_limited` and :func:`view_limited`: what a refused call of a
  function or a view returns (tasks: :mod:`django_redislock.celery.shaping`);
* :func:`check_coalesce`, :func:`check_debounce`: the Celery-only options
  ``coalesce`` and ``debounce`` validated where the decorator is applied (their
  run-time parts are :mod:`django_redislock.celery.coalesce` and ``.debounce``);
* :func:`shaping_key`: a shaping key under the lock name's hash tag;
* :func:`shaping_state`: the window's count, the cooldown's end, the pending
  coalesced call and the debounce deadline (read-only).

Not on Redlock: the counters would live on every master and a majority could not
bound the starts; the first call on a Redlock backend raises
:class:`ShapingUnsupported`.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from django.http import HttpResponse

from ..engine.calls import Call, Prior
from ..engine.driver import call_async, call_sync
from ..engine.identity import new_nonce
from ..engine.lua.shaping import ADMIT, COOL
from ..engine.shaping_state import ShapingState, decode_state, shaping_key, state_call
from ..exceptions import LockError, RunLimited, ShapingUnsupported
from ..primitives import at_once
from ..primitives.lock import _start_clock

if TYPE_CHECKING:
    from ..engine.backends.base import AsyncBackend, Backend, BatchingAsyncBackend
    from ..primitives.at_once import LockAttempt
    from ..primitives.lock import Lock
    from .guard import GuardConfig

logger = logging.getLogger("django_redislock")

__all__ = [
    "ASK_AGAIN",
    "FUNCTION_LIMITED_MODES",
    "TASK_LIMITED_MODES",
    "Refusal",
    "Shaping",
    "ShapingState",
    "ShapingUnsupported",
    "aacquire_admitted",
    "aadmit",
    "aadmitting_backend",
    "aattempt_admitted",
    "acquire_admitted",
    "admitting_backend",
    "attempt_admitted",
    "attempt_carrying",
    "check_coalesce",
    "check_debounce",
    "aadmit_held",
    "admit",
    "admit_held",
    "cooling",
    "function_limited",
    "limited",
    "parse_rate",
    "shaping_key",
    "shaping_state",
    "view_limited",
]

#: The most starts a rate may allow per window: the sliding log keeps one member per start.
MAX_RATE = 10_000

#: ``on_limited`` modes of a Celery task (a callable is also accepted).
TASK_LIMITED_MODES = ("defer", "retry", "skip", "raise")
#: ``on_limited`` modes with a meaning for a plain function (or any value to return).
FUNCTION_LIMITED_MODES = ("raise", "skip")

_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hour": 3600.0, "d": 86400.0}
_UNITS["day"] = 86400.0
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+)\s*$")


def parse_rate(rate: object) -> tuple[int, float]:
    """``"10/m"`` (or ``"3/10s"``, ``"100/h"``, ``"5/30sec"``, or a tuple
    ``(count, seconds)``) as (starts, window in seconds); ValueError/TypeError
    saying why when it is not one."""
    if isinstance(rate, tuple) and len(rate) == 2:
        count, window = rate
    elif isinstance(rate, str):
        match = _RATE.match(rate.lower())
        if match is None or match.group(3) not in _UNITS:
            raise ValueError(
                f"rate must look like '10/m' (N per s, m, h or d, or per '30s'), not {rate!r}"
            )
        count = int(match.group(1))
        window = float(match.group(2) or 1) * _UNITS[match.group(3)]
    else:
        raise TypeError(
            f"rate must be a string like '10/m' or a tuple (count, seconds), not {rate!r}"
        )
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_RATE:
        raise ValueError(f"a rate's count must be an integer from 1 to {MAX_RATE}, not {count!r}")
    if (
        isinstance(window, bool)
        or not isinstance(window, (int, float))
        or not math.isfinite(window)
        or not 0.01 <= window <= 86400 * 7
    ):
        raise ValueError(f"a rate's window must be from 0.01 s to 7 days, not {window!r}")
    return count, float(window)


@dataclass(frozen=True)
class Shaping:
    """The validated shaping options of one guard."""

    #: At most this many starts per :attr:`window` per key; 0: no rate limit.
    rate_count: int = 0
    #: The rate's sliding window, in seconds.
    window: float = 0.0
    #: Seconds the key stays taken after a run ends; 0: none.
    cooldown: float = 0.0
    #: What a start refused by the rate or the cooldown does (see ``single_instance``).
    on_limited: Any = None

    @classmethod
    def build(
        cls,
        rate: object,
        cooldown: object,
        on_limited: Any,
        *,
        limit: int | None,
        where: str = "@single_instance",
        names: tuple[str, str, str, str] = ("rate", "cooldown", "on_limited", "limit"),
    ) -> Shaping | None:
        """The options, or None when neither *rate* nor *cooldown* is given. Raises
        ValueError/TypeError, saying why, for a value or a combination that makes no
        sense (``on_limited`` alone; ``cooldown`` with a concurrency ``limit``)."""
        rate_name, cooldown_name, on_limited_name, limit_name = names
        if rate is None and cooldown is None:
            if on_limited is not None:
                raise ValueError(
                    f"{where}: {on_limited_name} says what a start refused by {rate_name} or "
                    f"{cooldown_name} does; give one of them, or drop {on_limited_name}"
                )
            return None
        count, window = (0, 0.0) if rate is None else parse_rate(rate)
        seconds = 0.0
        if cooldown is not None:
            if isinstance(cooldown, bool) or not isinstance(cooldown, (int, float)):
                raise TypeError(f"{cooldown_name} must be a number of seconds, not {cooldown!r}")
            if not (math.isfinite(cooldown) and 0.001 <= cooldown <= 86400 * 7):
                raise ValueError(
                    f"{cooldown_name} must be from 0.001 s to 7 days, not {cooldown!r}"
                )
            seconds = float(cooldown)
            if limit is not None:
                raise ValueError(
                    f"{where}: {cooldown_name} keeps the key taken after a run so that runs "
                    f"never overlap, and {limit_name} lets several run at once; drop one"
                )
        if isinstance(on_limited, str) and on_limited not in TASK_LIMITED_MODES:
            raise ValueError(
                f"{on_limited_name} must be one of {TASK_LIMITED_MODES}, a callable, or "
                f"(functions, views) a value to return, not the string {on_limited!r}"
            )
        return cls(rate_count=count, window=window, cooldown=seconds, on_limited=on_limited)

    @property
    def window_ms(self) -> int:
        """The window in whole milliseconds (the scripts' unit)."""
        return max(1, round(self.window * 1000))

    @property
    def cooldown_ms(self) -> int:
        """The cooldown in whole milliseconds."""
        return max(1, round(self.cooldown * 1000))


@dataclass(frozen=True)
class Refusal:
    """Why a start was not admitted, and when one could be."""

    #: ``"rate"`` (the window is full) or ``"cooldown"`` (a run ended too recently).
    reason: str
    #: Seconds until a start could be admitted (by Redis's clock, at the refusal).
    retry_after: float
    #: Starts in the window at the refusal (0 for a cooldown).
    count: int
    #: The lock name.
    name: str

    @property
    def retry_after_whole(self) -> int:
        """:attr:`retry_after` rounded up to whole seconds, at least 1 (``Retry-After``)."""
        return max(1, math.ceil(self.retry_after))

    def describe(self, shaping: Shaping) -> str:
        """The refusal in words, for exceptions and logs."""
        if self.reason == "cooldown":
            return (
                f"key {self.name!r} is cooling down ({shaping.cooldown:g} s after its last "
                f"run) for {self.retry_after:.1f} s more"
            )
        return (
            f"key {self.name!r} already started {self.count} times in the last "
            f"{shaping.window:g} s (rate {shaping.rate_count}/{shaping.window:g}s); "
            f"the next start is admitted in {self.retry_after:.1f} s"
        )

    def error(self, shaping: Shaping) -> RunLimited:
        """The :class:`~django_redislock.RunLimited` raised for this refusal."""
        return RunLimited(
            self.describe(shaping),
            name=self.name,
            reason=self.reason,
            retry_after=self.retry_after,
        )


def check_coalesce(
    coalesce: object,
    *,
    limit: int | None,
    shaping: Shaping | None,
    on_locked: Any,
    timeout: float | None,
    where: str = "@single_instance",
    names: tuple[str, str, str] = ("coalesce", "limit", "timeout"),
) -> bool:
    """*coalesce* validated: a bool, and only with options it combines with (no
    concurrency limit, rate, cooldown, ``on_locked`` or wait: a call that finds the
    key held becomes the pending run)."""
    coalesce_name, limit_name, timeout_name = names
    if not isinstance(coalesce, bool):
        raise TypeError(f"{coalesce_name} must be True or False, not {coalesce!r}")
    if not coalesce:
        return False
    why = None
    if limit is not None:
        why = f"{limit_name} lets several run at once, and coalescing keeps one running"
    elif shaping is not None:
        why = "a rate or a cooldown refuses starts, and a pending run must start when the run ends"
    elif on_locked is not None:
        why = "on_locked says what a call that finds the key held does, and it becomes pending"
    elif timeout != 0:
        why = f"a call that finds the key held becomes pending at once: no {timeout_name}"
    if why is not None:
        raise ValueError(f"{where}: {coalesce_name} does not combine here: {why}")
    return True


def check_debounce(
    debounce: object,
    *,
    coalesce: bool,
    limit: int | None,
    shaping: Shaping | None,
    on_locked: Any,
    timeout: float | None,
    where: str = "@single_instance",
    names: tuple[str, str, str, str] = ("debounce", "coalesce", "limit", "timeout"),
) -> float | None:
    """*debounce* validated: None, or seconds from 0.01 to a day, and only with options
    it combines with (a debounced call is postponed, never refused or waited for)."""
    debounce_name, coalesce_name, limit_name, timeout_name = names
    if debounce is None:
        return None
    if isinstance(debounce, bool) or not isinstance(debounce, (int, float)):
        raise TypeError(f"{debounce_name} must be a number of seconds, not {debounce!r}")
    if not (math.isfinite(debounce) and 0.01 <= debounce <= 86400):
        raise ValueError(f"{debounce_name} must be from 0.01 s to a day, not {debounce!r}")
    why = None
    if coalesce:
        why = f"{coalesce_name} runs the pending call when the run ends, not after a quiet time"
    elif limit is not None:
        why = f"{limit_name} lets several run at once, and a debounced key runs once"
    elif shaping is not None:
        why = "a rate or a cooldown refuses starts, and the debounced run must start"
    elif on_locked is not None:
        why = "on_locked does not apply: the due run waits for a held key"
    elif timeout != 0:
        why = f"the due run waits for a held key by itself: no {timeout_name}"
    if why is not None:
        raise ValueError(f"{where}: {debounce_name} does not combine here: {why}")
    return float(debounce)


def _keys(backend: Backend | AsyncBackend, name: str) -> tuple[str, str]:
    if backend.features.quorum:
        raise ShapingUnsupported(
            f"rate= and cooldown= (lock {name!r}) need one Redis (or Cluster) to count starts "
            "with one clock; on Redlock each master would count its own, and a majority "
            "cannot bound the starts. Use a manager on one Redis for this guard."
        )
    return shaping_key(backend, name, "rate"), shaping_key(backend, name, "cooldown")


def _admit_call(
    backend: Backend | AsyncBackend,
    shaping: Shaping,
    name: str,
    holder: tuple[bytes, str] | None = None,
) -> Call:
    """ADMIT for a start of *name*; with *holder* (the lock hash's key and the owner),
    counted only if that owner holds the lock when it runs."""
    keys: tuple[Any, ...] = _keys(backend, name)
    args: tuple[Any, ...] = (shaping.rate_count, shaping.window_ms, new_nonce())
    if holder is not None:
        keys, args = (*keys, holder[0]), (*args, holder[1])
    return Call(ADMIT, keys, args, "admit a start (rate limit, cooldown)", name)


def start_refusal(reply: Any, name: str) -> Refusal | None:
    """What ADMIT's *reply* decided for a start of *name*: None (admitted, counted in the
    rate window) or the :class:`Refusal` (the rate or the cooldown). Every path that
    admits a start reads its answer here."""
    if int(reply[0]) == 1:
        return None
    reason = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
    return Refusal(reason, int(reply[2]) / 1000, int(reply[3]), name)


def admit(config: GuardConfig, lock: Lock) -> Refusal | None:
    """Whether the run whose lock *lock* was just acquired may start: None (admitted,
    counted in the rate window) or the :class:`Refusal`. Raises LockBackendError."""
    shaping = config.shaping
    if shaping is None:
        return None
    backend = config.lock_manager().backend()
    return start_refusal(call_sync(_admit_call(backend, shaping, lock.name), backend), lock.name)


async def aadmit(config: GuardConfig, lock: Lock) -> Refusal | None:
    """:func:`admit` for asyncio."""
    shaping = config.shaping
    if shaping is None:
        return None
    backend = config.lock_manager().source.abackend()
    reply = await call_async(_admit_call(backend, shaping, lock.name), backend)
    return start_refusal(reply, lock.name)


def _cool_call(backend: Backend | AsyncBackend, shaping: Shaping, name: str) -> Call:
    return Call(COOL, _keys(backend, name)[1:], (shaping.cooldown_ms,), "start the cooldown", name)


def cooling(config: GuardConfig, lock: Lock, *, asyncio: bool = False) -> Prior | None:
    """A run of *lock*'s key ended: the start of its cooldown, to send just before the
    run's release, in its round trip (``lock._leave(..., prior=...)``; a release that
    waits for transactions sends it alone, at once); None when the guard has no
    cooldown. A Redis error is logged, not raised: the run has happened."""
    shaping = config.shaping
    if shaping is None or not shaping.cooldown:
        return None
    manager = config.lock_manager()
    backend = manager.source.abackend() if asyncio else manager.backend()
    return Prior(_cool_call(backend, shaping, lock.name), partial(_cooled, lock.name))


def _cooled(name: str, reply: Any) -> None:
    if isinstance(reply, Exception):
        logger.error(
            "redislock: could not start the cooldown of %r after its run; the next run may "
            "start before it ends",
            name,
            exc_info=reply,
        )


def function_limited(
    config: GuardConfig, refusal: Refusal, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """What a refused call of a plain function returns (or raises): ``on_limited``
    ``"raise"`` (default: :class:`~django_redislock.RunLimited`), ``"skip"`` (None),
    a callable ``(refusal, *args, **kwargs)`` (its result), or any other value."""
    shaping = config.shaping
    assert shaping is not None
    mode = shaping.on_limited
    if mode is None or mode == "raise":
        raise refusal.error(shaping)
    if isinstance(mode, str) and mode in ("defer", "retry"):
        raise TypeError(f"on_limited={mode!r} only works on Celery tasks")
    logger.info("redislock: call of %s skipped: %s", config.spec.base, refusal.describe(shaping))
    if mode == "skip":
        return None
    if callable(mode):
        return mode(refusal, *args, **kwargs)
    return mode


def view_limited(config: GuardConfig, refusal: Refusal, request: Any) -> Any:
    """What a refused request gets: ``429 Too Many Requests`` with ``Retry-After``
    (default), an ``HttpResponse`` given as ``on_limited``, a callable
    ``(request, refusal)``'s result, or ``"raise"`` (:class:`~django_redislock.RunLimited`)."""
    shaping = config.shaping
    assert shaping is not None
    mode = shaping.on_limited
    logger.info(
        "redislock: request %s %s refused: %s",
        request.method,
        request.path,
        refusal.describe(shaping),
    )
    if mode == "raise":
        raise refusal.error(shaping)
    if isinstance(mode, HttpResponse):
        return mode
    if callable(mode):
        return mode(request, refusal)
    if mode is not None:
        raise TypeError(
            f"on_limited={mode!r} has no meaning for a view: give an HttpResponse, "
            "a callable (request, refusal) or 'raise'"
        )
    seconds = refusal.retry_after_whole
    response = HttpResponse(
        f"Too many runs of this action; try again in {seconds} s.\n",
        status=429,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(seconds)
    return response


def _config_of(guarded: Any) -> GuardConfig:
    from .guard import task_hooks

    config = getattr(guarded, "_redislock_config", None)
    if config is None and callable(getattr(guarded, "_get_current_object", None)):
        guarded = guarded._get_current_object()  # a lazy Celery task (a proxy)
    for hooks in task_hooks() if config is None else ():
        # a SingleInstanceTask, or a task made from a @single_instance function
        found = None if hooks.lock_options_of is None else hooks.lock_options_of(guarded)
        if found is not None:
            config = found[0]
            break
    if config is None:
        raise TypeError(f"{guarded!r} is not guarded by @single_instance")
    return config  # type: ignore[no-any-return]


def shaping_state(guarded: Any, name: str) -> ShapingState:
    """The rate window's count, the cooldown left, the pending coalesced call and the
    debounce deadline of the key *name* of *guarded*: a function decorated with
    ``@single_instance`` (or a Celery task made from one), or a ``SingleInstanceTask``.
    Read-only, one round trip."""
    config = _config_of(guarded)
    shaping = config.shaping
    window_ms = shaping.window_ms if shaping is not None and shaping.rate_count else 0
    backend = config.lock_manager().backend()
    return decode_state(call_sync(state_call(backend, name, window_ms), backend))


def _give_back(lock: Lock) -> None:
    # The start was refused (or could not be decided): the call's own hold goes back.
    from .guard import release_task_hold

    release_task_hold(lock, every_hold=False)


def admit_held(config: GuardConfig, lock: Lock) -> Refusal | None:
    """:func:`admit` for a function's or a view's call holding *lock*; a refused start
    (or one Redis could not decide) gives its hold back before returning (raising)."""
    try:
        refusal = admit(config, lock)
    except BaseException:
        _give_back(lock)
        raise
    if refusal is not None:
        _give_back(lock)
    return refusal


async def aadmit_held(config: GuardConfig, lock: Lock) -> Refusal | None:
    """:func:`admit_held` for asyncio."""
    try:
        refusal = await aadmit(config, lock)
    except BaseException:
        await _agive_back(lock)
        raise
    if refusal is not None:
        await _agive_back(lock)
    return refusal


async def _agive_back(lock: Lock) -> None:
    try:
        await lock.arelease()
    except LockError:
        lock._forget(lock.owner)
        logger.error("redislock: could not give back lock %r", lock.name, exc_info=True)


#: :func:`attempt_admitted`'s answer when ADMIT could not say (it failed, or found the
#: hold gone): the start is admitted with a round trip of its own (:func:`admit`).
ASK_AGAIN: Any = object()


def acquire_admitted(config: GuardConfig, lock: Lock, *, wait: bool) -> tuple[bool, Refusal | None]:
    """``config.acquire(lock)`` and, once it is held, :func:`admit_held`: whether it is
    held, and the start's refusal (None: admitted, or not held).

    A guard that shapes its runs and makes one attempt (``timeout=0``, the default)
    sends the attempt and the admission in one round trip (:func:`attempt_admitted`);
    the rest acquires, then admits."""
    if config.shaping is None:  # nothing to admit: every guarded call comes here
        return config.acquire(lock, wait=wait), None
    backend = admitting_backend(config, lock) if config.attempts_once(wait) else None
    if backend is None:
        acquired = config.acquire(lock, wait=wait)
        return acquired, admit_held(config, lock) if acquired else None
    held, answer = attempt_admitted(config, lock, backend)
    if not held:
        return False, None
    if answer is ASK_AGAIN:
        return True, admit_held(config, lock)
    if answer is not None:
        _give_back(lock)
    return True, answer


async def aacquire_admitted(
    config: GuardConfig, lock: Lock, *, wait: bool
) -> tuple[bool, Refusal | None]:
    """:func:`acquire_admitted` for asyncio."""
    if config.shaping is None:
        return await config.aacquire(lock, wait=wait), None
    backend = aadmitting_backend(config, lock) if config.attempts_once(wait) else None
    if backend is None:
        acquired = await config.aacquire(lock, wait=wait)
        return acquired, await aadmit_held(config, lock) if acquired else None
    held, answer = await aattempt_admitted(config, lock, backend)
    if not held:
        return False, None
    if answer is ASK_AGAIN:
        return True, await aadmit_held(config, lock)
    if answer is not None:
        await _agive_back(lock)
    return True, answer


def admitting_backend(config: GuardConfig, lock: Lock) -> Backend | None:
    """The backend that sends an attempt at *lock* and its start's admission in one
    round trip (a shaped guard's mutex on one Redis or a Cluster), or None."""
    if config.shaping is None or lock._kind.primitive != "mutex":
        return None
    return at_once.batch_backend([lock], least=1)


def aadmitting_backend(config: GuardConfig, lock: Lock) -> BatchingAsyncBackend | None:
    """:func:`admitting_backend` for asyncio."""
    if config.shaping is None or lock._kind.primitive != "mutex":
        return None
    return at_once.abatch_backend([lock], least=1)


def attempt_admitted(config: GuardConfig, lock: Lock, backend: Backend) -> tuple[bool, Any]:
    """One attempt at *lock* (never queued) with its start's admission after it, in one
    round trip (*backend*: :func:`admitting_backend`'s). ADMIT counts the start only if
    the attempt's owner then holds the lock. Returns (held, the admission: None, a
    :class:`Refusal`, or :data:`ASK_AGAIN`); a refused start keeps its hold (the
    caller gives it back, or keeps it). Raises as ``acquire()`` does."""
    held, reply = attempt_carrying(lock, backend, _admission(config, lock, backend))
    return (True, _answer(reply, lock.name)) if held else (False, None)


def attempt_carrying(lock: Lock, backend: Backend, also: at_once.Also) -> tuple[bool, Any]:
    """One attempt at *lock* (never queued) with the one call *also* makes after it, in
    one round trip (*backend*: a batching backend, see :func:`admitting_backend`).
    Returns (held, that call's reply: a value or the exception it met; None when not
    held). Raises as ``acquire()`` does, a hold it got given back first."""
    started = _start_clock()
    taken: list[Lock] = []
    got, (reply,) = at_once.take_sync([lock], backend, started, taken, also)
    at_once.tell_refused(got, started, backend)
    if got.error is not None:  # as acquire() raises it; a hold it got goes back first
        if taken:
            _give_back(lock)
        raise got.error
    return (True, reply) if taken else (False, None)


async def aattempt_admitted(
    config: GuardConfig, lock: Lock, backend: BatchingAsyncBackend
) -> tuple[bool, Any]:
    """:func:`attempt_admitted` for asyncio."""
    started = _start_clock()
    taken: list[Lock] = []
    admission = _admission(config, lock, backend)
    got, (reply,) = await at_once.take_async([lock], backend, started, taken, admission)
    at_once.tell_refused(got, started, None)
    if got.error is not None:
        if taken:
            await _agive_back(lock)
        raise got.error
    return (True, _answer(reply, lock.name)) if taken else (False, None)


def _admission(config: GuardConfig, lock: Lock, backend: Backend | AsyncBackend) -> at_once.Also:
    """The ADMIT call that follows *lock*'s attempt in its round trip, counted only if
    the attempt's owner then holds the lock."""
    shaping = config.shaping
    assert shaping is not None  # (see acquire_admitted)

    def admit_after(made: Sequence[LockAttempt]) -> list[Call]:
        op = made[0].op
        return [_admit_call(backend, shaping, lock.name, holder=(op.keys[0], op.owner))]

    return admit_after


def _answer(reply: Any, name: str) -> Any:
    """What ADMIT's *reply*, sent with a granted attempt, says: None (admitted), the
    :class:`Refusal`, or :data:`ASK_AGAIN` when it failed or found the hold gone (an
    operator released the lock between the two scripts): asked again, as after any
    acquire."""
    if isinstance(reply, Exception) or int(reply[0]) == 2:
        return ASK_AGAIN
    return start_refusal(reply, name)


def limited(
    config: GuardConfig,
    refusal: Refusal,
    request: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """What a refused call returns: :func:`view_limited` for a view (*request*),
    :func:`function_limited` otherwise."""
    if request is not None:
        return view_limited(config, refusal, request)
    return function_limited(config, refusal, args, kwargs)
