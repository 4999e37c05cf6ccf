"""raygeom/ holds no function over MAX_LINES lines (walked with ast, nothing imported), and no builder of the pages of
docs/results/: those are the repository's write-ups, in tools/ (tests/unit/test_results_pages.py runs them)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 120


def long_functions(package: Path, most: int = MAX_LINES) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > most:
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_the_walk_finds_a_long_function_nested_or_not(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(4))
    (package / "a.py").write_text(f"def top():\n    x = 1\n    y = 2\n\n\nclass C:\n    def method(self):\n{body}\n")
    assert long_functions(package, most=5) == []
    assert long_functions(package, most=4) == ["pkg/a.py:7 method (5 lines)"]  # a method, inside its class
    assert long_functions(package, most=2) == ["pkg/a.py:1 top (3 lines)", "pkg/a.py:7 method (5 lines)"]


def test_no_function_of_raygeom_is_over_120_lines():
    assert long_functions(ROOT / "raygeom") == []


def test_the_results_pages_are_built_outside_the_package():
    """The pages' builders live in tools/; the package only exports the rows a job's page cites."""
    from tools import results_pages

    assert {module.partition(".")[0] for module in results_pages.GENERATED.values()} == {"tools"}
    text = "\n".join(path.read_text() for path in (ROOT / "raygeom").rglob("*.py"))
    for word in ("render_page", "page_text", "mechanism_lines", "import tools", "from tools"):
        assert word not in text, word
