"""Celery on real workers (prefork, threads, solo) whose broker redelivers fast: a
redelivered copy of a running message (same task id) never runs beside it, a
redelivery after a SIGKILLed worker still runs, and a task that locks its own guard's
name does not deadlock.

The worker's broker has a 2 s visibility timeout and looks for unacknowledged messages
every second (``REDISLOCK_TEST_VISIBILITY``, see tests/celery_app.py), so a task with
``acks_late=True`` that runs 6 s is handed out again while it runs.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator

import celery
import pytest
import redis
from django.conf import settings

from django_redislock import locks
from tests import celery_app as ca
from tests.brokers import needs_prompt_redelivery

pytestmark = [pytest.mark.celery, pytest.mark.slow]

VISIBILITY = "2"
QUEUE = "redeliver"


def _flush_broker() -> None:
    base = settings.REDIS_URL.rsplit("/", 1)[0]
    for db in (1, 2):
        redis.Redis.from_url(f"{base}/{db}").flushdb()


def _worker(name: str, pool: str = "prefork") -> ca.Worker:
    return ca.Worker(
        concurrency=2,
        pool=pool,
        name=name,
        queues=QUEUE,
        env={"REDISLOCK_TEST_VISIBILITY": VISIBILITY, "REDISLOCK_TEST_LOG_LEVEL": "INFO"},
    )


@pytest.fixture(params=["prefork", "threads", "solo"])
def worker(request: pytest.FixtureRequest) -> Iterator[ca.Worker]:
    """A worker on each pool. A solo worker runs one task at a time, so a redelivered
    copy can only overlap the first on another worker: with solo, a second solo worker
    consumes the same queue (how solo pools are scaled)."""
    _flush_broker()
    workers = [_worker("redeliver", request.param)]
    if request.param == "solo":
        workers.append(_worker("redeliver-2", "solo"))
    workers[0].peers = workers
    try:
        for w in workers:
            w.wait_ready()
        yield workers[0]
    finally:
        for w in workers:
            w.stop()


def _wait_log(worker: ca.Worker, text: str, timeout: float) -> None:
    """Wait (bounded) until the log of *worker*, or of a solo worker beside it, has *text*."""
    workers = worker.peers
    deadline = time.monotonic() + timeout
    while not any(text in w.log_text(full=True) for w in workers):
        assert time.monotonic() < deadline, f"no {text!r} in the worker log:\n" + worker.log_text()
        time.sleep(0.1)


def _events(tag: str, timeout: float) -> list[str]:
    got = ca.probe.blpop([f"events:{tag}"], timeout=timeout)
    assert got is not None, f"no event on events:{tag} within {timeout} s"
    return got[1].decode().split()


@needs_prompt_redelivery
def test_a_redelivered_copy_never_runs_beside_the_running_one(worker: ca.Worker, name: str) -> None:
    result = ca.long_acks_late.apply_async((name, 6.0), queue=QUEUE)
    start = _events(name, 20)
    assert start[:2] == ["start", result.id]
    # Within the 6 s run the broker hands the same message out again (same task id):
    # the copy is deferred (sent again for when the lease runs out), not run.
    _wait_log(worker, f"{result.id}] is a redelivered copy of execution", 15)
    end = _events(name, 15)
    assert end[:2] == ["end", result.id]
    # The copy stored no result: the caller reads the real execution's.
    assert result.get(timeout=15) == "done"
    # The deferred copy comes back, finds the execution completed, and is dropped.
    _wait_log(worker, f"{result.id}] already completed", 20)
    # Only one execution ran the body; the on_locked callable (which would have
    # stored its own result) was never called for a copy of the same task id.
    rest = ca.probe.lrange(f"events:{name}", 0, -1)
    assert rest == [], rest
    assert result.get(timeout=5) == "done"
    assert locks.get(f"redeliver:{name}") is None


@needs_prompt_redelivery
def test_a_redelivery_after_the_worker_was_killed_still_runs(name: str) -> None:
    _flush_broker()
    first = _worker("doomed")
    try:
        first.wait_ready()
        result = ca.long_acks_late.apply_async((name, 30.0), queue=QUEUE)
        start = _events(name, 20)
        assert start[:2] == ["start", result.id]
        first.kill()  # the whole worker: nobody releases the lock, nothing is acked
    finally:
        first.stop()
    second = _worker("survivor")
    try:
        second.wait_ready()
        # The dead execution's 2 s lease runs out; the redelivered message then runs.
        again = _events(name, 30)
        assert again[:2] == ["start", result.id], again
        assert int(again[2]) != int(start[2])  # another process
        info = locks.get(f"redeliver:{name}")
        assert info is not None and info.task_id == result.id
        assert info.owner != f"{result.id}" and info.pid == int(again[2])
        ca.app.control.revoke(result.id, terminate=True)
    finally:
        second.stop()


def test_a_task_that_locks_its_own_guard_name_finishes(worker: ca.Worker, name: str) -> None:
    result = ca.locks_itself.apply_async((7, name), queue=QUEUE)
    # It re-entered its own lock (same owner, one more hold) instead of waiting for it.
    assert _events(name, 20) == ["inside", "True", "2"]
    # The function guarded by the same name re-entered it as well.
    assert result.get(timeout=20) == 2
    assert locks.get("selflock:7") is None


def _start_pid(tag: str, task_id: str) -> int:
    """Wait for the start event of *task_id* on events:<tag>; return its process's pid."""
    event = _events(tag, 20)
    assert event[:2] == ["start", task_id], event
    return int(event[2])


