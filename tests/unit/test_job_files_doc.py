"""docs/job-files.md is made from the declarations (issue 48 §1): it regenerates without drift, documents every key
of every registered analysis and of every other section load_job reads, its examples are jobs load_job reads as the
page says, and `raygeom explain NAME` prints one section (an unknown NAME: one line with the nearest, exit 2)."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from typer.testing import CliRunner

from raygeom.analyses import registry
from raygeom.cli.root import app
from raygeom.jobs import reference
from raygeom.jobspec import SWEEP_KEYS, TRAIN_KEYS, load_job

PAGE = Path(__file__).resolve().parents[2] / "docs" / "job-files.md"


def test_the_page_regenerates_without_drift():
    assert PAGE.read_text() == reference.markdown(), "regenerate: raygeom explain --markdown > docs/job-files.md"
    shown = CliRunner().invoke(app, ["explain", "--markdown"])
    assert shown.exit_code == 0 and shown.output == PAGE.read_text()


def _section(heading: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"### `{heading}`")
    end = text.find("\n### ", start + 1)
    return text[start : end if end > 0 else None]


def _keys(block: str) -> set[str]:
    return set(re.findall(r"^\| `([a-z_0-9]+)` \|", block, flags=re.M))


def test_every_key_of_every_registered_analysis_is_documented():
    known = registry.analyses()
    assert len(known) >= 12
    for name, analysis in known.items():
        documented = _keys(_section(f"[analyses.{name}]"))
        declared = {f.name for f in analysis.Params.declared()}
        assert documented == declared, (name, declared ^ documented)
        for spec in analysis.Params.declared():  # its help text as declared, | and < escaped for Markdown
            assert spec.metadata["help"].replace("|", "\\|").replace("<", "\\<") in _section(f"[analyses.{name}]")


def test_every_key_load_job_reads_is_documented():
    from raygeom.analyses.train import TrainSettings
    from raygeom.jobspec import MODEL_KEYS, CorpusSection, JobSection, TrajectorySettings, WidthSettings
    from raygeom.params import PGAParams
    from raygeom.replica.settings import ExtractionSettings

    def names(cls):
        return {f.name for f in cls.declared()}

    expected = {
        "[job]": names(JobSection),
        "[[models]]": set(MODEL_KEYS),
        "[corpus]": names(CorpusSection),
        "[extract]": names(ExtractionSettings) | {"layers"},
        "[pga]": names(PGAParams),
        "[sweep]": set(SWEEP_KEYS),
        "[train]": set(TRAIN_KEYS) | {f.name for f in fields(TrainSettings)},
        "[trajectory]": names(TrajectorySettings),
        "[width]": names(WidthSettings),
    }
    for heading, keys in expected.items():
        assert _keys(_section(heading)) == keys, (heading, keys ^ _keys(_section(heading)))


def _blocks() -> list[str]:
    return re.findall(r"```toml\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_the_page_examples_are_jobs_that_load_as_it_says(tmp_path):
    grid, ladder, complete, every = _blocks()
    head = "[[models]]\nid = 'smollm2'\n"
    job = tmp_path / "grid.toml"
    job.write_text(head + grid)
    assert [p.params.r for p in load_job(job).planned()] == [0, 1, 5]
    job.write_text(head + ladder)
    assert [(p.params.k_per_d, p.analysis) for p in load_job(job).planned()] == [
        (0.05, "pga"),
        (0.1, "pga"),
        (0.2, "pga"),
        (0.0, "pga"),
    ]
    job.write_text(complete)
    loaded = load_job(job)
    assert [m.source for m in loaded.models] == ["smollm2", "gemma3-270m"]
    assert [p.analysis for p in loaded.planned()] == ["pga", "pga", "spectral", "convergence"]
    job.write_text(every)  # every registered analysis at its defaults: a job load_job accepts as it is
    assert {p.analysis for p in load_job(job).planned()} == set(registry.analyses())
    # [pga] alone is PGA of every layer; beside [analyses] tables it adds no PGA run
    job.write_text(head + "[pga]\nk = 7\n")
    assert [(p.analysis, p.params.k) for p in load_job(job).planned()] == [("pga", 7)]
    job.write_text(head + "[pga]\nk = 7\n[analyses.spectral]\n")
    assert [p.analysis for p in load_job(job).planned()] == ["spectral"]


def test_explain_prints_one_analysis_or_section():
    for name in ("spectral", "knn_lm", "extract", "[analyses.twonn]", "models"):
        shown = CliRunner().invoke(app, ["explain", name])
        assert shown.exit_code == 0, shown.output
        section = next(s for s in reference.sections() if s.name == name.strip("[]").removeprefix("analyses."))
        for key in section.keys:
            assert f"\n{key.name}" in shown.output and key.help in shown.output


def test_explain_of_an_unknown_name_is_one_line_with_the_nearest():
    shown = CliRunner().invoke(app, ["explain", "spectra"])
    assert shown.exit_code == 2
    lines = shown.output.strip().splitlines()
    assert len(lines) == 1 and "did you mean spectral?" in lines[0], shown.output
