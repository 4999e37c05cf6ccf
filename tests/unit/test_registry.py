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
from raygeom.params import Params, check_value, declared_type

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
    if meta.get("rule"):  # a string with a grammar (a comma-separated list of numbers): text that is not one
        cases.append(("not allowed by its rule", "x,", "x,"))
    if meta.get("low") is not None:
        below = meta["low"] if meta["low_open"] else meta["low"] - 1
        cases.append(("out of range", below, str(below)))
    if meta.get("high") is not None:
        above = meta["high"] if meta["high_open"] else meta["high"] + 1
        cases.append(("out of range", above, str(above)))
    if kind is int:  # a run that could never end (or numpy overflows): TOML's largest integer
        cases.append(("absurdly large", 2**63 - 1, str(2**63 - 1)))
    return cases


def every_params_class() -> list[type]:
    import raygeom.analyses.train  # noqa: F401 - each module declaring Params is imported, so every subclass is seen
    import raygeom.cli.root  # noqa: F401
    import raygeom.jobspec  # noqa: F401

    found, todo = [], [Params]
    while todo:
        cls = todo.pop()
        found += cls.__subclasses__()
        todo += cls.__subclasses__()
    return sorted(set(found), key=lambda c: (c.__module__, c.__name__))


def test_every_declared_number_has_a_range_a_run_can_meet():
    """Item 1 of issue 41: a number with no upper bound ran forever (n_boot = 2**63 - 1) or stored NaN."""
    unbounded = [
        f"{cls.__module__}.{cls.__name__}.{spec.name}"
        for cls in every_params_class()
        for spec in cls.declared()
        if declared_type(cls, spec.name) in (int, float)
        and (spec.metadata.get("low") is None or spec.metadata.get("high") is None)
        or spec.metadata.get("rule")
        and "<=" not in spec.metadata["rule"][1]
    ]
    assert len(every_params_class()) >= 15 and not unbounded, unbounded


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
    job.write_text(
        "[[models]]\nid = 'smollm2'\n[extract]\nlayers = [0, 5, -1]\n"
        "[analyses.pga]\nr = [0, 1, 5]\nk = 16\n[analyses.spectral]\n[analyses.twonn]\n"
    )
    spec = load_job(job)
    assert spec.layers == "0,5,-1"
    planned = spec.planned()
    assert [(p.analysis, getattr(p.params, "r", None)) for p in planned] == [
        ("pga", 0),
        ("pga", 1),
        ("pga", 5),
        ("spectral", None),
        ("twonn", None),
    ]
    assert all(p.params.k == 16 for p in planned if p.analysis == "pga")
    overridden = spec.with_overrides(k=8).planned()
    assert [getattr(p.params, "k", None) for p in overridden] == [8, 8, 8, 8, None]


def test_unknown_analysis_and_key_are_refused_in_one_line(tmp_path):
    runner = CliRunner()
    for body, expected in (
        ("[analyses.nope]\n", "unknown analysis 'nope'"),
        ("[analyses.pga]\nkk = 3\n", "unknown key(s): kk"),
        ("[analyses.pga]\nr = []\n", "r is an empty list"),
    ):
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
    "width": ("raygeom.jobspec", "WidthSettings", "[train]\nrun_dir = 'run'\nsave_every = 100\nhidden_size = [32, 64]\n"),
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


# ------------------------------------------------------------------ the hand-written commands' declared flags


def _commands():
    """(path, click command) of every command of the app, each callback once (`analyze pga` and `pga` are two)."""
    import typer

    from raygeom.cli.root import app as root_app

    def walk(command, path):
        if hasattr(command, "commands"):
            for name, sub in sorted(command.commands.items()):
                yield from walk(sub, [*path, name])
        else:
            yield path, command

    return list(walk(typer.main.get_command(root_app), []))


def _arguments(command) -> list[str]:
    """A value for each required argument (a job file that is not there: a flag refused first never reads it)."""
    return ["job.toml" for p in command.params if p.param_type_name == "argument" and p.required]


