#!/usr/bin/env python
"""Per-task overhead of single-instance Celery tasks on a real worker.

Variants (all trivial ``return n`` bodies, every call with a fresh ``n`` so no
lock is ever contended):

* ``plain``: no lock (the baseline);
* ``floor``: a bare ``SET NX PX`` before the body and ``DEL`` after it, on the
  client our locks use: two round trips and nothing else, the least any
  run-time lock can add (the figure the run-time modes are compared with);
* ``lock_only``: a plain task whose body is ``with locks.lock("bench-lock:{n}")``:
  our lock without the task integration around it;
* ``decorated``: ``@single_instance("bench:{n}")`` under ``@app.task``;
* ``decorated_late``: the same on an ``acks_late=True`` task, whose execution also
  looks for and writes its completion record (a broker's copy of a completed task
  is dropped: docs/celery.md);
* ``based``: ``base=SingleInstanceTask`` (run-time lock only);
* ``based_unique``: ``SingleInstanceTask`` with ``unique_on_enqueue=True``
  (a lock taken in ``apply_async``, re-entered and released by the worker);
* ``once_task`` / ``singleton_task``: celery-once and celery-singleton (both
  lock at enqueue), when installed (``pip install -e . --group bench``).

One real ``celery worker --pool=solo`` (one process, so runtimes are not
disturbed by a sibling) on a throw-away local redis-server (broker DB 1,
results DB 2, our locks DB 0, peers' locks DB 5). Variants are interleaved
batch by batch in rotating order so machine noise hits them alike.

Figures per variant:

* ``enqueue``: median wall time of one ``apply_async`` in the client;
* ``runtime``: median task runtime as the worker measures it ("succeeded in"),
  which includes the run-time lock acquire/release;
* ``added``: ``runtime`` minus the baseline's, and ``enqueue`` minus the
  baseline's: the per-task overhead;
* ``tasks/s``: batch size / (first publish -> last result), median over batches.

``--shaping``: the modes of issue 25 against plain ``@single_instance``, side by
side (tasks ``shaped_*`` of tests/celery_app.py, whose bodies record each run in a
Redis list, as a debounced run is a new task): ``rate`` (one start an hour per key),
``cooldown`` (an hour), ``coalesce=True``, ``debounce`` (10 ms). Two experiments,
each interleaved the same way, on the same solo worker:

* ``runs``: every call on a fresh key, so each runs and nothing is refused or
  pending: the uncontended cost of the mode's scripts (for debounce, the whole
  cost of a debounced run: the timer's message sent again, back at the due time,
  sending the run: three executions);
* ``busy``: every call on a key the mode keeps busy (the benchmark holds it: plain
  skips, coalesce pends; its one start used: rate; cooling down: cooldown; a
  debounced run due in an hour: debounce), so none runs: the cost of a call that
  is skipped, pends or is postponed. Every result is checked to be a skip marker.

Figures per row, per call: tasks/s (median over batches), the worker process's CPU
(``/proc/<pid>/stat``) and redis-server's (``INFO cpu``), Redis commands
(``INFO commandstats`` deltas per batch, by command: broker, result backend, the
benchmark's own record and the lock's scripts, with the commands they run), the
enqueue time; and the ratios of tasks/s and worker CPU to plain. Enqueueing does
the same for every mode (all are decided in the worker).

Run from the repository root::

    .venv/bin/python benchmarks/bench_celery.py               # 3000 tasks per variant
    .venv/bin/python benchmarks/bench_celery.py --tasks 600   # fewer
    .venv/bin/python benchmarks/bench_celery.py --shaping     # 15 rounds x 200 per row
    .venv/bin/python benchmarks/bench_celery.py --quick [--shaping]   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

from call_timing import cpu_model  # noqa: E402

from tests import celery_app as ca  # noqa: E402  (starts redis-server, sets up Django)

BASE_VARIANTS = [
    "plain",
    "floor",
    "lock_only",
    "decorated",
    "decorated_late",
    "based",
    "based_unique",
]
LINE = re.compile(r"Task tests\.celery_app\.(\w+)\[[^\]]+\] succeeded in ([0-9.eE-]+)s")


@dataclass
class Variant:
    """One row: how a batch of its calls is prepared (untimed), sent and waited for."""

    name: str
    #: Prepares a batch (untimed) and returns the sender of call *n* (a fresh number).
    prepare: Callable[[], Callable[[int], Any]]
    #: Waits until the batch's calls are done (given what the sender returned).
    finish: Callable[[list[Any]], None]
    #: Undoes what ``prepare`` set up, after the batch (untimed).
    after: Callable[[], None] = lambda: None


@dataclass
class Samples:
    """What the batches of one variant measured."""

    enqueue: list[float] = field(default_factory=list)  # s per send, in the client
    rates: list[float] = field(default_factory=list)  # calls/s per batch
    commands: Counter[str] = field(default_factory=Counter)  # by command, over all batches
    worker_cpu: float = 0.0  # s of the worker process's CPU over all batches
    redis_cpu: float = 0.0  # s of redis-server's CPU over all batches

    def per_call(self) -> dict[str, float]:
        calls = len(self.enqueue)
        return {
            "calls": calls,
            "enqueue_us": statistics.median(self.enqueue) * 1e6,
            "tasks_per_s": statistics.median(self.rates),
            "commands_per_call": sum(self.commands.values()) / calls,
            "commands": {c: n / calls for c, n in sorted(self.commands.items()) if n},
            "worker_cpu_us": self.worker_cpu / calls * 1e6,
            "redis_cpu_us": self.redis_cpu / calls * 1e6,
        }


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process *pid* so far (Linux; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _redis_counters(client: Any) -> tuple[Counter[str], float]:
    """Commands served so far, by command (``INFO commandstats``: those a script runs
    count too), and redis-server's CPU seconds."""
    stats = client.info("commandstats")
    cpu = client.info("cpu")
    calls = Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})
    return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def interleave(variants: list[Variant], rounds: int, batch: int, worker: Any) -> dict[str, Samples]:
    """Run *rounds* batches of *batch* calls of each variant, in rotating order so that
    machine noise hits them alike; count commands and the worker's and Redis's CPU per
    batch (the benchmark's own INFO calls excluded)."""
    import redis

    stats = redis.Redis.from_url(ca.settings.REDIS_URL)
    samples = {v.name: Samples() for v in variants}
    counter = 0
    for r in range(rounds):
        for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
            send = v.prepare()
            got = samples[v.name]
            calls0, rcpu0 = _redis_counters(stats)
            wcpu0 = _process_cpu(worker.process.pid)
            sent = []
            start = time.perf_counter()
            for _ in range(batch):
                counter += 1
                t0 = time.perf_counter()
                sent.append(send(counter))
                got.enqueue.append(time.perf_counter() - t0)
            v.finish(sent)
            got.rates.append(batch / (time.perf_counter() - start))
            got.worker_cpu += _process_cpu(worker.process.pid) - wcpu0
            calls1, rcpu1 = _redis_counters(stats)
            calls1["info"] -= 2  # the INFO pair of the first reading
            got.commands.update(calls1 - calls0)
            got.redis_cpu += rcpu1 - rcpu0
            v.after()
    return samples


