"""A child of tests/test_fencing_procs.py: ``python -m tests.fencing_proc NAME TTL PREFIX PK``.

It holds the lock *NAME* (lease *TTL*, renewed by its watchdog), prints ``acquired
<token>`` and waits for a line on stdin: the parent stops it there (SIGSTOP) until the
lease has run out and another holder took the lock, then continues it. It then writes
through every guarded path, sync and async, printing ``refused <path>``, ``wrote
<path>`` or ``error <path> <message>`` for each, plus one plain, unguarded write
(``plain``: the control, which nothing refuses), then ``done``. Its databases
(``FENCING_DATABASES``: JSON, a Django ``DATABASES``) hold ``Invoice`` row *PK*.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any


def main(name: str, ttl: str, prefix: str, pk: str) -> None:
    """Run as described in the module docstring."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from django.conf import settings

    settings.DATABASES = json.loads(os.environ["FENCING_DATABASES"])
    import django

    django.setup()
    import redis

    from django_redislock import LockLost, locks
    from django_redislock.exceptions import StaleFencingToken
    from tests.fencing_models import Invoice

    aliases = [alias for alias in settings.DATABASES if alias != "default"]
    plain = redis.Redis.from_url(settings.REDIS_URL)

    def attempt(path: str, write: Callable[[], Any]) -> None:
        try:
            write()
        except StaleFencingToken:
            print("refused", path, flush=True)
        except Exception as error:  # reported, for the parent's assertion message
            print("error", path, type(error).__name__, str(error).replace("\n", " "), flush=True)
        else:
            print("wrote", path, flush=True)

    try:
        with locks.lock(name, ttl=float(ttl)) as held:
            token = held.fencing_token
            print("acquired", token, flush=True)
            sys.stdin.readline()  # stopped here; continued once another holder took over
            g = held.guarded()
            attempt("check", held.check)
            attempt("set", lambda: g.set(f"{prefix}:s", "zombie"))
            attempt("hset", lambda: g.hset(f"{prefix}:h", {"by": "zombie"}))
            attempt("incrby", lambda: g.incrby(f"{prefix}:n", 1))
            attempt("delete", lambda: g.delete(f"{prefix}:d"))
            attempt("execute", lambda: g.execute("LPUSH", f"{prefix}:l", "zombie"))
            for alias in aliases:
                rows = Invoice.objects.using(alias).filter(pk=int(pk))
                attempt(
                    f"db:{alias}", lambda rows=rows: rows.fenced_update(token=token, note="zombie")
                )

            async def asynchronous() -> None:
                steps: dict[str, Callable[[], Awaitable[Any]]] = {
                    "acheck": lambda: locks.ais_current(name, token),
                    "aset": lambda: g.aset(f"{prefix}:s", "zombie"),
                    "ahset": lambda: g.ahset(f"{prefix}:h", {"by": "zombie"}),
                    "aincrby": lambda: g.aincrby(f"{prefix}:n", 1),
                    "adelete": lambda: g.adelete(f"{prefix}:d"),
                    "aexecute": lambda: g.aexecute("LPUSH", f"{prefix}:l", "zombie"),
                }
                for alias in aliases:
                    rows = Invoice.objects.using(alias).filter(pk=int(pk))
                    steps[f"adb:{alias}"] = lambda rows=rows: rows.afenced_update(
                        token=token, note="zombie"
                    )
                for path, step in steps.items():
                    try:
                        result = await step()
                    except StaleFencingToken:
                        print("refused", path, flush=True)
                    except Exception as error:
                        print("error", path, type(error).__name__, error, flush=True)
                    else:
                        # ais_current answers False rather than raising: that is its refusal.
                        print("refused" if result is False else "wrote", path, flush=True)
                await locks.source.abackend().aclose()

            asyncio.run(asynchronous())
            plain.set(f"{prefix}:plain", "zombie")
            print("wrote plain", flush=True)
    except LockLost:
        print("lost", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
