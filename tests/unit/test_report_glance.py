"""The report is right at a glance, read as a browser gets it (the plotly figures embedded in the HTML, typed arrays
decoded): from a store with two models x CCR 0/1/5 x two revisions, no two lines of one panel look alike (colour,
dash, marker), every line runs left to right, legends stay short and name what varies, and every section is one
analysis that has rows, once."""

import html
import re
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from raygeom.analyses import registry
from raygeom.report.html import build_sections, write_report
from raygeom.store.tree import atomic_write_table
from tests.figures import decode, figures_of
from tests.synthetic import declared_rows, job_store_rows, write_analysis_store, write_job_store

MODELS, REVISIONS, RANKS = ("EleutherAI--pythia-14m", "EleutherAI--pythia-31m"), ("step1000", "step143000"), (0, 1, 5)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = write_job_store(tmp_path_factory.mktemp("job"), models=MODELS, revisions=REVISIONS, ranks=RANKS)
    text = write_report(root).read_text()
    return root, text, figures_of(text)


def series_traces(figure: dict) -> list[dict]:
    """The lines a reader tells apart in the legend (not bands, chance levels or heatmap marks)."""
    return [
        t
        for t in figure["data"]
        if t.get("type", "scatter") == "scatter"
        and "lines" in str(t.get("mode", ""))
        and t.get("fill") != "toself"
        and t.get("showlegend") is not False
    ]


def test_no_two_lines_of_a_panel_look_alike(page):
    _, _, figures = page
    checked = 0
    for figure in figures:
        looks = [
            (t["line"].get("color"), t["line"].get("dash"), t.get("marker", {}).get("symbol")) for t in series_traces(figure)
        ]
        assert all(None not in look for look in looks), figure["layout"]["title"]
        repeated = [look for look, n in Counter(looks).items() if n > 1]
        assert not repeated, (figure["layout"]["title"]["text"], repeated)
        checked += len(looks)
    # each model's PGA panel: 2 revisions x 3 ranks; the last-revision panel: 2 models x 3 ranks; spectral 4 x (2+2+2),
    # probe 2+2+2
    assert checked == 2 * 6 + 6 + 4 * 6 + 6


def test_colour_is_the_revision_and_dash_and_marker_the_ccr_rank(page):
    _, _, figures = page
    panel = next(f for f in figures if f["layout"]["title"]["text"] == f"{MODELS[0]}: Subspace PGA z by depth")
    lines = series_traces(panel)
    assert sorted(t["name"] for t in lines) == sorted(f"{rev}, CCR-{r}" for rev in REVISIONS for r in RANKS)
    by_revision = {rev: {t["line"]["color"] for t in lines if t["name"].startswith(rev + ",")} for rev in REVISIONS}
    assert all(len(colours) == 1 for colours in by_revision.values()) and len(set.union(*by_revision.values())) == 2
    by_rank = {r: {(t["line"]["dash"], t["marker"]["symbol"]) for t in lines if t["name"].endswith(f"CCR-{r}")} for r in RANKS}
    assert all(len(styles) == 1 for styles in by_rank.values()) and len(set.union(*by_rank.values())) == 3
    # what the legend leaves out is in the hover: the model, the revision and every setting
    hover = next(t for t in lines if t["name"] == "step1000, CCR-5")["hovertemplate"]
    for setting in (MODELS[0], "step1000", "CCR-5", "k=8", "20 nulls", "pool=last", "seq_len=32", "corpus=bbc"):
        assert setting in hover, setting
    last = next(
        f
        for f in figures
        if "every model at its last revision" in f["layout"]["title"]["text"] and "PGA" in f["layout"]["title"]["text"]
    )
    colours = {t["name"].split(",")[0]: t["line"]["color"] for t in series_traces(last)}
    assert set(colours) == set(MODELS) and len(set(colours.values())) == 2  # across models: colour by model


def test_every_line_runs_left_to_right_and_each_point_is_a_row(page):
    _, _, figures = page
    rows = job_store_rows(models=MODELS, revisions=REVISIONS, ranks=RANKS)["pga"]
    for figure in figures:
        for trace in series_traces(figure):
            x = decode(trace["x"])
            assert x.dtype.kind == "f" and np.all(np.diff(x) > 0), trace["name"]
    panel = next(f for f in figures if f["layout"]["title"]["text"] == f"{MODELS[1]}: Subspace PGA z by depth")
    line = next(t for t in series_traces(panel) if t["name"] == "step143000, CCR-1")
    expected = sorted(
        (r for r in rows if r["model"] == MODELS[1] and r["revision"] == "step143000" and r["r"] == 1),
        key=lambda r: r["relative_depth"],
    )
    assert decode(line["y"]).tolist() == pytest.approx([r["z"] for r in expected])


