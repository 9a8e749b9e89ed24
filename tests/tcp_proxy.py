"""A loopback TCP proxy in front of the real redis-server, for injecting network faults.

A real server cannot lose a reply on demand, so the tests put this proxy between
the client and Redis: it forwards bytes both ways and, when told, drops the
connection right after the server's next reply arrives (the command ran but
the client never hears so), refuses all traffic (Redis looks down), or swallows
all traffic while keeping connections open (a partition: calls hang until the
client's socket timeout).
"""

from __future__ import annotations

import socket
import threading
import time


class TcpProxy:
    """Forwards 127.0.0.1:<port> to the Redis at *upstream_port*."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._drop_replies = 0
        self.dropped = 0
        self.down = False
        #: While True, bytes are swallowed in both directions and connections
        #: stay open: the server looks unreachable (a partition), not down.
        self.blackholed = False
        #: Seconds each server reply is held back (a slow network).
        self.reply_delay = 0.0
        #: Chunks of bytes forwarded each way: a client's requests sent before it
        #: waits for a reply (a pipeline) arrive together, so ``requests`` counts the
        #: round trips a client started (on loopback, for requests of a few KiB).
        self.requests = 0
        self.replies = 0
        self._conns: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        """A redis:// URL pointing at the proxy."""
        return f"redis://127.0.0.1:{self.port}/0"

    def drop_next_replies(self, count: int = 1) -> None:
        """Swallow the next *count* server replies and cut those connections."""
        with self._lock:
            self._drop_replies = count

    def set_down(self, down: bool) -> None:
        """While down, cut every connection and refuse new ones."""
        with self._lock:  # with _accept's check: no connection made meanwhile survives
            self.down = down
            conns, self._conns = (self._conns, []) if down else ([], self._conns)
        for conn in conns:
            _close(conn)

    def blackhole(self, on: bool) -> None:
        """Swallow all traffic (without closing anything) while *on*."""
        self.blackholed = on

    def close(self) -> None:
        """Stop accepting and cut everything."""
        self._closed = True
        self.set_down(True)
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.down:
                _close(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=2)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            for sock in (client, upstream):  # as Redis and redis-py do: no Nagle delay
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                down = self.down
                if not down:
                    self._conns += [client, upstream]
            if down:  # cut while this one was being connected upstream
                _close(client)
                _close(upstream)
                continue
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, is_reply: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if self.blackholed:
                    continue
                if is_reply and self.reply_delay:
                    time.sleep(self.reply_delay)
                if is_reply:
                    with self._lock:
                        drop = self._drop_replies > 0
                        if drop:
                            self._drop_replies -= 1
                            self.dropped += 1
                    if drop:
                        break
                with self._lock:
                    if is_reply:
                        self.replies += 1
                    else:
                        self.requests += 1
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src)
            _close(dst)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
