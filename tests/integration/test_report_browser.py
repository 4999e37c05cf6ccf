"""The HTML report in a real browser (headless Chromium, Debian's package): a store filled by every command
on tiny offline Pythia models, and a synthetic store of the full Pythia grid. Each page must show every
plot, log no JavaScript error, request nothing but itself, answer a legend click and not be blank."""

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.browser import CHROMIUM, pixel_spread, visit

pytestmark = pytest.mark.integration
SCREENSHOTS = os.environ.get("RAYGEOM_SCREENSHOTS")  # keep the screenshots there when set

PROBE = """(() => {
  const divs = [...document.querySelectorAll('.plotly-graph-div')];
  return {figures: divs.length,
          rendered: divs.filter(d => d.querySelector('.main-svg') && d._fullData && d._fullData.length > 0).length,
          sections: [...document.querySelectorAll('section')].map(s => s.id),
          firstVisible: document.getElementById('fig-1')._fullData[0].visible};
})()"""
FIRST_LEGEND_ITEM = "#fig-1 .legend .traces"
AFTER_CLICK = "document.getElementById('fig-1')._fullData[0].visible"


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail("headless Chromium is missing: `make test` installs it (apt-get install -y chromium), see the README")
    return CHROMIUM


def invoke(*args):
    from raygeom.cli.root import app

    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def corpus(path: Path) -> Path:
    from raygeom.testing import TINY_TEXT, varied_text

    sentences = [s for s in TINY_TEXT.split(" . ") if s]
    with path.open("w") as handle:
        for i in range(60):
            text = (
                f"{varied_text(i)} {sentences[i % 5]} {i} {sentences[(2 * i + 1) % 6]} {3 * i} {sentences[(i + 2) % 5]} . "
                f"{sentences[(i + 3) % 5]}"
            )
            handle.write(json.dumps({"text": text, "label": ["markets", "politics", "sport"][i % 3]}) + "\n")
    return path


@pytest.fixture(scope="module")
def every_command_store(hub_cache, ray_local, warm_replicas, tmp_path_factory):
    """One store written by pga (three revisions: a heatmap), diagnose, probe, converge, dispersion, select, knn, train.

    The commands after pga reuse the replicas it loaded (tests/conftest.py warm_replicas) instead of starting their
    own, each about 7 s of importing torch and transformers in a new Ray worker: 3 replica starts instead of 11."""
    # Ray Data/Train set up their log handlers on the stderr of the moment they are first imported; inside
    # CliRunner that stream is closed afterwards, and later tests' ray.data logging would hit it.
    import ray.data  # noqa: F401
    import ray.train  # noqa: F401

    root = tmp_path_factory.mktemp("every")
    text, out = corpus(root / "topics.jsonl"), root / "store"
    model = "EleutherAI/pythia-14m"
    extract = ["-c", text, "-n", 24, "--seq-len", 16, "--out", out]
    started = time.perf_counter()
    printed = invoke(
        "pga",
        "-m",
        model,
        "-r",
        "step0",
        "-r",
        "step1000",
        "-r",
        "step143000",
        *extract,
        "--k",
        8,
        "--n-null",
        6,
        "--null-chunks",
        2,
    )
    assert f"report:  {out / 'report.html'}" in " ".join(printed.split("\n"))
    invoke("diagnose", "-m", model, "-r", "step1000", *extract, "--k", 8, "--ccr-ranks", "0,1", "--n-null", 6, "--null-chunks", 2)
    invoke("probe", "-m", model, "-r", "step1000", *extract)
    invoke("converge", "-m", f"{model}@step0", "-m", f"{model}@step1000", *extract, "--k", 8, "--n-null", 6, "--null-chunks", 2)
    chunks = ["-c", text, "--chunk-len", 32, "--chunks-per-domain", 6, "--batch-size", 4, "--out", out]
    invoke("dispersion", "-m", model, "-r", "step1000", *chunks, "--group-size", 3, "--n-groups", 5, "--n-slices", 3)
    invoke("select", "-m", model, "-r", "step0", "-r", "step1000", *chunks)
    invoke(
        "knn",
        "-m",
        model,
        "-r",
        "step1000",
        "-c",
        text,
        "--chunk-len",
        48,
        "--train-chunks",
        6,
        "--test-chunks",
        4,
        "--k",
        8,
        "--lam",
        "0.25,0.5",
        "--bootstrap-block",  # 2 evaluation chunks x 6 blocks: at least the 10 an interval needs
        8,
        "--out",
        out,
    )
    printed = invoke(
        "train",
        "-c",
        text,
        "--lam",
        0.5,
        "--steps",
        8,
        "--batch-size",
        8,
        "--seq-len",
        32,
        "--hidden-size",
        32,
        "--n-layers",
        2,
        "--vocab-size",
        300,
        "--eval-every",
        4,
        "--out",
        out,
    )
    assert "report:" in printed
    print(f"every-command store built in {time.perf_counter() - started:.0f} s, replicas started: {warm_replicas.started}")
    return out


