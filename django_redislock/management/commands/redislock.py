"""``manage.py redislock``: list, show, release and extend locks from the shell; read
one lock's recent ``history`` and the ``contention`` overview (which locks cost most
waiting lately).

A semaphore or read-write lock is shown with every holder (mode, owner, token,
lease); ``release`` and ``extend`` act on the holders matching ``--owner`` and/or
``--fencing-token`` (``--token``), or on every holder when neither is given.
Every lock shows its queue length and liveness ("renewed 2.0 s ago", "NOT RENEWED
for 25 s"); ``show`` lists the waiters in order (texts from :mod:`..describe`).
"""

from __future__ import annotations

import json
import math
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_redislock.describe.history import (
    contention_as_dict,
    event_as_dict,
    history_lines,
    spreads,
)
from django_redislock.describe.shaping import shaping_as_dict, shaping_lines
from django_redislock.describe.snapshot import (
    WaiterLine,
    liveness,
    lock_as_dict,
    queue_text,
    seconds_text,
    short_holder,
    waiter_lines,
    with_waiters,
)
from django_redislock.engine.info import HolderInfo, LockInfo
from django_redislock.engine.shaping_state import ShapingState
from django_redislock.exceptions import LockError, ShapingUnsupported
from django_redislock.primitives.manager import LockManager
from django_redislock.runner.cli import RUN_HELP, add_run_arguments, run_from_options
from django_redislock.runner.cli import split_command as _split_command

#: Locks printed at a time by ``list`` (``--json`` reads their waiters in one round trip).
BATCH = 200


def _lease(ttl: float | None) -> str:
    if ttl is None:
        return "-"
    return "no expiry" if math.isinf(ttl) else f"{ttl:.1f}s"


def _queue(info: LockInfo) -> str:
    return f"queue={'-' if info.queue_length is None else info.queue_length}"


def _primitive(info: LockInfo) -> str:
    """``mutex``, ``semaphore 2/3``, ``rwlock write``, ``rwlock 3 readers``."""
    if info.primitive == "semaphore":
        return f"semaphore {len(info.holders)}/{info.limit if info.limit is not None else '?'}"
    if info.primitive == "rwlock":
        readers = len(info.readers)
        reading = f"{readers} reader{'s' * (readers != 1)}"
        if info.writer is not None:
            return "rwlock write" + (f"+{reading}" if readers else "")
        return f"rwlock {reading}"
    return info.primitive


def _shaping_of(manager: LockManager, name: str) -> ShapingState | None:
    """The key's shaping, or None where the backend keeps none (Redlock)."""
    try:
        return manager.shaping(name)
    except ShapingUnsupported:
        return None


def _holder_line(holder: HolderInfo) -> str:
    return (
        f"  {holder.mode}\towner={holder.owner}\t{short_holder(holder)}\t"
        f"fence={holder.fencing_token}\tcount={holder.hold_count}\tlease={_lease(holder.ttl)}\t"
        f"{liveness(holder).loud_text}"
    )


def _waiter_line(line: WaiterLine) -> str:
    """``  #1  owner=o  exclusive  host/pid/thread  purpose=...  waiting for 3.2 s (since
    10:55:02)  gives up in 4.1 s (at 10:55:09)`` (or ``no limit``)."""
    waiter = line.waiter
    since = f" (since {waiter.waiting_since:%H:%M:%S})" if waiter.waiting_since else ""
    gives_up = (
        f"gives up {line.deadline_text} (at {waiter.deadline:%H:%M:%S})"
        if waiter.deadline
        else line.deadline_text
    )
    return (
        f"  #{line.position}\towner={waiter.owner}\t{waiter.mode}\t{short_holder(waiter)}\t"
        f"purpose={waiter.purpose or '-'}\twaiting {line.waited_text}{since}\t{gives_up}"
    )


