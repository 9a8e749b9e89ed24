"""The Celery app the Celery tests run in a real worker: ``celery -A tests.celery_app worker``.

Broker and result backend are databases 1 and 2 of the test redis-server (the
per-test flush only empties database 0, where the locks and the probe lists
live). Tasks report what they do by pushing to ``events:<tag>`` and wait for
the test on ``gate:<tag>``, so tests await events instead of sleeping.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

import redis  # noqa: E402
from celery import Celery  # noqa: E402
from celery.exceptions import Ignore  # noqa: E402
from django.conf import settings  # noqa: E402

from django_redislock import locks, single_instance  # noqa: E402
from django_redislock.celery import SingleInstanceTask  # noqa: E402

_BASE = settings.REDIS_URL.rsplit("/", 1)[0]
BROKER_URL = f"{_BASE}/1"
RESULT_URL = f"{_BASE}/2"

app = Celery("tests")
app.conf.update(
    broker_url=BROKER_URL,
    result_backend=RESULT_URL,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    result_expires=600,
)
if os.environ.get("REDISLOCK_TEST_VISIBILITY"):
    # A broker that redelivers an unacknowledged message after a few seconds, and
    # looks for such messages every second (tests/test_celery_redelivery.py).
    app.conf.broker_transport_options = {
        "visibility_timeout": float(os.environ["REDISLOCK_TEST_VISIBILITY"]),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }

if os.environ.get("REDISLOCK_TEST_PREFETCH"):
    # A worker that reserves messages ahead of its runs (Celery's default is 4).
    app.conf.worker_prefetch_multiplier = int(os.environ["REDISLOCK_TEST_PREFETCH"])

if os.environ.get("REDISLOCK_TEST_SOFT_SHUTDOWN"):
    # Celery 5.5+: a cold shutdown first waits this long for running tasks, then
    # cancels them and restores their unacknowledged messages (the Kubernetes setting).
    app.conf.worker_soft_shutdown_timeout = float(os.environ["REDISLOCK_TEST_SOFT_SHUTDOWN"])

probe = redis.Redis.from_url(settings.REDIS_URL)
GATE_WAIT = 20  # seconds a task waits for its gate at most


def _event(tag: str, *parts: Any) -> None:
    probe.rpush(f"events:{tag}", " ".join(str(p) for p in parts))


def _wait_gate(tag: str, wait: float = GATE_WAIT) -> None:
    probe.blpop([f"gate:{tag}"], timeout=wait)


@app.task(bind=True)
@single_instance("acct:{account_id}", ttl=30)
def hold(self: Any, account_id: int, tag: str) -> str:
    """Hold acct:<id> until the test opens gate:<tag>."""
    _event(tag, "start", self.request.id)
    _wait_gate(tag)
    _event(tag, "end", self.request.id)
    return "done"


@app.task(bind=True, base=SingleInstanceTask, lock_key="limited:{group}", lock_limit=2)
def limited(self: Any, group: str, tag: str) -> str:
    """At most two at once per group (a semaphore): runs until gate:<tag> opens."""
    _event(tag, "start", self.request.id)
    _wait_gate(tag)
    return "done"


@app.task
@single_instance("short:{account_id}", ttl=1)
def short_hold(account_id: int, tag: str) -> str:
    """Hold short:<id> (a 1 s lease, so only the watchdog keeps it) until gate:<tag> opens."""
    from celery import current_task

    _event(tag, "start", current_task.request.id)
    _wait_gate(tag)
    _event(tag, "end", current_task.request.id)
    return "done"


@app.task(bind=True, max_retries=10)
@single_instance("retrying:{account_id}", ttl=2, on_locked="retry")
def hold_or_retry(self: Any, account_id: int, tag: str) -> str:
    """Like ``hold``, but a duplicate retries after the holder's remaining lease."""
    _event(tag, "start", self.request.id, self.request.retries)
    _wait_gate(tag)
    _event(tag, "end", self.request.id)
    return "done"


@app.task(
    bind=True,
    base=SingleInstanceTask,
    lock_key="uniq:{item}",
    lock_ttl=30,
    unique_on_enqueue=True,
)
def unique(self: Any, item: Any, tag: str) -> str:
    """Queued at most once per item; waits for gate:<tag>."""
    _event(tag, "start", self.request.id)
    _wait_gate(tag)
    _event(tag, "end", self.request.id)
    return "done"


