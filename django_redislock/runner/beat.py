"""Celery beat with a hot standby: a scheduler that publishes only while its term leads.

Run beat under the runner on every host, with this scheduler::

    python -m django_redislock run beat --wait --ttl 10 -- \\
        celery -A proj beat -S django_redislock.runner.beat:LeaderScheduler

(``manage.py redislock run beat --wait -- celery ...`` in a Django project). Only
the runner holding the lock ``beat`` runs beat; the others stand by. The runner
stops its beat when the lock is lost, and the command's watcher (``watcher``) stops a
beat whose runner alone is stopped before a standby's beat can start. But a beat
paused with its runner and its watcher (a VM pause, a stopped container) past its
lease resumes *before* they can stop it, with overdue entries to send at once. So
before each send this scheduler asks Redis whether its term (``REDISLOCK_TERM``,
from the runner) still leads (``Election.is_current``: one ``HGET``, one round trip
per due entry); when it does not, nothing is sent and beat exits (``SystemExit``, which beat's loop
treats as a shutdown). Why a per-send check and not a flag from the watchdog:
the watchdog of the paused process resumes at the same moment as beat, so only
Redis can say, at send time, that the term is stale.

:class:`LeaderOnly` is the mixin, for any scheduler class (django-celery-beat's
``DatabaseScheduler`` too)::

    from django_celery_beat.schedulers import DatabaseScheduler
    from django_redislock.runner.beat import LeaderOnly

    class Scheduler(LeaderOnly, DatabaseScheduler):
        pass

The Redis is ``REDISLOCK_URL`` from the environment (the runner's ``--url`` sets it
for its command), else the project's settings (``django_redislock.locks``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery.beat import PersistentScheduler

from ..election import Election, ElectionError

logger = logging.getLogger("django_redislock")


class Leadership:
    """The term this process was started with (``REDISLOCK_NAME`` / ``REDISLOCK_TERM``,
    set by the runner) and the election it can be checked against."""

    def __init__(self, election: Election, term: int) -> None:
        self.election = election
        self.term = term

    @classmethod
    def from_environment(cls) -> Leadership:
        """The runner's name and term; raises :class:`ElectionError` outside a runner."""
        name, term = os.environ.get("REDISLOCK_NAME"), os.environ.get("REDISLOCK_TERM")
        if not name or not term or not term.isdigit():
            raise ElectionError(
                "this scheduler publishes only while its term leads: run beat under the "
                "runner (python -m django_redislock run NAME --wait -- celery ... beat), "
                "which sets REDISLOCK_NAME and REDISLOCK_TERM"
            )
        from ..primitives.manager import LockManager, locks

        url = os.environ.get("REDISLOCK_URL")
        manager = LockManager(url=url) if url else locks
        return cls(Election(name, manager=manager), int(term))

    def current(self) -> bool:
        """Whether the term still leads (one round trip)."""
        return self.election.is_current(self.term)


class LeaderOnly:
    """A mixin for a ``celery.beat.Scheduler`` class: before each send, check that the
    runner's term still leads; if not, send nothing and end beat (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.leadership = Leadership.from_environment()
        super().__init__(*args, **kwargs)

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """Send *entry* (the scheduler's own ``apply_async``) only while the term leads."""
        leadership = self.leadership
        if not leadership.current():
            logger.error(
                "redislock: beat's term %s of %r no longer leads: not sending %r; stopping beat",
                leadership.term, leadership.election.name, getattr(entry, "name", entry),
            )  # fmt: skip
            raise SystemExit(79)
        return super().apply_async(entry, producer, advance, **kwargs)  # type: ignore[misc]


class LeaderScheduler(LeaderOnly, PersistentScheduler):  # type: ignore[misc]
    """Celery's default scheduler (``PersistentScheduler``) that sends only while the
    runner's term leads: ``celery beat -S django_redislock.runner.beat:LeaderScheduler``."""
