"""The package's layout rules, read from its source with ``ast`` (this module imports none of it).

* No import cycles between the package's modules, except the ones listed in
  ``ALLOWED_CYCLES`` (each entry is a known cycle being taken apart).
* ``django_redislock/engine/`` is Django-free: it imports neither Django nor
  Celery, and of the rest of the package only ``django_redislock.exceptions``.
* The package's parts (its folders and top-level modules) are layers, ``LAYERS``: a
  part imports only parts of a lower layer (or itself), so nothing in ``engine/``
  reaches the folders above it, and ``guards/`` reaches Celery only through its hooks.

An import counts wherever it is written (module level or inside a function),
except under ``if TYPE_CHECKING:``, which never runs. For the engine rule,
``TYPE_CHECKING`` imports count too: a type-only dependency on Django is still
one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

PACKAGE = "django_redislock"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
ENGINE = f"{PACKAGE}.engine"

#: Cycles tolerated for now, each as the set of the modules in it; delete an
#: entry once its cycle is gone.
ALLOWED_CYCLES: set[frozenset[str]] = set()

#: The package's parts, lowest layer first: a part may import only parts of a lower
#: layer (and itself). A part is a folder (``primitives``) or a top-level module
#: (``conf``); ``""`` is the package's ``__init__`` (the public API), on top.
LAYERS: list[set[str]] = [
    {"exceptions"},
    {"engine"},
    {"settings_spec"},
    {"standalone"},
    {"conf", "signals", "models"},
    {"client", "fencing", "election"},
    {"primitives"},
    {"describe", "guards"},
    {"celery", "django_tasks", "admin", "checks", "metrics", "testing", "runner"},
    {"management"},
    {"migrations"},
    {"apps", "pytest_plugin", "", "__main__"},
]
#: Imports allowed against the layers: (importing module, imported module).
LAYER_EXCEPTIONS = {
    # the version string of the package, for the OpenTelemetry meter's name
    (f"{PACKAGE}.metrics.otel", PACKAGE),
}

#: What engine/ may import from the rest of the package.
ENGINE_MAY_IMPORT = {f"{PACKAGE}.exceptions"}
#: Top-level distributions engine/ may not import.
ENGINE_BANNED = {"django", "celery"}


@dataclass(frozen=True)
class Import:
    """One import of module *target* by module *source*, at *line*."""

    source: str
    target: str
    line: int
    type_checking: bool


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _file(module: str) -> str:
    return str(_modules()[module].relative_to(ROOT.parent))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, type_checking: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every node under *node*, with whether it sits under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            yield child, type_checking
            for stmt in child.body:
                yield stmt, True
                yield from _walk(stmt, True)
            for stmt in child.orelse:  # the else branch runs
                yield stmt, type_checking
                yield from _walk(stmt, type_checking)
            continue
        yield child, type_checking
        yield from _walk(child, type_checking)


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of ``from <level dots><name> import ...`` written in *module*."""
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: -(level - 1)]
    return ".".join(base + ([name] if name else []))


def _imports(module: str, source: str, modules: set[str], is_package: bool) -> Iterator[Import]:
    """The imports in *source* (the text of *module*): package modules by their name."""
    for node, type_checking in _walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno, type_checking)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node.level, node.module)
            submodules = [f"{target}.{a.name}" for a in node.names]
            found = [m for m in submodules if m in modules]
            # ``from pkg import submodule`` imports the submodule; ``from mod import
            # name`` the module itself.
            for sub in found:
                yield Import(module, sub, node.lineno, type_checking)
            if len(found) < len(submodules):
                yield Import(module, target, node.lineno, type_checking)


def _all_imports() -> list[Import]:
    modules = _modules()
    return [
        imp
        for module, path in modules.items()
        for imp in _imports(
            module, path.read_text(encoding="utf-8"), set(modules), path.name == "__init__.py"
        )
    ]