def declared_flag_cases():
    """Every declared flag of every hand-written command, and of one registry command (they are all made by one
    function with the same grid options; their own parameters are test_bad_value_is_refused_by_its_declaration's)."""
    seen, registry_commands = set(), []
    for path, command in _commands():
        if getattr(command.callback, "analysis", None):
            registry_commands.append(path)
            if len(registry_commands) > 1:
                continue
        declared = getattr(command.callback, "declared", {})
        for _name, flag in declared.items():
            key = (getattr(command.callback, "__wrapped__", command.callback), flag.flag)
            if key in seen:
                continue
            seen.add(key)
            spec = next(f for f in fields(flag.cls) if f.name == flag.name)
            cases = [(case, text) for case, _, text in bad_values(flag.cls, spec) if text is not None]
            if spec.metadata.get("choices"):
                cases.append(("not a choice", "no-such-choice"))
            for case, text in cases:
                yield pytest.param(path, _arguments(command), flag.flag, text, id=f"{' '.join(path)} {flag.flag}={text!r}:{case}")


def test_every_hand_written_command_declares_its_flags():
    """Every option of a command with declarations is declared (true/false flags and --job aside), its default is
    allowed by its declaration, and the commands that take a grid have --job."""
    covered = set()
    for path, command in _commands():
        declared = getattr(command.callback, "declared", None)
        if declared is None:
            continue
        covered.add(" ".join(path))
        analysis = getattr(command.callback, "analysis", None)  # a registry command: its Params declare the rest
        own = {f.name for f in fields(ANALYSES[analysis].Params)} if analysis else set()
        for option in command.params:
            if option.param_type_name != "option" or option.name in ("job", "help", *own) or option.is_flag:
                continue
            assert option.name in declared, f"{' '.join(path)} {option.opts[0]} has no declaration"
        for flag in declared.values():
            for value in flag.default if flag.many else [flag.default]:
                if value is not None:
                    check_value(flag.cls, flag.name, str(value) if flag.path else value)
    assert {"pga", "run", "plan", "status", "diagnose", "converge", "probe", "dispersion", "select", "knn", "train"} <= covered, (
        covered
    )
    for path, command in _commands():
        if path[0] in ("pga", "diagnose", "converge", "probe", "dispersion", "select", "knn", "train", "analyze"):
            assert "job" in {p.name for p in command.params}, path


def _by_command():
    grouped = {}
    for case in declared_flag_cases():
        path, arguments, flag, text = case.values
        grouped.setdefault(" ".join(path), (path, arguments, []))[2].append((case.id, flag, text))
    return [pytest.param(path, arguments, cases, id=name) for name, (path, arguments, cases) in grouped.items()]


@pytest.mark.parametrize("path,arguments,cases", _by_command())
def test_every_declared_flag_of_every_command_is_refused_by_its_declaration(
    path, arguments, cases, tmp_path, monkeypatch, capsys
):
    """For each declared flag of the command: wrong type, out of range, NaN, empty or not a choice gives one line
    naming the flag and its range, exit 2, and nothing made in the working directory (the default stores are
    relative to it). One test per command, its cases in a loop (each is a few milliseconds in process)."""
    import sys

    from raygeom.cli import root

    monkeypatch.chdir(tmp_path)
    failures = []
    for case, flag, text in cases:
        monkeypatch.setattr(sys, "argv", ["raygeom", *path, flag, text, *arguments])
        with pytest.raises(SystemExit) as done:
            root.main()
        captured = capsys.readouterr()
        lines = [line for line in (captured.err + captured.out).splitlines() if line.strip()]
        if not (done.value.code == 2 and len(lines) == 1 and flag in lines[0] and "must be" in lines[0]):
            failures.append((case, done.value.code, lines))
        if list(tmp_path.iterdir()):
            failures.append((case, "left behind", sorted(p.name for p in tmp_path.iterdir())))
    assert not failures, failures


REFUSE_IN_A_FRESH_PROCESS = """
import json, sys
from raygeom.cli import root
for argv in json.loads(sys.argv[1]):
    sys.argv = ["raygeom", *argv]
    try:
        root.main()
    except SystemExit as done:
        assert done.code == 2, (argv, done.code)
print(sorted(m for m in ("torch", "transformers", "ray") if m in sys.modules))
"""


