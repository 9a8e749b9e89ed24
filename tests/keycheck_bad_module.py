"""A task module whose ``@single_instance`` names a missing argument: importing it
raises ValueError (tests/test_key_checks.py has a Celery app import it)."""

from __future__ import annotations

from django_redislock import single_instance


@single_instance("report:{acount_id}")
def report(account_id: int) -> None:
    """Never defined: the decorator refuses the key at import."""