@app.task(
    bind=True,
    base=SingleInstanceTask,
    lock_key="typed:{ident}:{day}:{amount}:{at}",
    unique_on_enqueue=True,
)
def typed(self: Any, ident: Any, day: Any, amount: Any, at: Any, tag: str = "typed") -> str:
    """Key from a UUID, a date, a Decimal and a datetime: must match at enqueue and run time."""
    _event(tag, "start", self.request.id)
    _wait_gate(tag)
    return "done"


@app.task(
    bind=True,
    base=SingleInstanceTask,
    lock_key="retry-keep:{n}",
    lock_ttl=30,
    unique_on_enqueue=True,
    max_retries=3,
)
def retry_once(self: Any, n: int, tag: str) -> str:
    """Retries itself once (countdown 1 s), keeping its lock; then finishes."""
    _event(tag, "run", self.request.id, self.request.retries)
    if self.request.retries == 0:
        raise self.retry(countdown=1)
    return "done"


@app.task(bind=True, max_retries=3)
@single_instance("retry-release:{n}", lock_on_retry="release")
def retry_releasing(self: Any, n: int, tag: str) -> str:
    """Retries itself once (countdown 1 s), freeing its lock meanwhile; then finishes."""
    _event(tag, "run", self.request.id, self.request.retries)
    if self.request.retries == 0:
        raise self.retry(countdown=1)
    return "done"


@app.task(bind=True, base=SingleInstanceTask, lock_key="resched", unique_on_enqueue=True)
def reschedule(self: Any, left: int, tag: str) -> str:
    """Re-queues itself *left* more times from inside its own body."""
    _event(tag, "run", self.request.id, left)
    if left > 0:
        self.apply_async((left - 1, tag), countdown=1)
    return "done"


@app.task(bind=True)
@single_instance("ignored:{n}")
def ignored(self: Any, n: int, tag: str) -> None:
    """Ends with Ignore (its lock must still be released)."""
    _event(tag, "run", self.request.id)
    raise Ignore()


@app.task
def plain(n: int) -> int:
    """No lock at all (the benchmark's baseline)."""
    return n


@app.task
def floor(n: int) -> int:
    """The least a run-time lock can cost: SET NX PX before, DEL after (benchmark).

    Two round trips on the client our locks use, with no owner check, no queue,
    no renewal and nothing for the admin to show: the floor the run-time modes
    are measured against.
    """
    from django_redislock.client.connection import resolve_client

    client = resolve_client()
    key = f"bench-floor:{n}"
    client.set(key, "1", nx=True, px=30000)
    client.delete(key)
    return n


@app.task
def lock_only(n: int) -> int:
    """A plain task whose body takes ``locks.lock()``: our lock, no task glue (benchmark)."""
    with locks.lock(f"bench-lock:{n}"):
        return n


@app.task
@single_instance("bench:{n}")
def decorated(n: int) -> int:
    """@single_instance around a trivial body (benchmark)."""
    return n


@app.task(acks_late=True)
@single_instance("bench-late:{n}")
def decorated_late(n: int) -> int:
    """@single_instance on an ``acks_late`` task (benchmark): its lock also reads and
    writes the execution's completion record."""
    return n


@app.task(base=SingleInstanceTask, lock_key="bench-base:{n}")
def based(n: int) -> int:
    """SingleInstanceTask around a trivial body (benchmark)."""
    return n


@app.task(base=SingleInstanceTask, lock_key="bench-uniq:{n}", unique_on_enqueue=True)
def based_unique(n: int) -> int:
    """SingleInstanceTask with enqueue-time dedupe around a trivial body (benchmark)."""
    return n


# Shaped runs against plain ``@single_instance`` (benchmarks/bench_celery.py --shaping).
# Every body records its run in ``bench:done``: a debounced run is a new task, so the
# call's own AsyncResult never gets its result. Each call on a fresh key runs; calls on
# a key the benchmark made busy (held, rated, cooling, pending, debouncing) end without
# running, each with its skip marker.
BENCH_DONE = "bench:done"


@app.task
@single_instance("bench-plain:{n}")
def shaped_plain(n: Any) -> Any:
    """Plain ``@single_instance``, the baseline of the shaped variants (benchmark)."""
    probe.rpush(BENCH_DONE, n)
    return n


@app.task
@single_instance("bench-rate:{n}", rate=(1, 3600), on_limited="skip")
def shaped_rate(n: Any) -> Any:
    """One start per hour per key: a fresh key starts, a second call is skipped."""
    probe.rpush(BENCH_DONE, n)
    return n


