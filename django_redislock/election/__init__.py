"""Leader election and the command runner, built on the lock.

``locks.election(name)`` makes an :class:`Election`: ``campaign()`` until this
process leads, ``resign()``, ``leader()``, ``is_current(term)`` and
``with election.leading() as term:``. The runner (:mod:`.runner`) runs a command
while holding a lock: ``python -m django_redislock run NAME -- CMD ...`` or
``manage.py redislock run``. See docs/one-process.md.
"""

from .election import Change, Election, ElectionError, Leader, LeadershipLost, Leading

__all__ = ["Change", "Election", "ElectionError", "Leader", "LeadershipLost", "Leading"]
