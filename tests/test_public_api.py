"""The package stands on redis-py's public API: no underscore attribute of redis-py's.

The rule (docs/architecture.md, "Acquire, release and hand-off"): every command goes
through redis-py's documented interfaces, so its instrumentation, retries, credential
providers and maintenance notifications apply to the lock's commands as to any other.
This reads the source with ``ast``, nothing imported or patched:

* redis-py's underscore names are collected from the installed redis-py's own source
  (every ``_name`` it defines or reads as an attribute: ``_sock``, ``_command_packer``,
  ``_RESP2Parser``, ...);
* every ``x._name`` in django_redislock whose name is one of those is a reach into
  redis-py, unless ``x`` is ``self``/``cls`` of a class of ours that does not derive from
  a redis-py class and the name is one our own code defines (``self._lock`` is ours);
* so are ``getattr(x, "_name")`` (and ``hasattr``/``setattr``), ``from redis... import
  _name``, and ``__dict__``/``vars()`` on redis-py's objects (``redis.Redis.__dict__[...]``
  identity checks; any ``__dict__`` in the transport layer, where every object is
  redis-py's).

Each remaining exception is named in :data:`ALLOWED` with why; an entry no longer used
fails too, so the list cannot outlive its reason. The scanner itself is checked on the
reaches it must catch (``conn._sock``, ``conn._command_packer``, a ``__dict__`` identity
check), so a rule weakened into catching nothing fails here.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import redis

PACKAGE = Path(__file__).resolve().parent.parent / "django_redislock"
#: The modules where every object handled is redis-py's (the transport layer).
TRANSPORT = ("engine/backends/", "client/")

#: (module relative to the package, redis-py's underscore name) -> why it stays.
ALLOWED: dict[tuple[str, str], str] = {
    ("engine/backends/redlock.py", "_sock"): (
        "Redlock's blocking scatter writes one call to N masters and select()s over their "
        "sockets from one thread (a paused master must cost one timeout, not one per "
        "master); redis-py's Connection has no public socket or fileno, and the asyncio "
        "backend's task per master has no such need"
    ),
    ("client/connection.py", "_cache"): (
        "not redis-py's: Django's RedisCache keeps its RedisCacheClient as _cache (a name "
        "redis-py uses too), and Django offers no public way to the redis-py client it "
        "builds; the client found is then used through its public API only"
    ),
}

DUNDER_DICT = "__dict__"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_and_read(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The underscore names *tree* defines (defs, classes, assignments, attribute
    targets) and every underscore name it uses at all (those and attribute reads)."""
    defined: set[str] = set()
    used: set[str] = set()
    for node in ast.walk(tree):
        name = None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = node.name
            defined.add(name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            name = node.id
            defined.add(name)
        elif isinstance(node, ast.Attribute):
            name = node.attr
            if isinstance(node.ctx, ast.Store):
                defined.add(name)
        elif isinstance(node, ast.alias):
            name = node.asname or node.name.split(".")[0]
            defined.add(name)
        if name is not None:
            used.add(name)
    return {n for n in defined if _is_private(n)}, {n for n in used if _is_private(n)}


@functools.cache
def redis_py_names() -> frozenset[str]:
    """Every underscore name the installed redis-py's source defines or reads."""
    names: set[str] = set()
    for path in Path(redis.__file__).resolve().parent.rglob("*.py"):
        _, used = _defined_and_read(ast.parse(path.read_text(encoding="utf-8")))
        names |= used
    return frozenset(names)


def _modules(root: Path) -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(root.rglob("*.py")):
        yield path.relative_to(root).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


@functools.cache
def package_names(root: Path = PACKAGE) -> frozenset[str]:
    """The underscore names django_redislock's own code defines."""
    names: set[str] = set()
    for _, tree in _modules(root):
        names |= _defined_and_read(tree)[0]
    return frozenset(names)


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _redis_bound(tree: ast.Module) -> set[str]:
    """The names *tree* binds by importing redis-py (``redis``, ``Redis``, ...)."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "redis":
                    bound.add(alias.asname or "redis")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "redis":
            bound |= {alias.asname or alias.name for alias in node.names}
    return bound


def _redis_classes(tree: ast.Module, bound: set[str]) -> set[ast.ClassDef]:
    """Our classes deriving from a redis-py class (their ``self`` is redis-py's)."""
    return {
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and any(_root_name(b) in bound for b in node.bases)
    }


def reaches(module: str, tree: ast.Module, ours: frozenset[str]) -> list[tuple[str, str, int]]:
    """Each (module, name, line) where *tree* reaches into redis-py's private parts."""
    private = redis_py_names()
    bound = _redis_bound(tree)
    transport = module.startswith(TRANSPORT)
    found: list[tuple[str, str, int]] = []
    own_self: set[int] = set()  # ids of self/cls Name nodes inside our own classes
    redis_subclasses = _redis_classes(tree, bound)
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and cls not in redis_subclasses:
            own_self |= {
                id(n)
                for n in ast.walk(cls)
                if isinstance(n, ast.Name) and n.id in ("self", "cls", "mcs")
            }
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr == DUNDER_DICT and (transport or _root_name(node.value) in bound):
                found.append((module, DUNDER_DICT, node.lineno))
            elif node.attr in private:
                on_own_self = isinstance(node.value, ast.Name) and id(node.value) in own_self
                if not (on_own_self and node.attr in ours):
                    found.append((module, node.attr, node.lineno))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = node.args
            if node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(args) >= 2:
                text = args[1]
                if isinstance(text, ast.Constant) and text.value in private:
                    found.append((module, str(text.value), node.lineno))
            elif node.func.id == "vars" and args and (transport or _root_name(args[0]) in bound):
                found.append((module, "vars()", node.lineno))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "redis":
            if _is_private(node.module or "") or any(
                _is_private(p) for p in node.module.split(".")
            ):
                found.append((module, node.module, node.lineno))
            found += [(module, a.name, node.lineno) for a in node.names if _is_private(a.name)]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "redis" and any(_is_private(p) for p in parts):
                    found.append((module, alias.name, node.lineno))
    return found


def package_reaches(root: Path = PACKAGE) -> list[tuple[str, str, int]]:
    """Every reach into redis-py's private parts in the package at *root*."""
    ours = package_names(root)
    return [hit for module, tree in _modules(root) for hit in reaches(module, tree, ours)]


def _snippet_reaches(source: str, module: str = "engine/backends/x.py") -> list[str]:
    return [name for _, name, _ in reaches(module, ast.parse(source), package_names())]


def test_the_package_reaches_into_no_private_part_of_redis_py_but_the_allowed() -> None:
    found = package_reaches()
    unexplained = sorted({f"{m}:{line} {n}" for m, n, line in found if (m, n) not in ALLOWED})
    assert not unexplained, unexplained
    # (an allowed name the installed redis-py does not have, such as ``_cache`` before
    # redis-py 8, is not looked for: it is not a reach into this version)
    private = redis_py_names()
    unused = {a for a in ALLOWED if a[1] in private} - {(m, n) for m, n, _ in found}
    assert not unused, f"allowed reaches no longer made (drop them): {unused}"


def test_the_scanner_catches_the_reaches_it_exists_for() -> None:
    """What the retired direct path did, and what a new reach could look like."""
    assert _snippet_reaches("def f(conn):\n    return conn._sock is not None") == ["_sock"]
    assert _snippet_reaches("type(conn._command_packer)") == ["_command_packer"]
    assert _snippet_reaches("getattr(conn, '_sock', None)") == ["_sock"]
    assert _snippet_reaches("import redis\nx = redis.Redis.__dict__['execute_command']") == [
        DUNDER_DICT
    ]
    assert _snippet_reaches("'execute_command' in client.__dict__") == [DUNDER_DICT]
    assert _snippet_reaches("from redis.connection import _RESP2Parser") == ["_RESP2Parser"]
    assert _snippet_reaches("import redis\np = redis.connection._RESP2Parser") == ["_RESP2Parser"]
    subclass = (
        "import redis\nclass C(redis.Connection):\n    def f(self):\n        return self._sock"
    )
    assert _snippet_reaches(subclass) == ["_sock"]
    # Our own underscore names on our own objects are not redis-py's business.
    own = "class Lock:\n    def f(self):\n        return self._lock"
    assert _snippet_reaches(own, "primitives/x.py") == []
    assert _snippet_reaches("lock._caller()", "primitives/x.py") == []
