"""``@single_instance`` on plain functions (sync and async) and its key templates."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import inspect
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User

from django_redislock import LockInfo, LockNotAcquired, locks, signals, single_instance
from django_redislock.guards.keys_template import KeySpec, normalize


class Holder:
    """Holds a lock from another thread, as another caller would."""

    def __init__(self, name: str, ttl: float = 30) -> None:
        self.lock = locks.lock(name, ttl=ttl, owner="someone-else")
        assert self.lock.acquire(blocking=False)

    def release(self) -> None:
        self.lock.release()


# -- keys -----------------------------------------------------------------------


def test_positional_and_keyword_calls_give_the_same_key() -> None:
    def f(account_id: int, mode: str = "full") -> None: ...

    spec = KeySpec("sync:{account_id}:{mode}", f)
    assert spec.render((42,), {}) == "sync:42:full"
    assert spec.render((), {"account_id": 42}) == "sync:42:full"
    assert spec.render((42, "full"), {}) == spec.render((), {"mode": "full", "account_id": 42})


def test_attribute_access_and_model_instances_as_pks() -> None:
    def f(user: Any) -> None: ...

    user = User(pk=5, username="u")
    assert KeySpec("u:{user.pk}", f).render((user,), {}) == "u:5"
    # An instance here and its pk in a worker give the same key.
    assert KeySpec("u:{user}", f).render((user,), {}) == KeySpec("u:{user}", f).render((5,), {})
    args = KeySpec(single_instance.ARGS, f)
    assert args.render((user,), {}) == args.render((), {"user": 5})


def test_values_key_the_same_as_after_a_json_round_trip() -> None:
    def f(a: Any, b: Any, c: Any, d: Any, e: Any) -> None: ...

    values = (
        uuid.UUID(int=7),
        dt.date(2026, 1, 2),
        decimal.Decimal("1.50"),
        dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.timezone.utc),
        (1, 2),
    )
    as_json = (
        "00000000-0000-0000-0000-000000000007",
        "2026-01-02",
        "1.50",
        "2026-01-02T03:04:00+00:00",
        [1, 2],
    )
    for key in ("{a}|{b}|{c}|{d}|{e}", single_instance.ARGS):
        spec = KeySpec(key, f)
        assert spec.render(values, {}) == spec.render(as_json, {})
    assert normalize({"x": values}) == {"x": list(as_json)}


def test_args_key_is_per_arguments_and_readable() -> None:
    def report(kind: str, year: int = 2026) -> None: ...

    spec = KeySpec(single_instance.ARGS, report)
    one = spec.render(("sales",), {})
    prefix = f"{__name__}.test_args_key_is_per_arguments_and_readable.<locals>.report:"
    assert one.startswith(prefix)
    assert one == spec.render((), {"kind": "sales", "year": 2026})
    assert one != spec.render(("sales", 2025), {})


def test_unknown_argument_fails_at_decoration_time() -> None:
    with pytest.raises(ValueError, match="has no argument called 'acount_id'"):

        @single_instance("sync:{acount_id}")
        def sync(account_id: int) -> None: ...

    with pytest.raises(ValueError, match="positional field"):
        single_instance("sync:{0}")(lambda x: x)


def test_key_that_cannot_be_rendered_is_a_clear_error_at_call_time(name: str) -> None:
    @single_instance("u:{user.pk}")
    def f(user: Any) -> None: ...

    with pytest.raises(ValueError, match="cannot render lock key"):
        f(None)
    assert list(locks.active()) == []


def test_unstable_values_refuse_an_args_digest() -> None:
    @single_instance(single_instance.ARGS)
    def f(thing: Any) -> None: ...

    with pytest.raises(TypeError, match="stable lock key"):
        f(object())


def test_callable_key_and_default_key(name: str) -> None:
    seen: list[str | None] = []

    @single_instance(lambda a, b=0: f"{name}:{a + b}")
    def f(a: int, b: int = 0) -> None:
        seen.append(_held_names())

    @single_instance()
    def g() -> None:
        seen.append(_held_names())

    f(1, b=2)
    g()
    assert seen == [f"{name}:3", f"{__name__}.test_callable_key_and_default_key.<locals>.g"]


def _held_names() -> str | None:
    names = [info.name for info in locks.active()]
    return names[0] if len(names) == 1 else None


# -- sync functions ---------------------------------------------------------------


def test_runs_the_body_under_the_lock_and_releases(name: str) -> None:
    @single_instance(f"{name}:{{n}}", ttl=5)
    def work(n: int) -> LockInfo | None:
        return locks.get(f"{name}:{n}")

    info = work(3)
    assert info is not None and info.kind == "function" and info.lease == 5
    assert locks.get(f"{name}:3") is None


def test_held_lock_raises_by_default_and_fires_contended(name: str) -> None:
    holder = Holder(f"{name}:1")
    contended: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        contended.append(kwargs)

    signals.lock_contended.connect(receiver)
    try:

        @single_instance(f"{name}:{{n}}")
        def work(n: int) -> str:
            return "ran"

        with pytest.raises(LockNotAcquired, match="someone-else"):
            work(1)
        assert work(2) == "ran"  # another key is independent
    finally:
        signals.lock_contended.disconnect(receiver)
        holder.release()
    assert [c["name"] for c in contended] == [f"{name}:1"]
    assert work(1) == "ran"


def test_on_locked_value_skip_and_callable(name: str) -> None:
    holder = Holder(name)
    try:
        assert single_instance(name, on_locked="busy")(lambda: "ran")() == "busy"
        assert single_instance(name, on_locked="skip")(lambda: "ran")() is None

        def fallback(info: LockInfo | None, x: int) -> tuple[str | None, int]:
            return (info.owner if info else None, x)

        assert single_instance(name, on_locked=fallback)(lambda x: "ran")(9) == ("someone-else", 9)
    finally:
        holder.release()


def test_timeout_waits_for_the_release(name: str) -> None:
    holder = Holder(name)
    timer = threading.Timer(0.3, holder.release)
    timer.start()
    try:
        assert single_instance(name, timeout=10)(lambda: "ran")() == "ran"
    finally:
        timer.cancel()


def test_sync_function_is_reentrant_in_its_thread(name: str) -> None:
    @single_instance(name)
    def countdown(n: int) -> int:
        return n if n == 0 else countdown(n - 1)

    assert countdown(3) == 0
    assert locks.get(name) is None


def test_exception_in_body_releases(name: str) -> None:
    @single_instance(name)
    def boom() -> None:
        raise RuntimeError("x")

    with pytest.raises(RuntimeError):
        boom()
    assert locks.get(name) is None


def test_decorating_a_class_names_method_decorator() -> None:
    class View:
        pass

    with pytest.raises(TypeError, match="method_decorator"):
        single_instance("x")(View)


# -- async functions --------------------------------------------------------------


def test_async_function_runs_once_at_a_time(name: str) -> None:
    inside = 0
    overlaps = 0

    @single_instance(name, timeout=10)
    async def work(i: int) -> int:
        nonlocal inside, overlaps
        inside += 1
        overlaps += inside > 1
        await asyncio.sleep(0.01)
        inside -= 1
        return i

    async def main() -> list[int]:
        return list(await asyncio.gather(*(work(i) for i in range(5))))

    assert asyncio.run(main()) == [0, 1, 2, 3, 4]
    assert overlaps == 0
    assert locks.get(name) is None


def test_async_function_held_elsewhere(name: str) -> None:
    holder = Holder(name)

    @single_instance(name)
    async def work() -> str:
        return "ran"

    @single_instance(name, on_locked=lambda info: "fallback")
    async def work2() -> str:
        return "ran"

    try:
        with pytest.raises(LockNotAcquired):
            asyncio.run(work())
        assert asyncio.run(work2()) == "fallback"
    finally:
        holder.release()
    assert asyncio.run(work()) == "ran"


# -- several processes --------------------------------------------------------------


def _count_in_child(name: str, rounds: int, queue: Any) -> None:
    r = redis.Redis.from_url(settings.REDIS_URL)

    @single_instance(name, timeout=30)
    def critical() -> bool:
        overlap = r.incr(f"{name}:inside") != 1
        value = int(r.get(f"{name}:counter") or 0)
        r.set(f"{name}:counter", value + 1)
        r.decr(f"{name}:inside")
        return overlap

    queue.put(sum(critical() for _ in range(rounds)))


def test_processes_never_overlap(name: str, redis_client: redis.Redis) -> None:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_count_in_child, args=(name, 50, queue)) for _ in range(4)]
    for p in procs:
        p.start()
    overlaps = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert overlaps == [0, 0, 0, 0]
    assert int(redis_client.get(f"{name}:counter")) == 200  # no lost update


def test_import_without_celery_installed() -> None:
    code = (
        "import sys; sys.modules['celery'] = None\n"
        "import django_redislock as d\n"
        "from django_redislock import *\n"
        "assert callable(d.single_instance)\n"
        "@d.single_instance('x:{a}')\ndef f(a): return a\n"
        "assert 'celery' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "try:\n    d.SingleInstanceTask\nexcept ImportError:\n    print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(Path(__file__).resolve().parent.parent),
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_explicit_owner_string_and_callable(name: str) -> None:
    @single_instance(f"{name}:{{n}}", owner="batch-7")
    def fixed(n: int) -> str | None:
        info = locks.get(f"{name}:{n}")
        return info.owner if info else None

    @single_instance(f"{name}:{{n}}", owner=lambda n: f"job-{n}")
    def computed(n: int) -> str | None:
        info = locks.get(f"{name}:{n}")
        return info.owner if info else None

    assert fixed(1) == "batch-7"
    assert computed(2) == "job-2"
    # Another caller with the same explicit owner re-enters instead of being refused.
    held = locks.lock(f"{name}:3", owner="batch-7")
    assert held.acquire(blocking=False)
    try:
        assert fixed(3) == "batch-7"
        assert locks.get(f"{name}:3") is not None  # still held by the outer hold
    finally:
        held.release()


def test_a_limit_lets_that_many_calls_run_at_once(name: str) -> None:
    inside = threading.Barrier(3, timeout=10)
    leave = threading.Event()

    @single_instance("export:{tenant}", limit=2, ttl=10)
    def export(tenant: int) -> str:
        inside.wait()  # two calls and the test meet here: both run at once
        leave.wait(10)
        return "ok"

    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(export(7))) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    info = locks.get("export:7")
    assert info.primitive == "semaphore" and info.limit == 2 and len(info.holders) == 2
    with pytest.raises(LockNotAcquired, match="all 2 places of lock 'export:7' are taken"):
        export(7)
    leave.set()
    for t in threads:
        t.join(10)
    assert results == ["ok", "ok"] and locks.get("export:7") is None


def test_a_limit_is_checked_at_decoration(name: str) -> None:
    with pytest.raises(ValueError, match="between 1 and"):
        single_instance("x", limit=0)
    with pytest.raises(TypeError, match="whole number"):
        single_instance("x", limit="3")  # type: ignore[arg-type]


def _plain_params(a: int, b: str = "x", *, c: int = 3) -> None:
    """Every parameter plain: the quick binding serves most calls."""


def _varargs(a: int, *rest: int, **more: int) -> None:
    """Variadic: always the full binding."""


@pytest.mark.parametrize(
    ("func", "args", "kwargs"),
    [
        (_plain_params, (1,), {}),
        (_plain_params, (1, "y"), {}),
        (_plain_params, (), {"a": 1, "c": 9}),
        (_plain_params, (1,), {"c": 5, "b": "z"}),
        (_varargs, (1, 2, 3), {"k": 4}),
        (_varargs, (1,), {}),
    ],
)
def test_quick_binding_gives_what_signature_bind_gives(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    from django_redislock.guards.keys_template import ARGS

    spec = KeySpec(ARGS, func)
    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    expected = dict(bound.arguments)
    expected.update(expected.pop("more", {}))
    if "rest" in expected:
        expected["rest"] = list(expected["rest"])
    assert spec.bind(args, kwargs) == expected


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "missing a required argument: 'a'"),
        ((1, "y", 3), {}, "too many positional arguments"),
        ((1,), {"a": 2}, "multiple values for argument 'a'"),
        ((1,), {"d": 2}, "unexpected keyword argument 'd'"),
    ],
)
def test_a_call_that_does_not_bind_is_refused_with_the_reason(
    args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:

    spec = KeySpec("k:{a}", _plain_params)
    with pytest.raises(TypeError, match=re.escape(message)):
        spec.render(args, kwargs)
