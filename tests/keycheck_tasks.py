"""Tasks whose lock options fail only when the Celery app is finalized (imported by
the check of tests/test_key_checks.py through Celery's autodiscovery, never by tests)."""

from __future__ import annotations

from celery import shared_task

from django_redislock.celery import SingleInstanceTask


@shared_task(base=SingleInstanceTask, lock_key="sync:{acount_id}")
def sync_account(account_id: int) -> None:
    """The key's field is misspelt: the class is built, and fails, at finalize."""
