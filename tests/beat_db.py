"""django-celery-beat's DatabaseScheduler with LeaderOnly, as a project would write it
(docs/one-process.md): ``celery beat -S tests.beat_db:Scheduler``."""

from django_celery_beat.schedulers import DatabaseScheduler

from django_redislock.runner.beat import LeaderOnly


class Scheduler(LeaderOnly, DatabaseScheduler):
    """DatabaseScheduler that sends only while the runner's term leads."""
