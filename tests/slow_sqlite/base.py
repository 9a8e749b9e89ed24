"""Django's SQLite backend, with every commit ``TEST_COMMIT_DELAY`` seconds slower.

SQLite has no deferred trigger that could slow a ``COMMIT`` down as PostgreSQL's
``pg_sleep`` in a deferred constraint trigger does, so the wait comes before the
real commit: the transaction stays open (its write lock held, its rows invisible to
other connections) for that long, then commits, as a slow disk's commit would.
"""

from __future__ import annotations

import time

from django.db.backends.sqlite3 import base


class DatabaseWrapper(base.DatabaseWrapper):
    """SQLite, with commits delayed by the ``TEST_COMMIT_DELAY`` setting of the alias."""

    def _commit(self) -> None:
        time.sleep(float(self.settings_dict.get("TEST_COMMIT_DELAY", 0)))
        super()._commit()
