"""``python -m django_redislock run NAME [options] -- CMD ...``: the command runner
without a Django project (see :mod:`django_redislock.runner.cli`)."""

import sys

from django_redislock.runner.cli import main

if __name__ == "__main__":
    sys.exit(main())
