"""The admin lock viewer: the ``HeldLockAdmin`` registered for the placeholder model.

Django's admin autodiscovery imports this package, which registers the viewer on the
default admin site. Its parts: ``model_admin`` (the ModelAdmin and its URLs), ``views``
(the list and detail pages), ``listing`` and ``query`` (the list's window over the scan
and its query string), ``actions`` and ``targets`` (the operator's force release and
extend), ``contention`` (the Contention page and a lock's history section).
"""

from .model_admin import HeldLockAdmin

__all__ = ["HeldLockAdmin"]
