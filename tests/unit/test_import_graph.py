"""raygeom's layers point one way: the import graph of raygeom/ (built with ast, so nothing is imported)
has no cycles, and every module imports only modules of its own layer or of the layers below it.

Layers, bottom up: the declarations every layer shares (errors, params); numerics and sources; store; replica;
engine; analyses; report; jobs (with the job-file parser, jobspec); api; cli. raygeom.testing (the tiny models the
tests and benchmarks build) sits on top. Every module of raygeom/ is in one layer.
An edge is any ``import raygeom.x`` or ``from raygeom.x import y``, at module level or inside a function
(a function-level import is a dependency all the same, only a later one): ``from raygeom.x import y`` is an
edge to ``raygeom.x`` and, when ``raygeom/x/y.py`` exists, to ``raygeom.x.y``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "raygeom"

ALLOWED_CYCLES: list[set[str]] = []  # none

# Bottom up; a module may import its own layer and the layers before it.
LAYERS: list[tuple[str, ...]] = [
    ("raygeom.errors", "raygeom.params", "raygeom.names", "raygeom.extras"),
    ("raygeom.numerics", "raygeom.sources"),
    ("raygeom.store",),
    ("raygeom.replica",),
    ("raygeom.engine",),
    ("raygeom.analyses",),
    ("raygeom.report",),
    ("raygeom.jobs", "raygeom.jobspec"),
    ("raygeom", "raygeom.api"),  # the package's lazy public names are the API's (every module's ancestor: no edge)
    ("raygeom.cli",),
    ("raygeom.testing",),
]
# Within the bottom layers, numerics is pure: arrays in and out, no files, models or texts.
FORBIDDEN = {"raygeom.numerics": ("raygeom.sources",)}


def layer_of(module: str) -> int:
    """The index in LAYERS of the layer holding ``module`` (the longest package name that contains it)."""
    found = [
        (len(name), index)
        for index, names in enumerate(LAYERS)
        for name in names
        if module == name or (name != "raygeom" and module.startswith(name + "."))
    ]
    if not found:
        raise AssertionError(f"{module} is in no layer; add it to LAYERS")
    return max(found)[1]


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
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
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


def back_edges(graph: dict[str, set[str]]) -> list[str]:
    wrong = [f"{m} -> {t}" for m, targets in graph.items() for t in sorted(targets) if layer_of(t) > layer_of(m)]
    for module, targets in graph.items():
        for layer, below in FORBIDDEN.items():
            if _inside(module, layer):
                wrong += [f"{module} -> {t}" for t in sorted(targets) if any(_inside(t, b) for b in below)]
    return sorted(wrong)


def test_every_module_is_in_a_layer():
    for module in import_graph():
        layer_of(module)


def test_back_edges_are_found():
    graph = {
        "raygeom.store.tree": {"raygeom.api"},
        "raygeom.api": {"raygeom.store.tree"},
        "raygeom.numerics.pga": {"raygeom.sources.layers"},
        "raygeom.sources.layers": set(),
    }
    assert back_edges(graph) == ["raygeom.numerics.pga -> raygeom.sources.layers", "raygeom.store.tree -> raygeom.api"]


def test_layers_import_only_downwards():
    wrong = back_edges(import_graph())
    assert not wrong, f"{len(wrong)} imports that run back up a layer:\n" + "\n".join(wrong)


def test_every_renderer_is_an_import_the_graph_sees():
    """How an analysis is drawn is the report layer's (raygeom.report.renderers, keyed by analysis name), never text in
    an analysis naming a report function: each built-in renderer is a function of a report module that
    renderers.py imports (so the layer and cycle checks above cover it), keyed by a registered analysis."""
    from raygeom.analyses import registry
    from raygeom.report import renderers

    graph = import_graph()
    for path in (PACKAGE / "analyses").glob("*.py"):
        assert '"raygeom.report' not in path.read_text(), path.name  # no "module:function" text
    assert renderers.BUILT_IN
    for name, renderer in renderers.BUILT_IN.items():
        assert name in registry.analyses(), name
        for function in (renderer.section, renderer.figures):
            if function is not None:
                assert _inside(function.__module__, "raygeom.report"), (name, function)
                assert function.__module__ in graph["raygeom.report.renderers"], (name, function.__module__)


def private_imports(package: Path = PACKAGE) -> list[str]:
    """``from raygeom.<a>... import _name`` in a module of another package than <a>: a private name used across
    packages, which should be public (or stay inside its package)."""
    found = []
    for module, path in modules(package).items():
        own = module.split(".")[1] if module.count(".") else ""
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("raygeom."):
                if node.module.split(".")[1] != own:
                    found += [f"{module}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return sorted(found)


def test_no_private_name_is_imported_across_packages(tmp_path):
    (tmp_path / "raygeom" / "numerics").mkdir(parents=True)
    (tmp_path / "raygeom" / "numerics" / "u.py").write_text("_q = 1\n")
    (tmp_path / "raygeom" / "numerics" / "v.py").write_text("from raygeom.numerics.u import _q\n")  # its own package
    (tmp_path / "raygeom" / "api.py").write_text("from raygeom.numerics.u import _q\n")
    assert private_imports(tmp_path / "raygeom") == ["raygeom.api: raygeom.numerics.u._q"]
    assert private_imports() == []


# `raygeom run`'s path (issue 45): the driver (raygeom.jobs.run) calls its steps in turn, load, plan, extract, write,
# and each module here imports only the modules before it, so a reader follows a run downward once and never returns
# to a module already left. The plan of passes comes first: the pooled pass's texts are its.
RUN_PATH = (
    "raygeom.jobs.passes",
    "raygeom.jobs.preflight",
    "raygeom.jobs.progress",
    "raygeom.jobs.load",
    "raygeom.jobs.plan",
    "raygeom.jobs.extract",
    "raygeom.jobs.write",
    "raygeom.jobs.run",
)
# The generic steps name no analysis: what an analysis does is its declaration's (its registry entry, its renderer).
GENERIC_STEPS = (
    "raygeom.cli.sweep",  # plan and status
    "raygeom.engine.contract",
    "raygeom.engine.orchestrate",
    "raygeom.engine.replica_actor",
    "raygeom.engine.units",
    "raygeom.engine.weights",
    "raygeom.jobs.plan",
    "raygeom.jobs.preflight",
    "raygeom.jobs.passes",
    "raygeom.jobs.progress",
    "raygeom.jobs.load",
    "raygeom.jobs.extract",
    "raygeom.jobs.write",
    "raygeom.jobs.run",
)


def run_path_back_edges(graph: dict[str, set[str]], path: tuple[str, ...] = RUN_PATH) -> list[str]:
    """``a -> b`` for each module of ``path`` that imports itself or a later one (the driver included)."""
    return [f"{m} -> {t}" for i, m in enumerate(path) for t in sorted(graph.get(m, ())) if t in path[i:]]


def test_a_step_that_imports_a_later_step_is_found():
    graph = {"a.load": {"a.write"}, "a.write": {"a.load"}, "a.run": {"a.load", "a.write"}}
    assert run_path_back_edges(graph, ("a.load", "a.write", "a.run")) == ["a.load -> a.write"]


def test_the_run_path_imports_only_downward():
    graph = import_graph()
    assert not run_path_back_edges(graph), run_path_back_edges(graph)
    steps = {"raygeom.jobs.load", "raygeom.jobs.plan", "raygeom.jobs.extract", "raygeom.jobs.write"}
    assert steps <= graph["raygeom.jobs.run"]  # the driver calls each step itself
    users = sorted(m for m, targets in graph.items() if "raygeom.jobs.run" in targets)
    assert users == ["raygeom.cli.root", "raygeom.jobs.trajectory"], users  # the command and the driver built on it


def named_analyses(path: Path, names: set[str]) -> list[str]:
    """The analysis names a module's code says: string constants that are not docstrings, and identifiers."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [name for name in names if name in node.value.split()]
        elif isinstance(node, (ast.Name, ast.Attribute, ast.FunctionDef, ast.alias)):
            word = getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "name", "")
            word = word.lower()
            found += [name for name in names if name in word.split("_") or ("_" in name and name in word)]
    return sorted(set(found))


def test_the_generic_steps_name_no_analysis():
    from raygeom.analyses import registry

    names = set(registry.analyses())
    known = modules()
    named = {m: named_analyses(known[m], names) for m in GENERIC_STEPS}
    assert not any(named.values()), named


def test_the_check_finds_an_analysis_named_in_code_but_not_in_a_docstring(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""Draws pga."""\n\n\ndef f(rows):\n    """pga too."""\n    return rows["pga"], knn_lm_rows\n')
    assert named_analyses(path, {"pga", "knn_lm", "gap"}) == ["knn_lm", "pga"]
