"""A resolved lock backend: the Redis client and key layout one manager uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .keys import KeySpace
from .wakeup import WakeHub, hub_for


@dataclass
class Backend:
    """The Redis client, key space and tunables a :class:`LockManager` resolved from settings."""

    client: Any
    keyspace: KeySpace
    retention_ms: int
    _hub_prefix: str = field(init=False)

    retention_arg: bytes = field(init=False)

    def __post_init__(self) -> None:
        self._hub_prefix = f"{self.keyspace.prefix}:wake:"
        self.retention_arg = str(self.retention_ms).encode()

    def hub(self) -> WakeHub:
        """This process's wake-up hub for the client (created on first use)."""
        return hub_for(self.client, self._hub_prefix)
