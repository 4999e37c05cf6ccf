"""docs/quickstart.ipynb runs top to bottom on the real SmolLM2-135M and shows its plot."""

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_notebook_runs_and_plots(monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    # The kernel is a new process: it must import this checkout and load the built-in model offline.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(ROOT / "docs" / "quickstart.ipynb", as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "docs")}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream" and o.get("name") == "stdout")
    assert "LlamaForCausalLM with 30 blocks; 40 texts" in printed
    for layer in ("block_00", "block_05", "block_29", "final_norm"):
        assert f"{layer:>10}  depth" in printed, layer
    # the 40 texts' last tokens: too few distinct embeddings for k = 32 after CCR-1, said in one line, not a z
    assert "     embed  depth" in printed or "     embed  not scored: rank" in printed
    assert any("image/png" in o.get("data", {}) for o in outputs)
