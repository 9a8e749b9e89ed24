"""What the installed kombu can do for tests that need a broker to hand a message out again."""

from __future__ import annotations

import pytest
from kombu.transport.redis import Channel

#: These tests need the broker to hand an unacknowledged message out again within
#: a few seconds. kombu before the ``unacked_restore_interval`` transport option
#: (the oldest cell's kombu 5.3) looks for such messages on a fixed cadence of up to
#: about 100 s, so the redelivery would not come within the test's bounds.
needs_prompt_redelivery = pytest.mark.skipif(
    not hasattr(Channel, "unacked_restore_interval"),
    reason="this kombu cannot redeliver within seconds (no unacked_restore_interval)",
)
