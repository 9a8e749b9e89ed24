"""Rate limits and cooldowns on a real Redis Cluster: the shaping keys carry the lock
name's hash tag, so each script touches one slot, on every primary."""

from __future__ import annotations

import uuid

import pytest

from django_redislock import LockManager, RunLimited, single_instance
from django_redislock.guards.shaping import shaping_state
from tests.redis_cluster import Cluster, shared_cluster
from tests.test_cluster import names_on_each_primary

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def manager() -> LockManager:
    cluster: Cluster = shared_cluster()
    return LockManager(client=cluster.client())


def test_rate_and_cooldown_on_every_primary(manager: LockManager) -> None:
    prefix = f"sh{uuid.uuid4().hex[:8]}:"
    for name in names_on_each_primary(manager, prefix):

        @single_instance(name, rate="2/m", manager=manager)
        def rated() -> str:
            return "ran"

        @single_instance(name + ":c", cooldown=30, manager=manager)
        def cooled() -> str:
            return "ran"

        assert [rated(), rated()] == ["ran", "ran"]
        with pytest.raises(RunLimited, match="already started 2 times"):
            rated()
        assert shaping_state(rated, name).count == 2
        assert cooled() == "ran"
        with pytest.raises(RunLimited) as refused:
            cooled()
        assert refused.value.reason == "cooldown"
        assert shaping_state(cooled, name + ":c").cooldown_left > 29
