"""``manage.py redislock``: list, show and release locks from the shell."""

from __future__ import annotations

import json
import math
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_redislock.engine.info import LockInfo
from django_redislock.exceptions import LockError
from django_redislock.manager import LockManager


def _lease(info: LockInfo) -> str:
    if info.ttl is None:
        return "-"
    return "no expiry" if math.isinf(info.ttl) else f"{info.ttl:.1f}s"


def _holder(info: LockInfo) -> str:
    if info.task_id:
        return f"task {info.task_name or '?'}[{info.task_id}]"
    parts = [p for p in (info.host, str(info.pid) if info.pid else None, info.thread) if p]
    return "/".join(parts) or (info.owner or "?")


class Command(BaseCommand):
    """List held locks, show one lock's metadata, or force-release a lock."""

    help = (
        "Inspect and release django-redislock locks: list [--prefix P] | show NAME | release NAME"
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--cache", help="cache alias to use instead of REDISLOCK_CACHE")
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="list held locks")
        listing.add_argument("--prefix", default="", help="only names starting with this")
        listing.add_argument("--limit", type=int, default=1000, help="stop after this many")
        listing.add_argument("--json", action="store_true", help="one JSON object per line")
        show = sub.add_parser("show", help="show one lock")
        show.add_argument("name")
        show.add_argument("--json", action="store_true")
        release = sub.add_parser("release", help="force-release a lock (operator action)")
        release.add_argument("name")
        release.add_argument("--owner", help="only if still held by this owner token")
        release.add_argument("--fencing-token", type=int, help="only if still at this token")

    def handle(self, *args: Any, **options: Any) -> None:
        manager = LockManager(options.get("cache"))
        action = options["action"]
        try:
            if action == "list":
                self._list(manager, options)
            elif action == "show":
                self._show(manager, options)
            else:
                self._release(manager, options)
        except LockError as exc:
            raise CommandError(str(exc)) from exc
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc

    def _list(self, manager: LockManager, options: dict[str, Any]) -> None:
        count = 0
        for info in manager.active(options["prefix"]):
            if count >= options["limit"]:
                self.stdout.write(f"... stopped after {options['limit']} locks (use --limit)")
                break
            count += 1
            if options["json"]:
                self.stdout.write(json.dumps(_as_dict(info)))
            else:
                self.stdout.write(
                    f"{info.name}\t{_holder(info)}\tfence={info.fencing_token}\t"
                    f"count={info.hold_count}\tlease={_lease(info)}"
                )
        if not options["json"]:
            self.stdout.write(f"{count} lock(s) held")

    def _show(self, manager: LockManager, options: dict[str, Any]) -> None:
        info = manager.get(options["name"])
        if info is None:
            raise CommandError(f"lock {options['name']!r} is not held")
        data = _as_dict(info)
        if options["json"]:
            self.stdout.write(json.dumps(data))
            return
        for key, value in data.items():
            self.stdout.write(f"{key:>14}: {value}")

    def _release(self, manager: LockManager, options: dict[str, Any]) -> None:
        name = options["name"]
        if manager.force_release(
            name, owner=options.get("owner"), fencing_token=options.get("fencing_token")
        ):
            self.stdout.write(f"released {name!r}")
        elif options.get("owner") or options.get("fencing_token") is not None:
            raise CommandError(f"lock {name!r} is not held, or no longer by that owner/token")
        else:
            raise CommandError(f"lock {name!r} is not held")


def _as_dict(info: LockInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "key": info.key,
        "owner": info.owner,
        "hold_count": info.hold_count,
        "fencing_token": info.fencing_token,
        "acquired_at": info.acquired_at.isoformat() if info.acquired_at else None,
        "ttl": None if info.ttl is None or math.isinf(info.ttl) else round(info.ttl, 3),
        "lease": info.lease,
        "host": info.host,
        "pid": info.pid,
        "thread": info.thread,
        "purpose": info.purpose,
        "task_id": info.task_id,
        "task_name": info.task_name,
        "kind": info.kind,
        "extra": info.extra,
    }