def test_a_requeued_copy_of_a_killed_pool_process_runs_at_once(
    worker: ca.Worker, name: str
) -> None:
    """acks_late + reject_on_worker_lost: Celery requeues the message of a pool process
    that died; the copy runs at once, not after the dead execution's 30 s lease."""
    if worker.pool != "prefork":
        pytest.skip("only a prefork pool has pool processes to lose")
    result = ca.requeued_on_loss.apply_async((name,), queue=QUEUE)
    pid = _start_pid(name, result.id)
    os.kill(pid, signal.SIGKILL)  # as the OOM killer does: none of the task's code runs
    killed = time.monotonic()
    again = _start_pid(name, result.id)  # the same task id, started again
    assert again != pid
    assert time.monotonic() - killed < 10, "the copy waited for the dead execution's lease"
    ca.probe.rpush(f"gate:{name}", "go")
    assert result.get(timeout=20) == "done"
    assert _events(name, 5)[:2] == ["end", result.id]
    assert ca.probe.llen(f"events:{name}") == 0  # it ran to completion once, after the loss


def test_a_copy_of_a_completed_task_is_dropped(worker: ca.Worker, name: str) -> None:
    """A late redelivery of a message whose execution completed (here: the same task id
    sent again) is recognised and not run again, and stores no result over the real one."""
    first = ca.late_long_lease.apply_async((name,), queue=QUEUE)
    assert _start_pid(name, first.id)
    ca.probe.rpush(f"gate:{name}", "go")
    assert first.get(timeout=20) == "done"
    assert _events(name, 5)[:2] == ["end", first.id]
    copy = ca.late_long_lease.apply_async((name,), queue=QUEUE, task_id=first.id)
    _wait_log(worker, f"{first.id}] already completed", 20)
    assert ca.probe.llen(f"events:{name}") == 0, "the completed task ran again"
    assert copy.get(timeout=5) == "done"
    assert locks.get(f"late:{name}") is None


class _Monitor:
    """The commands the lock's Redis runs meanwhile (``MONITOR``), each with whether a
    script ran it ("lua") or a client sent it; it stops at an ``ECHO`` of its own."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self._end = f"monitor-end-{uuid.uuid4().hex}"
        # (kept: a collected client closes its pool, and the monitor's connection)
        self._client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=30)
        self._monitor = self._client.monitor()
        self._monitor.__enter__()  # MONITOR is on once this returns
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            got = self._monitor.next_command()
            if self._end in got["command"]:
                return
            self.seen.append((got["client_type"], got["command"]))

    def close(self) -> list[tuple[str, str]]:
        ca.probe.echo(self._end)
        self._thread.join(30)
        assert not self._thread.is_alive(), "MONITOR did not show the end marker"
        self._monitor.__exit__()
        return self.seen


def test_an_acks_late_execution_reads_and_writes_its_record_in_its_lock_s_scripts(
    worker: ca.Worker, name: str
) -> None:
    """No round trip of its own: the record is read by the acquire script and written by
    the release script (MONITOR shows them run by "lua"), and no client sends a command
    naming it."""
    lock_name = f"late:{name}"
    monitor = _Monitor()
    try:
        first = ca.late_long_lease.apply_async((name,), queue=QUEUE)
        assert _start_pid(name, first.id)
        ca.probe.rpush(f"gate:{name}", "go")
        assert first.get(timeout=20) == "done"
        assert _events(name, 5)[:2] == ["end", first.id]
    finally:
        seen = monitor.close()
    record = locks.backend().keyspace.keys(lock_name).completion(first.id)
    sent = [command.split()[0] for source, command in seen if record in command and source != "lua"]
    inside = [
        command.split()[0] for source, command in seen if record in command and source == "lua"
    ]
    assert set(sent) == {"EVALSHA"}, sent  # as a script's key only: no command of its own
    assert inside == ["EXISTS", "SET"], inside  # read by the acquire, written by the release
    assert ca.probe.pttl(record) > 0


def test_a_copy_of_a_live_execution_is_deferred_not_consumed(worker: ca.Worker, name: str) -> None:
    """A copy that finds its lock held by another execution of its task id that is not
    known to be dead is sent again for when that hold's lease runs out; if the hold was
    never released (the execution died where nobody saw it), the copy then runs."""
    task_id = f"copy-{name}"
    # Another execution of this task id, alive as far as anyone can tell (this process),
    # whose lease runs out in 3 s without a release: as a worker on another host that
    # was cut off.
    held = locks.lock(f"late:{name}", owner=f"{task_id}:elsewhere", ttl=3, auto_renew=False)
    assert held.acquire(blocking=False)
    result = ca.late_long_lease.apply_async((name,), queue=QUEUE, task_id=task_id)
    _wait_log(worker, f"{task_id}] is a redelivered copy of execution", 20)
    assert ca.probe.llen(f"events:{name}") == 0  # not run beside the other execution
    _start_pid(name, task_id)  # the deferred copy, once the lease ran out
    ca.probe.rpush(f"gate:{name}", "go")
    assert result.get(timeout=20) == "done"


@needs_prompt_redelivery
def test_a_redelivery_after_the_worker_was_killed_runs_before_the_lease_ends(name: str) -> None:
    """The whole worker SIGKILLed (nobody frees the lock): the redelivered copy, on a
    worker of the same host, sees the holder's process is gone and takes over at once
    instead of waiting out the dead execution's 30 s lease."""
    _flush_broker()
    first = _worker("doomed-late")
    try:
        first.wait_ready()
        result = ca.late_long_lease.apply_async((name,), queue=QUEUE)
        pid = _start_pid(name, result.id)
        first.kill()
        killed = time.monotonic()
    finally:
        first.stop()
    second = _worker("survivor-late")
    try:
        second.wait_ready()
        again = _start_pid(name, result.id)
        assert again != pid
        assert time.monotonic() - killed < 15, "the copy waited for the dead execution's lease"
        info = locks.get(f"late:{name}")
        assert info is not None and info.pid == again
        ca.probe.rpush(f"gate:{name}", "go")
        assert result.get(timeout=20) == "done"
    finally:
        second.stop()


