"""The package's import graph has no cycle, between modules or between subpackages.

An edge is an import that runs when its module loads: imports under `if TYPE_CHECKING:` and
imports inside functions are not edges. Importing `a.b.c` also loads the packages `a` and
`a.b`, except those the importer already sits in (they are loaded before it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import kvmigrate

Graph = dict[str, set[str]]

PACKAGE_ROOT = Path(kvmigrate.__file__).parent


def module_names(root: Path) -> dict[str, Path]:
    """Every module below `root`, by dotted name; a package by the name of its folder."""
    names: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def load_time_imports(body: Sequence[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs as it loads: not in functions or classes' methods, not under
    `if TYPE_CHECKING:` (its `else:` branch does run)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node):
                yield from load_time_imports(node.body)
            yield from load_time_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from load_time_imports(block)
            for handler in node.handlers:
                yield from load_time_imports(handler.body)
        elif isinstance(node, ast.With | ast.ClassDef):
            yield from load_time_imports(node.body)


def imported_modules(
    node: ast.Import | ast.ImportFrom,
    importer: Path,
    importer_name: str,
    modules: Mapping[str, Path],
) -> set[str]:
    """The modules one import statement names: `from a import b` names `a.b` when that is a
    module, else `a`."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    module = node.module or ""
    if node.level:
        base = importer_name.split(".")
        if importer.name != "__init__.py":
            base.pop()
        base = base[: len(base) - node.level + 1]
        module = ".".join([*base, module] if module else base)
    return {
        f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
        for alias in node.names
    }


def import_graph(modules: Mapping[str, Path]) -> Graph:
    """Each module's load-time imports, and the packages they load on the way."""
    graph: Graph = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in load_time_imports(ast.parse(path.read_text()).body):
            for target in imported_modules(node, path, name, modules):
                parts = target.split(".")
                for end in range(1, len(parts) + 1):
                    loaded = ".".join(parts[:end])
                    already_loaded = loaded != target and name.startswith(loaded + ".")
                    if loaded in modules and loaded != name and not already_loaded:
                        edges.add(loaded)
        graph[name] = edges
    return graph


def subpackage_graph(graph: Graph, depth: int = 2) -> Graph:
    """Modules merged into their subpackage (`kvmigrate.recorder.store` into
    `kvmigrate.recorder`): two subpackages must not need each other either."""
    merged: Graph = {}
    for source, targets in graph.items():
        group = ".".join(source.split(".")[:depth])
        edges = merged.setdefault(group, set())
        edges |= {".".join(t.split(".")[:depth]) for t in targets} - {group}
    return merged


def find_cycle(graph: Graph) -> list[str] | None:
    """One cycle as the path `a -> b -> ... -> a`, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
        path = [start]
        stack = [iter(sorted(graph.get(start, ())))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_the_finder_reports_a_cycle_it_is_given() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_sees_the_imports_that_run_and_only_those() -> None:
    graph = import_graph(module_names(PACKAGE_ROOT))
    # A module-level import, and the package it sits in that it loads on the way.
    assert "kvmigrate.redaction" in graph["kvmigrate.recorder.convert"]
    assert "kvmigrate.parity" in graph["kvmigrate.recorder.convert"]
    # The store factories load their implementations by name, when a URL asks for one.
    assert "kvmigrate.recorder.sqlite_store" not in graph["kvmigrate.recorder.store"]
    assert "kvmigrate.rollout.redis_store" not in graph["kvmigrate.rollout.store"]


def test_no_module_cycle() -> None:
    cycle = find_cycle(import_graph(module_names(PACKAGE_ROOT)))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_subpackage_cycle() -> None:
    cycle = find_cycle(subpackage_graph(import_graph(module_names(PACKAGE_ROOT))))
    assert cycle is None, "subpackage import cycle: " + " -> ".join(cycle or [])