def _flush() -> None:
    import redis

    base = ca.settings.REDIS_URL.rsplit("/", 1)[0]
    for db in (0, 1, 2, 5):
        redis.Redis.from_url(f"{base}/{db}").flushdb()


def _sender(task: Any) -> Callable[[], Callable[[int], Any]]:
    """A variant's ``prepare`` for calls that each send *task* with a fresh number."""
    return lambda: lambda n: task.apply_async((n,))


def _results(results: list[Any]) -> None:
    for res in results:
        res.get(timeout=120)


def _machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu": cpu_model(),
        "platform": platform.platform(),
    }


def run(tasks: int, batch: int) -> dict[str, Any]:
    """Run the benchmark; return the figures."""
    _flush()
    names = BASE_VARIANTS + ca.PEERS
    variants = [Variant(v, _sender(getattr(ca, v)), _results) for v in names]
    worker = ca.Worker(pool="solo", concurrency=1, name="bench")
    try:
        worker.wait_ready()
        # Warm-up: imports, script loading, connections.
        for i, v in enumerate(names):
            getattr(ca, v).delay(-1 - i).get(timeout=60)
        samples = interleave(variants, max(1, tasks // batch), batch, worker)
        time.sleep(0.5)  # let the worker flush its log file
    finally:
        worker.stop()
    runtimes: dict[str, list[float]] = {v: [] for v in names}
    for line in worker.log.read_text().splitlines():
        m = LINE.search(line)
        if m and m.group(1) in runtimes:
            runtimes[m.group(1)].append(float(m.group(2)))
    from django_redislock import locks

    leftover = sum(1 for _ in locks.active())  # held locks (fence counters are not locks)
    figures: dict[str, Any] = {}
    for v in names:
        got = samples[v]
        figures[v] = {
            "tasks": len(got.enqueue),
            "enqueue_us": statistics.median(got.enqueue) * 1e6,
            "runtime_us": statistics.median(runtimes[v]) * 1e6 if runtimes[v] else None,
            "tasks_per_s": statistics.median(got.rates),
        }
    plain = figures["plain"]
    for v in names:
        f = figures[v]
        f["added_enqueue_us"] = f["enqueue_us"] - plain["enqueue_us"]
        f["added_runtime_us"] = (
            None if f["runtime_us"] is None else f["runtime_us"] - plain["runtime_us"]
        )
    return {
        "machine": _machine(),
        "tasks_per_variant": tasks,
        "batch": batch,
        "locks_left_held": leftover,
        "variants": figures,
    }


#: The shaped rows (--shaping): row -> task of tests/celery_app.py, each on keys of its own.
SHAPED = {
    "plain": "shaped_plain",
    "rate": "shaped_rate",
    "cooldown": "shaped_cooldown",
    "coalesce": "shaped_coalesce",
    "debounce": "shaped_debounce",
}


def _bodies_done(sent: list[Any]) -> None:
    """Wait for one record in ``bench:done`` per call (a debounced run is a new task)."""
    for _ in sent:
        if ca.probe.blpop([ca.BENCH_DONE], timeout=120) is None:
            raise TimeoutError("a shaped task did not run within 120 s")


def _skipped(sent: list[Any]) -> None:
    """Wait for every call's result: each must have ended without running its body."""
    from django_redislock.celery import is_skipped

    for res in sent:
        result = res.get(timeout=120)
        if not is_skipped(result):
            raise AssertionError(f"a call on a busy key did not end skipped: {result!r}")


def _busy(row: str, keys: Any) -> Variant:
    """A batch of calls on one key that *row*'s guard keeps from running: held by the
    benchmark (plain, coalesce: each call pends), its one start an hour used (rate),
    cooling down (cooldown), or with a debounced run an hour away (debounce)."""
    from django_redislock import locks

    task = getattr(ca, "shaped_debounce_quiet" if row == "debounce" else SHAPED[row])
    held: list[Any] = []

    def prepare() -> Callable[[int], Any]:
        key = next(keys)
        name = {
            "plain": "bench-plain",
            "rate": "bench-rate",
            "cooldown": "bench-cool",
            "coalesce": "bench-co",
            "debounce": "bench-dbq",
        }[row] + f":{key}"
        if row in ("plain", "coalesce"):
            lock = locks.lock(name, ttl=600)
            if not lock.acquire(blocking=False):
                raise RuntimeError(f"{name} is taken")
            held.append(lock)
        if row in ("rate", "cooldown"):
            task.delay(key).get(timeout=60)  # the key's one start
            ca.probe.delete(ca.BENCH_DONE)
        if row in ("coalesce", "debounce"):
            task.delay(key)  # the first call: the pending slot's sweeper, the timer
            deadline = time.monotonic() + 60
            while not _waiting(locks.shaping(name)):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name}: the first call did not pend")
                time.sleep(0.005)
        return lambda n: task.apply_async((key,))

    def after() -> None:
        while held:
            held.pop().release()

    return Variant(row, prepare, _skipped, after)


def _waiting(state: Any) -> bool:
    return bool(state.pending or state.debounce_due_in is not None)


def _ratios(samples: dict[str, Samples]) -> dict[str, Any]:
    rows = {row: got.per_call() for row, got in samples.items()}
    plain = rows["plain"]
    for f in rows.values():
        f["tasks_per_s_vs_plain"] = f["tasks_per_s"] / plain["tasks_per_s"]
        f["worker_cpu_vs_plain"] = f["worker_cpu_us"] / plain["worker_cpu_us"]
        f["added_commands"] = f["commands_per_call"] - plain["commands_per_call"]
    return rows


def run_shaping(rounds: int, batch: int) -> dict[str, Any]:
    """Shaped task runs against plain ``@single_instance`` on one solo worker, two
    experiments, each interleaved: ``runs`` (every call on a fresh key, so each runs:
    the uncontended cost of the mode's scripts and, for debounce, its timer's two
    re-sends) and ``busy`` (every call on a key the mode keeps busy, so none runs:
    the cost of a call that is skipped, pends or is postponed)."""
    import itertools

    import redis

    _flush()
    keys = itertools.count()
    runs = [Variant(row, _sender(getattr(ca, name)), _bodies_done) for row, name in SHAPED.items()]
    busy = [_busy(row, keys) for row in SHAPED]
    worker = ca.Worker(pool="solo", concurrency=1, name="bench-shaping")
    try:
        worker.wait_ready()
        for v in runs:  # warm-up: imports, script loading, connections
            v.finish([v.prepare()(-1)])
        for v in busy:
            v.prepare()(-1).get(timeout=60)
            v.after()
        ran = interleave(runs, rounds, batch, worker)
        refused = interleave(busy, rounds, batch, worker)
    finally:
        worker.stop()
    from django_redislock import locks

    return {
        "machine": _machine(),
        "redis": redis.Redis.from_url(ca.settings.REDIS_URL).info("server")["redis_version"],
        "redis_py": redis.__version__,
        "rounds": rounds,
        "batch": batch,
        "locks_left_held": sum(1 for _ in locks.active()),
        "runs": _ratios(ran),
        "busy": _ratios(refused),
    }


def _print_shaping(results: dict[str, Any]) -> None:
    m = results["machine"]
    print(
        f"{m['cpu']} ({m['cpus']} CPUs), Python {m['python']}, redis-server {results['redis']}, "
        f"redis-py {results['redis_py']}: {results['rounds']} rounds x {results['batch']} calls"
    )
    titles = {
        "runs": "every call on a fresh key: each runs",
        "busy": "every call on a busy key: none runs (skipped / pends / postponed)",
    }
    for part, title in titles.items():
        print(f"\n{part}: {title}")
        print(
            f"{'row':<10}{'tasks/s':>9}{'vs plain':>9}{'worker µs':>11}{'vs plain':>9}"
            f"{'redis µs':>10}{'cmds':>7}{'+cmds':>7}{'enqueue µs':>12}"
        )
        for row, f in results[part].items():
            print(
                f"{row:<10}{f['tasks_per_s']:>9.0f}{f['tasks_per_s_vs_plain']:>8.2f}x"
                f"{f['worker_cpu_us']:>11.0f}{f['worker_cpu_vs_plain']:>8.2f}x"
                f"{f['redis_cpu_us']:>10.0f}{f['commands_per_call']:>7.1f}"
                f"{f['added_commands']:>+7.1f}{f['enqueue_us']:>12.0f}"
            )
    print(f"\nlocks still held afterwards (must be 0): {results['locks_left_held']}")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=3000, help="tasks per variant")
    ap.add_argument("--batch", type=int, default=200, help="tasks per interleaved batch")
    ap.add_argument(
        "--shaping",
        action="store_true",
        help="rate, cooldown, coalesce and debounce against plain @single_instance",
    )
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 batches of 50 per row")
    ap.add_argument("--out", default=None, help="JSON output path")
    args = ap.parse_args(argv)
    if args.quick:
        args.tasks, args.batch = 100, 50
    stamp = time.strftime("%Y-%m-%d-%H%M%S") + ("-quick" if args.quick else "")
    if args.shaping:
        results = run_shaping(max(1, args.tasks // args.batch), args.batch)
        _print_shaping(results)
        default = f"celery-shaping-{stamp}.json"
    else:
        results = run(args.tasks, args.batch)
        _print_variants(results)
        default = f"celery-{stamp}.json"
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / default
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"JSON: {out}")
    return 0 if results["locks_left_held"] == 0 else 1


def _print_variants(results: dict[str, Any]) -> None:
    print(
        f"{'variant':<16}{'tasks':>7}{'enqueue us':>12}{'+enq us':>9}"
        f"{'runtime us':>12}{'+run us':>9}{'tasks/s':>9}"
    )
    for v, f in results["variants"].items():
        print(
            f"{v:<16}{f['tasks']:>7}{f['enqueue_us']:>12.0f}{f['added_enqueue_us']:>9.0f}"
            f"{(f['runtime_us'] or 0):>12.0f}{(f['added_runtime_us'] or 0):>9.0f}"
            f"{f['tasks_per_s']:>9.0f}"
        )
    print(f"locks still held afterwards (must be 0): {results['locks_left_held']}")


if __name__ == "__main__":
    sys.exit(main())
