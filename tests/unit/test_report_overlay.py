"""`raygeom report A B` through the CLI: B's rows are drawn beside A's, each store its own series, never joined."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.figures import decode as _decode
from tests.figures import figures_of
from tests.synthetic import write_pythia_grid_store

ROOT = Path(__file__).resolve().parents[2]


def test_two_stores_overlay_with_each_store_a_facet(tmp_path):
    first = write_pythia_grid_store(tmp_path / "run-a", sizes=("70m",), revisions=("step1000", "step143000"), seed=1)
    second = write_pythia_grid_store(tmp_path / "run-b", sizes=("70m",), revisions=("step1000", "step143000"), seed=2)
    out = tmp_path / "both.html"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "report", str(first), str(second), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = figures_of(out.read_text())
    names = [trace.get("name") or "" for figure in figures for trace in figure["data"] if trace.get("showlegend") is not False]
    assert any(n.endswith(", run-a") for n in names) and any(n.endswith(", run-b") for n in names)  # a store by its name
    assert max(map(len, names)) <= 40
    for figure in figures:  # the legend stays a column beside the plot (plotly's default place), never over it
        assert figure["layout"].get("legend", {}).get("x", 1.02) >= 1.0 or figure["layout"]["legend"].get("orientation") == "h"
    for figure in figures:
        lines = [t for t in figure["data"] if "lines" in str(t.get("mode", "")) and t.get("fill") != "toself"]
        seen = set()
        for trace in lines:
            x = _decode(trace.get("x"))
            if x is None or x.dtype.kind not in "fiu":
                continue
            assert np.all(np.diff(x) > 0), trace.get("name")
            assert trace.get("name") not in seen
            seen.add(trace.get("name"))
    # The overlay changes nothing in either store; each store's own report is still its own.
    assert not (first / "report.html").exists() and not (second / "report.html").exists()
    missing = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "report", str(first), str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert missing.returncode == 2 and "nope is not a directory" in missing.stderr


def test_the_public_write_report_overlays_and_lists_every_stores_extractions(tmp_path):
    import raygeom

    rng = np.random.default_rng(0)
    for name in ("run-a", "run-b"):
        raygeom.write_activations(
            tmp_path / name,
            model=f"model-{name}",
            layer="block_00",
            vectors=rng.normal(size=(6, 8)),
            readout=rng.normal(size=(10, 8)),
            n_blocks=2,
            source=f"hooks of {name}",
        )
    out = raygeom.write_report(tmp_path / "run-a", tmp_path / "both.html", overlay=[tmp_path / "run-b"])
    text = out.read_text()
    for name in ("run-a", "run-b"):
        assert f"<td>{name}</td><td>model-{name}</td>" in text and f"hooks of {name}" in text


def test_store_labels_are_short_and_distinct():
    from raygeom.report.html import STORE_LABEL_MAX, _store_labels

    assert _store_labels([Path("/x/run-a"), Path("/y/run-b")]) == ["run-a", "run-b"]
    assert _store_labels([Path("/x/store"), Path("/y/store")]) == ["x/store", "y/store"]
    long = [Path("/x/pythia-sweep-2026-bbc-final"), Path("/x/pythia-sweep-2026-lee-final")]
    assert _store_labels(long) == ["bbc", "lee"]  # the words both share say nothing in a legend
    labels = _store_labels([Path("/x/" + "a" * 30 + "1"), Path("/x/" + "a" * 30 + "2")])
    assert len(set(labels)) == 2 and max(map(len, labels)) <= STORE_LABEL_MAX
