"""A lock's commands go through redis-py's public interfaces, as any command of the user's.

Every script is sent with the client's ``execute_command`` and every batch with its
``pipeline()``, so what the user's client does to its commands applies to the lock's:
instrumentation on the class or the instance (OpenTelemetry, Sentry and ddtrace wrap
the class), a subclass's own reply parsing, redis-py's own metrics, a ``command_packer``
or connection class of the user's, the pool's limits, retries and fork safety. Which
code ran is observed with ``sys.setprofile`` (the code objects called), nothing the
path depends on patched; the wrappers are real ones, the kind those libraries install.
Lost replies are lost for real by the loopback TCP proxy; a connection closed by the
server is closed with ``CLIENT KILL``.
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
import redis.asyncio.connection
import redis.client
import redis.connection
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redislock import LockManager

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


def _with_block(manager: LockManager, name: str) -> None:
    with manager.lock(name, ttl=10, auto_renew=False):
        assert manager.get(name) is not None


def _port() -> int:
    return int(redis.Redis.from_url(settings.REDIS_URL).connection_pool.connection_kwargs["port"])


def _client(port: int | None = None, **kwargs: Any) -> redis.Redis:
    """A client with no retries of its own: a stale connection used would fail the call."""
    return redis.Redis(
        host="127.0.0.1", port=port or _port(), retry=Retry(NoBackoff(), 0), **kwargs
    )


def _aclient(**kwargs: Any) -> redis.asyncio.Redis:
    return redis.asyncio.Redis(
        host="127.0.0.1", port=_port(), retry=Retry(NoBackoff(), 0), **kwargs
    )


def _on_an_asyncio_client(use: Callable[[LockManager], Awaitable[None]]) -> None:
    """Run *use* with a manager on a new ``redis.asyncio`` client, in a new event loop."""

    async def run() -> None:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        try:
            await use(LockManager(async_client=client))
        finally:
            await client.aclose()

    asyncio.run(run())


# -- every script through execute_command, every batch through pipeline() ------------


def test_a_plain_clients_lock_calls_go_through_execute_command(name: str) -> None:
    manager = LockManager(client=redis.Redis.from_url(settings.REDIS_URL))
    _with_block(manager, name)  # scripts loaded, connection made
    lock = manager.lock(name, ttl=10, auto_renew=False)
    with _recording() as called:
        lock.acquire()
        lock.release()
    assert called.count(_EXECUTE) == 2  # acquire, release
    assert manager.get(name) is None  # released for real


def test_an_asyncio_plain_clients_lock_calls_go_through_execute_command(name: str) -> None:
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
    assert _AEXECUTE in called  # a coroutine's every resumption is a "call"


def _both(manager: LockManager, names: list[str]) -> None:
    with manager.lock_many(names, ttl=10, auto_renew=False):
        assert all(manager.get(n) is not None for n in names)
    assert all(manager.get(n) is None for n in names)


def test_a_plain_clients_batches_go_through_its_pipeline(name: str) -> None:
    manager = LockManager(client=redis.Redis.from_url(settings.REDIS_URL))
    names = [f"{name}:a", f"{name}:b"]
    _both(manager, names)  # warm
    with _recording() as called, manager.lock_many(names, ttl=10, auto_renew=False):
        pass
    assert all(manager.get(n) is None for n in names)
    assert called.count(_PIPE_EXECUTE) == 2  # the attempts, the releases


def test_an_asyncio_plain_clients_batches_go_through_its_pipeline(name: str) -> None:
    names = [f"{name}:a", f"{name}:b"]

    async def use(manager: LockManager) -> None:
        async with manager.lock_many(names, ttl=10, auto_renew=False):  # warm
            pass
        with _recording() as seen:
            async with manager.lock_many(names, ttl=10, auto_renew=False):
                pass
        assert all([await manager.aget(n) is None for n in names])
        assert _APIPE_EXECUTE in seen

    _on_an_asyncio_client(use)


# -- what the user's client does applies to the lock's commands ----------------------


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


class _ParsingRedis(redis.Redis):
    """A user's client class that reads every reply its own way (here: redis-py's,
    noted), without touching ``execute_command``."""

    parsed: list[str] = []

    def parse_response(self, connection: Any, command_name: Any, **options: Any) -> Any:
        type(self).parsed.append(str(command_name))
        return super().parse_response(connection, command_name, **options)


def test_a_subclassed_clients_own_reply_parsing_reads_the_lock_replies(name: str) -> None:
    client = _ParsingRedis.from_url(settings.REDIS_URL)
    manager = LockManager(client=client)
    _with_block(manager, name)
    _ParsingRedis.parsed.clear()
    lock = manager.lock(name, ttl=10, auto_renew=False)
    assert lock.acquire(blocking=False)
    lock.release()
    assert _ParsingRedis.parsed.count("EVALSHA") == 2, _ParsingRedis.parsed
    client.close()


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


def test_a_single_connection_clients_lock_calls_go_on_its_connection(name: str) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL, single_connection_client=True)
    try:
        manager = LockManager(client=client)
        _with_block(manager, name)
        with _recording() as called:
            _with_block(manager, name)
        assert called.count(_EXECUTE) >= 2
        assert manager.get(name) is None
    finally:
        client.close()


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


# -- the bytes on the wire: redis-py's packers, the user's encodings -----------------


def test_a_lock_named_and_described_in_any_script_round_trips(name: str) -> None:
    manager = LockManager(client=redis.Redis.from_url(settings.REDIS_URL))
    named = f"{name}:caf\xe9 \u2603 \U0001f512"
    meta = {"who": "Jos\xe9", "why": "\u2603 " + "x" * 8000}  # past redis-py's chunk size
    with manager.lock(named, ttl=10, auto_renew=False, meta=meta):
        info = manager.get(named)
        assert info is not None and info.name == named
        assert info.meta["who"] == meta["who"] and info.meta["why"] == meta["why"]
    assert manager.get(named) is None


class _CountingPacker(redis.connection.PythonRespSerializer):
    """A user's ``command_packer``: redis-py's, counting what it packs."""

    packed: list[Any] = []

    def pack(self, *args: Any) -> Any:
        type(self).packed.append(args[0])
        return super().pack(*args)


class _OwnSendingConnection(redis.connection.Connection):
    """A connection class that writes its own way (here: redis-py's, the commands
    noted): a single command and a pipeline's batch alike go through it."""

    packed: list[Any] = []

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        data = command if isinstance(command, (bytes, str)) else b"".join(command)
        type(self).packed += ["EVALSHA"] * bytes(data).count(b"\r\nEVALSHA\r\n")
        super().send_packed_command(command, check_health)


