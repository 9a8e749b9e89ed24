"""The prefork pattern of the metrics tests: ``python -m tests.metrics_proc DIR GROUP N K``.

Like a gunicorn master with ``--preload`` or a Celery prefork worker: with
``PROMETHEUS_MULTIPROC_DIR`` = *DIR* set before ``prometheus_client`` is imported,
the parent sets Django up, enables the Prometheus metrics, takes ``GROUP:held``
and forks *N* children. Each child acquires and releases ``GROUP:<i>`` *K* times,
then gives up one wait (50 ms) on ``GROUP:held``. The parent reaps them, releases
and prints ``done``.
"""

from __future__ import annotations

import os
import sys


def main(directory: str, group: str, children: int, iterations: int) -> None:
    """Run the parent (see the module docstring)."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django_redislock import locks, metrics

    metrics.enable("prometheus")
    held = locks.lock(f"{group}:held", ttl=30, owner="parent")
    assert held.acquire(blocking=False)
    pids = []
    for child in range(children):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                lock = locks.lock(f"{group}:{child}", ttl=10)
                for _ in range(iterations):
                    with lock:
                        pass
                assert not locks.lock(f"{group}:held", ttl=10).acquire(timeout=0.05)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    failed = [pid for pid in pids if os.waitpid(pid, 0)[1] != 0]
    held.release()
    print("failed" if failed else "done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