@app.task
@single_instance("bench-cool:{n}", cooldown=3600, on_limited="skip")
def shaped_cooldown(n: Any) -> Any:
    """An hour's cooldown per key: a fresh key starts, a call after its run is skipped."""
    probe.rpush(BENCH_DONE, n)
    return n


@app.task
@single_instance("bench-co:{n}", coalesce=True)
def shaped_coalesce(n: Any) -> Any:
    """Coalescing: a fresh key runs; a call that finds the key held pends (benchmark)."""
    probe.rpush(BENCH_DONE, n)
    return n


@app.task
@single_instance("bench-db:{n}", debounce=0.01)
def shaped_debounce(n: Any) -> Any:
    """Debounced by 10 ms: each call on a fresh key runs once, after its quiet period."""
    probe.rpush(BENCH_DONE, n)
    return n


@app.task
@single_instance("bench-dbq:{n}", debounce=3600)
def shaped_debounce_quiet(n: Any) -> Any:
    """Debounced by an hour: the calls after a key's first are postponed (benchmark)."""
    probe.rpush(BENCH_DONE, n)
    return n


# Peer libraries, for benchmarks/bench_celery.py (optional: the ``bench`` extra).
PEERS: list[str] = []
try:
    from celery_once import QueueOnce
except ImportError:  # pragma: no cover - optional
    pass
else:
    app.conf.ONCE = {
        "backend": "celery_once.backends.Redis",
        "settings": {"url": f"{_BASE}/5", "default_timeout": 60},
    }

    @app.task(base=QueueOnce, once={"keys": ["n"]})
    def once_task(n: int) -> int:
        """celery-once's QueueOnce around a trivial body (benchmark)."""
        return n

    PEERS.append("once_task")
try:
    from celery_singleton import Singleton
except ImportError:  # pragma: no cover - optional
    pass
else:
    app.conf.singleton_backend_url = f"{_BASE}/5"

    @app.task(base=Singleton)
    def singleton_task(n: int) -> int:
        """celery-singleton's Singleton around a trivial body (benchmark)."""
        return n

    PEERS.append("singleton_task")