def test_a_refused_flag_imports_neither_torch_nor_transformers_nor_ray(tmp_path):
    """One declared flag of each command refused, all in one fresh process: nothing heavy was imported for them."""
    import json
    import subprocess
    import sys

    argvs = []
    for case in _by_command():
        path, arguments, cases = case.values
        _, flag, text = cases[0]
        argvs.append([*path, flag, text, *arguments])
    done = subprocess.run(
        [sys.executable, "-c", REFUSE_IN_A_FRESH_PROCESS, json.dumps(argvs)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) == len(argvs)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ the registry as an interface


def _declare(base=registry.Analysis, **attributes):
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class SomeParams(Params):
        k: int = registry.param(3, "A k.", low=1)

    namespace = {
        "name": "some",
        "version": 1,
        "Params": SomeParams,
        "title": "Some",
        "columns": ("k", "value"),
        "series": ("k",),
        **attributes,
    }
    return type("Some", (base,), namespace)


def test_the_methods_an_analysis_must_implement_follow_its_extraction_kind():
    pooled = _declare()
    assert pooled.__abstractmethods__ == {"units"}
    with pytest.raises(TypeError, match="units"):
        pooled()
    own = _declare(extraction="chunks")
    assert own.__abstractmethods__ == {"run", "planned_units"}
    with pytest.raises(TypeError, match="does not implement planned_units, run"):
        registry._check_declaration(own)
    done = _declare(extraction="chunks", run=lambda *a: [], planned_units=lambda *a: (0, 0))
    registry._check_declaration(done)
    assert done().planned_units() == (0, 0)


@pytest.mark.parametrize(
    "attributes, message",
    [
        ({"series": ("value",)}, "series name 'value' must be a parameter and a declared column (not a parameter)"),
        ({"columns": ("value",)}, "series name 'k' must be a parameter and a declared column (not a column)"),
        ({"metrics": (registry.Metric("nope", "nope"),)}, "metric 'nope' names undeclared column"),
    ],
)
def test_registration_refuses_a_declaration_the_report_could_not_label(attributes, message):
    cls = _declare(units=lambda *a: [], **attributes)
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        registry.register(cls)
    assert "some" not in registry.analyses()


@pytest.mark.parametrize(
    "attributes, message",
    [
        ({"name": "my analysis!"}, "its name must be an identifier"),
        ({"name": "report"}, "its name 'report' is a built-in command of raygeom"),
        ({"name": "run"}, "its name 'run' is a built-in command of raygeom"),
        ({"command": "export"}, "its command 'export' is a built-in command of raygeom"),
        ({"command": "bad command"}, "its command 'bad command' must be an identifier"),
        ({"name": "pc1"}, "registered twice"),
        ({"name": "select"}, "its name or command is analysis 'gap'"),  # `raygeom select` runs gap
        ({"command": "twonn"}, "its name or command is analysis 'twonn'"),
        ({"version": "one"}, "version must be a positive integer, got 'one'"),
        ({"version": 0}, "version must be a positive integer, got 0"),
        ({"version": True}, "version must be a positive integer, got True"),
        ({"version": 1.5}, "version must be a positive integer, got 1.5"),
        ({"columns": ("k", "value", "model")}, "column\\(s\\) model are provenance columns"),
        ({"columns": ("k", "d", "n", "value")}, "column\\(s\\) d, n are provenance columns"),
        ({"metrics": (registry.Metric("value", "v", level=1.0),)}, "has level 1.0; a coverage > 0 and < 1"),
        ({"metrics": (registry.Metric("value", "v", level="coverage"),)}, "has level 'coverage'; .* or a declared column"),
    ],
)
def test_registration_refuses_a_name_version_column_or_level_the_cli_store_or_report_could_not_hold(attributes, message):
    """A refused declaration never reaches the registry: the built-in command, the other analysis and the rows'
    provenance stay what they were."""
    before = dict(registry.analyses())
    cls = _declare(units=lambda *a: [], **attributes)
    with pytest.raises((TypeError, RuntimeError), match=message):
        registry.register(cls)
    assert registry.analyses() == before


def test_a_column_of_a_provenance_name_is_refused_only_where_the_registry_builds_the_row():
    """An analysis with an extraction of its own builds its rows itself (convergence's ``n`` is its pair's text count);
    one reading the pooled extraction starts each row with layer_row, whose ``model`` or ``d`` its column would overwrite."""
    from raygeom.analyses.provenance import PROVENANCE_COLUMNS, layer_row

    info = {"all_layers": ["embed", "block_00", "final_norm"], "d": 8, "source": "file", "settings": {}}
    assert tuple(layer_row("m", "main", "embed", info)) == PROVENANCE_COLUMNS
    own = _declare(extraction="chunks", run=lambda *a: [], planned_units=lambda *a: (0, 0), columns=("k", "value", "n"))
    registry._check_declaration(own)
    with pytest.raises(TypeError, match="provenance"):
        registry._check_declaration(_declare(units=lambda *a: [], columns=("k", "value", "n")))


@pytest.mark.parametrize(
    "level, rows, label",
    [
        (0.8, [], "80 %"),
        (0.95, [], "95 %"),
        (0.999, [], "99.9 %"),
        ("level", [{"level": 0.9}, {"level": 0.9}], "90 %"),
        ("level", [{"level": 0.8}, {"level": 0.95}, {"level": None}], "80 %/95 %"),
    ],
)
def test_a_metric_s_interval_is_labelled_with_its_declared_level(level, rows, label):
    assert registry.Metric("value", "v", "value_lo", "value_hi", level=level).level_label(rows) == label


def test_labels_and_legends_name_a_level_of_0_8_as_80_percent(tmp_path):
    """The console table's header, the PNG's axis label and the report section's intro of a metric declared at 0.8."""
    import matplotlib

    matplotlib.use("Agg")
    from rich.console import Console

    from raygeom.report import tables
    from raygeom.report.profiles import analysis_section

    analysis = _declare(
        units=lambda *a: [],
        columns=("k", "value", "value_lo", "value_hi"),
        metrics=(registry.Metric("value", "some value", "value_lo", "value_hi", level=0.8),),
    )()
    rows = [
        {
            "model": "m",
            "revision": "main",
            "layer": f"block_{i:02d}",
            "layer_index": i,
            "relative_depth": i / 2,
            "n": 9,
            "d": 4,
            "k": 3,
            "value": 1.0 + i,
            "value_lo": 0.5 + i,
            "value_hi": 1.5 + i,
        }
        for i in range(3)
    ]
    console = Console(record=True, width=200)
    tables.print_analysis(console, analysis, rows)
    assert "some value [80 %]" in console.export_text() and "95" not in console.export_text()
    section = analysis_section(analysis, rows, [])
    assert "Bands are 80 % intervals (some value)." in section.intro and "95 %" not in section.intro
    import matplotlib.pyplot as plt

    labels = []
    real = plt.Axes.set_ylabel
    try:
        plt.Axes.set_ylabel = lambda self, text, *a, **k: labels.append(text) or real(self, text, *a, **k)
        tables.plot_analysis(analysis, rows, tmp_path)
    finally:
        plt.Axes.set_ylabel = real
    assert labels == ["some value (band: 80 % interval)"]


def test_a_per_layer_analysis_is_declared_by_its_task_and_arguments(tmp_path):
    """PerLayer: one unit per layer running ``task(root, model, revision, layer, *arguments, key)``; its row is
    layer_row, then the parameters that are columns, then what the task returned (through ``finish``)."""

    def value_task(root, model, revision, layer, k, key):
        return {"value": k * 10.0}

    some = _declare(registry.PerLayer, task=value_task, arguments=("k",))
    registry._check_declaration(some)
    analysis = some()

    class FakeStore:
        root = tmp_path

    info = {"all_layers": ["embed", "block_00", "final_norm"], "d": 8, "key": "abc", "settings": {}}
    units = analysis.units(FakeStore(), "m", "main", ["embed", "final_norm"], some.Params(k=4), info)
    assert [u.key for u in units] == [analysis.unit_key("abc", layer, some.Params(k=4)) for layer in ("embed", "final_norm")]
    [step] = units[0].parts
    assert step.args == (str(tmp_path), "m", "main", "embed", 4, "abc") and step.fn is value_task
    row = units[1].finish([step.fn(*step.args)])
    assert row["layer"] == "final_norm" and row["relative_depth"] == 1.0 and row["d"] == 8
    assert (row["k"], row["value"], row["unit_key"]) == (4, 40.0, units[1].key)
    assert list(row)[-3:] == ["k", "value", "unit_key"]
    with pytest.raises(TypeError, match="declares its task"):
        registry._check_declaration(_declare(registry.PerLayer, arguments=("k",)))
    with pytest.raises(TypeError, match="arguments seed are not parameters"):
        registry._check_declaration(_declare(registry.PerLayer, task=value_task, arguments=("seed",)))


def test_rows_are_checked_against_the_declared_columns():
    analysis = _declare(units=lambda *a: [])()
    analysis.check_rows([{"model": "m", "k": 3, "value": 1.0}, {"model": "m", "note": "refused"}])
    with pytest.raises(RuntimeError, match="without its declared column\\(s\\) value; a changed row needs a version bump"):
        analysis.check_rows([{"model": "m", "k": 3}])


def test_every_module_of_the_package_is_discovered_whatever_its_decorator_line_says(tmp_path):
    """Discovery imports modules; it does not search their text for "@register"."""
    import pkgutil

    import raygeom.analyses as package

    source = Path(registry.__file__).read_text()
    assert "read_text" not in source and "load_entry_points(ENTRY_POINTS)" in source
    names = {m.name for m in pkgutil.iter_modules(package.__path__)}
    import sys

    assert all(f"raygeom.analyses.{name}" in sys.modules for name in names - {"registry"})
    # an installed plugin's analyses come from its own package, through the entry points (not from raygeom's)
    modules = {type(a).__module__ for a in ANALYSES.values()}
    assert {m for m in modules if m.startswith("raygeom.")} <= {f"raygeom.analyses.{n}" for n in names}
    assert {m.rpartition(".")[2] for m in modules if m.startswith("raygeom.")} >= {"pga", "pc1", "twonn"}


def test_discovering_every_analysis_imports_no_torch():
    """Discovery imports every analysis module, and the CLI is built from it: none of them may load torch, Ray or
    scipy.special at import (about 2 s, 1 s and 0.4 s), or a bad flag would no longer be refused in about 1 s."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom raygeom.analyses import registry\nregistry.analyses()\nimport raygeom.cli.root\n"
        "print(sorted(m for m in ('torch', 'transformers', 'ray', 'sklearn', 'scipy.special') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2]
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "body,expected",
    [
        ("[analysis.twonn]\n", "unknown top-level section '[analysis]' (did you mean [analyses.twonn]?)"),
        ("[dispersion]\nfoo = 1\n", "unknown top-level section '[dispersion]'"),
        ("[analyses.twnn]\n", "unknown analysis 'twnn' (did you mean twonn?)"),
        ("[analyses.pga]\nkk = 3\n", "unknown key(s): kk (did you mean k?)"),
        ("[corpus]\nn_sample = 3\n", "unknown key(s) in [corpus]: n_sample (did you mean n_samples?)"),
        ("[analyses.pc1]\nk = 20\nk_per_d = 0.25\n", "k and k_per_d conflict"),
        ("[pga]\nk = 20\nk_per_d = 0.25\n", "k and k_per_d conflict"),
        ("[analyses.convergence]\n", "convergence needs at least two models"),
        ("[pga]\nn_null = 9223372036854775807\n", "[pga] n_null must be an integer >= 2 and <= 1,000,000"),
        ("[analyses.gap]\nn_boot = 9223372036854775807\n", "n_boot must be an integer >= 100 and <= 100,000"),
    ],
)
def test_every_word_of_a_job_file_is_known_and_conflicts_are_refused(body, expected, tmp_path):
    """Issue 41 item 2: words that are not keys were dropped (the job then planned the default PGA)."""
    job = tmp_path / "job.toml"
    out = tmp_path / "out"
    job.write_text(f"[job]\nout = '{out}'\n[[models]]\nid = 'smollm2'\n" + body)
    result = CliRunner().invoke(app, ["plan", str(job)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and expected in lines[0], result.output
    assert not out.exists()


def test_a_job_file_analysis_and_its_command_refuse_the_same_job(tmp_path):
    """One refusal hook (Analysis.check_job): [analyses.convergence] over one model and `converge` over one model
    are refused with the same line, before any work."""
    job = tmp_path / "job.toml"
    job.write_text(f"[job]\nout = '{tmp_path / 'a'}'\n[[models]]\nid = 'smollm2'\n[analyses.convergence]\n")
    from_job = CliRunner().invoke(app, ["run", str(job)])
    from_command = CliRunner().invoke(app, ["converge", "-m", "smollm2", "--out", str(tmp_path / "b")])
    refusals = [result.output.strip().splitlines() for result in (from_job, from_command)]
    assert [from_job.exit_code, from_command.exit_code] == [2, 2] and all(len(lines) == 1 for lines in refusals), refusals
    assert refusals[0][0].endswith(refusals[1][0].removeprefix("error: ")), refusals
    assert "convergence needs at least two models" in refusals[1][0]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_n_null_auto_is_one_word_in_a_job_file_and_a_flag(tmp_path):
    """`[analyses.pga] n_null = "auto"`, `[pga] n_null = "auto"` and `--n-null auto` plan the same PGA."""
    from raygeom.params import AUTO_NULL_BLOCK

    planned = []
    for section in ("[analyses.pga]", "[pga]"):
        job = tmp_path / "job.toml"
        job.write_text(f"[job]\nout = '{tmp_path / 'o'}'\n[[models]]\nid = 'smollm2'\n{section}\nn_null = 'auto'\n")
        result = CliRunner().invoke(app, ["plan", str(job)])
        assert result.exit_code == 0, result.output
        planned.append(__import__("raygeom.jobspec").jobspec.load_job(job).planned()[0].params)
    assert planned[0] == planned[1] and (planned[0].n_null, planned[0].n_null_auto) == (AUTO_NULL_BLOCK, True)
    grid = registry.parse_analyses({"pga": {"n_null": ["auto", 50]}})
    assert [(p.params.n_null, p.params.n_null_auto) for p in grid] == [(AUTO_NULL_BLOCK, True), (50, False)]
    refused = CliRunner().invoke(app, ["pga", "--n-null", "many", "--out", str(tmp_path / "o")])
    assert refused.exit_code == 2 and "--n-null must be an integer >= 2 and <= 1,000,000 or 'auto'" in refused.output


def test_a_top_level_word_that_is_no_section_is_refused(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text("analysis = 3\n[[models]]\nid = 'smollm2'\n")
    result = CliRunner().invoke(app, ["plan", str(job)])
    assert result.exit_code == 2 and "unknown top-level key 'analysis' (did you mean [analyses]?)" in result.output


# ------------------------------------------------------------------ one road per analysis: everything from its declaration


def test_every_analysis_command_job_keys_and_report_come_from_its_declaration(tmp_path):
    """Over the whole registry: `analyze <name>` and `raygeom <command>` (its declared command, else its name) are one
    generated command whose options are exactly the shared grid, its Params' flags and --report; a job file's
    [analyses.<name>] takes exactly its Params' fields; its report section, figures, console and documents are its
    declaration's (the report layer's functions for section and figures)."""
    import inspect

    import typer

    from raygeom.cli import analyses as generated
    from raygeom.report.renderers import renderer

    group = typer.main.get_command(app)
    for name, analysis in ANALYSES.items():
        own = {spec.name: spec.metadata.get("flag") or "--" + spec.name.replace("_", "-") for spec in analysis.Params.declared()}
        expected = set(generated.GRID) | set(own) | set(generated.OUTPUT_OPTIONS)
        for path in [("analyze", name), (analysis.command or name,)]:
            command = group
            for part in path:
                command = command.commands[part]
            assert name in getattr(command.callback, "analyses", ()), (path, name)
            options = {p.name: p for p in command.params if p.param_type_name == "option" and p.name != "help"}
            assert set(options) == expected, (path, set(options) ^ expected)
            for field, flag in own.items():
                assert flag in options[field].opts, (path, field, options[field].opts)
        # job keys: each declared field is a key of [analyses.<name>], and nothing else is
        assert registry.parse_analyses({name: {field: getattr(analysis.Params(), field) for field in own}})
        with pytest.raises(Exception, match="unknown key"):
            registry.parse_analyses({name: {"no_such_setting": 1}})
        # report: a section and figures drawn by the report layer's renderers (keyed by name), console and documents text
        drawn = renderer(name)
        built_in = type(analysis).__module__.startswith("raygeom.")  # a plugin's renderer is its own package's
        for function in (drawn.section, drawn.figures):
            if function is not None:
                assert callable(function) and (function.__module__.startswith("raygeom.report.") or not built_in), name
        if drawn.section is not None:
            assert list(inspect.signature(drawn.section).parameters) == ["root"], name
        if drawn.figures is not None:
            assert list(inspect.signature(drawn.figures).parameters) == ["rows", "directory"], name
        assert analysis.console([]) == [] and analysis.documents([]) == {}, name


def test_the_reserved_command_names_are_the_cli_s_own_commands():
    """registry.RESERVED_COMMANDS (read by register, below the CLI) is exactly the CLI's commands that no analysis
    generates: a new built-in command is reserved, or this fails."""
    import typer

    commands = set(typer.main.get_command(app).commands)
    generated = {a.command or a.name for a in ANALYSES.values()}
    assert commands - generated == set(registry.RESERVED_COMMANDS)
    assert not generated & set(registry.RESERVED_COMMANDS)


BROKEN_PLUGIN = {
    "broken_pkg/__init__.py": "",
    "broken_pkg/analysis.py": "import no_such_module_anywhere\n",
    "broken_pkg/renamed.py": (
        "from raygeom.analyses.registry import Analysis, Params, register\n"
        "@register\nclass Report(Analysis):\n    name = 'report'\n    version = 1\n    Params = Params\n    title = 'R'\n"
        "    def units(self, *a):\n        return []\n"
    ),
    "broken_pkg-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: broken-pkg\nVersion: 0.1\n",
    "broken_pkg-0.1.dist-info/entry_points.txt": (
        "[raygeom.analyses]\nbroken = broken_pkg.analysis\nrenamed = broken_pkg.renamed\n"
        "[raygeom.renderers]\nbroken_drawing = broken_pkg.analysis\n"
    ),
}


def test_a_plugin_that_fails_to_load_costs_one_warning_line_and_every_command_works(tmp_path):
    """Two entry points of one installed package fail (an import error; a registration refused: an analysis named as
    the built-in ``report``): ``raygeom --help`` and a command's refusal still work, each failure costing one line
    on stderr naming the entry point and its error; the report draws with a renderer entry point failing too."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    for name, text in BROKEN_PLUGIN.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{root}", COLUMNS="200")

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "raygeom.cli", *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
        )

    expected = [
        "warning: raygeom.analyses entry point 'broken' (broken_pkg.analysis) not loaded: ModuleNotFoundError: No module "
        "named 'no_such_module_anywhere'",
        "warning: raygeom.analyses entry point 'renamed' (broken_pkg.renamed) not loaded: TypeError: analysis 'report': "
        "its name 'report' is a built-in command of raygeom",
    ]
    helped = cli("--help")
    assert helped.returncode == 0 and "report" in helped.stdout and "pc1" in helped.stdout, helped.stderr
    assert helped.stderr.splitlines() == expected
    report = cli("report", "--help")  # the built-in command, not the refused analysis
    assert report.returncode == 0 and "store" in report.stdout.lower() and report.stderr.splitlines() == expected
    refused = cli("pc1", "--k", "0", "--out", "o")
    assert refused.returncode == 2 and refused.stderr.splitlines()[:2] == expected
    assert len(refused.stderr.splitlines()) == 3 and "--k" in refused.stderr.splitlines()[2]
    drawn = subprocess.run(
        [sys.executable, "-c", "from raygeom.report.renderers import renderer; print(renderer('pga').section.__name__)"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert drawn.stdout.strip() == "pga_section"
    assert drawn.stderr.splitlines() == [
        "warning: raygeom.renderers entry point 'broken_drawing' (broken_pkg.analysis) not loaded: ModuleNotFoundError: "
        "No module named 'no_such_module_anywhere'"
    ]


@pytest.mark.parametrize("name", sorted(ANALYSES))
def test_every_analysis_declares_what_plan_prices_and_checks(name):
    """What `raygeom plan` asks of every analysis, plugins included (issue 45: plan names no analysis): a positive work
    for a unit's settings with the words that say what it counts, a reference rate that is a positive number or
    none, headline settings that are its parameters, and the chunk counts and text checks plan and run make before
    any work, well formed on a small labelled corpus."""
    from dataclasses import asdict

    from raygeom.sources.corpus import Corpus

    analysis = ANALYSES[name]
    params = analysis.Params()
    row = {**asdict(analysis.for_width(params, 64)), "n": 40, "d": 64}
    assert analysis.work(row) > 0 and isinstance(analysis.work_words(row), str) and analysis.work_words(row)
    reference = analysis.reference_seconds(row)
    assert reference is None or reference > 0
    assert set(analysis.headline_values(params)) <= {f.name for f in fields(params)}
    texts = [f"text number {i} " + "word " * (20 + i % 50) for i in range(200)]
    corpus = Corpus("planted", texts, [f"topic{i % 3}" for i in range(200)])
    for key, count, chunk_len, seed, cut, labels, part in analysis.chunk_counts(params, corpus):
        assert getattr(params, key) == count and chunk_len == params.chunk_len and seed == params.seed, key
        assert set(cut) <= set(texts) and (labels is None or len(labels) == len(cut)) and isinstance(part, str)
    said = analysis.check_texts(params, corpus, 64, {"k": "--k", "r": "--ccr", "n_samples": "--n-samples"})
    assert said is None or isinstance(said, str)
