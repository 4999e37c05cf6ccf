"""raygeom's layers point one way: the import graph of raygeom/ (built with ast, so nothing is imported)
has no cycles, and no layer imports one above it.

Layers, top down: cli -> jobs (job drivers) -> analyses -> engine, replica, sources, store -> numerics.
An edge is any ``import raygeom.x`` or ``from raygeom.x import y``, at module level or inside a function
(a function-level import is a dependency all the same, only a later one): ``from raygeom.x import y`` is an
edge to ``raygeom.x`` and, when ``raygeom/x/y.py`` exists, to ``raygeom.x.y``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "raygeom"

ALLOWED_CYCLES: list[set[str]] = []  # none

FORBIDDEN = {
    "raygeom.engine": ("raygeom.analyses", "raygeom.jobs"),
    "raygeom.numerics": ("raygeom.engine", "raygeom.analyses", "raygeom.jobs", "raygeom.store", "raygeom.replica",
                         "raygeom.sources", "raygeom.cli", "raygeom.report"),
    "raygeom.analyses": ("raygeom.jobs", "raygeom.cli"),
}


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The raygeom modules ``module`` imports anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x, from ..y import z
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets.add(source)
            targets.update(f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in known)
    # A module's own ancestor packages run before it does, whatever it imports, so an edge to one orders nothing.
    ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    return {t for t in targets if t in known and t != module and t not in ancestors}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    known = modules(package)
    return {module: imported(module, path, known) for module, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_graph_sees_module_and_function_level_imports():
    graph = import_graph()
    assert "raygeom.store.tree" in graph["raygeom.engine.units"]  # module level
    assert "raygeom.sources.revisions" in graph["raygeom.jobspec"]  # inside a function
    assert "raygeom.numerics.pga" in graph["raygeom.numerics.pga_texts"]  # from raygeom.numerics import pga


def test_cycle_finder_finds_a_cycle_and_only_it():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [{"a", "b", "c"}]


def test_no_import_cycles():
    found = [sorted(c) for c in cycles(import_graph()) if c not in ALLOWED_CYCLES]
    assert not found, f"import cycles: {found}"


def test_layers_import_only_downwards():
    wrong = []
    for module, targets in import_graph().items():
        for layer, below in FORBIDDEN.items():
            if _inside(module, layer):
                wrong += [f"{module} -> {t}" for t in sorted(targets) if any(_inside(t, b) for b in below)]
    assert not wrong, "imports that run back up a layer:\n" + "\n".join(wrong)
