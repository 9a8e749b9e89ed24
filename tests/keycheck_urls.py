"""The URLconf of the ``manage.py check`` run of tests/test_key_checks.py.

It also creates the project's Celery app, as a project's ``__init__`` would (only
in that subprocess: its autodiscovered task module must never reach the test
process, where its shared task would join every Celery app).
"""

from tests import keycheck_celery  # noqa: F401
from tests.keycheck_views import urlpatterns  # noqa: F401
