"""An unmanaged placeholder model that gives the admin lock viewer its index entry.

:class:`HeldLock` has no database table: locks live in Redis. The model exists
so that the Django admin lists "Locks" under "Redis locks" and so that real
permission rows exist (``view_heldlock``, ``release_lock``, ``extend_lock``) that
can be granted to staff users and groups like any other permission.
"""

from __future__ import annotations

from django.db import models


class HeldLock(models.Model):
    """A lock held in Redis, as the admin shows it (never stored in the database)."""

    name: models.CharField[str, str] = models.CharField(max_length=1024, primary_key=True)

    class Meta:
        managed = False
        verbose_name = "lock"
        verbose_name_plural = "locks"
        default_permissions = ("view",)
        permissions = [
            ("release_lock", "Can force-release held locks"),
            ("extend_lock", "Can extend the lease of held locks"),
        ]

    def __str__(self) -> str:
        return str(self.name)
