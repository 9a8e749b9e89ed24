"""The ``run`` command line, shared by ``manage.py redislock run`` and
``python -m django_redislock run``: its arguments, their checks, and the standalone entry.

``python -m django_redislock run NAME [options] -- CMD ...`` needs no Django project:
the Redis is ``--url``, else ``$REDISLOCK_URL``; with ``$DJANGO_SETTINGS_MODULE``
set (and neither of those) Django is set up and the project's settings are used.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .runner import EXIT_USAGE, RunSpec, run

if TYPE_CHECKING:
    from django_redislock import LockManager

RUN_HELP = "run a command while holding a lock (or one of N permits); see docs/one-process.md"


class UsageError(ValueError):
    """The ``run`` arguments cannot work; the message says which and what to give instead."""


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``run`` subcommand's arguments, added to *parser*."""
    parser.add_argument("name", help="the lock's name (every host running the command uses it)")
    parser.add_argument(
        "--limit", type=int, default=None, metavar="N",
        help="run up to N copies at once (a semaphore of N permits) instead of one",
    )  # fmt: skip
    waiting = parser.add_mutually_exclusive_group()
    waiting.add_argument(
        "--wait", dest="wait", action="store_true", default=False,
        help="stand by until the lock is free, then run (hot standby)",
    )  # fmt: skip
    waiting.add_argument(
        "--no-wait", dest="wait", action="store_false",
        help="exit 75 at once when the lock is held (the default)",
    )  # fmt: skip
    parser.add_argument(
        "--ttl", type=float, default=None, metavar="S",
        help="the lease in seconds (default REDISLOCK_DEFAULT_TTL); a dead host's "
        "command is taken over within about one lease",
    )  # fmt: skip
    parser.add_argument(
        "--grace", type=float, default=1.0, metavar="S",
        help="seconds between SIGTERM and SIGKILL when the lock is lost (default 1; at "
        "most half the lease less a tenth of it, at most 1 s less)",
    )  # fmt: skip
    parser.add_argument("--purpose", default=None, help="shown with the holder")


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(*argv* before the first ``--``, the command after it); no ``--``: no command."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def unknown_arguments(extra: Sequence[str]) -> UsageError:
    """The error for arguments the parser did not know (a command without ``--``)."""
    return UsageError(
        f"unrecognized arguments: {' '.join(extra)} (options go before '--', the command "
        "after it: redislock run NAME [options] -- CMD [ARGS ...])"
    )


def spec_from(options: dict[str, Any], command: Sequence[str]) -> RunSpec:
    """The :class:`RunSpec` of parsed *options* and the *command* after ``--``; raises
    :class:`UsageError` for bad input."""
    if not command:
        raise UsageError("no command given: redislock run NAME [options] -- CMD [ARGS ...]")
    limit = options.get("limit")
    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be 1 or more, not {limit}")
    ttl = options.get("ttl")
    if ttl is not None and not (ttl > 0 and math.isfinite(ttl)):
        raise UsageError(f"--ttl must be a positive number of seconds, not {ttl:g}")
    grace = options.get("grace", 1.0)
    if not (grace >= 0 and math.isfinite(grace)):
        raise UsageError(f"--grace must be 0 or more seconds, not {grace:g}")
    name = options["name"]
    if not name:
        raise UsageError("the lock name must not be empty")
    return RunSpec(
        name=name, command=tuple(command), limit=limit, wait=bool(options.get("wait")),
        ttl=ttl, grace=grace, purpose=options.get("purpose"),
    )  # fmt: skip


def _manager(url: str | None) -> LockManager:
    url = url or os.environ.get("REDISLOCK_URL") or None
    if url is None and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        raise UsageError(
            "no Redis to use: pass --url redis://HOST:PORT/DB, set REDISLOCK_URL, or set "
            "DJANGO_SETTINGS_MODULE to use a project's settings"
        )
    if url is None:
        import django

        django.setup()
    from ..primitives.manager import LockManager

    if url is None:
        return LockManager()
    os.environ["REDISLOCK_URL"] = url  # for the command: beat's LeaderOnly checks its term there
    return LockManager(url=url)


def run_from_options(manager: LockManager, options: dict[str, Any], command: Sequence[str]) -> int:
    """``manage.py redislock run``: run the parsed *options* and *command* with *manager*;
    returns the exit status (bad input: a message and :data:`~.runner.EXIT_USAGE`)."""
    try:
        spec = spec_from(options, command)
    except UsageError as error:
        print(f"redislock run: {error}", file=sys.stderr)
        return EXIT_USAGE
    return run(spec, manager)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m django_redislock run ...``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m django_redislock")
    actions = parser.add_subparsers(dest="action", required=True)
    run_parser = actions.add_parser("run", help=RUN_HELP, description=RUN_HELP)
    add_run_arguments(run_parser)
    run_parser.add_argument("--url", default=None, help="the Redis URL (default $REDISLOCK_URL)")
    before, command = split_command(sys.argv[1:] if argv is None else argv)
    parsed, extra = parser.parse_known_args(before)
    options = vars(parsed)
    try:
        if extra:
            raise unknown_arguments(extra)
        spec = spec_from(options, command)
        manager = _manager(options.get("url"))
    except UsageError as error:
        print(f"redislock run: {error}", file=sys.stderr)
        return EXIT_USAGE
    return run(spec, manager)
