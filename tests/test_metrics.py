"""Lock metrics: values after a known sequence of operations on the real Redis,
in one process, in prometheus_client's multiprocess mode with real forked
children, through django-prometheus's ``/metrics`` view, and through
OpenTelemetry's SDK (in-memory reader)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings
from django.urls import path
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redislock import LockManager, locks, metrics, single_instance
from django_redislock.exceptions import LockBackendError
from tests.tcp_proxy import TcpProxy

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import REGISTRY, CollectorRegistry  # noqa: E402
from prometheus_client.multiprocess import MultiProcessCollector  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
urlpatterns: list[Any] = []  # this module is the ROOT_URLCONF of the /metrics test


@pytest.fixture
def prometheus() -> Iterator[None]:
    metrics.enable("prometheus")
    yield
    metrics.disable()


@pytest.fixture
def group() -> str:
    """A group no other test records into."""
    return f"m{uuid.uuid4().hex[:10]}"


def value(metric: str, registry: Any = REGISTRY, **labels: str) -> float:
    """A sample's value (0 when it was never recorded)."""
    return registry.get_sample_value(metric, labels) or 0.0


def eventually(check: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not true within {within} s"
        time.sleep(0.02)


def test_a_known_sequence_in_one_process(prometheus: None, group: str) -> None:
    name = f"{group}:orders"
    mutex = {"kind": "mutex", "group": group}
    first = locks.lock(name, ttl=5, auto_renew=False)
    before_acquire = time.monotonic()
    assert first.acquire()

    # A contended wait: another thread waits until the holder releases 0.3 s later.
    waited: list[bool] = []
    second = locks.lock(name, ttl=5, owner="waiter")  # released by this thread at the end
    waiter = threading.Thread(target=lambda: waited.append(second.acquire(timeout=5)))
    waiter.start()
    eventually(lambda: bool(locks.get(name) and locks.get(name).waiters))  # type: ignore[union-attr]
    time.sleep(0.3)
    first.release()
    at_most = time.monotonic() - before_acquire  # the hold lies within this
    waiter.join(5)
    assert waited == [True]

    # The waiter's thread holds it now (its lease runs out in 5 s): a wait gives up,
    # one attempt is refused.
    assert not locks.lock(name, ttl=5).acquire(timeout=0.2)
    assert not locks.lock(name, ttl=5).acquire(blocking=False)

    acquires = "redislock_acquires_total"
    assert value(acquires, **mutex, outcome="acquired") == 2
    assert value(acquires, **mutex, outcome="timeout") == 1
    assert value(acquires, **mutex, outcome="busy") == 1
    wait = "redislock_acquire_wait_seconds"
    assert value(f"{wait}_count", **mutex, outcome="acquired") == 2
    # The uncontended grant was fast, the contended one waited about 0.3 s.
    assert value(f"{wait}_bucket", **mutex, outcome="acquired", le="0.1") == 1
    assert 0.25 <= value(f"{wait}_sum", **mutex, outcome="acquired") < 5
    assert value(f"{wait}_count", **mutex, outcome="timeout") == 1
    assert 0.2 <= value(f"{wait}_sum", **mutex, outcome="timeout") < 2
    assert value("redislock_hold_seconds_count", **mutex) == 1
    assert 0.3 <= value("redislock_hold_seconds_sum", **mutex) <= at_most
    assert value("redislock_lost_total", **mutex) == 0
    second.release()


def test_asyncio_acquires_are_counted_alike(prometheus: None, group: str) -> None:
    name = f"{group}:async"

    async def sequence() -> tuple[bool, bool]:
        holder = LockManager().lock(name, ttl=5, owner="holder")
        async with holder:
            busy = await LockManager().lock(name, ttl=5).aacquire(timeout=0.1)
        free = LockManager().lock(name, ttl=5)
        got = await free.aacquire(timeout=1)
        await free.arelease()
        return busy, got

    assert asyncio.run(asyncio.wait_for(sequence(), 10)) == (False, True)
    mutex = {"kind": "mutex", "group": group}
    assert value("redislock_acquires_total", **mutex, outcome="acquired") == 2
    assert value("redislock_acquires_total", **mutex, outcome="timeout") == 1
    assert value("redislock_hold_seconds_count", **mutex) == 2
    assert 0.1 <= value("redislock_acquire_wait_seconds_sum", **mutex, outcome="timeout") < 2


def test_renewals_and_a_lost_lock(prometheus: None, group: str) -> None:
    name = f"{group}:job"
    mutex = {"kind": "mutex", "group": group}
    lock = locks.lock(name, ttl=0.6)  # renewed every 0.2 s
    assert lock.acquire()
    eventually(lambda: value("redislock_renewals_total", **mutex, outcome="renewed") >= 2)
    assert locks.force_release(name)
    eventually(lambda: value("redislock_lost_total", **mutex) == 1)
    assert lock.lost
    assert value("redislock_renewals_total", **mutex, outcome="failed") == 0


def test_a_backend_failure(prometheus: None, group: str) -> None:
    down = LockManager(url="redis://127.0.0.1:1/0")  # nothing listens there
    with override_settings(REDISLOCK_CLUSTER=False), pytest.raises(LockBackendError):
        down.lock(f"{group}:x", ttl=5).acquire(blocking=False)
    labels = {"kind": "mutex", "group": group, "operation": "acquire"}
    assert value("redislock_backend_errors_total", **labels) == 1


def test_renewal_and_release_failures(prometheus: None, group: str) -> None:
    upstream = redis.Redis.from_url(settings.REDIS_URL).connection_pool.connection_kwargs["port"]
    proxy = TcpProxy(upstream)
    try:
        client = redis.Redis(
            port=proxy.port, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
        )
        lock = LockManager(client=client).lock(f"{group}:flaky", ttl=3)  # renewed each 1 s
        mutex = {"kind": "mutex", "group": group}
        assert lock.acquire()
        proxy.set_down(True)
        eventually(lambda: value("redislock_renewals_total", **mutex, outcome="failed") >= 1)
        assert value("redislock_backend_errors_total", **mutex, operation="renew") >= 1
        with pytest.raises(LockBackendError):
            lock.release()
        assert value("redislock_backend_errors_total", **mutex, operation="release") == 1
        proxy.set_down(False)
        eventually(lambda: value("redislock_renewals_total", **mutex, outcome="renewed") >= 1)
        lock.release()  # the retry goes through
        assert value("redislock_lost_total", **mutex) == 0
    finally:
        proxy.close()


def test_kinds_and_groups(prometheus: None, group: str) -> None:
    with locks.semaphore(f"{group}:pool", 2, ttl=5):
        pass
    rw = locks.rw_lock(f"{group}:doc", ttl=5)
    with rw.read():
        pass
    with rw.write():
        pass
    for kind in ("semaphore", "read", "write"):
        assert value("redislock_acquires_total", kind=kind, group=group, outcome="acquired") == 1
    with locks.lock(f"{group}-no-colon", ttl=5):
        pass
    assert value("redislock_acquires_total", kind="mutex", group="other", outcome="acquired") >= 1
    with override_settings(REDISLOCK_METRICS_GROUPS=[f"{group}-a", f"{group}-ab"]):
        assert metrics.group_for_name(f"{group}-abc:1") == f"{group}-ab"
        assert metrics.group_for_name(f"{group}-ax") == f"{group}-a"
        assert metrics.group_for_name("elsewhere:1") == metrics.OTHER


def test_a_decorated_function_is_grouped_by_its_key_template(prometheus: None, group: str) -> None:
    template = group + ":sync:{account_id}"

    @single_instance(key=template, ttl=5)
    def sync(account_id: int) -> int:
        return account_id

    assert [sync(i) for i in range(3)] == [0, 1, 2]
    labels = {"kind": "mutex", "group": template}
    assert value("redislock_acquires_total", **labels, outcome="acquired") == 3
    assert value("redislock_hold_seconds_count", **labels) == 3


def test_a_celery_task_is_grouped_by_its_key_template(prometheus: None) -> None:
    from celery import Celery

    from django_redislock.celery import SingleInstanceTask

    app = Celery("metrics", set_as_current=False)
    app.conf.update(task_always_eager=True, task_eager_propagates=True, broker_url="memory://")

    @app.task(base=SingleInstanceTask, lock_key="metrics-task:{n}", unique_on_enqueue=True)
    def report(n: int) -> int:
        return n

    labels = {"kind": "mutex", "group": "metrics-task:{n}", "outcome": "acquired"}
    before = value("redislock_acquires_total", **labels)
    assert report.delay(7).get(timeout=5) == 7
    # The enqueue-time hold and the run's (a re-entry), both under the template.
    assert value("redislock_acquires_total", **labels) - before == 2


def test_metrics_are_off_unless_enabled(group: str) -> None:
    assert metrics.enabled() == ()
    with locks.lock(f"{group}:quiet", ttl=5):
        pass
    assert value("redislock_acquires_total", kind="mutex", group=group, outcome="acquired") == 0


def test_misuse_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="unknown metrics exporter 'statsd'"):
        metrics.enable("statsd")
    with override_settings(REDISLOCK_METRICS="prometheus"):
        metrics.enable_from_settings()
        assert metrics.enabled() == ("prometheus",)
        metrics.disable()


