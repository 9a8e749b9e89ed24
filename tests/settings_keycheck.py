"""The test settings with the URLconf of tests/keycheck_urls.py (for ``manage.py check``)."""

from tests.settings import *  # noqa: F403

ROOT_URLCONF = "tests.keycheck_urls"
