"""The lock engine: everything a lock decides and every call to Redis, without Django.

Rules of this package (checked by ``tests/test_layout.py``):

* it imports no Django and nothing of ``django_redislock`` outside ``engine/``
  except :mod:`django_redislock.exceptions`;
* what a lock *decides* (script arguments, reply decoding, the wait policy, the
  idempotent retry, hold bookkeeping) is pure code with no I/O: ``keys``,
  ``validate``, ``calls``, ``flows``, ``holds``, ``wake``, ``info``;
* only ``backends/`` and the wake-up hubs (``wakeup``, ``awakeup``) call
  redis-py; ``driver`` is the one place a flow meets I/O, once sync and once
  async.
"""
