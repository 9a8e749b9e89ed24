"""The lock list's query string: search, filters, ordering, page and auto-refresh,
read from a request, and the links that change one of them and keep the rest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest

from .listing import ORDERINGS, ListQuery, Window
from .targets import PRIMITIVE_LABELS

#: Auto-refresh periods (seconds) offered on the list page; 0 = off.
REFRESH_CHOICES = (0, 5, 30)
#: The kinds docs/admin.md describes, always offered by the kind filter (in this order).
KINDS = ("task", "view", "function", "lock", "foreign")
#: The columns the list sorts by (``o=<column>``, ``o=-<column>`` reversed).
SORTABLE = ("name", "age", "ttl", "renewed")
#: The sidebar's filters, each a query parameter.
FILTERS = ("host", "kind", "primitive", "overdue")


def query_from(request: HttpRequest) -> tuple[ListQuery, int, int]:
    """The list query, page number and refresh period from the query string."""
    get = request.GET
    order = get.get("o", "name")
    # Opaque to the admin; the backend starts over on a cursor it cannot read.
    cursor = get.get("cursor", "0")[:200] or "0"
    page = _int(get.get("p", "1"), 1)
    refresh = _int(get.get("refresh", "0"), 0)
    query = ListQuery(
        search=get.get("q", "").strip(),
        mode="prefix" if get.get("match") == "prefix" else "contains",
        ignore_case=get.get("i") == "1",
        host=get.get("host", ""),
        kind=get.get("kind", ""),
        primitive=get.get("primitive", ""),
        overdue=get.get("overdue") == "1",
        order=order if order in ORDERINGS else "name",
        cursor=cursor,
    )
    return query, max(1, page), refresh if refresh in REFRESH_CHOICES else 0


def _int(value: str, default: int) -> int:
    try:
        return int(value)
    except ValueError:
        return default


def params_of(query: ListQuery, page: int, refresh: int) -> dict[str, Any]:
    """The query string's parameters for *query*, *page* and *refresh* (empty = default)."""
    return {
        "q": query.search,
        "match": "prefix" if query.mode == "prefix" else "",
        "i": "1" if query.ignore_case else "",
        "host": query.host,
        "kind": query.kind,
        "primitive": query.primitive,
        "overdue": "1" if query.overdue else "",
        "o": "" if query.order == "name" else query.order,
        "cursor": "" if query.cursor == "0" else query.cursor,
        "p": "" if page == 1 else page,
        "refresh": refresh or "",
    }


def qs(params: dict[str, Any], **changes: Any) -> str:
    """``?query`` from *params* with *changes*, dropping empty values."""
    merged = {**params, **changes}
    return "?" + urlencode({k: v for k, v in merged.items() if v not in ("", None, 0)})


def sort_links(query: ListQuery, params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per sortable column: the URL its header links to (reversing the order when it
    is the current one), whether it is current, and whether descending."""
    links = {}
    for column in SORTABLE:
        current = query.order.lstrip("-") == column
        descending = query.order.startswith("-")
        new = f"-{column}" if current and not descending else column
        links[column] = {
            "url": qs(params, o="" if new == "name" else new, p=""),
            "current": current,
            "descending": descending,
        }
    return links


def filter_choices(
    query: ListQuery, params: dict[str, Any], window: Window | None
) -> dict[str, Any]:
    """The sidebar's filter links (host, kind, primitive, overdue), each keeping the
    others. Kinds and primitives are always the documented ones, plus any other seen."""
    base = {k: v for k, v in params.items() if k not in (*FILTERS, "p", "cursor")}
    chosen = {f: params[f] for f in FILTERS}

    def url(**change: str) -> str:
        return qs(base, **{**chosen, **change})

    hosts = sorted((window.hosts if window else set()) | ({query.host} - {""}))
    kinds = _in_order(KINDS, (window.kinds if window else set()) | ({query.kind} - {""}))
    primitives = _in_order(
        tuple(PRIMITIVE_LABELS),
        (window.primitives if window else set()) | ({query.primitive} - {""}),
    )
    overdue = "1" if query.overdue else ""
    return {
        "host_choices": _choices(hosts, query.host, lambda h: url(host=h)),
        "kind_choices": _choices(kinds, query.kind, lambda k: url(kind=k)),
        "primitive_choices": _choices(
            primitives, query.primitive, lambda p: url(primitive=p), PRIMITIVE_LABELS
        ),
        "overdue_choices": _choices(
            ["1"], overdue, lambda o: url(overdue=o), {"1": "only overdue holders"}
        ),
    }


def _in_order(known: tuple[str, ...], seen: set[str]) -> list[str]:
    """*known* in its order, then the other values of *seen* alphabetically."""
    return [*known, *sorted(seen - set(known))]


def _choices(
    values: list[str],
    current: str,
    url: Callable[[str], str],
    labels: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Filter links: "All" then one per value, marking the current one."""
    names = labels or {}
    out = [{"label": "All", "url": url(""), "selected": not current}]
    out += [{"label": names.get(v, v), "url": url(v), "selected": v == current} for v in values]
    return out
