"""Whether Celery's ``autoretry_for`` will retry an execution that raised, and how soon.

Celery wraps a task's ``run`` in its autoretry wrapper when the task is made
(``autoretry_for=...``), so the wrapper sits *outside* the guarded body: the
guard sees the task's exception, not the :class:`~celery.exceptions.Retry` the
wrapper raises afterwards. The guard asks :func:`autoretry_delay` to tell a
failure that Celery will retry (the lock is then kept for the retry, as for
``self.retry()``) from one that ends the task (the lock is released). The rules
are Celery's own (``celery/app/autoretry.py``): the exception is one of
``autoretry_for`` and none of ``dont_autoretry_for``, and the retries left
(``retry_kwargs["max_retries"]``, else ``max_retries``) are not used up.
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import Ignore, Retry
from celery.utils.time import get_exponential_backoff_interval


def autoretry_delay(task: Any, exc: BaseException) -> float | None:
    """The most seconds until Celery's autoretry runs *task* again after *exc*;
    None when it will not retry it (no autoretry, another exception, or no retries left).

    With ``retry_backoff`` the delay is the backoff without jitter (jitter only
    shortens it); otherwise ``retry_kwargs["countdown"]``, else the task's
    ``default_retry_delay``.
    """
    autoretry_for = tuple(getattr(task, "autoretry_for", None) or ())
    if not autoretry_for or not hasattr(task, "_orig_run"):
        return None
    if isinstance(exc, (Ignore, Retry)) or not isinstance(exc, autoretry_for):
        return None
    if isinstance(exc, tuple(getattr(task, "dont_autoretry_for", None) or ())):
        return None
    retry_kwargs: dict[str, Any] = dict(getattr(task, "retry_kwargs", None) or {})
    retries = int(getattr(task.request, "retries", 0) or 0)
    max_retries = retry_kwargs.get("max_retries", getattr(task, "max_retries", None))
    if max_retries is not None and retries >= max_retries:
        return None
    backoff = float(getattr(task, "retry_backoff", False) or 0)
    if backoff:
        return float(
            get_exponential_backoff_interval(
                factor=int(max(1.0, backoff)),
                retries=retries,
                maximum=int(getattr(task, "retry_backoff_max", 600)),
                full_jitter=False,
            )
        )
    countdown = retry_kwargs.get("countdown")
    if countdown is None:
        countdown = getattr(task, "default_retry_delay", None) or 0
    return max(0.0, float(countdown))
