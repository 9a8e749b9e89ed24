"""A lock's scripts go past ``execute_command`` only when nothing observes the client.

engine/backends/direct.py sends a lock's ``EVALSHA`` on a pooled connection when the
client is redis-py's own, unwrapped, and a batch of them past the client's pipeline;
instrumentation (a wrapper on the class, as OpenTelemetry, Sentry and ddtrace install,
or on the instance), a single-connection client and redis-py's own metrics keep every
command on ``execute_command`` (a wrapped ``Pipeline.execute``, every batch on it). Which
path ran is observed with ``sys.setprofile`` (the code objects called), so nothing
the decision looks at is patched; the wrappers the instrumentation tests install are
real ones, the kind those libraries install. The retries of both paths are compared
through the loopback TCP proxy, which loses a reply for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.client
import redis.client
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redislock import LockManager
from django_redislock.engine.backends import direct
from tests.tcp_proxy import TcpProxy

_EXECUTE = redis.Redis.execute_command.__code__
_AEXECUTE = redis.asyncio.Redis.execute_command.__code__
_PIPE_EXECUTE = redis.client.Pipeline.execute.__code__
_APIPE_EXECUTE = redis.asyncio.client.Pipeline.execute.__code__


@contextlib.contextmanager
def _recording() -> Iterator[list[Any]]:
    """The code objects of every Python function called inside the block."""
    seen: list[Any] = []

    def record(frame: Any, event: str, _arg: Any) -> None:
        if event == "call":
            seen.append(frame.f_code)

    sys.setprofile(record)
    try:
        yield seen
    finally:
        sys.setprofile(None)


def _called_code(run: Callable[[], Any]) -> list[Any]:
    """The code objects of every Python function *run* called."""
    with _recording() as seen:
        run()
    return seen


def _with_block(manager: LockManager, name: str) -> None:
    with manager.lock(name, ttl=10, auto_renew=False):
        assert manager.get(name) is not None


def test_a_plain_clients_lock_calls_go_past_execute_command(name: str) -> None:
    manager = LockManager(client=redis.Redis.from_url(settings.REDIS_URL))
    _with_block(manager, name)  # scripts loaded, connection made
    lock = manager.lock(name, ttl=10, auto_renew=False)
    called = _called_code(lambda: (lock.acquire(), lock.release()))
    assert _EXECUTE not in called
    assert called.count(direct.send.__code__) == 2  # acquire, release
    assert manager.get(name) is None  # released for real


def test_an_asyncio_plain_clients_lock_calls_go_past_execute_command(name: str) -> None:
    async def run() -> tuple[list[Any], bool]:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        manager = LockManager(async_client=client)
        try:
            async with manager.lock(name, ttl=10, auto_renew=False):  # warm
                pass
            lock = manager.lock(name, ttl=10, auto_renew=False)
            with _recording() as seen:
                await lock.aacquire()
                held = await manager.aget(name) is not None
                await lock.arelease()
            return seen, held and await manager.aget(name) is None
        finally:
            await client.aclose()

    called, held_then_freed = asyncio.run(run())
    assert held_then_freed
    assert _AEXECUTE not in called
    assert direct.asend.__code__ in called  # a coroutine's every resumption is a "call"


def _all_calls(manager: LockManager, name: str) -> int:
    """Python calls (ours and redis-py's) of one warm acquire and release, the fewest of 3."""
    lock = manager.lock(name, ttl=10, auto_renew=False)
    return min(len(_called_code(lambda: (lock.acquire(), lock.release()))) for _ in range(3))


def test_the_direct_send_costs_fewer_python_calls_than_execute_command(name: str) -> None:
    plain_client = redis.Redis.from_url(settings.REDIS_URL)
    wrapped_client = redis.Redis.from_url(settings.REDIS_URL)
    # The thinnest wrapper there is: the bound method itself, on the instance.
    wrapped_client.execute_command = functools.partial(  # type: ignore[method-assign]
        redis.Redis.execute_command, wrapped_client
    )
    plain, wrapped = LockManager(client=plain_client), LockManager(client=wrapped_client)
    for manager in (plain, wrapped):
        _with_block(manager, name)
    direct_calls, execute_calls = _all_calls(plain, name), _all_calls(wrapped, name)
    assert direct_calls < execute_calls, (direct_calls, execute_calls)
    if direct.REDIS_PY_VERSION >= (
        7,
        2,
    ):  # its metrics hooks: about 15 calls a command on redis-py 8.1
        assert direct_calls <= execute_calls - 16, (direct_calls, execute_calls)


def _on_an_asyncio_client(use: Callable[[LockManager], Awaitable[None]]) -> None:
    """Run *use* with a manager on a new ``redis.asyncio`` client, in a new event loop."""

    async def run() -> None:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        try:
            await use(LockManager(async_client=client))
        finally:
            await client.aclose()

    asyncio.run(run())


def _recording_wrapper(original: Any, seen: list[str]) -> Any:
    """A wrapper like the instrumentation libraries': functools.wraps, then the original."""

    @functools.wraps(original)
    def execute_command(self: Any, *args: Any, **options: Any) -> Any:
        seen.append(str(args[0]))
        return original(self, *args, **options)

    return execute_command


@pytest.mark.parametrize("where", ["class", "instance"])
def test_an_instrumented_client_sees_every_lock_command(
    name: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    manager = LockManager(client=client)
    _with_block(manager, name)  # the first calls ran before the instrumentation
    seen: list[str] = []
    if where == "class":
        wrapper = _recording_wrapper(redis.Redis.execute_command, seen)
        monkeypatch.setattr(redis.Redis, "execute_command", wrapper)
    else:
        bound = _recording_wrapper(redis.Redis.execute_command, seen).__get__(client)
        monkeypatch.setattr(client, "execute_command", bound, raising=False)
    lock = manager.lock(name, ttl=10, auto_renew=False)
    assert lock.acquire(blocking=False)
    lock.release()
    assert seen.count("EVALSHA") == 2, seen
    assert manager.get(name) is None


def test_an_instrumented_asyncio_client_sees_every_lock_command(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    original = redis.asyncio.Redis.execute_command

    @functools.wraps(original)
    async def execute_command(self: Any, *args: Any, **options: Any) -> Any:
        seen.append(str(args[0]))
        return await original(self, *args, **options)

    monkeypatch.setattr(redis.asyncio.Redis, "execute_command", execute_command)

    async def use(manager: LockManager) -> None:
        async with manager.lock(name, ttl=10, auto_renew=False):
            pass

    _on_an_asyncio_client(use)
    assert seen.count("EVALSHA") >= 2, seen  # acquire and release (a first NOSCRIPT adds one)


def test_a_single_connection_client_goes_through_execute_command(name: str) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL, single_connection_client=True)
    try:
        manager = LockManager(client=client)
        _with_block(manager, name)
        called = _called_code(lambda: _with_block(manager, name))
        assert called.count(_EXECUTE) >= 2
        assert direct.send.__code__ not in called
    finally:
        client.close()


def _proxied(relay: TcpProxy, retries: int) -> redis.Redis:
    """A client through *relay* whose connection errors are retried *retries* times."""
    return redis.Redis(
        host="127.0.0.1",
        port=relay.port,
        socket_timeout=2,
        socket_connect_timeout=1,
        retry=Retry(NoBackoff(), retries),
        retry_on_error=[redis.ConnectionError],
    )


def _lost_release_reply(relay: TcpProxy, name: str, instrumented: bool, retries: int) -> int:
    """Requests the proxy forwarded for a release whose first reply was lost."""
    client = _proxied(relay, retries)
    if instrumented:  # on the instance: this client only
        wrapper = _recording_wrapper(redis.Redis.execute_command, [])
        client.execute_command = wrapper.__get__(client)  # type: ignore[method-assign]
    manager = LockManager(client=client)
    _with_block(manager, name)  # scripts known, connection made
    lock = manager.lock(name, ttl=10, auto_renew=False)
    lock.acquire()
    lock.acquire()  # two holds: a release counted twice would free it
    relay.drop_next_replies(1)
    before = relay.requests
    lock.release()
    sent = relay.requests - before
    info = manager.get(name)
    assert info is not None and info.hold_count == 1, "a retried release counts once"
    lock.release()
    assert manager.get(name) is None
    client.close()
    return sent


@pytest.mark.parametrize("retries", [0, 2])
def test_a_lost_reply_is_retried_as_execute_command_would(
    proxy: TcpProxy,  # noqa: F811
    name: str,
    retries: int,
) -> None:
    direct_sent = _lost_release_reply(proxy, name, instrumented=False, retries=retries)
    wrapped_sent = _lost_release_reply(proxy, name, instrumented=True, retries=retries)
    assert direct_sent == wrapped_sent >= 2  # the lost one and its retry


def _both(manager: LockManager, names: list[str]) -> None:
    with manager.lock_many(names, ttl=10, auto_renew=False):
        assert all(manager.get(n) is not None for n in names)
    assert all(manager.get(n) is None for n in names)


def test_a_plain_clients_batches_go_past_its_pipeline(name: str) -> None:
    manager = LockManager(client=redis.Redis.from_url(settings.REDIS_URL))
    names = [f"{name}:a", f"{name}:b"]
    _both(manager, names)  # warm

    def both_taken() -> None:
        with manager.lock_many(names, ttl=10, auto_renew=False):
            pass

    called = _called_code(both_taken)  # (a snapshot read, get(), is a pipeline of its own)
    assert all(manager.get(n) is None for n in names)
    assert _PIPE_EXECUTE not in called
    assert called.count(direct.send_many.__code__) == 2  # the attempts, the releases


def test_an_asyncio_plain_clients_batches_go_past_its_pipeline(name: str) -> None:
    names = [f"{name}:a", f"{name}:b"]

    async def run() -> list[Any]:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        manager = LockManager(async_client=client)
        try:
            async with manager.lock_many(names, ttl=10, auto_renew=False):  # warm
                pass
            with _recording() as seen:
                async with manager.lock_many(names, ttl=10, auto_renew=False):
                    pass
            assert all([await manager.aget(n) is None for n in names])
            return seen
        finally:
            await client.aclose()

    called = asyncio.run(run())
    assert _APIPE_EXECUTE not in called
    assert direct.asend_many.__code__ in called


def test_an_instrumented_pipeline_sees_every_batch(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = LockManager(client=redis.Redis.from_url(settings.REDIS_URL))
    names = [f"{name}:a", f"{name}:b"]
    _both(manager, names)
    batches: list[list[str]] = []
    original = redis.client.Pipeline.execute

    @functools.wraps(original)
    def execute(self: Any, *args: Any, **options: Any) -> Any:
        batches.append([str(command[0][0]) for command in self.command_stack])
        return original(self, *args, **options)

    monkeypatch.setattr(redis.client.Pipeline, "execute", execute)
    _both(manager, names)
    scripts = [batch for batch in batches if "HGETALL" not in batch]  # not get()'s reads
    assert scripts == [["EVALSHA", "EVALSHA"], ["EVALSHA", "EVALSHA"]], batches


def test_an_instrumented_asyncio_pipeline_sees_every_batch(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [f"{name}:a", f"{name}:b"]
    batches: list[int] = []
    original = redis.asyncio.client.Pipeline.execute

    @functools.wraps(original)
    async def execute(self: Any, *args: Any, **options: Any) -> Any:
        batches.append(len(self.command_stack))
        return await original(self, *args, **options)

    monkeypatch.setattr(redis.asyncio.client.Pipeline, "execute", execute)

    async def use(manager: LockManager) -> None:
        async with manager.lock_many(names, ttl=10, auto_renew=False):
            pass

    _on_an_asyncio_client(use)
    assert batches[-2:] == [2, 2], batches  # the attempts, the releases


def _lost_batch_reply(relay: TcpProxy, name: str, instrumented: bool) -> int:
    """Requests the proxy forwarded for a lock_many whose first batch reply was lost."""
    client = _proxied(relay, 2)
    if instrumented:  # on the instance: this client's pipelines only
        client.pipeline = functools.partial(redis.Redis.pipeline, client)  # type: ignore[method-assign]
    manager = LockManager(client=client)
    names = [f"{name}:a", f"{name}:b"]
    _both(manager, names)  # scripts known, connection made
    relay.drop_next_replies(1)
    before = relay.requests
    with manager.lock_many(names, ttl=10, auto_renew=False):
        sent = relay.requests - before
        infos = [manager.get(n) for n in names]
        assert all(i is not None and i.hold_count == 1 for i in infos), infos
    assert all(manager.get(n) is None for n in names)
    client.close()
    return sent


def test_a_lost_batch_reply_is_retried_as_the_pipeline_would(
    proxy: TcpProxy,  # noqa: F811
    name: str,
) -> None:
    direct_sent = _lost_batch_reply(proxy, f"{name}:d", instrumented=False)
    wrapped_sent = _lost_batch_reply(proxy, f"{name}:w", instrumented=True)
    assert direct_sent == wrapped_sent >= 2  # the lost batch and its retry


_OBSERVED = textwrap.dedent(
    """
    import sys
    import redis
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from redis.observability.config import MetricGroup, OTelConfig
    from redis.observability.providers import get_observability_instance

    from django_redislock import LockManager, standalone

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    get_observability_instance().init(OTelConfig(metric_groups=[MetricGroup.COMMAND]))
    standalone.configure(REDISLOCK_URL=sys.argv[1])
    manager = LockManager(client=redis.Redis.from_url(sys.argv[1]))
    with manager.lock(sys.argv[2], ttl=10, auto_renew=False):
        pass
    names = [
        dict(point.attributes).get("db.operation.name")
        for resource in reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "db.client.operation.duration"
        for point in metric.data.data_points
    ]
    print("EVALSHA" in names, names)
    """
)


def test_redis_py_metrics_see_every_lock_command(name: str) -> None:
    pytest.importorskip("redis.observability", reason="redis-py 7.2+ has its own metrics")
    pytest.importorskip("opentelemetry.sdk.metrics")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "-c", _OBSERVED, settings.REDIS_URL, name],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("True"), result.stdout
