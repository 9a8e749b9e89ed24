"""A lock's commands share the user's connection pool as any command of the user's.

They go through redis-py's ``execute_command`` and ``pipeline()`` (tests/test_client_paths.py),
so the pool's limits, its checks of a connection before lending it, its fork safety and
the client's retries apply to them: a pool of one connection serves the lock and the
user's own commands alike (a user's pool class, a ``BlockingConnectionPool``); a
connection the server closed (``CLIENT KILL``, a real close) or that failed (a TCP
proxy that cuts every connection) does not fail the next call; a forked child and its
parent, threads and asyncio tasks sharing one client lose no update under the lock; a
reply lost for real (the proxy drops it) is retried and counts once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import threading
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redislock import LockBackendError, LockManager
from tests.tcp_proxy import TcpProxy
from tests.test_client_paths import _aclient, _both, _client, _port, _with_block

# -- the pool: its limits, a closed connection, a fork, threads and tasks -------------


class _OwnPool(redis.ConnectionPool):
    """A user's pool class: it may count or hand out connections its own way."""


@pytest.mark.parametrize(
    "pool",
    [
        pytest.param(lambda: redis.ConnectionPool(port=_port(), max_connections=1), id="limit-1"),
        pytest.param(
            lambda: redis.BlockingConnectionPool(port=_port(), max_connections=1, timeout=1),
            id="blocking-1",
        ),
        pytest.param(lambda: _OwnPool(port=_port(), max_connections=1), id="subclass"),
    ],
)
def test_a_pool_of_one_connection_serves_the_lock_and_the_user_alike(name: str, pool: Any) -> None:
    """Every lock call gives its connection back: a pool of one still serves the
    user's own commands between and after them."""
    client = redis.Redis(connection_pool=pool())
    manager = LockManager(client=client)
    for _ in range(3):
        with manager.lock(name, ttl=10, auto_renew=False):
            assert client.ping()
    assert client.ping() and manager.get(name) is None
    client.close()


def _kill_clients_named(redis_client: redis.Redis, client_name: str) -> int:
    """Close, from the server's side, every connection named *client_name*."""
    killed = 0
    for entry in redis_client.client_list():
        if entry.get("name") == client_name:
            killed += redis_client.client_kill_filter(_id=entry["id"])
    return killed


def test_a_connection_the_server_closed_does_not_fail_the_next_lock_call(
    name: str, redis_client: redis.Redis
) -> None:
    client = _client(client_name=f"closed-{name}")
    manager = LockManager(client=client)
    _with_block(manager, name)
    assert _kill_clients_named(redis_client, f"closed-{name}") >= 1
    with manager.lock(name, ttl=10) as held:
        assert held.fencing_token
    client.close()


def test_an_asyncio_connection_the_server_closed_does_not_fail_the_next_lock_call(
    name: str, redis_client: redis.Redis
) -> None:
    async def main() -> None:
        client = _aclient(client_name=f"closed-{name}")
        other = _aclient()
        manager = LockManager(async_client=client)
        try:
            async with manager.lock(name, ttl=10):
                pass
            assert _kill_clients_named(redis_client, f"closed-{name}") >= 1
            # One turn of the event loop's I/O (another connection's reply) lets it see
            # the close, as the pool's own check needs.
            with contextlib.suppress(redis.ConnectionError):
                await other.ping()
            await other.ping()
            async with manager.lock(name, ttl=10) as held:
                assert held.fencing_token
        finally:
            await client.aclose()
            await other.aclose()

    asyncio.run(main())


def _add_one(manager: LockManager, name: str, redis_client: redis.Redis, counter: str) -> None:
    """Read, then write the counter plus one, under the lock (a lost update shows)."""
    with manager.lock(name, ttl=10, timeout=20):
        value = int(redis_client.get(counter) or 0)
        redis_client.set(counter, value + 1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
# A fork of a process with threads (the watchdog's, the wake-up hub's) is what is
# tested: gunicorn's preload and Celery's prefork pool do it.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_and_its_parent_lock_on_one_client_at_once(
    name: str, redis_client: redis.Redis
) -> None:
    client = _client()
    manager = LockManager(client=client)
    _with_block(manager, name)  # the parent's pool has a connection
    counter = f"{name}:counter"
    cycles = 150
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: calls at the parent's time, on the inherited client
        status = 1
        try:
            os.close(read)
            os.write(write, b"1")
            for _ in range(cycles):
                _add_one(manager, name, redis_client, counter)
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 20)
    assert ready and os.read(read, 1) == b"1"
    os.close(read)
    for _ in range(cycles):
        _add_one(manager, name, redis_client, counter)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert int(redis_client.get(counter) or 0) == 2 * cycles  # no lost update
    client.close()


def test_after_a_failed_exchange_the_next_call_connects_afresh(
    name: str,
    proxy: TcpProxy,  # noqa: F811
) -> None:
    client = _client(port=proxy.port, socket_timeout=2, socket_connect_timeout=1)
    manager = LockManager(client=client)
    _with_block(manager, name)
    proxy.set_down(True)  # every connection cut, new ones refused
    try:
        with pytest.raises(LockBackendError):
            manager.lock(name, ttl=10).acquire(blocking=False)
    finally:
        proxy.set_down(False)
    with manager.lock(name, ttl=10) as held:
        assert held.fencing_token
    client.close()


def test_threads_sharing_a_pool_lose_no_update(name: str, redis_client: redis.Redis) -> None:
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


def test_asyncio_tasks_sharing_a_pool_lose_no_update(name: str, redis_client: redis.Redis) -> None:
    counter = f"{name}:counter"
    tasks, cycles = 10, 30

    async def main() -> None:
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
        finally:
            await client.aclose()

    asyncio.run(main())
    assert int(redis_client.get(counter) or 0) == tasks * cycles


# -- a retried send counts once ----------------------------------------------------


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


@pytest.mark.parametrize("retries", [0, 2])
def test_a_release_whose_reply_was_lost_is_retried_and_counts_once(
    proxy: TcpProxy,  # noqa: F811
    name: str,
    retries: int,
) -> None:
    client = _proxied(proxy, retries)
    manager = LockManager(client=client)
    _with_block(manager, name)  # scripts known, connection made
    lock = manager.lock(name, ttl=10, auto_renew=False)
    lock.acquire()
    lock.acquire()  # two holds: a release counted twice would free it
    proxy.drop_next_replies(1)
    before = proxy.requests
    lock.release()
    assert proxy.requests - before >= 2  # the lost one and its retry
    info = manager.get(name)
    assert info is not None and info.hold_count == 1, "a retried release counts once"
    lock.release()
    assert manager.get(name) is None
    client.close()


def test_a_batch_whose_reply_was_lost_is_retried_and_counts_once(
    proxy: TcpProxy,  # noqa: F811
    name: str,
) -> None:
    client = _proxied(proxy, 2)
    manager = LockManager(client=client)
    names = [f"{name}:a", f"{name}:b"]
    _both(manager, names)  # scripts known, connection made
    proxy.drop_next_replies(1)
    before = proxy.requests
    with manager.lock_many(names, ttl=10, auto_renew=False):
        assert proxy.requests - before >= 2  # the lost batch and its retry
        infos = [manager.get(n) for n in names]
        assert all(i is not None and i.hold_count == 1 for i in infos), infos
    assert all(manager.get(n) is None for n in names)
    client.close()
