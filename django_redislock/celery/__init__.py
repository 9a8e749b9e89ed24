"""Single-instance Celery tasks (needs Celery): ``SingleInstanceTask`` and ``is_skipped``.

Importing this package imports Celery and registers the worker-side handlers; the app's
``ready()`` imports it whenever Celery is installed. Its parts: ``task`` (the task class,
the run-time guard and the hooks ``@single_instance`` runs Celery task bodies through),
``redelivery`` (a broker's copy of an execution), ``lost`` (a killed pool process's lock),
``revoke`` (a revoked countdown task's hold) and ``autoretry`` (``autoretry_for`` keeps the
lock).
"""

from ..exceptions import DuplicateTaskError
from .task import SingleInstanceTask, is_skipped, run_decorated_task

__all__ = ["DuplicateTaskError", "SingleInstanceTask", "is_skipped", "run_decorated_task"]
