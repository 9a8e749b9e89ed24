"""A real Redis Cluster on loopback for the cluster tests: 3 primaries, 3 replicas.

Six ``redis-server --cluster-enabled yes`` on free ports (no persistence,
``cluster-node-timeout 1000`` so a failover takes about 2.5 s). The slots are
assigned and the nodes introduced with plain commands (``CLUSTER ADDSLOTS``,
``MEET``, ``REPLICATE``) rather than ``redis-cli --cluster create``: primary
``i`` serves the i-th third of the slots and replica ``i`` replicates it.
Every wait polls with a bounded deadline.

:func:`shared_cluster` starts one cluster per test process (the first caller
starts it, it is stopped at exit), so every cluster test module shares it.
A test that breaks it (a SIGKILLed primary) builds its own :class:`Cluster`.
"""

from __future__ import annotations

import atexit
import os
import random
import signal
import socket

import redis
import redis.cluster

from example_project.embedded_redis import EmbeddedRedis
from tests.replication import wait_until

SLOTS = 16384
NODE_TIMEOUT_MS = 1000
#: A node also listens on port + 10000 (the cluster bus), so ports stay below this.
_PORTS = (20000, 45000)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_node_port() -> int:
    """A port that is free on 127.0.0.1 together with its cluster-bus port (+10000)."""
    for _ in range(200):
        port = random.randrange(*_PORTS)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free pair of ports for a cluster node")


class RedisServer(EmbeddedRedis):
    """One cluster node on 127.0.0.1, answering PING when constructed."""

    def __init__(self, *extra_args: str) -> None:
        super().__init__(port=free_node_port(), extra_args=extra_args)
        self.wait_ready()


class Cluster:
    """Three primaries with one replica each, ready (``cluster_state:ok``) when constructed."""

    def __init__(self, primaries: int = 3) -> None:
        args = (
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(NODE_TIMEOUT_MS),
            "--repl-diskless-sync-delay",
            "0",
        )
        self.primaries = [RedisServer(*args) for _ in range(primaries)]
        self.replicas = [RedisServer(*args) for _ in range(primaries)]
        try:
            self._form()
        except BaseException:
            self.stop()
            raise

    @property
    def servers(self) -> list[RedisServer]:
        """Every server, primaries first."""
        return [*self.primaries, *self.replicas]

    @property
    def url(self) -> str:
        """A redis:// URL of the first primary (a cluster client finds the rest)."""
        return self.primaries[0].url

    def node(self, server: RedisServer) -> redis.Redis:
        """A plain client on one node."""
        return redis.Redis(port=server.port, socket_timeout=5)

    def client(self, **kwargs: object) -> redis.cluster.RedisCluster:
        """A new cluster client (socket timeouts of a few seconds)."""
        options: dict[str, object] = {"socket_timeout": 5, "socket_connect_timeout": 2}
        options.update(kwargs)
        return redis.cluster.RedisCluster(
            host="127.0.0.1",
            port=self.primaries[0].port,
            **options,  # type: ignore[arg-type]
        )

    def _form(self) -> None:
        count = len(self.primaries)
        for i, server in enumerate(self.primaries):
            first, last = i * SLOTS // count, (i + 1) * SLOTS // count - 1
            self.node(server).execute_command("CLUSTER ADDSLOTS", *range(first, last + 1))
        first = self.node(self.primaries[0])
        for server in self.servers[1:]:
            first.execute_command("CLUSTER MEET", "127.0.0.1", server.port)
        for server in self.servers:
            wait_until(
                lambda s=server: _info(self.node(s))["cluster_known_nodes"] == str(2 * count),
                15,
                "every node to know every other",
            )
        for primary, replica in zip(self.primaries, self.replicas, strict=True):
            node_id = self.node(primary).execute_command("CLUSTER MYID")
            self.node(replica).execute_command("CLUSTER REPLICATE", node_id)
        self.wait_ok()
        for primary in self.primaries:
            wait_until(
                lambda p=primary: int(self.node(p).info("replication")["connected_slaves"]) >= 1,
                15,
                "every primary to have its replica connected",
            )

    def wait_ok(self, timeout: float = 15) -> None:
        """Wait until every live node reports ``cluster_state:ok``."""
        for server in self.servers:
            if server.process.poll() is None:
                wait_until(
                    lambda s=server: _info(self.node(s))["cluster_state"] == "ok",
                    timeout,
                    f"cluster_state:ok on port {server.port}",
                )

    def server_for_slot(self, slot: int) -> RedisServer:
        """The server that currently serves *slot* as a primary."""
        for server in self.servers:
            if server.process.poll() is not None:
                continue
            for first, last, (_host, port, *_), *_ in self.node(server).cluster("SLOTS"):
                if first <= slot <= last:
                    return next(s for s in self.servers if s.port == int(port))
        raise AssertionError(f"no node serves slot {slot}")

    def replica_of(self, primary: RedisServer) -> RedisServer:
        """The replica of *primary* (as formed)."""
        return self.replicas[self.primaries.index(primary)]

    def stop(self) -> None:
        """Stop every server (also a SIGSTOPped or SIGKILLed one)."""
        for server in self.servers:
            if server.process.poll() is None:
                os.kill(server.process.pid, signal.SIGCONT)
            server.stop()


def _info(client: redis.Redis) -> dict[str, str]:
    text = client.execute_command("CLUSTER INFO")
    if isinstance(text, bytes):
        text = text.decode()
    if isinstance(text, dict):
        return {str(k): str(v) for k, v in text.items()}
    return dict(line.split(":", 1) for line in str(text).split() if ":" in line)


_shared: Cluster | None = None


def shared_cluster() -> Cluster:
    """The test process's cluster (started on first use, stopped at exit)."""
    global _shared
    if _shared is None:
        _shared = Cluster()
        atexit.register(_shared.stop)
    return _shared
