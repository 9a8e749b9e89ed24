"""Guards: ``@single_instance`` on functions, views and Celery tasks.

``decorators`` (the decorator and a view's answer when the lock is held or Redis is
down), ``guard`` (what the decorator and the task integrations share: the guard's
configuration, the task hooks, owner-checked releases), ``keys_template`` (lock names
computed from a call's arguments) and ``key_checks`` (system checks E005/W008 on the lock
keys of URLconf views and Celery tasks).
"""
