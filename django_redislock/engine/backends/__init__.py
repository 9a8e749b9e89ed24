"""Backends: the only code of the engine that talks to Redis (besides the wake-up hubs).

A backend runs :class:`~django_redislock.engine.calls.Call` objects, batches of
them, a page of a key scan and snapshot loads, and hands out its process's
wake-up hub. ``base`` declares the interface and its capability flags;
``single`` is one Redis master (plain or Sentinel), ``cluster`` a Redis Cluster;
``server`` is what both send to one server (used by ``cluster`` on each node).
"""
