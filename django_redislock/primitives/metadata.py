"""The metadata JSON a holder writes with each acquire (shown in the admin and ``LockInfo``).

``host``, ``pid``, ``thread`` (and the asyncio ``task``) of the caller, then the Lock's
``purpose``, ``extra`` and top-level ``meta`` fields, and ``"renews": false`` for a lock that
is not renewed (so its lease running down does not look like a dead holder), and the
``lock_delay`` of a lock that has one. It is sent on
every acquire, so it is serialised once per (process, thread, task): shared by all plain
locks, and kept per Lock when it has metadata of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from asyncio.events import _get_running_loop
from typing import Any

from ..engine.identity import HOSTNAME

__all__ = ["HolderMeta"]

#: The metadata of locks without purpose/extra/meta, per (pid, thread, task).
_plain_meta: dict[tuple[int, str, str], bytes] = {}


class HolderMeta:
    """One Lock's metadata text, cached for the caller it was last made for."""

    __slots__ = ("_cached",)

    def __init__(self) -> None:
        self._cached: tuple[tuple[int, str, str], bytes] | None = None

    def text(
        self,
        purpose: str | None,
        extra: dict[str, Any] | None,
        meta: dict[str, Any] | None,
        auto_renew: bool,
        lock_delay_ms: int = 0,
    ) -> bytes:
        """The JSON (bytes) for the current caller of a Lock with these options."""
        loop = _get_running_loop()
        task = None if loop is None else asyncio.current_task(loop)
        ident = (os.getpid(), threading.current_thread().name, task.get_name() if task else "")
        plain = purpose is None and not extra and not meta and auto_renew and not lock_delay_ms
        if plain:
            text = _plain_meta.get(ident)
            if text is not None:
                return text
        elif self._cached is not None and self._cached[0] == ident:
            return self._cached[1]
        fields: dict[str, Any] = {"host": HOSTNAME, "pid": ident[0], "thread": ident[1]}
        if ident[2]:
            fields["task"] = ident[2]
        if purpose is not None:
            fields["purpose"] = purpose
        if extra:
            fields["extra"] = extra
        if meta:
            for field, value in meta.items():
                fields.setdefault(field, value)
        if not auto_renew:
            fields["renews"] = False
        if lock_delay_ms:
            fields["lock_delay"] = lock_delay_ms / 1000  # shown where the holder is
        text = json.dumps(fields, separators=(",", ":")).encode()
        if plain:
            if len(_plain_meta) >= 1024:
                _plain_meta.clear()
            _plain_meta[ident] = text
        else:
            self._cached = (ident, text)
        return text