class _OwnPackingAsyncConnection(redis.asyncio.connection.Connection):
    """:class:`_OwnPackingConnection` for asyncio."""

    packed: list[Any] = []

    def pack_command(self, *args: Any) -> Any:
        type(self).packed.append(args[0])
        return super().pack_command(*args)


def _count_packed(packed: list[Any], run: Callable[[], None]) -> list[Any]:
    packed.clear()
    run()
    return list(packed)


def test_a_command_packer_of_the_users_packs_the_lock_commands(name: str) -> None:
    # 6000: redis-py's own buffer cutoff; the encoder: a connection's, as redis-py's.
    packer = _CountingPacker(6000, redis.connection.Connection().encoder.encode)
    pool = redis.ConnectionPool.from_url(settings.REDIS_URL, command_packer=packer)
    client = redis.Redis(connection_pool=pool)
    seen = _count_packed(
        _CountingPacker.packed, lambda: _with_block(LockManager(client=client), name)
    )
    assert seen.count("EVALSHA") >= 2, seen  # acquire and release, packed by the user's
    client.close()


def test_a_connection_class_that_writes_its_own_way_writes_the_lock_commands(
    name: str,
) -> None:
    pool = redis.ConnectionPool.from_url(settings.REDIS_URL, connection_class=_OwnSendingConnection)
    client = redis.Redis(connection_pool=pool)
    manager = LockManager(client=client)
    seen = _count_packed(_OwnSendingConnection.packed, lambda: _with_block(manager, name))
    assert seen.count("EVALSHA") >= 2, seen
    names = [f"{name}:a", f"{name}:b"]
    seen = _count_packed(_OwnSendingConnection.packed, lambda: _both(manager, names))
    assert seen.count("EVALSHA") >= 4, seen  # a batch: both attempts, both releases
    client.close()


def test_an_asyncio_connection_class_that_packs_its_own_way_packs_the_lock_commands(
    name: str,
) -> None:
    async def cycle() -> None:
        pool = redis.asyncio.ConnectionPool.from_url(
            settings.REDIS_URL, connection_class=_OwnPackingAsyncConnection
        )
        client = redis.asyncio.Redis(connection_pool=pool)
        manager = LockManager(async_client=client)
        try:
            async with manager.lock(name, ttl=10, auto_renew=False):
                assert await manager.aget(name) is not None
            assert await manager.aget(name) is None
        finally:
            await client.aclose()

    seen = _count_packed(_OwnPackingAsyncConnection.packed, lambda: asyncio.run(cycle()))
    assert seen.count("EVALSHA") >= 2, seen
