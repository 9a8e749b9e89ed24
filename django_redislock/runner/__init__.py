"""The command runner: run a command while holding a lock (or one of N permits).

``python -m django_redislock run NAME -- CMD ...`` and ``manage.py redislock run``
(``cli``: the arguments both share), the runner itself (``runner``: take the lock, start
CMD, renew, forward signals, stop CMD when the lock is lost), the command's watcher
(``watcher``: a process of its own that stops CMD once the hold can no longer be
confirmed, whether or not the runner gets to run) and Celery beat's
``LeaderScheduler`` (``beat``: a beat under a runner sends nothing once its term is
stale). See docs/one-process.md.
"""
