"""The command's watcher: a process of its own that stops the runner's command once the
hold can no longer be confirmed, whether or not the runner itself gets to run.

Why. The runner renews the lease (its watchdog thread) and stops its command when the
lock is lost, but only while the runner is scheduled. A runner stopped alone (SIGSTOP
of its pid, a debugger, a long GC pause, swap, a CPU-starved process) while its command
runs on renews nothing and stops nothing: the lease runs out in Redis, a standby takes
the lock and starts its own command, and two commands run at once until the runner is
resumed. The watcher closes that hole: it needs nothing from the runner but a heartbeat.

How. Before the command starts, the runner starts the watcher (``python -I -S`` on this
file: the standard library only, no Django, no Redis client, a few milliseconds to
start). The watcher makes a process group of its own (``setpgid(0, 0)``) and says
``ready``; the command is started *in that group*, so the group exists before the
command does and the watcher can stop the command and everything it started with one
``killpg``. The runner then feeds the watcher, through a pipe, the send time of each
confirmed renewal (``s <time.monotonic()>``: the initial confirmation before the
command starts, then every renewal the watchdog's ``lock_renewed`` signal reports
confirmed). The watcher keeps the deadline ``last confirmed send time + MARGIN`` on its
own monotonic clock (``CLOCK_MONOTONIC`` is one system-wide clock: the runner's
``time.monotonic()`` is the watcher's; a send time ahead of the watcher's clock is
taken as the watcher's now). When the deadline passes without a newer confirmation,
or the pipe ends without ``bye`` (the runner died), it writes ``stop <reason>`` to the
runner, sends the group SIGTERM, and SIGKILL after ``--grace`` (itself included: it is
its last act). ``bye`` (the runner reaped its command) ends it quietly.

The timing argument (why a standby can never start while the old command is alive).
Let *s* be the send time of the last confirmed renewal (or of the initial
confirmation), *T* the lease (``--ttl``), *G* the grace, and
``R = min(1 s, T / 10)`` the reserve, the allowance for the watcher's own wake-up
and for the kernel's SIGKILL to take effect.

1. Redis ran that renewal at some moment *e* >= *s* and set the lease to at least *T*
   from then (a renewal never shortens a lease). So the lock's key exists until at
   least ``e + T >= s + T``, and until then no standby can be granted it: a standby
   is granted the lock only once the key has expired (or is released, which the
   runner does only after its command is reaped).
2. The watcher's deadline is ``s + MARGIN`` with ``MARGIN = T - G - R``. At the deadline
   the group gets SIGTERM, at ``s + T - R`` SIGKILL, so the command is dead by
   ``s + T - R + (kill latency)``, which is before ``s + T`` as long as the watcher
   wakes and the kill lands within ``R`` (an idle process blocked in ``select``, so
   milliseconds). MARGIN + G is *strictly* less than the lease.
3. A later confirmation only moves the deadline later by the same rule, so it can
   never give the command more than its own lease; a confirmation that arrives after
   the stop began is ignored (the stop is final).
4. The standby's command starts after the standby was granted the lock (after the
   key expired, ``>= s + T``), so after the old command is gone. This holds whatever
   the runner does meanwhile: stopped, starved, dead (then its pipe ends and the
   watcher stops the command at once) or cut off from Redis (then no renewal is
   confirmed, and the watcher stops the command before the lease can run out: before
   the watchdog itself declares the loss at ``s + T - R``).

For the renewals to keep ahead of the deadline, MARGIN must leave room for the
watchdog's cadence (a renewal every third of the lease, a retry after a sixth):
``timing_problem`` refuses a grace above ``T / 2 - R`` (MARGIN below half the lease).

What it does not cover: a pause of the whole host (the watcher is paused too), an
operator's force release, a Redis restart without persistence or a failover that
loses the lease: there the old command may still act, and only its fencing token
(``REDISLOCK_TERM``) keeps its writes out (docs/one-process.md). A SIGSTOP of the
command's own process group stops the watcher with it, and the command too.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import sys
import threading
import time

#: Seconds the runner waits for the watcher to say it is ready.
START_TIMEOUT = 10.0


def reserve(ttl: float) -> float:
    """The allowance for the watcher's wake-up and the kernel's kill (``R``)."""
    return min(1.0, ttl / 10)


def margin(ttl: float | None, grace: float) -> float:
    """How long after a confirmed renewal's send time the watcher starts stopping the
    command (``T - G - R``); infinite for a lock without expiry (no lease runs out)."""
    if ttl is None:
        return float("inf")
    return ttl - grace - reserve(ttl)


def timing_problem(ttl: float | None, grace: float) -> str | None:
    """Why *ttl* and *grace* cannot keep the promise (None: they can)."""
    if ttl is None or margin(ttl, grace) >= ttl / 2:
        return None
    most = ttl / 2 - reserve(ttl)
    return (
        f"--grace {grace:g} is too long for a lease of {ttl:g} s: the command must be "
        "stopped (SIGTERM, the grace, SIGKILL) within the lease after the last confirmed "
        f"renewal, with room for renewals, so the grace can be at most {most:.3g} s for "
        "this lease; give a smaller --grace or a longer --ttl"
    )


class Watcher:
    """The runner's end of a watcher process (see the module): start it, feed it
    confirmations (from any thread), read its notices, end it."""

    def __init__(
        self, proc: asyncio.subprocess.Process, feed: int, notices: int, pgid: int
    ) -> None:
        self.proc = proc
        #: The process group the command must be started in (the watcher's own).
        self.pgid = pgid
        self._feed: int | None = feed
        self._feed_lock = threading.Lock()
        self._notices = notices
        self._buffer = b""
        #: Why the watcher stopped the command (None: it did not).
        self.stopped: str | None = None
        #: Whether its notices ended (it exited, or is exiting).
        self.ended = False

    @classmethod
    async def start(cls, grace: float, ttl: float | None) -> Watcher:
        """Start a watcher for a command under a lease of *ttl* (None: no expiry) with
        *grace*; raises OSError when it cannot be started or does not answer in time."""
        feed_read, feed = os.pipe()
        notices, notices_write = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", os.path.abspath(__file__),
                repr(float(grace)), repr(margin(ttl, grace)),
                stdin=feed_read, stdout=notices_write, stderr=None,
            )  # fmt: skip
        except BaseException:
            for fd in (feed_read, feed, notices, notices_write):
                os.close(fd)
            raise
        os.close(feed_read)
        os.close(notices_write)
        os.set_blocking(feed, False)  # a stopped watcher's full pipe must not block renewals
        try:
            line = await asyncio.wait_for(_read_line(notices), START_TIMEOUT)
            if not line.startswith(b"ready "):
                raise OSError(f"the watcher did not start ({line!r})")
        except (asyncio.TimeoutError, OSError) as error:
            os.close(feed)
            os.close(notices)
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            raise OSError(f"the command's watcher did not start: {error}") from None
        os.set_blocking(notices, False)
        return cls(proc, feed, notices, int(line.split()[1]))

    def confirm(self, sent_at: float) -> None:
        """A renewal sent at *sent_at* (``time.monotonic()``) was confirmed. Thread-safe;
        never blocks (a confirmation that does not fit is dropped: an earlier stop)."""
        self._write(f"s {sent_at!r}\n".encode())

    def notices(self) -> str | None:
        """Read what the watcher said since (never blocks); its stop reason, if any."""
        while True:
            try:
                data = os.read(self._notices, 4096)
            except (BlockingIOError, OSError):
                break
            if not data:
                self.ended = True
                break
            self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            if line.startswith(b"stop ") and self.stopped is None:
                self.stopped = line[5:].decode(errors="replace")
        return self.stopped

    @property
    def notices_fd(self) -> int:
        """The file descriptor of the watcher's notices (for ``loop.add_reader``)."""
        return self._notices

    async def close(self, reaped: bool) -> None:
        """End the watcher: *reaped* (the command was reaped) lets it exit quietly;
        otherwise the end of its pipe makes it stop the command's group."""
        if reaped:
            self._write(b"bye\n")
        with self._feed_lock:
            if self._feed is not None:
                os.close(self._feed)
                self._feed = None
        try:
            quiet = reaped and self.stopped is None  # (a stopping one is in its grace)
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), 2.0 if quiet else 0.1)
        except asyncio.TimeoutError:
            pass  # still in its grace: it ends by itself (SIGKILL of its group)
        try:
            os.close(self._notices)
        except OSError:
            pass

    def _write(self, data: bytes) -> None:
        with self._feed_lock:
            if self._feed is None:
                return
            try:
                os.write(self._feed, data)  # one short write: atomic on a pipe
            except OSError:  # full (dropped), or the watcher is gone
                pass