def test_legend_labels_are_short(page):
    _, _, figures = page
    labels = [t["name"] for f in figures for t in f["data"] if t.get("showlegend") is not False and t.get("name")]
    assert labels and max(map(len, labels)) <= 40, max(labels, key=len)


def test_one_section_per_analysis_that_has_rows_and_one_series_per_revision(page):
    root, text, figures = page
    headings = re.findall(r"<section id='([^']+)'><h2>([^<]+)</h2>", text)
    anchors = [anchor for anchor, _ in headings]
    assert len(anchors) == len(set(anchors))
    titles = {a.title: a for a in registry.analyses().values()}
    for anchor, heading in headings:
        if anchor in ("settings", "files"):  # the store's extractions and files, not an analysis
            continue
        assert heading in titles, heading
        analysis = titles[heading]
        assert (root / "results" / analysis.results_dir).is_dir() or (
            root / "results" / f"{analysis.results_dir}.parquet"
        ).is_file()
    assert [a for a, _ in headings if a not in ("settings", "files")] == ["pga", "probe", "spectral"]
    assert "Diagnostics" not in text
    # k_per_d written as 0.0 by the units and absent from the sweep's table is one setting: one heatmap per model and
    # rank, one line per revision and rank
    heatmaps = [
        f["layout"]["title"]["text"]
        for f in figures
        if f["data"][0].get("type") == "heatmap" and "PGA" in f["layout"]["title"]["text"]
    ]
    assert sorted(heatmaps) == sorted(f"{m}: Subspace PGA z over training (CCR-{r})" for m in MODELS for r in RANKS)
    assert "k_per_d" not in " ".join(t.get("name") or "" for f in figures for t in f["data"])


def test_each_registered_analysis_with_rows_gets_exactly_one_section_from_its_declaration(tmp_path, monkeypatch):
    """Over the whole registry: from a store holding rows of every registered analysis (shaped as each declares them),
    each gets exactly one section, anchored by its name and headed by its title, drawn once by the function its
    declaration names or, without one, as the generic section of its declared metrics (a panel per metric); from a
    store holding the rows of half of them, only those half have sections."""
    from raygeom.report import renderers

    analyses = registry.analyses()
    own = {name for name in analyses if renderers.renderer(name).section}
    named = [renderers.renderer(name).section for name in own]
    assert own and len(named) == len(set(named))  # a section draws one analysis
    drawn = Counter()
    for name in own:
        drawing = renderers.renderer(name)

        def spy(root, draw=drawing.section, name=name):
            drawn[name] += 1
            return draw(root)

        monkeypatch.setitem(renderers._RENDERERS, name, renderers.Renderer(section=spy, figures=drawing.figures))
    root = write_analysis_store(tmp_path / "every", analyses, revisions=("step143000",))
    text = write_report(root).read_text()
    headings = [(a, html.unescape(h)) for a, h in re.findall(r"<section id='([^']+)'><h2>([^<]+)</h2>", text)]
    assert headings[-1] == ("files", "Files")
    assert headings[:-1] == [(name, analyses[name].title) for name in ["pga", *sorted(set(analyses) - {"pga"})]]
    assert drawn == Counter({name: 1 for name in own})
    for section in build_sections(root):
        analysis = analyses[section.anchor]
        assert section.figures, section.anchor
        if analysis.name not in own:  # one revision per model: one panel per declared metric, every model in it
            titles = [f.layout.title.text for f in section.figures]
            assert titles == [f"{m.title} by depth" for m in analysis.metrics], (section.anchor, titles)
    names = sorted(analyses)
    half = {name: analyses[name] for name in names[1::2]}
    root = write_analysis_store(tmp_path / "half", half, revisions=("step143000",))
    # and one more whose rows carry no number to draw: no empty section for it
    empty = next(
        a
        for a in analyses.values()
        if a.name not in half and a.name not in own and a.results_dir not in {h.results_dir for h in half.values()}
    )
    blank = [{**r, **{c: None for m in empty.metrics for c in (m.column, m.lo, m.hi)}} for r in declared_rows(empty)]
    atomic_write_table(pa.Table.from_pylist(blank), root / "results" / f"{empty.results_dir}.parquet")
    assert sorted(s.anchor for s in build_sections(root)) == sorted(half)
