"""Who owns a lock: random owner tokens per process, thread and asyncio task.

An owner token is ``<process token>:<local token>``. The process token is
regenerated in a child after ``os.fork()``, so a forked child never passes for
its parent's owner. The local token belongs to the running asyncio task when
there is one (tasks on one event loop must not share ownership, so identity is
keyed by the task object itself rather than a context variable a child task
would inherit), otherwise to the current thread. Tokens come from ``secrets``:
they reveal nothing about the host and cannot be guessed.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import os
import secrets
import socket
import threading
import weakref
from asyncio.events import _get_running_loop
from collections.abc import Callable

_process_token = secrets.token_hex(8)
_thread_state = threading.local()
_task_tokens: weakref.WeakKeyDictionary[asyncio.Task[object], str] = weakref.WeakKeyDictionary()
_task_tokens_lock = threading.Lock()
_fork_hooks: list[Callable[[], None]] = []
#: The owner of sync code run by asgiref's ``sync_to_async`` (see current_owner),
#: with the event loop it was made for.
_call_owner: contextvars.ContextVar[tuple[int, str]] = contextvars.ContextVar(
    "redislock_call_owner"
)

try:  # asgiref comes with Django; the engine does not need it otherwise
    from asgiref.sync import SyncToAsync

    _asgiref_thread: threading.local | None = SyncToAsync.threadlocal
except ImportError:  # pragma: no cover
    _asgiref_thread = None

HOSTNAME = socket.gethostname()


_nonces = itertools.count(1)


def new_nonce() -> str:
    """A value never returned before by any process (unique, not secret): cheap."""
    return f"{_process_token}.{next(_nonces):x}"


def process_token() -> str:
    """This process's random token (a new one after fork)."""
    return _process_token


def current_owner() -> str:
    """The owner token of the running asyncio task, or else of the current thread.

    Sync code that asgiref's ``sync_to_async`` runs for a coroutine is owned by
    the calling task's context, not by the worker thread: outside a
    ``ThreadSensitiveContext`` one thread serves every task, and two tasks must
    not pass for one owner. asgiref copies context variables back to the
    caller, so one task's successive ``sync_to_async`` calls share an owner.
    """
    loop = _get_running_loop()
    task = None if loop is None else asyncio.current_task(loop)
    if task is not None:
        token = _task_tokens.get(task)
        if token is None:
            with _task_tokens_lock:
                token = _task_tokens.setdefault(task, secrets.token_hex(8))
        return f"{_process_token}:t{token}"
    # Tested before the thread's own token: asgiref's executor thread may have been
    # given one by code it ran outside a sync_to_async call (a sync view run by
    # the test client, say), and must not pass for one owner of every task later.
    main_loop = (
        None if _asgiref_thread is None else getattr(_asgiref_thread, "main_event_loop", None)
    )
    if main_loop is not None:
        # A token made for another event loop was inherited, not made by this
        # task: asgiref also copies context variables back through async_to_sync,
        # so one can leak into a thread's context and from there into every task
        # a later event loop starts.
        made = _call_owner.get(None)
        if made is None or made[0] != id(main_loop) or not made[1].startswith(_process_token):
            made = (id(main_loop), f"{_process_token}:c{secrets.token_hex(8)}")
            _call_owner.set(made)
        return made[1]
    # (process token, owner token): a thread that survived a fork gets a new one.
    pair: tuple[str, str] | None = getattr(_thread_state, "pair", None)
    if pair is not None and pair[0] == _process_token:
        return pair[1]
    pair = (_process_token, f"{_process_token}:{secrets.token_hex(8)}")
    _thread_state.pair = pair
    return pair[1]


def on_fork_in_child(hook: Callable[[], None], *, first: bool = False) -> None:
    """Register *hook* to run in a child process right after ``os.fork()``.

    *first* hooks run before the others (those that make the rest safe to run).
    """
    if first:
        _fork_hooks.insert(0, hook)
    else:
        _fork_hooks.append(hook)


def _after_fork_in_child() -> None:
    global _process_token, _task_tokens_lock
    _process_token = secrets.token_hex(8)
    _task_tokens_lock = threading.Lock()
    for hook in _fork_hooks:
        hook()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