async def _read_line(fd: int) -> bytes:
    """One line from *fd* (blocking reads in a thread; the start-up handshake only)."""

    def read() -> bytes:
        line = b""
        while not line.endswith(b"\n"):
            chunk = os.read(fd, 1)
            if not chunk:
                break
            line += chunk
        return line.strip()

    return await asyncio.get_running_loop().run_in_executor(None, read)


# -- the watcher process (``python -I -S watcher.py GRACE MARGIN``) ------------------------


def watch(grace: float, margin_s: float) -> None:
    """The watcher's loop: stdin carries ``s <send time>`` and ``bye`` lines from the
    runner; stdout gets ``ready <pgid>`` and ``stop <reason>``."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(sig, signal.SIG_IGN)  # the group's SIGTERM is not for the watcher
    os.setpgid(0, 0)
    pgid = os.getpgrp()
    _say(f"ready {pgid}")
    deadline: float | None = None  # no command before the first confirmation
    buffer = b""
    while True:
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            _stop(pgid, grace, "no renewal was confirmed in time")
        readable, _, _ = select.select([0], [], [], timeout)
        if not readable:
            continue
        data = os.read(0, 4096)
        if not data:
            _stop(pgid, grace, "the runner is gone")
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line == b"bye":
                return
            if line.startswith(b"s ") and margin_s != float("inf"):
                sent = min(float(line[2:]), time.monotonic())
                if deadline is None or sent + margin_s > deadline:
                    deadline = sent + margin_s


def _stop(pgid: int, grace: float, reason: str) -> None:
    """Tell the runner, SIGTERM the group, SIGKILL it (the watcher too) after *grace*."""
    _say(f"stop {reason}")
    try:
        os.killpg(pgid, signal.SIGTERM)
        time.sleep(grace)
    finally:
        os.killpg(pgid, signal.SIGKILL)
    os._exit(1)  # (not reached: the watcher is in the group)


def _say(text: str) -> None:
    try:
        os.write(1, f"{text}\n".encode())
    except OSError:  # the runner is gone: the notice has no reader
        pass


if __name__ == "__main__":
    watch(float(sys.argv[1]), float(sys.argv[2]))
