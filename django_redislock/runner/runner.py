"""The command runner: run a command while holding a lock (or one of N permits).

``redislock run NAME [--limit N] [--wait|--no-wait] [--ttl S] [--grace S] -- CMD ...``
(``runner/cli.py`` parses it; ``manage.py redislock run`` and ``python -m django_redislock
run`` both end here). The runner

1. takes the lock (``--limit N``: a permit of a semaphore of N), waiting for it
   with ``--wait`` (a hot standby) or giving up at once with ``--no-wait``;
2. starts CMD as its child with ``REDISLOCK_NAME`` and ``REDISLOCK_TERM`` (the
   hold's fencing token) in its environment, and keeps the lease renewed (the
   watchdog) while CMD runs;
3. forwards SIGTERM, SIGINT and SIGHUP to CMD, and exits with CMD's exit status
   (128 + the signal number when a signal ended CMD), releasing the lock as soon
   as CMD exits;
4. when the lock is lost (the watchdog could not renew it in time: a partition,
   a pause past the lease, an operator's force release), sends CMD SIGTERM, then
   SIGKILL after ``--grace`` seconds, and exits with ``EXIT_LOST`` (79).

On Linux CMD is started with a parent-death signal (SIGKILL): if the runner is
SIGKILLed, CMD dies with it, so it never runs on without the lock's renewal.

The runner is asyncio: the wait for the lock is an ``aacquire`` task that a
signal cancels (which takes the wait out of the queue in Redis), and CMD's exit,
the loss of the lock (sent from the watchdog thread) and the signals are events
of one loop.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from django_redislock.engine.identity import process_token
from django_redislock.exceptions import LockBackendError, LockMismatch, LockNotOwned
from django_redislock.signals import lock_lost, lock_renewed

from .watcher import Watcher, timing_problem

if TYPE_CHECKING:
    from django_redislock import Lock, LockManager

#: Bad input: no command, an unknown option, ``--limit`` below 1, a bad number.
EXIT_USAGE = 2
#: Redis could not be reached (at start, or while waiting): CMD was not started.
EXIT_UNAVAILABLE = 69
#: ``--no-wait`` and the lock (every permit) is held by others: CMD was not started.
EXIT_BUSY = 75
#: The lock was lost while CMD ran: CMD was stopped (SIGTERM, then SIGKILL).
EXIT_LOST = 79
#: CMD could not be executed (not found: 127, not executable: 126, as shells do).
EXIT_NOT_FOUND, EXIT_NOT_EXECUTABLE = 127, 126

#: Seconds the runner waits for Redis to answer its release before exiting anyway.
RELEASE_TIMEOUT = 5.0

#: The signals the runner passes on to CMD.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class RunSpec:
    """What to run and how: the lock's *name*, the *command* (argv), *limit* (None: a
    mutex; N: one of N permits), whether to *wait* for the lock, its lease *ttl*
    (None: ``REDISLOCK_DEFAULT_TTL``), the *grace* seconds between SIGTERM and
    SIGKILL when the lock is lost, and a *purpose* shown with the holder."""

    name: str
    command: tuple[str, ...]
    limit: int | None = None
    wait: bool = False
    ttl: float | None = None
    grace: float = 1.0
    purpose: str | None = None


def run(spec: RunSpec, manager: LockManager, out: TextIO | None = None) -> int:
    """Run *spec* with the locks of *manager*; return the exit status for the process."""
    return asyncio.run(Runner(spec, manager, out or sys.stderr).main())


class Runner:
    """One run of a command under a lock (see the module's docstring)."""

    def __init__(self, spec: RunSpec, manager: LockManager, out: TextIO) -> None:
        self.spec = spec
        self.manager = manager
        self.out = out
        self.lock = self._make_lock()
        self._stop_signal: int | None = None
        self._lost_reason: str | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._stopped: asyncio.Event | None = None
        self._lost: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watcher: Watcher | None = None

    def _make_lock(self) -> Lock:
        spec = self.spec
        options: dict[str, Any] = {
            "owner": f"{process_token()}:r{secrets.token_hex(6)}",
            "auto_renew": True,
            "raise_on_lost": False,
            "purpose": spec.purpose or f"redislock run {_command_text(spec.command)}",
            "meta": {"kind": "runner"},
        }
        if spec.ttl is not None:
            options["ttl"] = spec.ttl
        if spec.limit is None:
            return self.manager.lock(spec.name, **options)
        return self.manager.semaphore(spec.name, spec.limit, **options)

    def say(self, text: str) -> None:
        """Write one line of the runner's own news (stderr by default)."""
        print(f"redislock run {self.spec.name}: {text}", file=self.out, flush=True)

    async def main(self) -> int:
        """Take the lock, run the command under it, and return the exit status."""
        problem = timing_problem(self.lock.ttl_seconds, self.spec.grace)
        if problem is not None:
            self.say(f"{problem}; not starting the command")
            return EXIT_USAGE
        loop = self._loop = asyncio.get_running_loop()
        self._stopped, self._lost = asyncio.Event(), asyncio.Event()
        for sig in FORWARDED:
            loop.add_signal_handler(sig, self._on_signal, sig)
        lock_lost.connect(self._on_lost, weak=False)
        lock_renewed.connect(self._on_renewed, weak=False)
        try:
            refused = await self._acquire()
            if refused is not None:
                return refused
            return await self._run_held()
        finally:
            lock_renewed.disconnect(self._on_renewed)
            lock_lost.disconnect(self._on_lost)
            for sig in FORWARDED:
                loop.remove_signal_handler(sig)

    # -- events ----------------------------------------------------------------

    def _on_signal(self, sig: int) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.send_signal(sig)
            return
        self._stop_signal = sig
        assert self._stopped is not None
        self._stopped.set()

    def _on_lost(self, sender: object, lock: object = None, **kwargs: Any) -> None:
        # Sent from the watchdog's thread: hand the news to the loop.
        if lock is not self.lock or self._loop is None or self._lost is None:
            return
        self._lost_reason = str(kwargs.get("reason") or "the lease was lost")
        self._loop.call_soon_threadsafe(self._lost.set)

    def _on_renewed(self, sender: object, lock: object = None, **kwargs: Any) -> None:
        # Sent from the watchdog's thread: a confirmed renewal moves the watcher's
        # deadline on (its send time: the lease runs at least the ttl from then).
        watcher, sent_at = self._watcher, kwargs.get("sent_at")
        if lock is self.lock and watcher is not None and kwargs.get("error") is None:
            if isinstance(sent_at, float):
                watcher.confirm(sent_at)

    def _on_notice(self) -> None:
        # The watcher's notices (loop.add_reader): a stop is a loss of the hold.
        watcher = self._watcher
        if watcher is None or self._loop is None or self._lost is None:
            return
        if watcher.notices() is not None and not self._lost.is_set():
            self._lost_reason = self._watcher_reason(watcher)
            self._lost.set()
        if watcher.ended:
            self._loop.remove_reader(watcher.notices_fd)

    # -- phases ----------------------------------------------------------------

    async def _acquire(self) -> int | None:
        """Take the lock: None when held, else the exit status (CMD not started)."""
        assert self._stopped is not None
        if self.spec.wait:
            self.say("waiting for the lock (standby)")
        acquiring = asyncio.ensure_future(self.lock.aacquire(blocking=self.spec.wait))
        stopping = asyncio.ensure_future(self._stopped.wait())
        try:
            await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not acquiring.done():
            acquiring.cancel()  # leaves the queue in Redis (the wait's CANCEL)
            await asyncio.gather(acquiring, return_exceptions=True)
            return self._stopped_before_start()
        try:
            held = acquiring.result()
        except LockBackendError as error:
            self.say(f"cannot reach Redis, not starting the command: {error}")
            return EXIT_UNAVAILABLE
        except LockMismatch as error:
            self.say(f"{error}; not starting the command")
            return EXIT_USAGE
        if not held:
            self.say(f"held by {await self._holder_text()}; not starting the command "
                     "(--wait stands by for it)")  # fmt: skip
            return EXIT_BUSY
        if self._stop_signal is not None:
            await self._release()
            return self._stopped_before_start()
        return None

    def _stopped_before_start(self) -> int:
        sig = self._stop_signal or signal.SIGTERM
        self.say(f"stopped by {signal.Signals(sig).name} before the command started")
        return 128 + sig

    async def _holder_text(self) -> str:
        try:
            info = await self.manager.aget(self.spec.name)
        except LockBackendError:
            return "another process"
        if info is None:
            return "another process (gone since)"
        holders = info.holders
        return ", ".join(f"{h.host} pid {h.pid} (token {h.fencing_token})" for h in holders)

    async def _run_held(self) -> int:
        """Start the watcher, confirm the hold, run CMD in the watcher's process group."""
        try:
            watcher = await Watcher.start(self.spec.grace, self.lock.ttl_seconds)
        except OSError as error:
            await self._release()
            self.say(f"not starting the command: {error}")
            return EXIT_NOT_EXECUTABLE
        self._watcher = watcher
        assert self._loop is not None
        self._loop.add_reader(watcher.notices_fd, self._on_notice)
        reaped = False
        try:
            refused = await self._confirm(watcher)
            if refused is not None:
                reaped = True  # (no command to guard)
                return refused
            status = await self._run_watched(watcher)
            reaped = True
            return status
        finally:
            self._watcher = None
            self._loop.remove_reader(watcher.notices_fd)
            await watcher.close(reaped)

    async def _confirm(self, watcher: Watcher) -> int | None:
        """The watcher's first deadline, before CMD starts: reset the lease to its full
        length and hand the watcher that call's send time (None: confirmed; else the
        exit status, CMD not started)."""
        if self.lock.ttl_seconds is None:
            return None  # no expiry: no lease can run out
        sent = time.monotonic()
        try:
            await self.lock.areacquire()
        except LockNotOwned:
            self.say("the lock was lost before the command started; not starting it")
            return EXIT_LOST
        except LockBackendError as error:
            self.say(f"cannot reach Redis, not starting the command: {error}")
            return EXIT_UNAVAILABLE
        watcher.confirm(sent)
        return None

    async def _run_watched(self, watcher: Watcher) -> int:
        token = self.lock.fencing_token
        env = {**os.environ, "REDISLOCK_NAME": self.spec.name, "REDISLOCK_TERM": str(token)}
        self.say(f"the command's watcher is pid {watcher.proc.pid} (process group {watcher.pgid})")
        if watcher.notices() is not None or watcher.proc.returncode is not None:
            # (The runner was held up past the deadline between the confirmation and here.)
            self.say("the hold could no longer be confirmed in time; not starting the command")
            return EXIT_LOST
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.spec.command, env=env, preexec_fn=_child_setup(watcher.pgid)
            )
        except (OSError, subprocess.SubprocessError) as error:
            await self._release()
            reason = getattr(error, "strerror", None) or error
            self.say(f"cannot run {self.spec.command[0]!r}: {reason}")
            return EXIT_NOT_FOUND if isinstance(error, FileNotFoundError) else EXIT_NOT_EXECUTABLE
        self._proc = proc
        self.say(f"holds the lock (token {token}); started pid {proc.pid}")
        if self._stop_signal is not None:  # arrived while CMD was being started: pass it on
            _signal(proc, self._stop_signal)
        assert self._lost is not None
        exited = asyncio.ensure_future(proc.wait())
        lost = asyncio.ensure_future(self._lost.wait())
        gone = asyncio.ensure_future(watcher.proc.wait())
        try:
            await asyncio.wait({exited, lost, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            gone.cancel()
        self._on_notice()  # a stop it wrote before its signals: read before CMD's status
        if watcher.stopped is not None:
            self._lost_reason = self._watcher_reason(watcher)
            return await self._stop_lost(proc, exited)
        if not exited.done():
            if not self._lost.is_set():  # the watcher exited by itself (killed?)
                self._lost_reason = (
                    f"the command's watcher (pid {watcher.proc.pid}) exited: the hold can "
                    "no longer be guarded"
                )
            return await self._stop_lost(proc, exited)
        status = _exit_status(exited.result())
        if not await self._release() and status == 0:
            # (A command that found its own term stale, such as beat's LeaderOnly, exits 0.)
            self.say(f"exiting {EXIT_LOST}: the command ended after the lock was lost")
            return EXIT_LOST
        return status

    @staticmethod
    def _watcher_reason(watcher: Watcher) -> str:
        return f"{watcher.stopped}: the watcher stopped the command's process group {watcher.pgid}"

    async def _stop_lost(
        self, proc: asyncio.subprocess.Process, exited: asyncio.Future[int]
    ) -> int:
        if exited.done():
            self.say(f"LOST the lock ({self._lost_reason}); pid {proc.pid} has ended")
        else:
            self.say(f"LOST the lock ({self._lost_reason}); stopping pid {proc.pid} with SIGTERM")
            _signal(proc, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(exited), self.spec.grace)
            except asyncio.TimeoutError:
                self.say(f"pid {proc.pid} still running after {self.spec.grace:g} s: SIGKILL")
                _signal(proc, signal.SIGKILL)
                await exited
        # No release: the lock is gone (its lease ran out, or is running out behind a
        # partition, or an operator released it). A release would be refused, or would
        # wait on the very partition, and keep a standby's runner waiting for nothing.
        self.say(f"exiting {EXIT_LOST}: the command was stopped because the lock was lost")
        return EXIT_LOST

    async def _release(self, quiet: bool = False) -> bool:
        """Release the lock; False when it turned out to be gone already (lost)."""
        try:
            # Bounded: behind a partition the lease runs out by itself.
            await asyncio.wait_for(self.lock.arelease(), RELEASE_TIMEOUT)
        except asyncio.TimeoutError:
            if not quiet:
                self.say(f"no answer to the release in {RELEASE_TIMEOUT:g} s (its lease runs out)")
        except LockNotOwned:
            if not quiet:
                self.say("the lock was already gone when the command ended")
            return False
        except LockBackendError as error:
            if not quiet:
                self.say(f"could not release (its lease runs out by itself): {error}")
        return True


def _signal(proc: asyncio.subprocess.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:  # exited meanwhile
        pass


def _exit_status(returncode: int) -> int:
    """A child's exit status as a shell reports it (128 + N for signal N)."""
    return 128 - returncode if returncode < 0 else returncode


def _command_text(command: tuple[str, ...]) -> str:
    """The program's name only: its arguments may hold secrets, and the purpose is
    stored in Redis and shown in the admin."""
    return os.path.basename(command[0])[:80]


def _child_setup(pgid: int) -> Callable[[], None]:
    """CMD's pre-exec hook: join the watcher's process group *pgid* (so the watcher can
    stop CMD and what it starts), and on Linux the parent-death signal."""
    death = _parent_death_signal()

    def setup() -> None:
        os.setpgid(0, pgid)
        if death is not None:
            death()

    return setup


def _parent_death_signal() -> Callable[[], None] | None:
    """On Linux, a pre-exec hook that makes the kernel SIGKILL the child when the runner
    dies (``prctl(PR_SET_PDEATHSIG)``; the runner starts children from its main thread,
    whose end is what the kernel watches). Resolved before ``fork``, so the child only
    makes the system call; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()
    kill = int(signal.SIGKILL)

    def set_parent_death_signal() -> None:
        prctl(1, kill, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the runner died before the call
            os._exit(EXIT_LOST)

    return set_parent_death_signal
