"""Real primary/replica pairs (and a Sentinel set-up) for the wait_replicas tests.

Everything runs on loopback: a primary, a replica that replicates through a
:class:`~tests.tcp_proxy.TcpProxy` (so the tests can slow or cut the
replication stream for real), and optionally three sentinels.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

from tests.redis_server import RedisServer, free_port, redis_server_binary
from tests.tcp_proxy import TcpProxy

#: A replica's first sync starts at once (Redis 7 waits 5 s for more replicas by default).
FAST_SYNC = ("--repl-diskless-sync-delay", "0")


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll *check* every 20 ms until it is true; fail after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def link_up(replica: redis.Redis) -> bool:
    """Whether *replica* is connected to its primary and in sync."""
    info = replica.info("replication")
    return info.get("master_link_status") == "up" and not info.get("master_sync_in_progress")


class ReplicatedPair:
    """A primary and one replica that replicates through a proxy."""

    def __init__(self, *, through_proxy: bool = True) -> None:
        self.primary = RedisServer(*FAST_SYNC)
        self.proxy = TcpProxy(self.primary.port)
        upstream = self.proxy.port if through_proxy else self.primary.port
        self.replica = RedisServer("--replicaof", "127.0.0.1", str(upstream))
        self.primary_client = redis.Redis(port=self.primary.port, socket_timeout=5)
        self.replica_client = redis.Redis(port=self.replica.port, socket_timeout=5)
        wait_until(lambda: link_up(self.replica_client), 10, "the replica to sync")

    def stop(self) -> None:
        """Stop everything (also a SIGSTOPped or SIGKILLed server)."""
        for server in (self.primary, self.replica):
            if server.process.poll() is None:
                os.kill(server.process.pid, signal.SIGCONT)
            server.stop()
        self.proxy.close()

    def kill_primary(self) -> None:
        """SIGKILL the primary (nothing it did not send yet reaches the replica)."""
        self.primary.process.send_signal(signal.SIGKILL)
        self.primary.process.wait(5)

    def promote_replica(self) -> None:
        """Make the replica a primary, as a failover does."""
        self.replica_client.replicaof("NO", "ONE")


SERVICE = "lockfailover"


class SentinelSetup:
    """A primary, a replica and three sentinels (quorum 2) on loopback."""

    def __init__(self, down_after_ms: int = 1000) -> None:
        self.primary = RedisServer(*FAST_SYNC)
        self.replica = RedisServer(*FAST_SYNC, "--replicaof", "127.0.0.1", str(self.primary.port))
        wait_until(
            lambda: link_up(redis.Redis(port=self.replica.port, socket_timeout=2)),
            10,
            "the replica to sync",
        )
        self.sentinel_ports = [free_port() for _ in range(3)]
        self._dirs: list[Path] = []
        self._processes: list[subprocess.Popen[bytes]] = []
        for port in self.sentinel_ports:
            workdir = Path(tempfile.mkdtemp(prefix="redislock-sentinel-"))
            self._dirs.append(workdir)
            conf = workdir / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {workdir}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} 3000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            self._processes.append(
                subprocess.Popen(
                    [redis_server_binary(), str(conf), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        for port in self.sentinel_ports:
            sentinel = redis.Redis(port=port, socket_timeout=1)
            wait_until(
                lambda s=sentinel: (
                    int(  # type: ignore[misc]
                        s.sentinel_master(SERVICE).get("num-other-sentinels", 0)
                    )
                    >= 2
                    and int(s.sentinel_master(SERVICE).get("num-slaves", 0)) >= 1
                ),
                15,
                "the sentinels to find each other and the replica",
            )

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        """The sentinels' addresses, for ``redis.sentinel.Sentinel``."""
        return [("127.0.0.1", port) for port in self.sentinel_ports]

    def master_port(self) -> int:
        """The port of the primary the sentinels currently name."""
        sentinel = redis.Redis(port=self.sentinel_ports[0], socket_timeout=1)
        _host, port = sentinel.sentinel_get_master_addr_by_name(SERVICE)
        return int(port)

    def server_on(self, port: int) -> RedisServer:
        """The data server listening on *port*."""
        return self.primary if self.primary.port == port else self.replica

    def stop(self) -> None:
        """Stop the sentinels and the servers."""
        for process in self._processes:
            process.terminate()
        for process in self._processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
        for server in (self.primary, self.replica):
            server.stop()
