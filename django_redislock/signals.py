"""Django signals sent by locks.

Every signal is sent with ``sender`` = the :class:`~django_redislock.Lock` class
and these keyword arguments: ``lock`` (the Lock instance), ``name`` (the lock
name) and ``owner`` (the owner token), plus:

* ``lock_acquired``: ``fencing_token``, ``hold_count``, ``waited`` (seconds the
  acquire call took, waiting included).
* ``lock_not_acquired``: ``waited`` (seconds the call took) and ``blocking``
  (False: a one-attempt acquire found the lock held; True: a wait gave up at its
  timeout). Sent when ``acquire()``/``aacquire()`` returns False.
* ``lock_released``: ``hold_count`` (what is left; 0 = the lock is free) and
  ``held`` (seconds since the grant that began the owner's hold, when this
  release ended it; None for a re-entrant inner release, or when the grant was
  made while nobody listened to ``lock_acquired``).
* ``lock_lost``: ``reason``. May be sent from the watchdog thread.
* ``lock_contended``: ``pttl`` (remaining lease of the holder in seconds, or
  None), sent once per acquire call that found the lock held.
* ``lock_renewed``: ``error`` (None: the watchdog's renewal was confirmed; else
  the exception of a renewal that failed and will be retried; a renewal that
  finds the lock gone sends ``lock_lost`` instead) and ``sent_at`` (the
  ``time.monotonic()`` at which the renewal was sent: a confirmed renewal's lease
  runs at least the ttl from then). Sent from the watchdog's threads.
* ``lock_backend_error``: ``operation`` (``"acquire"`` or ``"release"``) and
  ``error`` (the :class:`~django_redislock.exceptions.LockBackendError` about
  to be raised).

``watchdog_overloaded`` is sent by the process's watchdog (``sender`` = its
class, from its thread) when it warns: ``reason`` (``"ceiling"``: the held locks
need more renewals a second than ``REDISLOCK_WATCHDOG_CEILING``; ``"behind"``: a
renewal went out more than halfway from when it was due to when its hold would
count as lost), ``renewals_per_second``, ``ceiling``, ``held`` and ``lag``
(seconds; 0.0 for ``"ceiling"``). At most once a minute per reason.

Each is sent only when it has receivers (the lock checks first), so an
unobserved signal costs nothing on the lock's hot path.

``force_released`` is sent by :meth:`~django_redislock.LockManager.force_release` with
``sender`` = the manager class, ``name``, ``info`` (the LockInfo before release,
or None) and ``released`` (bool).
"""

from django.dispatch import Signal

#: After each successful acquire, re-entrant ones included: ``fencing_token``,
#: ``hold_count``, ``waited``.
lock_acquired = Signal()
#: After each release: ``hold_count`` (what is left) and ``held``.
lock_released = Signal()
#: When a hold is found lost (possibly from the watchdog thread): ``reason``.
lock_lost = Signal()
#: Once per acquire call that found the lock held: ``pttl``.
lock_contended = Signal()
#: When an acquire returns False: ``waited`` and ``blocking``.
lock_not_acquired = Signal()
#: After each renewal by the watchdog (from its threads): ``error``, ``sent_at``.
lock_renewed = Signal()
#: When Redis fails an acquire or a release, before the error is raised:
#: ``operation`` and ``error``.
lock_backend_error = Signal()
#: By ``LockManager.force_release``: ``name``, ``info`` and ``released``.
force_released = Signal()
#: By the watchdog when it warns it may not keep up: ``reason``,
#: ``renewals_per_second``, ``ceiling``, ``held``, ``lag``.
watchdog_overloaded = Signal()
