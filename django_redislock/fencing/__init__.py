"""Fencing that the store enforces (docs/fencing.md).

* Redis: :class:`GuardedRedis` (``held.guarded()``), writes Redis makes only while the
  hold is current; ``held.check()`` / ``locks.is_current(name, token)``.
* Databases: :class:`FencingTokenField`, :class:`FencedQuerySet` /
  :class:`FencedManager` with ``fenced_update(token=..., **fields)``.

A refused write raises :class:`~django_redislock.exceptions.StaleFencingToken`.
"""

from django_redislock.exceptions import FencingUnsupported, StaleFencingToken

from .db import FencedManager, FencedQuerySet, FencingTokenField
from .redis_writes import GuardedRedis

__all__ = [
    "FencedManager",
    "FencedQuerySet",
    "FencingTokenField",
    "FencingUnsupported",
    "GuardedRedis",
    "StaleFencingToken",
]