class Worker:
    """A real ``celery worker`` subprocess on this app, in its own process group."""

    def __init__(
        self,
        *,
        concurrency: int = 2,
        pool: str = "prefork",
        name: str = "w1",
        queues: str = "celery",
        env: dict[str, str] | None = None,
        app_module: str = "tests.celery_app",
    ) -> None:
        self.pool = pool
        #: The environment the worker was started with, beside this process's.
        self.env = dict(env or {})
        #: The workers consuming the same queue, whose logs tell what happened to a
        #: message (two solo workers share one in the redelivery tests).
        self.peers: list[Worker] = [self]
        self.hostname = f"{name}-{os.getpid()}@127.0.0.1"
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"redislock-{self.hostname}.log"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                app_module,  # another test module may add tasks to this app
                "worker",
                f"--pool={pool}",
                f"--concurrency={concurrency}",
                "-l",
                "info",
                "-n",
                self.hostname,
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                f"--logfile={self.log}",
                "-Q",
                queues,
            ],
            cwd=str(Path(__file__).resolve().parent.parent),
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Return once the worker answers a ping; raise if it died or never answered."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"celery worker exited with {self.process.returncode}:\n" + self.log_text()
                )
            replies = app.control.ping(destination=[self.hostname], timeout=0.5)
            if replies:
                return
        raise RuntimeError("celery worker did not answer a ping in time:\n" + self.log_text())

    def log_text(self, full: bool = False) -> str:
        """The worker's log so far (its end, for failure messages; *full*: all of it)."""
        try:
            text = self.log.read_text()
            return text if full else text[-5000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the worker and its pool children at once (no cleanup runs)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """Stop the worker: a warm shutdown, then SIGKILL if it lingers."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        if self.process.poll() is None:
            self.kill()


# Redelivery and self-locking (tests/test_celery_redelivery.py).
def _duplicate_seen(info: Any, tag: str, hold: float) -> str:
    """on_locked of ``long_acks_late``: record the duplicate execution, run nothing."""
    from celery import current_task

    _event(tag, "duplicate", current_task.request.id)
    return "duplicate"


@app.task(bind=True, acks_late=True)
@single_instance("redeliver:{tag}", ttl=2, on_locked=_duplicate_seen)
def long_acks_late(self: Any, tag: str, hold: float) -> str:
    """Runs *hold* seconds, longer than the broker's visibility timeout."""
    _event(tag, "start", self.request.id, os.getpid(), time.monotonic())
    time.sleep(hold)
    _event(tag, "end", self.request.id, os.getpid(), time.monotonic())
    return "done"


@app.task(bind=True, base=SingleInstanceTask, lock_key="selflock:{n}", lock_ttl=5)
def locks_itself(self: Any, n: int, tag: str) -> int:
    """Takes its own guard's lock by name (and calls a function guarded by it)."""
    from django_redislock import locks

    with locks.lock(f"selflock:{n}") as held:  # waits without limit by default
        count = locks.get(f"selflock:{n}").hold_count
        _event(tag, "inside", held.owner == locks.get(f"selflock:{n}").owner, count)
    return guarded_helper(n)


@single_instance("selflock:{n}")
def guarded_helper(n: int) -> int:
    """A plain function guarded by the same name as the task that calls it."""
    from django_redislock import locks

    return locks.get(f"selflock:{n}").hold_count


# Canvases (tests/test_celery_canvas.py).
@app.task(bind=True)
def after(self: Any, previous: Any, tag: str) -> dict[str, Any]:
    """A chain's next step: records and returns the result it was given."""
    _event(tag, "after", self.request.id)
    return {"after": previous}


@app.task
def gather(results: list[Any], tag: str) -> list[Any]:
    """A chord's callback: records that it ran and returns the header's results."""
    _event(tag, "gathered", len(results))
    return results


# Lost pool processes (tests/test_celery_lost.py): each reports its pool process's pid.
@app.task(bind=True)
@single_instance("lost:{n}", ttl=30)
def lost_decorated(self: Any, n: str, tag: str) -> str:
    """Holds lost:<n> (a 30 s lease) until gate:<tag> opens."""
    _event(tag, "start", self.request.id, os.getpid())
    _wait_gate(tag)
    return "done"


@app.task(bind=True, base=SingleInstanceTask, lock_key="lost-base:{n}", lock_ttl=30)
def lost_based(self: Any, n: str, tag: str) -> str:
    """SingleInstanceTask holding lost-base:<n> (a 30 s lease) until gate:<tag> opens."""
    _event(tag, "start", self.request.id, os.getpid())
    _wait_gate(tag)
    return "done"


@app.task(bind=True, retry_on_worker_lost=True, default_retry_delay=1, max_retries=1)
@single_instance("lost-retry:{n}", ttl=30)
def lost_retried(self: Any, n: str, tag: str) -> str:
    """Retried 1 s after its pool process is lost (Celery 5.7+); holds lost-retry:<n>."""
    _event(tag, "start", self.request.id, os.getpid())
    _wait_gate(tag)
    return "done"


# Copies of an execution (tests/test_celery_redelivery.py): each reports its pid.
@app.task(bind=True, acks_late=True, reject_on_worker_lost=True)
@single_instance("requeued:{tag}", ttl=30)
def requeued_on_loss(self: Any, tag: str) -> str:
    """acks_late + reject_on_worker_lost, a 30 s lease: waits for gate:<tag>."""
    _event(tag, "start", self.request.id, os.getpid())
    _wait_gate(tag)
    _event(tag, "end", self.request.id, os.getpid())
    return "done"


@app.task(bind=True, acks_late=True, base=SingleInstanceTask, lock_key="late:{tag}", lock_ttl=30)
def late_long_lease(self: Any, tag: str) -> str:
    """acks_late, a 30 s lease: waits for gate:<tag>."""
    _event(tag, "start", self.request.id, os.getpid())
    _wait_gate(tag)
    _event(tag, "end", self.request.id, os.getpid())
    return "done"


# Celery's autoretry_for (tests/test_celery_worker.py).
@app.task(bind=True, autoretry_for=(ValueError,), retry_kwargs={"countdown": 2, "max_retries": 1})
@single_instance("autoretry:{tag}", ttl=30)
def flaky(self: Any, tag: str, always: bool = False) -> str:
    """Fails with ValueError (autoretried 2 s later, once); the retry succeeds unless *always*."""
    _event(tag, "run", self.request.id, self.request.retries)
    if always or self.request.retries == 0:
        raise ValueError("fails")
    return "done"


@app.task(bind=True, acks_late=True, reject_on_worker_lost=True)
@single_instance("chaos:{key}", ttl=4)
def chaos(self: Any, key: str, tag: str, seconds: float) -> str:
    """Runs *seconds*, recording its start and end with the process and the time."""
    _event(tag, "start", self.request.id, os.getpid(), time.monotonic())
    time.sleep(seconds)
    _event(tag, "end", self.request.id, os.getpid(), time.monotonic())
    return key
