"""The texts the admin, ``manage.py redislock`` and the example share (``describe.py``):
durations, and the liveness of holders read from the real test redis-server."""

from __future__ import annotations

import pytest
import redis

from django_redislock import locks
from django_redislock.describe.snapshot import liveness, seconds_text
from tests.test_admin import put_lock


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-1.0, "0.0 s"),
        (0.04, "0.0 s"),
        (2.46, "2.4 s"),
        (9.99, "9.9 s"),
        (10.0, "10 s"),
        (59.9, "59 s"),
        (60.0, "1 min 0 s"),
        (3599.0, "59 min 59 s"),
        (3600.0, "1 h 0 min"),
        (86400 * 3 + 3600 * 4 + 59, "3 d 4 h"),
    ],
)
def test_seconds_text(seconds: float, text: str) -> None:
    assert seconds_text(seconds) == text


def test_liveness_texts(redis_client: redis.Redis) -> None:
    def of(name: str) -> tuple[str, str, str]:
        info = locks.get(name)
        assert info is not None
        alive = liveness(info)
        return alive.state, alive.text, alive.loud_text

    key = put_lock(redis_client, "stuck", ttl_ms=60_000)
    redis_client.pexpire(key, 15_000)  # renewed 45 s ago: overdue
    assert of("stuck") == ("overdue", "not renewed for 45 s", "NOT RENEWED for 45 s")
    key = put_lock(redis_client, "fine", ttl_ms=60_000)
    redis_client.pexpire(key, 58_000)
    assert of("fine")[0] == "renewed" and of("fine")[1].startswith("renewed 2.")
    put_lock(redis_client, "queued", ttl_ms=60_000, meta={"renews": False})
    assert of("queued")[1:] == ("not renewed (runs out)", "not renewed (runs out)")
    put_lock(redis_client, "forever", ttl_ms=60_000)
    redis_client.persist("redislock:{forever}")
    assert of("forever")[:2] == ("no-expiry", "no expiry")
    redis_client.set("redislock:{foreign}", "x", px=60_000)
    assert of("foreign")[:2] == ("unknown", "unknown")
