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
    assert "read_text" not in source and "entry_points(group=ENTRY_POINTS)" in source
    names = {m.name for m in pkgutil.iter_modules(package.__path__)}
    import sys

    assert all(f"raygeom.analyses.{name}" in sys.modules for name in names - {"registry"})
    assert {type(a).__module__ for a in ANALYSES.values()} <= {f"raygeom.analyses.{n}" for n in names}


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
        ("[analyses.gap]\nn_boot = 9223372036854775807\n", "n_boot must be an integer >= 10 and <= 100,000"),
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
    from raygeom.report.tables import declared_function

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
        # report: a section and figures drawn by the report layer from the declaration, console and documents text
        for declared in (analysis.section, analysis.figures):
            if declared is not None:
                assert declared.startswith("raygeom.report.") and callable(declared_function(declared)), (name, declared)
        if analysis.section is not None:
            assert list(inspect.signature(declared_function(analysis.section)).parameters) == ["root"], name
        assert analysis.console([]) == [] and analysis.documents([]) == {}, name