class Command(BaseCommand):
    """List held locks, show one lock's holders and metadata, release or extend a lock."""

    help = (
        "Inspect and act on django-redislock locks: list [--prefix P] | show NAME | "
        "history NAME | contention [--window S] | release NAME [--owner O] [--token N] | "
        "extend NAME SECONDS [--owner O] [--token N]"
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--cache", help="cache alias to use instead of REDISLOCK_CACHE")
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="list held locks")
        listing.add_argument("--prefix", default="", help="only names starting with this")
        listing.add_argument("--limit", type=int, default=1000, help="stop after this many")
        listing.add_argument("--json", action="store_true", help="one JSON object per line")
        show = sub.add_parser("show", help="show one lock and all its holders")
        show.add_argument("name")
        show.add_argument("--json", action="store_true")
        history = sub.add_parser("history", help="what happened to one lock lately")
        history.add_argument("name")
        history.add_argument("--json", action="store_true")
        contention = sub.add_parser("contention", help="which locks cost most waiting lately")
        contention.add_argument(
            "--window", type=float, default=3600.0, help="seconds back from now (3600)"
        )
        contention.add_argument("--limit", type=int, default=20, help="how many groups (20)")
        contention.add_argument("--json", action="store_true", help="one JSON object per line")
        release = sub.add_parser("release", help="force-release a lock or holder (operator action)")
        release.add_argument("name")
        extend = sub.add_parser("extend", help="add time to a lease (operator action)")
        extend.add_argument("name")
        extend.add_argument("seconds", type=float, help="seconds to add to the remaining lease")
        for action in (release, extend):
            action.add_argument(
                "--owner", help="only the holder with this owner token (if it still holds)"
            )
            action.add_argument(
                "--fencing-token",
                "--token",
                dest="fencing_token",
                type=int,
                help="only the holder with this fencing token (if it still holds)",
            )
        add_run_arguments(sub.add_parser("run", help=RUN_HELP, description=RUN_HELP))

    def run_from_argv(self, argv: list[str]) -> None:
        """``run NAME [options] -- CMD ...``: the command after ``--`` is not parsed."""
        before, self.run_command = _split_command(argv)
        super().run_from_argv(before if "run" in before else argv)

    def handle(self, *args: Any, **options: Any) -> None:
        manager = LockManager(options.get("cache"))
        if options["action"] == "run":
            raise SystemExit(run_from_options(manager, options, getattr(self, "run_command", [])))
        handlers = {
            "list": self._list,
            "show": self._show,
            "release": self._release,
            "extend": self._extend,
            "history": self._history,
            "contention": self._contention,
        }
        try:
            handlers[options["action"]](manager, options)
        except LockError as exc:
            raise CommandError(str(exc)) from exc
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc

    def _history(self, manager: LockManager, options: dict[str, Any]) -> None:
        events = manager.history(options["name"])
        if options["json"]:
            self.stdout.write(json.dumps([event_as_dict(e) for e in events]))
            return
        if not events:
            self.stdout.write(f"nothing recorded for {options['name']!r}")
            return
        for key, text in spreads(events).items():
            if text:
                self.stdout.write(f"{key:>7}: {text}")
        for line in history_lines(events):
            self.stdout.write(
                f"{line.event.at:%Y-%m-%d %H:%M:%S}\t{line.event.event}\t"
                f"holder={line.holder}\theld={line.held or '-'}\t"
                f"waiter={line.waiter}\twaited={line.waited or '-'}"
            )

    def _contention(self, manager: LockManager, options: dict[str, Any]) -> None:
        groups, complete = manager.contention(options["window"], limit=options["limit"])
        for entry in groups:
            if options["json"]:
                self.stdout.write(json.dumps(contention_as_dict(entry)))
                continue
            self.stdout.write(
                f"{entry.group}\tlocks={entry.locks}\twaits={entry.waits}\t"
                f"waited={seconds_text(entry.waited)}\tlongest={seconds_text(entry.longest_wait)}"
                f"\ttimeouts={entry.timeouts}\texpiries={entry.expiries}\tlosses={entry.losses}"
                f"\tforced={entry.forced}"
            )
        if not complete:
            self.stdout.write("... not every lock's history was read (too many names)")

    def _list(self, manager: LockManager, options: dict[str, Any]) -> None:
        count = 0
        batch: list[LockInfo] = []
        for info in manager.active(options["prefix"]):
            if count >= options["limit"]:
                self._print(manager, batch, options["json"])
                batch = []
                self.stdout.write(f"... stopped after {options['limit']} locks (use --limit)")
                break
            count += 1
            batch.append(info)
            if len(batch) >= BATCH:
                self._print(manager, batch, options["json"])
                batch = []
        self._print(manager, batch, options["json"])
        if not options["json"]:
            self.stdout.write(f"{count} lock(s) held")

    def _print(self, manager: LockManager, infos: list[LockInfo], as_json: bool) -> None:
        """One line per lock (and per holder of a semaphore or read-write lock), or
        one JSON object per lock with its waiters."""
        if as_json:
            for info in with_waiters(manager, infos):
                self.stdout.write(json.dumps(lock_as_dict(info)))
            return
        for info in infos:
            alive = liveness(info).loud_text
            if info.primitive == "mutex":
                self.stdout.write(
                    f"{info.name}\t{_primitive(info)}\t{short_holder(info)}\t"
                    f"fence={info.fencing_token}\tcount={info.hold_count}\t"
                    f"lease={_lease(info.ttl)}\t{_queue(info)}\t{alive}"
                )
                continue
            self.stdout.write(
                f"{info.name}\t{_primitive(info)}\tlease={_lease(info.ttl)}\t{_queue(info)}\t{alive}"
            )
            for holder in info.holders:
                self.stdout.write(_holder_line(holder))

    def _show(self, manager: LockManager, options: dict[str, Any]) -> None:
        info = manager.get(options["name"])
        state = _shaping_of(manager, options["name"])
        recorded = info.meta.get("shaping") if info is not None else None
        shaping = recorded if isinstance(recorded, dict) else None
        if info is None:
            lines = [] if state is None else shaping_lines(state)
            raise CommandError(" ".join([f"lock {options['name']!r} is not held.", *lines]))
        data = lock_as_dict(info)
        if state is not None and (state.active or shaping):
            data["shaping"] = shaping_as_dict(state, shaping)
        if options["json"]:
            self.stdout.write(json.dumps(data))
            return
        data.pop("shaping", None)
        holders = data.pop("holders")
        del data["waiters"]
        for key, value in data.items():
            self.stdout.write(f"{key:>14}: {value}")
        self.stdout.write(f"{'liveness':>14}: {liveness(info).loud_text}")
        self.stdout.write(f"{'holders':>14}: {len(holders)}")
        for holder in info.holders:
            self.stdout.write(_holder_line(holder))
        self.stdout.write(f"{'waiters':>14}: {queue_text(info)}")
        for line in waiter_lines(info):
            self.stdout.write(_waiter_line(line))
        for text in [] if state is None else shaping_lines(state, shaping):
            self.stdout.write(f"{'shaping':>14}: {text}")

    def _selection(self, options: dict[str, Any]) -> tuple[str, str | None, int | None]:
        return options["name"], options.get("owner"), options.get("fencing_token")

    def _not_done(self, name: str, owner: str | None, token: int | None) -> CommandError:
        if owner or token is not None:
            return CommandError(f"lock {name!r} is not held, or no longer by that owner/token")
        return CommandError(f"lock {name!r} is not held")

    def _release(self, manager: LockManager, options: dict[str, Any]) -> None:
        name, owner, token = self._selection(options)
        before = manager.get(name)
        if not manager.force_release(name, owner=owner, fencing_token=token):
            raise self._not_done(name, owner, token)
        if before is None or before.primitive == "mutex":
            self.stdout.write(f"released {name!r}")
            return
        holders = before.holders_matching(owner, token)
        self.stdout.write(f"released {len(holders)} holder(s) of {name!r}")
        for holder in holders:
            self.stdout.write(_holder_line(holder))

    def _extend(self, manager: LockManager, options: dict[str, Any]) -> None:
        name, owner, token = self._selection(options)
        seconds = options["seconds"]
        result = manager.force_extend(name, seconds, owner=owner, fencing_token=token)
        if result.status == "no-expiry":
            raise CommandError(f"lock {name!r} has no expiry: there is no lease to extend")
        if not result.extended:
            raise self._not_done(name, owner, token)
        after = manager.get(name)
        if after is None or after.primitive == "mutex":
            self.stdout.write(f"extended {name!r} by {seconds:g}s: lease now {_lease(result.ttl)}")
            return
        holders = after.holders_matching(owner, token)
        self.stdout.write(f"extended {len(holders)} holder(s) of {name!r} by {seconds:g}s")
        for holder in holders:
            self.stdout.write(_holder_line(holder))
