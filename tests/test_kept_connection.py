"""The direct path keeps one connection per pool between exchanges (engine/backends/kept.py).

Against a real Redis: a plain pool lends a connection once and the lock calls after it
use the kept one (the pool's ``get_connection`` is watched with ``sys.setprofile``,
nothing patched); pools where keeping one would change something for the pool's other
users lend every time; a connection the server closed is closed and connected afresh
before it is used, with no retry to hide it (``CLIENT KILL`` of that connection, a real
close); a forked child and its parent run lock calls at once, each on its own
connection; a connection whose exchange failed (a TCP proxy that cuts every connection)
is closed, kept, and connected afresh for the next call, within the retry policy;
threads and asyncio tasks sharing one pool lose no update under the lock and leave at
most one connection kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redislock import LockBackendError, LockManager
from django_redislock.engine.backends import direct, kept
from tests.tcp_proxy import TcpProxy

_LEND = redis.ConnectionPool.get_connection
_ALEND = redis.asyncio.ConnectionPool.get_connection


def _port() -> int:
    return int(redis.Redis.from_url(settings.REDIS_URL).connection_pool.connection_kwargs["port"])


def _client(port: int | None = None, **kwargs: Any) -> redis.Redis:
    """A client with no retries: a stale connection used would fail the call."""
    return redis.Redis(
        host="127.0.0.1", port=port or _port(), retry=Retry(NoBackoff(), 0), **kwargs
    )


def _aclient(**kwargs: Any) -> redis.asyncio.Redis:
    return redis.asyncio.Redis(
        host="127.0.0.1", port=_port(), retry=Retry(NoBackoff(), 0), **kwargs
    )


@contextlib.contextmanager
def _calls(*functions: Any) -> Iterator[list[int]]:
    """How often any of *functions* (a pool's lending, say) is called inside the block."""
    codes = {getattr(f, "__wrapped__", f).__code__ for f in functions}
    count = [0]

    def watch(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code in codes:
            count[0] += 1

    sys.setprofile(watch)
    try:
        yield count
    finally:
        sys.setprofile(None)


def _warm(name: str, **kwargs: Any) -> tuple[redis.Redis, LockManager]:
    """A client (see :func:`_client`) and a manager on it, after one lock call."""
    client = _client(**kwargs)
    manager = LockManager(client=client)
    with manager.lock(name, ttl=10):
        pass
    return client, manager


def _add_one(manager: LockManager, name: str, redis_client: redis.Redis, counter: str) -> None:
    """Read, then write the counter plus one, under the lock (a lost update shows)."""
    with manager.lock(name, ttl=10, timeout=20):
        value = int(redis_client.get(counter) or 0)
        redis_client.set(counter, value + 1)


def _kept(pool: Any) -> list[Any]:
    keeper = kept.keeper(pool)
    assert keeper is not None
    return keeper.idle


def test_a_plain_pool_lends_once_and_later_lock_calls_use_the_kept_connection(
    name: str,
) -> None:
    client, manager = _warm(name)
    assert len(_kept(client.connection_pool)) == 1
    with _calls(_LEND) as lent:
        for _ in range(5):
            with manager.lock(name, ttl=10):
                pass
    assert lent[0] == 0
    assert len(_kept(client.connection_pool)) == 1


async def _hub_subscribed(manager: LockManager, timeout: float = 5.0) -> None:
    """Await this loop's wake-up hub being subscribed (bounded by *timeout*)."""
    hub = manager.source.abackend().hub()
    deadline = asyncio.get_running_loop().time() + timeout
    while not hub.ready:
        assert asyncio.get_running_loop().time() < deadline, "the wake-up hub never subscribed"
        await asyncio.sleep(0.005)


def test_an_asyncio_pool_lends_once_too(name: str) -> None:
    async def main() -> int:
        client = _aclient()
        manager = LockManager(async_client=client)
        try:
            async with manager.lock(name, ttl=10):
                pass
            # A blocking acquire starts the loop's wake-up hub, whose reader task
            # subscribes on a connection of its own from the pool. The pool's
            # get_connection is a coroutine: each resumption of one begun before the
            # window is a "call" to sys.setprofile, so the subscription must be done
            # before the lock calls are counted. (With redis-py 7.0 and 7.1 it was often
            # still connecting after the warm-up call: the pubsub's lend was counted.)
            await _hub_subscribed(manager)
            with _calls(_ALEND) as lent:
                for _ in range(5):
                    async with manager.lock(name, ttl=10):
                        pass
            assert len(_kept(client.connection_pool)) == 1
            return lent[0]
        finally:
            await client.aclose()

    assert asyncio.run(main()) == 0


class _OwnPool(redis.ConnectionPool):
    """A user's pool class: it may count or hand out connections its own way."""


@pytest.mark.parametrize(
    "pool",
    [
        pytest.param(lambda: redis.ConnectionPool(port=_port(), max_connections=10), id="limit-10"),
        pytest.param(lambda: redis.BlockingConnectionPool(port=_port()), id="blocking"),
        pytest.param(lambda: _OwnPool(port=_port()), id="subclass"),
    ],
)
def test_pools_where_keeping_one_would_matter_lend_every_time(name: str, pool: Any) -> None:
    client = redis.Redis(connection_pool=pool())
    manager = LockManager(client=client)
    with manager.lock(name, ttl=10):
        pass
    assert kept.keeper(client.connection_pool) is None
    lending = (type(client.connection_pool).get_connection,)
    with _calls(*lending) as lent:
        for _ in range(3):
            with manager.lock(name, ttl=10):
                pass
    assert lent[0] == 6  # an acquire and a release each
    # Every connection went back: the pool's limit is the user's to use.
    assert not getattr(client.connection_pool, "_in_use_connections", ())


def test_a_connection_the_server_closed_is_replaced_before_it_is_used(
    name: str, redis_client: redis.Redis
) -> None:
    client, manager = _warm(name)
    (conn,) = _kept(client.connection_pool)
    conn.send_command("CLIENT", "ID")
    assert redis_client.client_kill_filter(_id=conn.read_response()) == 1
    with _calls(direct._failed) as failed, manager.lock(name, ttl=10) as held:
        assert held.fencing_token
    assert failed[0] == 0  # no exchange was tried on the closed connection
    assert len(_kept(client.connection_pool)) == 1


def test_an_asyncio_connection_the_server_closed_is_replaced_before_it_is_used(
    name: str, redis_client: redis.Redis
) -> None:
    async def main() -> None:
        client = _aclient()
        other = _aclient()
        manager = LockManager(async_client=client)
        try:
            async with manager.lock(name, ttl=10):
                pass
            (conn,) = _kept(client.connection_pool)
            await conn.send_command("CLIENT", "ID")
            assert redis_client.client_kill_filter(_id=await conn.read_response()) == 1
            # One turn of the event loop's I/O (another connection's reply) lets it see
            # the close, as the pool's own check needs.
            with contextlib.suppress(redis.ConnectionError):
                await other.ping()
            await other.ping()
            with _calls(direct._afailed) as failed:
                async with manager.lock(name, ttl=10) as held:
                    assert held.fencing_token
            assert failed[0] == 0  # no exchange was tried on the closed connection
        finally:
            await client.aclose()
            await other.aclose()

    asyncio.run(main())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
# A fork of a process with threads (the watchdog's, the wake-up hub's) is what is
# tested: gunicorn's preload and Celery's prefork pool do it.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_and_its_parent_each_use_their_own_connection(
    name: str, redis_client: redis.Redis
) -> None:
    client, manager = _warm(name)
    (parent_conn,) = _kept(client.connection_pool)
    parent_port = parent_conn._sock.getsockname()[1]
    counter = f"{name}:counter"
    cycles = 150
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a first lock call alone, then calls at the parent's time
        status = 1
        try:
            os.close(read)
            with manager.lock(name, ttl=10, timeout=20):
                pass
            (child_conn,) = _kept(client.connection_pool)
            os.write(write, str(child_conn._sock.getsockname()[1]).encode())
            for _ in range(cycles):
                _add_one(manager, name, redis_client, counter)
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 20)
    child_port = int(os.read(read, 64) or 0) if ready else 0
    os.close(read)
    for _ in range(cycles):
        _add_one(manager, name, redis_client, counter)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_port and child_port != parent_port  # the child's first call had its own
    assert int(redis_client.get(counter) or 0) == 2 * cycles  # no lost update
    assert _kept(client.connection_pool) == [parent_conn]