def _graph() -> dict[str, dict[str, int]]:
    """module -> {imported package module: first line}, imports that run only."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {m: {} for m in modules}
    for imp in _all_imports():
        if imp.type_checking or imp.target not in modules or imp.target == imp.source:
            continue
        graph[imp.source].setdefault(imp.target, imp.line)
    return graph


def _strongly_connected(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _cycle_in(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """The shortest cycle through the first module of *component*, as a closed path."""
    start = min(component)
    parents: dict[str, str] = {}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node]):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(parents[path[-1]])
                return [*reversed(path), start]
            if nxt in component and nxt not in parents:
                parents[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"no cycle through {sorted(component)}")


def _describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    steps = [f"  {_file(a)} line {graph[a][b]}: imports {b}" for a, b in pairwise(cycle)]
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


def test_the_import_reader() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import django_redislock.a\n"
        "from . import b, not_a_module\n"
        "from .c import thing\n"
        "from ..outside import x\n"
        "if TYPE_CHECKING:\n"
        "    from .d import D\n"
        "else:\n"
        "    from .e import E\n"
        "def f():\n"
        "    from .f import g\n"
    )
    modules = {f"{PACKAGE}.{m}" for m in "abcdef"}
    found = {
        (imp.target, imp.type_checking)
        for imp in _imports(f"{PACKAGE}.mod", source, modules, is_package=False)
    }
    assert found == {
        ("typing", False),
        (f"{PACKAGE}.a", False),
        (f"{PACKAGE}.b", False),
        (PACKAGE, False),  # not_a_module: a name from the package's __init__
        (f"{PACKAGE}.c", False),
        ("outside", False),
        (f"{PACKAGE}.d", True),
        (f"{PACKAGE}.e", False),
        (f"{PACKAGE}.f", False),
    }
    assert _resolve(f"{ENGINE}.backends.base", False, 3, "exceptions") == f"{PACKAGE}.exceptions"
    assert _resolve(ENGINE, True, 1, "flows") == f"{ENGINE}.flows"
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}}
    assert _strongly_connected(graph) == [{"a", "b", "c"}]
    assert _cycle_in(graph, {"a", "b", "c"}) == ["a", "b", "c", "a"]


def test_the_scan_sees_the_package() -> None:
    graph = _graph()
    assert len(graph) > 20
    assert f"{PACKAGE}.primitives.manager" in graph[f"{PACKAGE}.admin.listing"]


def test_no_import_cycles() -> None:
    graph = _graph()
    cycles = [
        _describe(graph, _cycle_in(graph, component))
        for component in _strongly_connected(graph)
        if frozenset(component) not in ALLOWED_CYCLES
    ]
    assert not cycles, "import cycles between package modules:\n" + "\n\n".join(cycles)


def test_decorators_do_not_import_celery() -> None:
    """The decorator reaches Celery through the hooks of ``guards/guard.py`` only."""
    found = [
        f"line {imp.line}: {imp.target}"
        for imp in _all_imports()
        if imp.source == f"{PACKAGE}.guards.decorators"
        and (
            imp.target.split(".")[0] == "celery"
            or imp.target == f"{PACKAGE}.celery"
            or imp.target.startswith(f"{PACKAGE}.celery.")
        )
    ]
    assert not found, "decorators.py imports Celery: " + ", ".join(found)


def test_engine_imports_no_django_and_only_exceptions_of_the_package() -> None:
    found = []
    for imp in _all_imports():
        if imp.source != ENGINE and not imp.source.startswith(ENGINE + "."):
            continue
        top = imp.target.split(".")[0]
        outside = (
            top == PACKAGE
            and imp.target != ENGINE
            and not imp.target.startswith(ENGINE + ".")
            and imp.target not in ENGINE_MAY_IMPORT
        )
        if top in ENGINE_BANNED or outside:
            found.append(f"{_file(imp.source)} line {imp.line}: imports {imp.target}")
    assert not found, "engine/ reaches outside its floor:\n" + "\n".join(found)


def _part(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_layers_name_every_part() -> None:
    parts = {_part(m) for m in _modules()}
    named = set().union(*LAYERS)
    assert parts <= named, f"parts missing from LAYERS: {sorted(parts - named)}"
    assert named <= parts, f"LAYERS names parts that are gone: {sorted(named - parts)}"


def test_each_part_imports_only_lower_layers() -> None:
    layer = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}
    graph = _graph()
    found = [
        f"{_file(source)} line {line}: imports {target} "
        f"(layer {layer[_part(target)]} >= its own {layer[_part(source)]})"
        for source, targets in graph.items()
        for target, line in targets.items()
        if _part(source) != _part(target)
        and layer[_part(target)] >= layer[_part(source)]
        and (source, target) not in LAYER_EXCEPTIONS
    ]
    assert not found, "imports against the layers (tests/test_layout.py LAYERS):\n" + "\n".join(
        found
    )