@pytest.mark.skipif(
    tuple(int(p) for p in celery.__version__.split(".")[:2]) < (5, 5),
    reason="soft shutdown (worker_soft_shutdown_timeout) came in Celery 5.5",
)
def test_a_cold_shutdown_hands_a_running_task_to_another_worker(name: str) -> None:
    """Celery 5.5+'s soft/cold shutdown cancels a running acks_late task and restores its
    message: another worker runs it at once, not after the cancelled execution's lease."""
    _flush_broker()
    leaving = ca.Worker(
        concurrency=1, name="leaving", queues=QUEUE, env={"REDISLOCK_TEST_SOFT_SHUTDOWN": "1"}
    )
    try:
        leaving.wait_ready()
        result = ca.late_long_lease.apply_async((name,), queue=QUEUE)
        pid = _start_pid(name, result.id)
        os.kill(leaving.process.pid, signal.SIGQUIT)  # cold shutdown, after a 1 s soft one
        stopped = time.monotonic()
        leaving.process.wait(timeout=30)
    finally:
        leaving.stop()
    other = _worker("taking-over")
    try:
        other.wait_ready()
        again = _start_pid(name, result.id)
        assert again != pid
        assert time.monotonic() - stopped < 15, "the copy waited for the cancelled lease"
        ca.probe.rpush(f"gate:{name}", "go")
        assert result.get(timeout=20) == "done"
        assert _events(name, 5)[:2] == ["end", result.id]
    finally:
        other.stop()


@needs_prompt_redelivery
def test_every_message_runs_to_completion_once_at_a_time_through_kills(name: str) -> None:
    """Two prefork workers, a 2 s visibility timeout (so every 3 s task is also handed
    out again while it runs), acks_late + reject_on_worker_lost, and pool processes
    SIGKILLed under their tasks: each message runs to completion, its executions never
    overlap, and each caller reads the real result. Checked from the bodies' own
    start/end records."""
    _flush_broker()
    workers = [_worker("chaos-a"), _worker("chaos-b")]
    try:
        for w in workers:
            w.wait_ready()
        results = {
            f"k{i}": ca.chaos.apply_async((f"k{i}", name, 3.0), queue=QUEUE) for i in range(6)
        }
        by_id = {r.id: key for key, r in results.items()}
        records: list[list[str]] = []
        kills: dict[int, float] = {}
        deadline = time.monotonic() + 90
        ended: set[str] = set()
        while ended != set(by_id) and time.monotonic() < deadline:
            got = ca.probe.blpop([f"events:{name}"], timeout=5)
            if got is None:
                continue
            event = got[1].decode().split()
            records.append(event)
            if event[0] == "end":
                ended.add(event[1])
            elif event[0] == "start" and len(kills) < 2 and int(event[2]) not in kills:
                os.kill(int(event[2]), signal.SIGKILL)  # under its task: no code of it runs
                kills[int(event[2])] = time.monotonic()
        assert ended == set(by_id), f"not every message ran to completion: {records}"
        assert len(kills) == 2
        for key, result in results.items():
            assert result.get(timeout=30) == key  # the real result, never a marker
        for task_id in by_id:
            runs = sorted((float(e[3]), e[0], int(e[2])) for e in records if e[1] == task_id)
            busy_until = 0.0
            for at, what, pid in runs:
                if what == "start":
                    assert at >= busy_until, f"two executions of {task_id} overlapped: {runs}"
                    ends = [t for t, w, p in runs if w == "end" and p == pid and t >= at]
                    busy_until = min(ends) if ends else kills[pid]
    finally:
        for w in workers:
            w.stop()
