"""The command the runner tests run under ``redislock run``: ``python -m tests.runner_child
URL PREFIX MODE``.

It reads its term from ``REDISLOCK_TERM`` and writes to the Redis at *URL* (directly,
never through a test's proxy), under keys starting with *PREFIX*:

* ``PREFIX:attempts`` (list): every write it tries, ``"<term> <event> <pid>"``, in the
  order Redis ran them (unfenced: what really ran, and when, relative to the others);
* ``PREFIX:log`` (list): the writes the fence accepted, a term never below the highest
  term accepted before (``PREFIX:max``); a stale term's write goes to
  ``PREFIX:refused`` instead;
* ``PREFIX:events`` (list): ``"<term> <event>"`` for the test to ``BLPOP`` (no polling);
* ``PREFIX:starts`` (tests/starts.py): its start, with the earlier children still alive.

Events: ``start``, then ``tick`` every 20 ms, ``signal <N>`` for a signal received.
*MODE*: ``run`` (tick until a signal ends it: SIGTERM/SIGINT/SIGHUP are recorded and
end it with 128 + N), ``exit:N`` (one tick, then exit N), ``stubborn`` (record and
ignore SIGTERM: only SIGKILL ends it).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import redis

from tests.starts import record_start

FENCED = """
local term = tonumber(ARGV[1])
redis.call('RPUSH', KEYS[1], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3])
redis.call('RPUSH', KEYS[5], ARGV[1] .. ' ' .. ARGV[2])
local highest = tonumber(redis.call('GET', KEYS[2]) or '0')
if term < highest then
  redis.call('RPUSH', KEYS[4], ARGV[1] .. ' ' .. ARGV[2])
  return 0
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('RPUSH', KEYS[3], ARGV[1] .. ' ' .. ARGV[2])
return 1
"""


def main(url: str, prefix: str, mode: str) -> None:
    """Write ``start`` and ticks with this child's term until told to stop (see above)."""
    client = redis.Redis.from_url(url, socket_timeout=10)
    script = client.register_script(FENCED)
    term = os.environ["REDISLOCK_TERM"]
    keys = [f"{prefix}:{k}" for k in ("attempts", "max", "log", "refused", "events")]
    pid = str(os.getpid())

    def write(event: str) -> None:
        # Redis may be restarting (a test does that): retry for a bounded while.
        deadline = time.monotonic() + 10
        while True:
            try:
                script(keys=keys, args=[term, event, pid])
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    ending: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        ending.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    record_start(client, prefix)
    write("start")
    while True:
        write("tick")
        if mode.startswith("exit:"):
            sys.exit(int(mode[5:]))
        while ending:
            signum = ending.pop(0)
            write(f"signal {signum}")
            if mode != "stubborn":
                sys.exit(128 + signum)
        time.sleep(0.02)


if __name__ == "__main__":
    main(*sys.argv[1:4])
