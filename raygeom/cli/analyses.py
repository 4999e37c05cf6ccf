"""Commands built from the analysis registry: `raygeom analyze <name>` for every registered analysis, and
`raygeom <command>` (its declared ``command``, else its name). Each takes the same grid options (models,
revisions, corpus, extraction, layers, store) and its analysis's declared parameters as flags; `--job FILE`
takes the grid from a job file instead. Nothing here names an analysis."""

from __future__ import annotations

import inspect
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from raygeom.analyses import registry
from raygeom.cli.flags import GRID_OPTIONS, ReportOption, checked, fail, grid_job, metavar
from raygeom.errors import RaygeomError
from raygeom.params import allowed, declared_type, default_of, parse_text

GRID = GRID_OPTIONS  # the grid every analysis command shares (raygeom.cli.flags): one declaration, one default each


def _flag(spec) -> str:
    return spec.metadata.get("flag") or "--" + spec.name.replace("_", "-")


def _param_options(params_cls) -> dict:
    options = {}
    for spec in params_cls.declared():
        kind = declared_type(params_cls, spec.name)
        flag = _flag(spec)
        names = (f"{flag}/--no-{flag[2:]}",) if kind is bool else (flag,)
        text = (
            f"{spec.metadata['help']} Allowed: {allowed(params_cls, spec.name)}. (default: {default_of(params_cls, spec.name)})"
        )
        # Values arrive as text and are parsed by the declaration, so every refusal is the same one line.
        options[spec.name] = (
            Optional[bool] if kind is bool else Optional[str],
            typer.Option(None, *names, help=text, metavar=metavar(params_cls, spec.name)),
        )
    return options


def _field(params_cls, name: str):
    return next(spec for spec in params_cls.declared() if spec.name == name)


def build_job(analysis_name: str, grid: dict, values: dict):
    """The job a registry command runs: the job file's (or the flags') grid with this one analysis."""
    analysis = registry.get(analysis_name)
    planned = (registry.Planned(analysis_name, analysis.Params.from_mapping(values)),)
    return replace(grid_job(analysis_name, grid), analyses=planned)


def check_report(report: Path | None) -> None:
    """A --report directory that cannot be made fails before any work, with one line."""
    if report is None:
        return
    try:
        report.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RaygeomError(f"report directory {report} cannot be created: {error.strerror or error}") from None
    if not os.access(report, os.W_OK):
        raise RaygeomError(f"report directory {report} is not writable")


def copy_report(analysis, outputs, report: Path) -> None:
    """What the run of ``analysis`` wrote (its table, plots and documents) copied into ``report``, each atomically,
    and a CSV of this run's rows named as its command (<command>.csv, as docs/results cite them)."""
    from raygeom.report.figures import write_csv

    rows = getattr(outputs, "analysis_rows", {}).get(analysis.name)
    if rows:
        write_csv(rows, report / f"{analysis.command or analysis.name}.csv")
    for path in getattr(outputs, "files", {}).get(analysis.name, []):
        if path is not None and path.is_file() and path.parent.resolve() != report.resolve():
            temporary = report / f".{path.name}.tmp"
            shutil.copyfile(path, temporary)
            temporary.replace(report / path.name)


# The options every generated command has besides the grid and its Params: not settings of the analysis.
OUTPUT_OPTIONS = {"report": (Optional[str], ReportOption)}


def options_of(analysis) -> dict:
    """name -> (annotation, typer option) of the generated command of ``analysis``: the grid, its Params' flags (a
    parameter named like a grid option is the analysis's), --report."""
    return {**GRID, **_param_options(analysis.Params), **OUTPUT_OPTIONS}


def make_command(analysis_name: str):
    analysis = registry.get(analysis_name)
    param_options = _param_options(analysis.Params)
    options = options_of(analysis)

    def command(**kwargs):
        from raygeom.cli.root import _run, console

        # An analysis parameter named like a grid option (a token analysis's batch_size) is the analysis's.
        grid = {name: kwargs[name] for name in (*GRID, "given") if name not in param_options}
        report = kwargs["report"]
        try:
            values = {
                name: kwargs[name]
                if isinstance(kwargs[name], bool)
                else parse_text(analysis.Params, name, kwargs[name], _flag(_field(analysis.Params, name)))
                for name in param_options
                if kwargs[name] is not None
            }
            job = build_job(analysis_name, grid, values)
            check_report(report)
            outputs = _run(job, grid["address"], grid["num_cpus"])
            if report is not None:
                copy_report(analysis, outputs, report)
                console.print(f"report: {report}", markup=False, highlight=False)
        except RaygeomError as error:
            fail(str(error))

    options["given"] = (frozenset, frozenset())  # the flags given (checked passes them; not an option)
    command.__signature__ = inspect.Signature(
        [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)
            for name, (annotation, option) in options.items()
        ]
    )
    command.__annotations__ = {name: annotation for name, (annotation, _) in options.items()}
    what = (type(analysis).__doc__ or "").strip() or f"{analysis.title} of every chosen layer, per model and revision."
    command.__doc__ = (
        f"{what} ({analysis.name}, version {analysis.version}). Rows go to <out>/results/{analysis.results_dir}.parquet."
    )
    command = checked(command)
    command.analysis = analysis_name  # its own flags are its Params' (checked by parse_text above)
    return command


def register(app: typer.Typer) -> None:
    existing = {c.name or c.callback.__name__ for c in app.registered_commands}
    analyze = typer.Typer(help="Run any registered analysis over a grid of models x revisions x layers.", no_args_is_help=True)
    for name in sorted(registry.analyses()):
        command = make_command(name)
        analyze.command(name=name)(command)
        called = registry.get(name).command or name  # e.g. convergence runs as `raygeom converge`
        if called not in existing:  # a command still written by hand keeps its name (dispersion, select)
            existing.add(called)
            app.command(name=called)(command)
    app.add_typer(analyze, name="analyze")