def test_a_connection_whose_exchange_failed_is_connected_afresh_for_the_next_call(
    name: str,
    proxy: TcpProxy,  # noqa: F811
) -> None:
    client, manager = _warm(name, port=proxy.port, socket_timeout=2, socket_connect_timeout=1)
    pool = client.connection_pool
    (conn,) = _kept(pool)
    proxy.set_down(True)  # every connection cut, new ones refused
    try:
        with pytest.raises(LockBackendError):
            manager.lock(name, ttl=10).acquire(blocking=False)
        # Kept (the engine's retries reconnect it rather than take another of the
        # pool's), closed by redis-py: nothing half-read can be used again.
        assert _kept(pool) == [conn]
        assert conn._sock is None
    finally:
        proxy.set_down(False)
    with _calls(direct._failed) as failed, manager.lock(name, ttl=10):
        pass
    assert failed[0] == 0
    assert _kept(pool) == [conn] and conn._sock is not None


def test_threads_sharing_a_pool_lose_no_update_and_keep_one_connection(
    name: str, redis_client: redis.Redis
) -> None:
    client = _client()
    manager = LockManager(client=client)
    counter = f"{name}:counter"
    threads, cycles = 6, 60
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(cycles):
                _add_one(manager, name, redis_client, counter)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert not errors
    assert int(redis_client.get(counter) or 0) == threads * cycles
    assert len(_kept(client.connection_pool)) <= 1


def test_asyncio_tasks_sharing_a_pool_lose_no_update_and_keep_one_connection(
    name: str, redis_client: redis.Redis
) -> None:
    counter = f"{name}:counter"
    tasks, cycles = 10, 30

    async def main() -> int:
        client = _aclient()
        manager = LockManager(async_client=client)

        async def work() -> None:
            for _ in range(cycles):
                async with manager.lock(name, ttl=10, timeout=20):
                    value = int(await client.get(counter) or 0)
                    await asyncio.sleep(0)
                    await client.set(counter, value + 1)

        try:
            await asyncio.wait_for(asyncio.gather(*(work() for _ in range(tasks))), 60)
            return len(_kept(client.connection_pool))
        finally:
            await client.aclose()

    assert asyncio.run(main()) <= 1
    assert int(redis_client.get(counter) or 0) == tasks * cycles
