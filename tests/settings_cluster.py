"""Settings for the cluster tests' child processes: ``tests.settings`` with the locks on
the Redis Cluster named by ``REDISLOCK_TEST_CLUSTER_URL`` (found by ``REDISLOCK_URL``'s
cluster detection)."""

import os

from tests.settings import *  # noqa: F403

REDISLOCK_URL = os.environ["REDISLOCK_TEST_CLUSTER_URL"]
