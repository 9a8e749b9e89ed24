"""Bounded, SCAN-based listing of held locks for the admin lock viewer.

One request never loads every lock: it continues a ``SCAN`` from a cursor,
loads the lock hashes it finds (pipelined), keeps those that pass the search
and filters, and stops once it has a *window* of rows, has examined *budget*
keys, or the scan is complete. Sorting applies to that window; when the scan
stopped early the caller shows "more than N" and offers the next cursor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..engine.info import LockInfo
from ..engine.keys import KeySpace, glob_escape
from ..primitives.manager import LockManager

#: Accepted values of the ``o`` (ordering) query parameter.
ORDERINGS = ("name", "-name", "age", "-age", "ttl", "-ttl", "renewed", "-renewed")


@dataclass(frozen=True)
class ListQuery:
    """What the operator asked for: search text, filters, ordering, scan cursor."""

    search: str = ""
    #: "contains" or "prefix".
    mode: str = "contains"
    #: Whether the search ignores case.
    ignore_case: bool = False
    host: str = ""
    kind: str = ""
    #: "mutex", "semaphore", "rwlock" or "" (any).
    primitive: str = ""
    #: Only locks with a holder that missed its renewals.
    overdue: bool = False
    order: str = "name"
    #: Where the walk continues: an opaque cursor ("0" starts over).
    cursor: str = "0"

    def matches(self, info: LockInfo) -> bool:
        """True if *info* passes the search and the filters."""
        if self.search:
            name, search = info.name, self.search
            if self.ignore_case:
                name, search = name.casefold(), search.casefold()
            if not (name.startswith(search) if self.mode == "prefix" else search in name):
                return False
        if self.overdue and not info.overdue:
            return False
        if self.host and self.host not in _hosts(info):
            return False
        if self.kind and info.kind != self.kind:
            return False
        if self.primitive and info.primitive != self.primitive:
            return False
        return True


@dataclass
class Window:
    """The rows one request found, and where the scan stopped."""

    rows: list[LockInfo]
    #: Keys loaded and tested (matched by the SCAN pattern).
    examined: int
    #: The cursor to continue from; "0" when the scan went through the whole keyspace.
    next_cursor: str
    #: Owner hosts, kinds and primitives seen among the examined locks (for the filter lists).
    hosts: set[str] = field(default_factory=set)
    kinds: set[str] = field(default_factory=set)
    primitives: set[str] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        """True if no matching lock was left unexamined."""
        return self.next_cursor == "0"


def _hosts(info: LockInfo) -> set[str]:
    """The hosts of every holder of *info* (a semaphore's or read-write lock's several)."""
    found = {h.host for h in info.holders if h.host}
    if info.host:
        found.add(info.host)
    return found


def scan_pattern(keyspace: KeySpace, query: ListQuery) -> str:
    """The SCAN MATCH pattern for *query*; a superset that :meth:`ListQuery.matches` narrows.

    Glob metacharacters in the search text are escaped, so they match themselves.
    Ignoring case, an ASCII letter matches as ``[aA]`` and another cased character
    as ``*`` (Redis compares bytes).
    """
    if not query.ignore_case:
        if query.mode == "prefix" or not query.search:
            return keyspace.match_pattern(query.search)
        return keyspace.match_pattern("") + "*" + glob_escape(query.search) + "*"
    body = "".join(_any_case(ch) for ch in query.search)
    if query.mode == "prefix" and not query.search.startswith(("}", "\\")):
        return keyspace.match_pattern("")[:-1] + body + "*"
    return keyspace.match_pattern("") + body + "*"


def _any_case(ch: str) -> str:
    """*ch* as a MATCH pattern that ignores its case."""
    if ch.lower() == ch.upper():
        return glob_escape(ch)
    if ch.isascii():
        return f"[{ch.lower()}{ch.upper()}]"
    return "*"


def _sort_key(order: str) -> Callable[[LockInfo], Any]:
    field_name = order.lstrip("-")
    if field_name == "age":
        # Oldest first for "age"; unknown acquisition times sort last.
        return lambda i: (i.acquired_at is None, i.acquired_at.timestamp() if i.acquired_at else 0)
    if field_name == "ttl":
        return lambda i: (i.ttl is None, i.ttl if i.ttl is not None else math.inf, i.name)
    if field_name == "renewed":
        # Longest ago (the likeliest stuck) first; locks without a lease last.
        return lambda i: (i.renewed_ago is None, -(i.renewed_ago or 0.0), i.name)
    return lambda i: i.name


def sort_rows(rows: list[LockInfo], order: str) -> list[LockInfo]:
    """*rows* sorted by name, age, remaining lease or last renewal; a leading ``-``
    reverses."""
    if order not in ORDERINGS:
        order = "name"
    return sorted(rows, key=_sort_key(order), reverse=order.startswith("-"))


def scan_window(
    manager: LockManager,
    query: ListQuery,
    *,
    window: int = 1000,
    budget: int = 20000,
    batch: int = 1000,
    max_calls: int = 200,
) -> Window:
    """Collect up to about *window* rows matching *query*, continuing from ``query.cursor``.

    Bounded work: at most *budget* keys loaded and *max_calls* SCAN calls.
    Whole SCAN batches are processed so the returned cursor loses nothing.
    """
    pattern = scan_pattern(manager.backend().keyspace, query)
    rows: list[LockInfo] = []
    hosts: set[str] = set()
    kinds: set[str] = set()
    primitives: set[str] = set()
    cursor, examined, calls = query.cursor, 0, 0
    while True:
        cursor, infos = manager.scan_page(cursor, pattern=pattern, count=batch)
        calls += 1
        examined += len(infos)
        for info in infos:
            hosts.update(_hosts(info))
            kinds.add(info.kind)
            primitives.add(info.primitive)
            if query.matches(info):
                rows.append(info)
        if cursor == "0" or len(rows) >= window or examined >= budget or calls >= max_calls:
            break
    return Window(
        rows=sort_rows(rows, query.order),
        examined=examined,
        next_cursor=cursor,
        hosts=hosts,
        kinds=kinds,
        primitives=primitives,
    )
