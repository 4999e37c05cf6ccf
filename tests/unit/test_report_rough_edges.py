"""The report's rough edges, each on a small synthetic store: many layers on one ordered colour scale with a colour
bar, a section only for an analysis a job asked for, tables sorted, ticks readable, and console tables in one box
style that fits a 120-column log."""

import io
import re

import pyarrow as pa
import pyarrow.parquet as pq

from raygeom.analyses import registry
from raygeom.analyses.results_table import asked, record_asked
from raygeom.cli.consoles import TABLE_WIDTH, LogConsole
from raygeom.report.html import build_sections, write_report
from raygeom.report.tables import print_lines
from raygeom.store.tree import atomic_write_table
from tests.figures import figures_of
from tests.report_checks import alike_series, has_colour_bar, looks, small_or_turned_ticks, tables_of, unsorted_tables
from tests.synthetic import write_analysis_store

CHUNK_ANALYSES = ("token_dispersion", "slices")
N_LAYERS = 30


def chunk_store(root):
    analyses = {name: registry.get(name) for name in CHUNK_ANALYSES}
    return write_analysis_store(root, analyses, revisions=("step143000",), n_layers=N_LAYERS)


def test_an_analysis_sharing_its_rows_gets_a_section_only_where_a_job_asked_for_it(tmp_path):
    root = chunk_store(tmp_path / "store")
    assert asked(root) is None
    before = {s.anchor for s in build_sections(root)}
    assert set(CHUNK_ANALYSES) <= before  # a store that records nothing: every analysis with rows, as before
    record_asked(root, "token_dispersion")
    record_asked(root, "token_dispersion")
    assert asked(root) == {"token_dispersion"}
    after = {s.anchor for s in build_sections(root)}
    assert "token_dispersion" in after and "slices" not in after
    record_asked(root, "slices")
    assert set(CHUNK_ANALYSES) <= {s.anchor for s in build_sections(root)}


def test_perplexity_groups_of_many_layers_are_coloured_by_depth_with_a_colour_bar(tmp_path):
    root = chunk_store(tmp_path / "store")
    layers = ["embed", *[f"block_{i:02d}" for i in range(N_LAYERS - 2)], "final_norm"]
    groups = [
        {"model": model, "layer": layer, "group": g, "mean_perplexity": 10.0 + g, "mean_dispersion": 0.1 * g + i / 100}
        for model in ("EleutherAI--pythia-14m", "EleutherAI--pythia-31m")
        for i, layer in enumerate(reversed(layers))  # stored in no particular order
        for g in range(5)
    ]
    atomic_write_table(pa.Table.from_pylist(groups), root / "results" / "dispersion_groups.parquet")
    figures = figures_of(write_report(root).read_text())
    panels = [f for f in figures if "perplexity groups" in f["layout"]["title"]["text"]]
    assert len(panels) == 2
    for panel in panels:
        series = looks(panel)
        assert [name for name, _ in series] == layers  # in depth order in the legend
        colours = [look[0] for _, look in series]
        assert len(set(colours)) == N_LAYERS  # no palette of ten repeating over 30 layers
        assert has_colour_bar(panel)
        bar = next(t for t in panel["data"] if (t.get("marker") or {}).get("showscale"))
        assert "depth" in bar["marker"]["colorbar"]["title"]["text"]
    assert alike_series(figures) == [] and small_or_turned_ticks(figures) == []


def test_tables_are_sorted_by_model_revision_and_depth_and_ticks_are_readable(tmp_path):
    analyses = {name: registry.get(name) for name in CHUNK_ANALYSES}
    root = write_analysis_store(tmp_path / "store", analyses, revisions=("step143000", "step1000", "step512"), n_layers=6)
    path = root / "results" / "dispersion_layers.parquet"
    rows = pq.read_table(path).to_pylist()[::-1]  # stored last model, revision and layer first
    atomic_write_table(pa.Table.from_pylist(rows), path)
    page = write_report(root).read_text()
    depth = {(r["model"], r["layer"]): r["relative_depth"] for r in rows}
    per_layer = next(t for t in tables_of(page) if "token_dispersion" in t[0])
    assert [(r["model"], r["revision"], r["layer"]) for r in per_layer[:3]] == [
        ("EleutherAI--pythia-14m", "step512", layer) for layer in ("embed", "block_00", "block_01")
    ]
    assert unsorted_tables(page, depth) == []
    figures = figures_of(page)
    assert small_or_turned_ticks(figures) == [] and alike_series(figures) == []


def test_markdown_console_lines_print_as_box_tables_that_fit_a_log_line():
    out = io.StringIO()
    console = LogConsole(file=out, width=1000)  # piped: raygeom.cli.consoles.WIDE
    header = ["layer", *(f"a rather long column heading {i}" for i in range(8))]
    lines = [
        "kNN-LM  some/model@step1000  (a line before the table stays as it is)",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join([f"block_{i:02d}", *(f"{i * 0.1234:.4f} [0.1, 0.2]" for _ in range(8))]) + " |" for i in range(3)),
        "",
        "best layer: block_01",
    ]
    print_lines(console, lines)
    printed = out.getvalue().splitlines()
    assert printed[0] == lines[0] and printed[-1] == lines[-1]
    assert not any(line.startswith("|") for line in printed)
    table = [line for line in printed if re.match(r"[┏┃┡│└]", line)]
    assert table and max(len(line) for line in table) <= TABLE_WIDTH
    assert sum("block_0" in line for line in printed) >= 3


def test_the_extractions_table_lists_every_kind_the_store_holds(tmp_path):
    from raygeom.store.tree import atomic_write_text
    from tests.report_checks import extraction_kinds
    from tests.synthetic import write_job_store

    root = write_job_store(tmp_path / "store", models=("EleutherAI--pythia-14m",), revisions=("step0",), ranks=(0,))
    (root / "activations" / "model=m" / "revision=step0").mkdir(parents=True)
    atomic_write_text(
        '{"model": "m", "revision": "step0", "settings": {"pool": "mean"}}',
        root / "activations" / "model=m" / "revision=step0" / "_COMPLETE.json",
    )
    summary = [{"model": "m", "revision": "step0", "layer": name, "d": 8, "key": "abc", "chunk_len": 64} for name in "xy"]
    atomic_write_table(pa.Table.from_pylist(summary), root / "dispersion" / "model=m" / "revision=step0" / "summary-abc.parquet")
    atomic_write_text(
        '{"key": "def", "layers": ["embed", "attn_last"], "model": "m", "revision": "step0", "settings": {"chunk_len": 48}}',
        root / "knn" / "model=m" / "revision=step0" / "def" / "_COMPLETE.json",
    )
    page = write_report(root).read_text()
    assert extraction_kinds(page) == {"pooled", "chunks", "knn"}
