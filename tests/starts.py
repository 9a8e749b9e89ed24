"""An outside recorder of commands' starts, for "never two commands alive at once":
``python -m tests.runner_child`` and the beat tests' ``celery beat`` record their start
here (a Redis list), and at that moment check which commands that started before them
are still alive (a zombie counts as gone: it runs nothing).

``PREFIX:starts``: ``"<pid> <time.time()> <alive pids, comma-separated or ->"``, in the
order Redis ran the pushes; ``PREFIX:started`` gets the pid as well, for a test's
``BLPOP`` (no polling).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import redis


def alive(pid: int) -> bool:
    """Whether *pid* runs (a zombie does not: it died and waits for its parent). Linux."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(") ", 1)[1][:1]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def record_start(client: redis.Redis, prefix: str) -> None:
    """Record this process's start under *prefix*, with the earlier starters still alive.

    Its pid goes in first (``PREFIX:pids``), then the earlier ones are checked: of two
    commands starting at once, the later one sees the earlier.
    """
    me = os.getpid()
    at = time.time()
    count = client.rpush(f"{prefix}:pids", me)
    earlier = [int(p) for p in client.lrange(f"{prefix}:pids", 0, int(count) - 2)]
    running = [str(p) for p in earlier if p != me and alive(p)]
    client.rpush(f"{prefix}:starts", f"{me} {at!r} {','.join(running) or '-'}")
    client.rpush(f"{prefix}:started", me)


@dataclass(frozen=True)
class Start:
    """One recorded start: the command's *pid*, *at* (wall clock), and the pids of the
    commands that started before it and were still *running* then."""

    pid: int
    at: float
    running: tuple[int, ...]


def starts(client: redis.Redis, prefix: str) -> list[Start]:
    """The starts recorded under *prefix*, in order."""
    rows = []
    for row in client.lrange(f"{prefix}:starts", 0, -1):
        pid, at, running = (row.decode() if isinstance(row, bytes) else row).split(" ")
        others = () if running == "-" else tuple(int(p) for p in running.split(","))
        rows.append(Start(int(pid), float(at), others))
    return rows


def next_start(client: redis.Redis, prefix: str, timeout: float) -> int:
    """The pid of the next command to start under *prefix*; fails after *timeout* s."""
    popped = client.blpop([f"{prefix}:started"], timeout=timeout)
    assert popped is not None, f"no command started within {timeout} s"
    return int(popped[1])
