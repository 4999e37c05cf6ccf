"""docs/architecture.md's table of layers is the import test's LAYERS (issue 48 §5): every layer of
tests/unit/test_import_graph.py is named there, in the same order, each row numbered as its layer, and the modules a
row names are the modules of that layer (names.py included)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_import_graph import LAYERS, layer_of

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _module(path: str) -> str:
    """raygeom/sources/ -> raygeom.sources, raygeom/jobspec.py -> raygeom.jobspec, raygeom/__init__.py -> raygeom."""
    parts = path.strip("/").removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def table_rows(text: str) -> list[tuple[int, list[str]]]:
    """(layer number, modules) of each row of the table of layers."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0].isdigit():
            rows.append((int(cells[0]), [_module(p) for p in re.findall(r"`(raygeom/[\w/.]*)`", cells[2])]))
    return rows


def check(text: str) -> list[str]:
    rows = table_rows(text)
    wrong = []
    for number, named in rows:
        wrong += [f"row {number}: {m} is in layer {layer_of(m)}" for m in named if layer_of(m) != number]
    numbers = [number for number, _ in rows]
    if numbers != sorted(numbers):
        wrong.append(f"rows out of order: {numbers}")
    named = {m for _, modules in rows for m in modules}
    wrong += [f"{m} (layer {i}) is not in the table" for i, layer in enumerate(LAYERS) for m in layer if m not in named]
    return wrong


def test_the_table_of_layers_is_the_import_tests_layers():
    assert not check(DOC.read_text())


def test_the_check_finds_a_missing_module_and_a_layer_out_of_order():
    text = DOC.read_text()
    without = text.replace("`raygeom/names.py`, ", "")
    assert "raygeom.names (layer 0) is not in the table" in check(without)
    swapped = text.replace("| 7 | jobs |", "| 9 | jobs |")
    assert any("out of order" in w for w in check(swapped)) and any("is in layer 7" in w for w in check(swapped))
