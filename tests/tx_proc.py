"""A child process of tests/test_transactions.py: ``python -m tests.tx_proc REQUESTS``.

Its databases come from ``TX_DATABASES`` (JSON: a Django ``DATABASES``) and the ones
the view counts in from ``TX_COUNTED`` (comma-separated aliases). It sets up Django
with ``tests.settings`` (reusing the parent's Redis through ``REDISLOCK_TEST_REDIS_URL``)
and ``tests.tx_views`` as the URLconf, prints ``ready``, waits for a line on stdin, then
posts REQUESTS requests to the guarded view through Django's test client (the real
handler: ``ATOMIC_REQUESTS`` wraps the view) and prints ``done`` and a JSON list of
``[status, what the view read]`` (null for a failed request; the error is logged on
stderr).
"""

from __future__ import annotations

import json
import os
import sys


def main(requests: str) -> None:
    """Run as described in the module docstring."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from django.conf import settings

    settings.DATABASES = json.loads(os.environ["TX_DATABASES"])
    settings.TX_COUNTED = os.environ["TX_COUNTED"].split(",")
    settings.ROOT_URLCONF = "tests.tx_views"
    import django

    django.setup()
    from django.db import connections
    from django.test import Client

    print("ready", flush=True)
    sys.stdin.readline()
    client = Client(raise_request_exception=False)
    answers = []
    for _ in range(int(requests)):
        response = client.post("/count/")
        answers.append(
            [response.status_code, response.json() if response.status_code == 200 else None]
        )
    connections.close_all()
    print("done", json.dumps(answers, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
