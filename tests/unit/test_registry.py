"""The analysis registry: every declared parameter of every registered analysis is refused, with one line naming
it, when wrong, both as a command-line flag and as a job-file key; nothing is left behind. Generated from the
declarations, so a new parameter or analysis is covered without a new test."""

import math
from dataclasses import fields
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raygeom.analyses import registry
from raygeom.cli.root import app
from raygeom.params import Params, declared_type, check_value

ANALYSES = registry.analyses()


def bad_values(cls, spec) -> list[tuple[str, object, str]]:
    """(case, job-file value, command-line text) that the declaration must refuse."""
    kind, meta = declared_type(cls, spec.name), spec.metadata
    cases = []
    if kind is int:
        cases += [("wrong type", 1.5, "1.5"), ("empty", "", "")]
    elif kind is float:
        cases += [("wrong type", "abc", "abc"), ("nan", math.nan, "nan"), ("empty", "", "")]
    elif kind is str:
        cases += [("wrong type", 5, None)] + ([("empty", "", "")] if meta.get("nonempty") else [])
    elif kind is bool:
        cases += [("wrong type", "yes", None)]
    if meta.get("low") is not None:
        below = meta["low"] if meta["low_open"] else meta["low"] - 1
        cases.append(("out of range", below, str(below)))
    if meta.get("high") is not None:
        above = meta["high"] if meta["high_open"] else meta["high"] + 1
        cases.append(("out of range", above, str(above)))
    return cases


def declared_cases():
    for name, analysis in sorted(ANALYSES.items()):
        for spec in analysis.Params.declared():
            for case, value, text in bad_values(analysis.Params, spec):
                yield pytest.param(name, spec, value, text, id=f"{name}.{spec.name}:{case}")


def test_every_analysis_declares_what_the_cli_job_and_report_need():
    assert {"pga", "spectral", "pc1", "probe", "twonn"} <= set(ANALYSES)
    for name, analysis in ANALYSES.items():
        assert analysis.name == name and isinstance(analysis.version, int) and analysis.title
        assert issubclass(analysis.Params, Params) and analysis.Params.declared(), name
        for spec in analysis.Params.declared():
            assert spec.metadata["help"], f"{name}.{spec.name} has no help"
            check_value(analysis.Params, spec.name, getattr(analysis.Params(), spec.name))  # defaults are allowed
        columns = set(analysis.columns)
        for metric in analysis.metrics:
            assert {metric.column, metric.lo, metric.hi, metric.chance} - {None} <= columns | {"pc1_readout_chance"}, name
        assert set(analysis.series) <= {f.name for f in fields(analysis.Params)}, name


