"""Where the Redis client comes from: ``connection`` (a cache alias's client or
``REDISLOCK_URL``, and its asyncio twin) and ``source`` (``BackendSource``: settings, or an
explicit client, turned into one blocking backend and one asyncio backend per event loop).
"""
