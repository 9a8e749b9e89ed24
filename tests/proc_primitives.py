"""A child-process agent for the semaphore / read-write lock / ``fair=False`` tests:
``python -m tests.proc_primitives [--skew SECONDS]``.

The parent drives it with one JSON command per stdin line and reads one JSON event
per stdout line (see :class:`Agent`). Like tests/proc.py, the child sets up Django
with ``DJANGO_SETTINGS_MODULE`` (``tests.settings``, or ``tests.settings_cluster``)
and reuses the parent's Redis through ``REDISLOCK_TEST_REDIS_URL``.

``--skew SECONDS`` shifts this process's ``time.time()`` (the client's wall clock)
by SECONDS before anything is imported: a clock fault between clients that a real
server cannot produce, so it is injected here, in this child only.

Times in events are ``time.monotonic()``: on Linux that clock is system-wide
(CLOCK_MONOTONIC), so the parent and every child compare them directly.

The invariant checker of the ``loop`` command runs inside Redis: entering and
leaving a critical section are each one Lua script, so the check and the count
it looks at are atomic (see :data:`ENTER`).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

#: Enter a critical section. KEYS: readers inside, exclusive holders inside,
#: violations, the most readers/permits seen at once. ARGV: mode ('r' a reader,
#: 'x' a writer or mutex holder, 's' a permit holder), limit (for 's').
#: Two sections that overlap are always seen: the later entry finds the earlier
#: one's count still up (its exit script has not run yet).
ENTER = r"""
local mode, limit = ARGV[1], tonumber(ARGV[2])
local function most(n)
  if n > tonumber(redis.call('GET', KEYS[4]) or '0') then redis.call('SET', KEYS[4], n) end
end
if mode == 'r' then
  local n = redis.call('INCR', KEYS[1])
  if tonumber(redis.call('GET', KEYS[2]) or '0') ~= 0 then redis.call('INCR', KEYS[3]) end
  most(n)
elseif mode == 'x' then
  local n = redis.call('INCR', KEYS[2])
  if n ~= 1 or tonumber(redis.call('GET', KEYS[1]) or '0') ~= 0 then
    redis.call('INCR', KEYS[3])
  end
else
  local n = redis.call('INCR', KEYS[1])
  if n > limit then redis.call('INCR', KEYS[3]) end
  most(n)