def test_the_django_prometheus_view_shows_our_metrics(prometheus: None, group: str) -> None:
    from django_prometheus.exports import ExportToDjangoView

    urlpatterns[:] = [path("metrics", ExportToDjangoView)]
    with locks.lock(f"{group}:page", ttl=5):
        pass
    with override_settings(ROOT_URLCONF=__name__):
        response = Client().get("/metrics")
    assert response.status_code == 200
    text = response.content.decode()
    line = f'redislock_acquires_total{{group="{group}",kind="mutex",outcome="acquired"}} 1.0'
    assert line in text


@pytest.mark.slow
def test_multiprocess_mode_sums_forked_children(
    tmp_path: Path, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    children, iterations = 3, 4
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-m", "tests.metrics_proc", str(tmp_path), group, str(children),
         str(iterations)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.stdout.strip() == "done", result.stderr
    assert len(list(tmp_path.glob("*.db"))) > 1  # one file per process and kind
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    mutex = {"kind": "mutex", "group": group}
    acquired = children * iterations + 1  # and the parent's own
    assert value("redislock_acquires_total", registry, **mutex, outcome="acquired") == acquired
    assert value("redislock_acquires_total", registry, **mutex, outcome="timeout") == children
    assert value("redislock_hold_seconds_count", registry, **mutex) == acquired
    wait = "redislock_acquire_wait_seconds_bucket"
    assert value(wait, registry, **mutex, outcome="timeout", le="+Inf") == children

    # django-prometheus's view reads the same directory in multiprocess mode.
    from django_prometheus.exports import ExportToDjangoView

    urlpatterns[:] = [path("metrics", ExportToDjangoView)]
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with override_settings(ROOT_URLCONF=__name__):
        text = Client().get("/metrics").content.decode()
    line = f'redislock_acquires_total{{group="{group}",kind="mutex",outcome="timeout"}} 3.0'
    assert line in text


def test_opentelemetry_through_the_sdk(group: str) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from django_redislock.metrics.otel import OpenTelemetryRecorder

    reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    recorder = OpenTelemetryRecorder(MeterProvider(metric_readers=[reader]), tracer_provider)
    metrics.enable("opentelemetry")
    metrics._recorders["opentelemetry"] = recorder  # the SDK's providers, not the global ones
    try:
        name = f"{group}:report"
        holder = locks.lock(name, ttl=5, owner="holder")
        assert holder.acquire()
        release = threading.Timer(0.2, holder.release)
        release.start()
        waiter = locks.lock(name, ttl=5)
        assert waiter.acquire(timeout=5)  # waits about 0.2 s
        assert not locks.lock(name, ttl=5, owner="late").acquire(timeout=0.1)
        waiter.release()
        release.join(5)
    finally:
        metrics.disable()
    points: dict[tuple[str, str], Any] = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    attrs = point.attributes
                    if attrs.get("redislock.group") == group:
                        points[metric.name, attrs.get("redislock.outcome", "")] = point
    assert points["redislock.acquires", "acquired"].value == 2
    assert points["redislock.acquires", "timeout"].value == 1
    assert points["redislock.acquire.wait", "acquired"].count == 2
    assert points["redislock.acquire.wait", "acquired"].sum >= 0.15
    assert points["redislock.hold", ""].count == 2
    waits = [s for s in spans.get_finished_spans() if s.attributes["redislock.group"] == group]
    assert sorted(s.attributes["redislock.outcome"] for s in waits) == ["acquired", "timeout"]
    assert all(
        s.name == "redislock.acquire" and s.attributes["redislock.name"] == name for s in waits
    )
    assert all(s.end_time - s.start_time >= 0.09e9 for s in waits)


def test_an_exporter_without_its_package_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "django_redislock.metrics.otel", raising=False)
    monkeypatch.delitem(metrics._made, "opentelemetry", raising=False)  # made by a test before
    with pytest.raises(
        ImproperlyConfigured,
        match=r"pip install opentelemetry-api, or django-redislock's \[opentelemetry\] extra",
    ):
        metrics.enable("opentelemetry")
