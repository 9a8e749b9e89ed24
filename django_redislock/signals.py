"""Django signals sent by locks.

Every signal is sent with ``sender`` = the :class:`~django_redislock.Lock` class
and these keyword arguments: ``lock`` (the Lock instance), ``name`` (the lock
name) and ``owner`` (the owner token), plus:

* ``lock_acquired``: ``fencing_token``, ``hold_count``.
* ``lock_released``: ``hold_count`` (what is left; 0 = the lock is free).
* ``lock_lost``: ``reason``. May be sent from the watchdog thread.
* ``lock_contended``: ``pttl`` (remaining lease of the holder in seconds, or
  None), sent once per acquire call that found the lock held.

``force_released`` is sent by :meth:`~django_redislock.LockManager.force_release` with
``sender`` = the manager class, ``name``, ``info`` (the LockInfo before release,
or None) and ``released`` (bool).
"""

from django.dispatch import Signal

lock_acquired = Signal()
lock_released = Signal()
lock_lost = Signal()
lock_contended = Signal()
force_released = Signal()