end
return 1
"""
#: Leave a critical section (same KEYS and ARGV as ENTER).
LEAVE = r"""
if ARGV[1] == 'x' then return redis.call('DECR', KEYS[2]) end
return redis.call('DECR', KEYS[1])
"""


def checker_keys(base: str) -> dict[str, str]:
    """The Redis keys of the checker and the guarded counter under *base*."""
    return {
        "readers": f"{base}:readers",
        "exclusive": f"{base}:exclusive",
        "violations": f"{base}:violations",
        "most": f"{base}:most",
        "counter": f"{base}:counter",
    }


def _skew(argv: list[str]) -> None:
    if "--skew" in argv:
        shift = float(argv[argv.index("--skew") + 1])
        real = time.time
        time.time = lambda: real() + shift  # type: ignore[assignment]


class Agent:
    """Runs commands from stdin; each ``hold`` runs in its own thread so that several
    waits can queue at once while the agent keeps reading commands.

    Commands (``op``):

    * ``hold`` -- acquire one lock object with the explicit owner ``<id>@<pid>``:
      ``prim`` ``lock`` / ``sem`` / ``read`` / ``write``, ``name``, and the options
      ``limit``, ``ttl``, ``auto_renew``, ``fair``, ``timeout``. Events ``waiting``,
      then ``acquired`` (``token``, ``t``, ``waited``) or ``failed``.
    * ``release`` -- release hold ``id``; event ``released`` (``t``, ``called``: when
      ``release()`` was called, ``left``).
    * ``loop`` -- ``threads`` threads repeat acquire / critical section / release
      on ``name`` until the monotonic time ``until``, with the Redis-side checker
      under ``base``; event ``done`` with the counts.
    * ``churn`` -- one thread acquires, holds ``hold`` s, releases, waits ``gap`` s,
      and again, until ``stop`` (the name of a Redis key that appears); ``done``.
    * ``exit``.
    """

    def __init__(self) -> None:
        import redis
        from django.conf import settings

        self.redis = redis.Redis.from_url(settings.REDIS_URL)
        self.enter = self.redis.register_script(ENTER)
        self.leave = self.redis.register_script(LEAVE)
        self.holds: dict[str, Any] = {}
        self.out = threading.Lock()
        self.threads: list[threading.Thread] = []

    def say(self, **event: Any) -> None:
        with self.out:
            sys.stdout.write(json.dumps(event) + "\n")
            sys.stdout.flush()

    def lock(self, cmd: dict[str, Any], owner: str | None) -> Any:
        from django_redislock import locks

        opts: dict[str, Any] = {"timeout": cmd.get("timeout", 30)}
        for key in ("ttl", "auto_renew", "fair"):
            if key in cmd:
                opts[key] = cmd[key]
        if owner is not None:
            opts["owner"] = owner
        prim, name = cmd["prim"], cmd["name"]
        if prim == "lock":
            return locks.lock(name, **opts)
        if prim == "sem":
            return locks.semaphore(name, cmd["limit"], **opts)
        rw = locks.rw_lock(name, **opts)
        return rw.read() if prim == "read" else rw.write()

    # -- commands ----------------------------------------------------------------

    def hold(self, cmd: dict[str, Any]) -> None:
        ident = cmd["id"]
        lock = self.lock(cmd, f"{ident}@{os.getpid()}")
        self.holds[ident] = lock
        self.say(ev="waiting", id=ident, t=time.monotonic())
        started = time.monotonic()
        try:
            got = lock.acquire()
        except Exception as exc:  # reported to the parent, which fails the test
            self.say(ev="failed", id=ident, error=repr(exc))
            return
        now = time.monotonic()
        if not got:
            self.say(ev="failed", id=ident, error="timeout", t=now)
            return
        self.say(ev="acquired", id=ident, token=lock.fencing_token, t=now, waited=now - started)

    def release(self, cmd: dict[str, Any]) -> None:
        ident = cmd["id"]
        called = time.monotonic()
        left = self.holds[ident].release()
        self.say(ev="released", id=ident, t=time.monotonic(), called=called, left=left)

    def loop(self, cmd: dict[str, Any]) -> None:
        from django_redislock import LockNotAcquired

        keys = checker_keys(cmd["base"])
        ckeys = [keys["readers"], keys["exclusive"], keys["violations"], keys["most"]]
        mode = {"read": "r", "write": "x", "lock": "x", "sem": "s"}[cmd["prim"]]
        args = [mode, cmd.get("limit", 0)]
        hold, until = float(cmd.get("hold", 0.002)), float(cmd["until"])
        results: list[dict[str, Any]] = []

        def work() -> None:
            lock = self.lock(cmd, None)  # this thread is the owner
            sections = torn = timeouts = 0
            max_wait = 0.0
            while time.monotonic() < until:
                asked = time.monotonic()
                try:
                    got = lock.acquire()
                except LockNotAcquired:
                    got = False
                if not got:
                    timeouts += 1
                    continue
                max_wait = max(max_wait, time.monotonic() - asked)
                try:
                    self.enter(keys=ckeys, args=args)
                    if mode == "x":  # a non-atomic read-modify-write
                        value = int(self.redis.get(keys["counter"]) or 0)
                        time.sleep(hold)
                        self.redis.set(keys["counter"], value + 1)
                    elif mode == "r":  # a reader sees no write in the middle
                        before = self.redis.get(keys["counter"])
                        time.sleep(hold)
                        torn += before != self.redis.get(keys["counter"])
                    else:
                        time.sleep(hold)
                    self.leave(keys=ckeys, args=args)
                    sections += 1
                finally:
                    lock.release()
            results.append(
                {"sections": sections, "torn": torn, "timeouts": timeouts, "max_wait": max_wait}
            )

        workers = [threading.Thread(target=work) for _ in range(int(cmd.get("threads", 1)))]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        self.say(
            ev="done",
            id=cmd["id"],
            sections=[r["sections"] for r in results],
            torn=sum(r["torn"] for r in results),
            timeouts=sum(r["timeouts"] for r in results),
            max_wait=max((r["max_wait"] for r in results), default=0.0),
        )

    def churn(self, cmd: dict[str, Any]) -> None:
        lock = self.lock(cmd, None)
        hold, gap, stop = float(cmd["hold"]), float(cmd["gap"]), cmd["stop"]
        deadline = time.monotonic() + float(cmd.get("limit_s", 30))
        sections = 0
        self.say(ev="churning", id=cmd["id"])
        while not self.redis.exists(stop) and time.monotonic() < deadline:
            with lock:
                sections += 1
                time.sleep(hold)
            if gap:
                time.sleep(gap)
        self.say(ev="done", id=cmd["id"], sections=sections)

    def run(self) -> None:
        self.say(ev="ready", pid=os.getpid())
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd["op"]
            if op == "exit":
                break
            if op == "release":
                self.release(cmd)
                continue
            target = {"hold": self.hold, "loop": self.loop, "churn": self.churn}[op]
            thread = threading.Thread(target=target, args=(cmd,), daemon=True)
            thread.start()
            self.threads.append(thread)
        for thread in self.threads:
            thread.join(30)


if __name__ == "__main__":
    _skew(sys.argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    Agent().run()
