"""Django signals of leader elections (:class:`~django_redislock.election.Election`).

Every signal is sent with ``sender`` = the ``Election`` class and the keyword
arguments ``election`` (the instance) and ``name`` (the election's name), plus:

* ``elected``: ``term`` (the new leadership's fencing token). Sent by
  ``campaign()`` / ``acampaign()`` in the process that won.
* ``deposed``: ``term`` and ``reason``. Sent when the leader learns that its
  leadership is gone without resigning: the watchdog found the lease lost (it
  ran out, an operator released it, Redis forgot it), or ``resign()`` found it
  taken. May be sent from the watchdog's thread; it comes before the lease can
  have run out in Redis whenever the watchdog can tell (see docs/architecture.md,
  "The watchdog").
* ``leader_changed``: ``term`` (the term now leading, None: nobody leads as far
  as this process knows) and ``previous`` (the term before, or None). Sent in
  the process whose ``Election`` was elected, resigned or was deposed, at once;
  and by ``Election.wait_for_change()`` in an observer, which is poked by elections
  and resigns (see docs/one-process.md, "Observers").
"""

from django.dispatch import Signal

#: This process's election won: ``term``.
elected = Signal()
#: This process's leadership was found lost: ``term`` and ``reason``.
deposed = Signal()
#: The leader changed as this process saw it: ``term`` and ``previous``.
leader_changed = Signal()
