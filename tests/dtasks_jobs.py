"""A deduplicated ``django.tasks`` task for the real-worker test: reports its run on
``events:<tag>`` in the test Redis and waits for ``gate:<tag>``."""

from __future__ import annotations

import os

import redis
from django.conf import settings

from django_redislock import locks
from django_redislock.django_tasks import single_instance_task

probe = redis.Redis.from_url(settings.REDIS_URL)


@single_instance_task("dtasks-report:{account}", ttl=5, lock_enqueue_ttl=60)
def report(account: int, tag: str) -> str:
    """Records the lock as its run holds it, then waits (bounded) for the test."""
    info = locks.get(f"dtasks-report:{account}")
    owner = info.owner if info is not None else None
    count = info.hold_count if info is not None else None
    probe.rpush(f"events:{tag}", f"start {os.getpid()} {owner} {count}")
    probe.blpop([f"gate:{tag}"], timeout=20)
    probe.rpush(f"events:{tag}", "end")
    return f"report {account}"