def check_page(path: Path, name: str, expected_sections: set[str]) -> dict:
    page = visit(path, probe=PROBE, click=FIRST_LEGEND_ITEM, after_click=AFTER_CLICK)
    assert page.errors == [], page.errors
    own = path.resolve().as_uri()
    assert [u for u in page.requests if u != own and not u.startswith("data:")] == []  # offline: nothing else is fetched
    probe = page.probe
    assert probe["figures"] == path.read_text().count("Plotly.newPlot(") and probe["rendered"] == probe["figures"], probe
    assert expected_sections <= set(probe["sections"]), probe["sections"]
    assert probe["firstVisible"] is True and page.after_click == "legendonly"  # a legend click hides that line
    spread, colours = pixel_spread(page.screenshot)
    assert spread > 10 and colours > 500, (spread, colours)  # a blank or one-colour page has ~0 and a handful
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        (Path(SCREENSHOTS) / f"{name}.png").write_bytes(page.screenshot)
        shutil.copyfile(path, Path(SCREENSHOTS) / f"{name}.html")
    return probe


def test_report_of_a_store_every_command_wrote_renders_in_chromium(browser, every_command_store):
    path = every_command_store / "report.html"  # the last command's report covers everything in the store
    analyses = {"pga", "spectral", "probe", "convergence", "token_dispersion", "slices", "gap", "knn_lm", "diagnostics"}
    expected = analyses | {"train", "settings"}  # the sections of what is not an analysis
    probe = check_page(path, "every-command", expected)
    assert probe["figures"] >= 12


def test_report_of_the_full_pythia_grid_is_bounded_and_renders(browser, tmp_path):
    from raygeom.report.html import write_report
    from tests.synthetic import write_pythia_grid_store

    root = write_pythia_grid_store(tmp_path)
    started = time.perf_counter()
    path = write_report(root)
    seconds = time.perf_counter() - started
    size = path.stat().st_size
    print(f"full Pythia grid (32,956 units): {size / 1e6:.1f} MB in {seconds:.0f} s")
    assert size < 30e6
    check_page(path, "pythia-grid", {"pga"})  # the sweep heatmaps are in the PGA section


def test_report_of_a_store_every_command_wrote_has_no_rough_edges(every_command_store):
    """As the every-analysis job's report (tests/integration/test_every_analysis_job.py), on the store the commands
    filled one by one: three revisions of one model (a heatmap), each command's extraction kind listed."""
    from tests.report_checks import assert_no_rough_edges, extraction_kinds

    page, figures = assert_no_rough_edges(every_command_store)
    assert extraction_kinds(page) == {"pooled", "chunks", "knn"}
    assert any(trace.get("type") == "heatmap" for figure in figures for trace in figure["data"])
