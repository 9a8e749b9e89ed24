"""The lock objects and their manager, over the engine.

``lock`` (``Lock``: acquire, release, extend, inspection, ``with`` / ``async with``),
``semaphore`` and ``rwlock`` (``Lock`` s whose holds are permits, or read and write
holds), ``manager`` (``LockManager`` and the default ``locks``) and ``transactions``
(a release inside an atomic block waits for its end).
"""