@pytest.mark.parametrize("name,spec,value,text", list(declared_cases()))
def test_bad_value_is_refused_by_its_declaration(name, spec, value, text, tmp_path):
    runner = CliRunner()
    flag = spec.metadata.get("flag") or "--" + spec.name.replace("_", "-")
    out = tmp_path / "out"
    if text is not None:
        result = runner.invoke(app, ["analyze", name, flag, text, "--out", str(out)])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and flag in lines[0] and "must be" in lines[0], result.output
        assert not out.exists()
    job = tmp_path / "job.toml"
    literal = "nan" if isinstance(value, float) and math.isnan(value) else repr(value).replace("'", '"')
    if isinstance(value, bool) or value is True:
        literal = str(value).lower()
    job.write_text(f"[job]\nout = {str(out)!r}\n[[models]]\nid = 'smollm2'\n[analyses.{name}]\n{spec.name} = {literal}\n")
    result = runner.invoke(app, ["run", str(job)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"[analyses.{name}] {spec.name} must be" in lines[0], result.output
    assert not out.exists()


def test_lists_in_a_job_file_are_grids(tmp_path):
    from raygeom.jobspec import load_job

    job = tmp_path / "job.toml"
    job.write_text("[[models]]\nid = 'smollm2'\n[extract]\nlayers = [0, 5, -1]\n"
                   "[analyses.pga]\nr = [0, 1, 5]\nk = 16\n[analyses.spectral]\n[analyses.twonn]\n")
    spec = load_job(job)
    assert spec.layers == "0,5,-1"
    planned = spec.planned()
    assert [(p.analysis, getattr(p.params, "r", None)) for p in planned] == [("pga", 0), ("pga", 1), ("pga", 5),
                                                                             ("spectral", None), ("twonn", None)]
    assert all(p.params.k == 16 for p in planned if p.analysis == "pga")
    overridden = spec.with_overrides(k=8).planned()
    assert [getattr(p.params, "k", None) for p in overridden] == [8, 8, 8, 8, None]


def test_unknown_analysis_and_key_are_refused_in_one_line(tmp_path):
    runner = CliRunner()
    for body, expected in (("[analyses.nope]\n", "unknown analysis 'nope'"),
                           ("[analyses.pga]\nkk = 3\n", "unknown key(s): kk"),
                           ("[analyses.pga]\nr = []\n", "r is an empty list")):
        job = tmp_path / "job.toml"
        job.write_text(f"[job]\nout = '{tmp_path / 'out'}'\n[[models]]\nid = 'smollm2'\n" + body)
        result = runner.invoke(app, ["run", str(job)])
        assert result.exit_code == 2 and expected in result.output, result.output
        assert not Path(tmp_path / "out").exists()


# Job-file sections declared with Params: each with the smallest valid job around it.
SECTIONS = {
    "job": ("raygeom.jobspec", "JobSection", "[[models]]\nid = 'smollm2'\n"),
    "corpus": ("raygeom.jobspec", "CorpusSection", "[[models]]\nid = 'smollm2'\n"),
    "sweep": ("raygeom.jobspec", "SweepSettings", "[[models]]\nid = 'smollm2'\n"),
    "trajectory": ("raygeom.jobspec", "TrajectorySettings", "[train]\nrun_dir = 'run'\nsave_every = 100\n"),
    "train": ("raygeom.analyses.train", "TrainSettings", ""),
    "extract": ("raygeom.replica.settings", "ExtractionSettings", "[[models]]\nid = 'smollm2'\n"),
    "width": ("raygeom.jobspec", "WidthSettings",
              "[train]\nrun_dir = 'run'\nsave_every = 100\nhidden_size = [32, 64]\n"),
}


def section_cases():
    import importlib

    for section, (module, name, base) in SECTIONS.items():
        cls = getattr(importlib.import_module(module), name)
        for spec in cls.declared():
            for case, value, _ in bad_values(cls, spec):
                yield pytest.param(section, base, spec, value, id=f"[{section}].{spec.name}:{case}")


def toml_literal(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return repr(value).replace("'", '"')


@pytest.mark.parametrize("section,base,spec,value", list(section_cases()))
def test_bad_job_section_value_is_refused_by_its_declaration(section, base, spec, value, tmp_path):
    out = tmp_path / "out"
    body = {"train": "run_dir = 'run'\nsave_every = 100\n"}.get(section, "")
    if section == "job":
        text = f"{base}[job]\n{spec.name} = {toml_literal(value)}\n" + ("" if spec.name == "out" else f"out = {str(out)!r}\n")
    else:
        text = f"[job]\nout = {str(out)!r}\n{base}[{section}]\n{body}{spec.name} = {toml_literal(value)}\n"
    job = tmp_path / "job.toml"
    job.write_text(text)
    result = CliRunner().invoke(app, ["run", str(job)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"[{section}] {spec.name} must be" in lines[0], result.output
    assert not out.exists() and not (tmp_path / "run").exists()


def _numeric_options():
    import typer

    from raygeom.cli.root import app as root_app

    group = typer.main.get_command(root_app)

    def walk(command, path):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, [*path, name])
            return
        for option in command.params:
            kind = option.bare_type() if option.param_type_name == "option" else None
            if kind in (int, float, "int", "float") and option.opts[0].startswith("--"):
                yield pytest.param(path, option.opts[0], id=f"{' '.join(path)} {option.opts[0]}")

    yield from walk(group, [])


@pytest.mark.parametrize("path,flag", list(_numeric_options()))
def test_every_numeric_flag_of_every_command_refuses_text_in_one_line(path, flag, tmp_path, monkeypatch, capsys):
    """The hand-written commands' typed flags too: a value their type cannot parse is one line and exit 2 (the CLI's
    main() turns click's usage errors into its one-line refusal), before anything starts."""
    import sys

    from raygeom.cli import root

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["raygeom", *path, flag, "not-a-number"])
    with pytest.raises(SystemExit) as done:
        root.main()
    assert done.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and flag in lines[0] and "error:" in lines[0], lines
    assert list(tmp_path.iterdir()) == []
