#!/usr/bin/env python
"""Redis memory per held lock and per released name, side by side with the peers.

For each library and each N, on a fresh redis-server (the system's binary, started
here on a free loopback port, no persistence): N distinct names are locked and
held (growth of ``used_memory`` without the clients' buffers, per lock), then all
released (what stays, per name, and how many keys). Peers: the floor (``SET NX
PX`` + a compare-and-delete script), redis-py's ``Lock`` and python-redis-lock (the
``bench`` dependency group); ours with ``auto_renew=False`` (the watchdog is
measured in ``bench_scale.py``).

    .venv/bin/python benchmarks/bench_memory.py --n 1000 10000 100000

It prints one line per library and N, and a JSON list at the end (``--json FILE``).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

_RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server() -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return proc, port
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _used(client: redis.Redis) -> int:
    memory = client.info("memory")
    return int(memory["used_memory"]) - int(memory.get("mem_clients_normal", 0))


def _libraries(port: int) -> dict[str, Callable[[str], Any]]:
    client = redis.Redis(port=port)
    release = client.register_script(_RELEASE)

    class Floor:
        def __init__(self, name: str) -> None:
            self.name, self.token = name, f"{id(self)}"

        def acquire(self) -> bool:
            return bool(client.set(self.name, self.token, nx=True, px=600_000))

        def release(self) -> None:
            release(keys=[self.name], args=[self.token])

    libs: dict[str, Callable[[str], Any]] = {
        "floor": Floor,
        "redis-py Lock": lambda name: client.lock(name, timeout=600),
    }
    try:
        import redis_lock

        libs["python-redis-lock"] = lambda name: redis_lock.Lock(client, name, expire=600)
    except ImportError:
        pass

    from django.conf import settings

    if not settings.configured:
        import django

        settings.configure(
            USE_TZ=True, INSTALLED_APPS=[], REDISLOCK_URL=f"redis://127.0.0.1:{port}/0"
        )
        django.setup()
    from django_redislock import LockManager

    manager = LockManager(url=f"redis://127.0.0.1:{port}/0")

    def ours(name: str) -> Any:
        return manager.lock(name, ttl=600, auto_renew=False)

    libs["django-redislock"] = ours
    return libs


def measure(lib: str, n: int) -> dict[str, Any]:
    """One library at N held locks, on a server of its own."""
    proc, port = _server()
    try:
        client = redis.Redis(port=port)
        make = _libraries(port)[lib]
        warm = make("warm")  # scripts loaded, connections open
        warm.acquire()
        warm.release()
        keys0, used0 = client.dbsize(), _used(client)
        held = []
        for i in range(n):
            lock = make(f"report:{i:07d}")
            assert lock.acquire()
            held.append(lock)
        keys1, used1 = client.dbsize(), _used(client)
        for lock in held:
            lock.release()
        keys2, used2 = client.dbsize(), _used(client)
        return {
            "library": lib,
            "n": n,
            "held_bytes_per_lock": round((used1 - used0) / n, 1),
            "held_keys_per_lock": round((keys1 - keys0) / n, 3),
            "left_bytes_per_name": round((used2 - used0) / n, 1),
            "left_keys": keys2 - keys0,
        }
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    """Run every library at every N and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", nargs="+", help="these libraries only (by the names printed)")
    args = parser.parse_args()
    probe, port = _server()
    names = [n for n in _libraries(port) if not args.only or n in args.only]
    probe.terminate()
    results = []
    for n in args.n:
        for lib in names:
            row = measure(lib, n)
            results.append(row)
            print(
                f"{lib:20} N={n:>7}  held {row['held_bytes_per_lock']:>7} B/lock "
                f"({row['held_keys_per_lock']} keys)  left {row['left_bytes_per_name']:>6} "
                f"B/name ({row['left_keys']} keys)",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
