"""Locks in words and JSON, shared by the admin, ``manage.py redislock`` and the example:
``snapshot`` (a held lock: liveness, holders, waiters) and ``history`` (a lock's recent
events and the contention overview).
"""
