"""Commands built from the analysis registry: `raygeom analyze <name>` for every registered analysis, and
`raygeom <name>` for those without a command of their own. Each takes the same grid options (models,
revisions, corpus, extraction, layers, store) and its analysis's declared parameters as flags; `--job FILE`
takes the grid from a job file instead. Nothing here names an analysis."""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Optional

import typer

from raygeom.analyses import registry
from raygeom.cli.flags import GRID_OPTIONS, checked, fail, grid_job, metavar
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
        text = f"{spec.metadata['help']} Allowed: {allowed(params_cls, spec.name)}. (default: {default_of(params_cls, spec.name)})"
        # Values arrive as text and are parsed by the declaration, so every refusal is the same one line.
        options[spec.name] = (Optional[bool] if kind is bool else Optional[str],
                              typer.Option(None, *names, help=text, metavar=metavar(params_cls, spec.name)))
    return options


def _field(params_cls, name: str):
    return next(spec for spec in params_cls.declared() if spec.name == name)


def build_job(analysis_name: str, grid: dict, values: dict):
    """The job a registry command runs: the job file's (or the flags') grid with this one analysis."""
    analysis = registry.get(analysis_name)
    planned = (registry.Planned(analysis_name, analysis.Params.from_mapping(values)),)
    return replace(grid_job(analysis_name, grid), analyses=planned)


def make_command(analysis_name: str):
    analysis = registry.get(analysis_name)
    param_options = _param_options(analysis.Params)
    options = {**GRID, **param_options}

    def command(**kwargs):
        from raygeom.cli.root import _run

        # An analysis parameter named like a grid option (a token analysis's batch_size) is the analysis's.
        grid = {name: kwargs[name] for name in (*GRID, "given") if name not in param_options}
        try:
            values = {name: kwargs[name] if isinstance(kwargs[name], bool)
                      else parse_text(analysis.Params, name, kwargs[name], _flag(_field(analysis.Params, name)))
                      for name in param_options if kwargs[name] is not None}
            job = build_job(analysis_name, grid, values)
            _run(job, grid["address"], grid["num_cpus"])
        except RaygeomError as error:
            fail(str(error))

    options["given"] = (frozenset, frozenset())  # the flags given (checked passes them; not an option)
    command.__signature__ = inspect.Signature([
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)
        for name, (annotation, option) in options.items()])
    command.__annotations__ = {name: annotation for name, (annotation, _) in options.items()}
    command.__doc__ = (f"{analysis.title} of every chosen layer, per model and revision "
                       f"({analysis.name}, version {analysis.version}). Rows go to <out>/results/{analysis.results_dir}.parquet.")
    command = checked(command)
    command.analysis = analysis_name  # its own flags are its Params' (checked by parse_text above)
    return command


def register(app: typer.Typer) -> None:
    existing = {c.name or c.callback.__name__ for c in app.registered_commands}
    analyze = typer.Typer(help="Run any registered analysis over a grid of models x revisions x layers.",
                          no_args_is_help=True)
    for name in sorted(registry.analyses()):
        command = make_command(name)
        analyze.command(name=name)(command)
        if name not in existing and not registry.get(name).command:  # e.g. convergence runs as `raygeom converge`
            app.command(name=name)(command)
    app.add_typer(analyze, name="analyze")

