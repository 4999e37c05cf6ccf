"""Commands built from the analysis registry: `raygeom analyze <name>` for every registered analysis, and
`raygeom <command>` (its declared ``command``, else its name). Each takes the same grid options (models,
revisions, corpus, extraction, layers, store) and its analysis's declared parameters as flags; `--job FILE`
takes the grid from a job file instead. Nothing here names an analysis."""

from __future__ import annotations

import inspect
import os
import shutil
from dataclasses import fields
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


def build_group_job(names: tuple[str, ...], grid: dict, values: dict):
    """The job of a command of one or more analyses (``names``, whose Params take ``values``, the flags given): with
    ``--job``, each of them the job plans, the flags given over its parameters (none planned: from the flags alone);
    without, each from the flags."""
    job = grid_job(names[0], {**grid, **({"seed": values["seed"]} if "seed" in values else {})})
    planned = []
    for name in names:
        analysis = registry.get(name)
        own = {key: value for key, value in values.items() if key in {f.name for f in fields(analysis.Params)}}
        in_job = [item for item in job.planned() if item.analysis == name] if grid.get("job") is not None else []
        planned += [registry.Planned(name, item.params.given_over(own)) for item in in_job] or [
            registry.Planned(name, analysis.Params.from_mapping(own))
        ]
    return job.with_planned(tuple(dict.fromkeys(planned)))


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


def copy_report(analysis, outputs, report: Path, root: Path | None = None) -> None:
    """What the run of ``analysis`` wrote (its table, plots and documents) copied into ``report``, each atomically,
    a CSV of this run's rows named as its command (<command>.csv, as docs/results cite them), and one of each table
    it declares (``tables``: the rows of this run's units in the store ``root``)."""
    from raygeom.report.figures import write_csv
    from raygeom.store.tree import read_table

    rows = outputs.rows.get(analysis.name)
    if rows:
        write_csv(rows, report / f"{analysis.command or analysis.name}.csv")
        keys = {row.get("unit_key") for row in rows}
        for name, table in analysis.tables.items():
            path = Path(root or ".") / "results" / f"{table}.parquet"
            if path.is_file():
                write_csv([r for r in read_table(path).to_pylist() if r.get("unit_key") in keys], report / f"{name}.csv")
    for path in outputs.files.get(analysis.name, []):
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


def _group_params(names: tuple[str, ...]) -> dict:
    """name -> the Params class that declares it first, over the analyses of one command."""
    declaring = {}
    for name in names:
        params_cls = registry.get(name).Params
        for spec in params_cls.declared():
            declaring.setdefault(spec.name, params_cls)
    return declaring


def make_command(analysis_name: str, *more: str):
    """The generated command of one analysis, or of several read together (``more``: e.g. the token-level dispersion
    and its slices, one forward pass): the grid, every Params' flags (one flag per name), --report."""
    names = (analysis_name, *more)
    chosen = [registry.get(name) for name in names]
    declaring = _group_params(names)
    param_options = {}
    for analysis in chosen:
        param_options.update({k: v for k, v in _param_options(analysis.Params).items() if k not in param_options})
    options = {**GRID, **param_options, **OUTPUT_OPTIONS}

    def command(**kwargs):
        from raygeom.cli.root import _run, console

        # An analysis parameter named like a grid option (a token analysis's batch_size) is the analysis's.
        grid = {name: kwargs[name] for name in (*GRID, "given") if name not in param_options}
        report = kwargs["report"]
        try:
            values = {
                name: kwargs[name]
                if isinstance(kwargs[name], bool)
                else parse_text(declaring[name], name, kwargs[name], _flag(_field(declaring[name], name)))
                for name in param_options
                if kwargs[name] is not None
            }
            job = build_group_job(names, grid, values)
            check_report(report)
            outputs = _run(job, grid["address"], grid["num_cpus"])
            if report is not None:
                for analysis in chosen:
                    copy_report(analysis, outputs, report, Path(job.out))
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
    what = " ".join(
        (type(a).__doc__ or "").strip() or f"{a.title} of every chosen layer, per model and revision." for a in chosen[:1]
    )
    command.__doc__ = (
        f"{what} ({', '.join(f'{a.name}, version {a.version}' for a in chosen)}). Rows go to "
        + ", ".join(f"<out>/results/{a.results_dir}.parquet" for a in dict((a.results_dir, a) for a in chosen).values())
        + "."
    )
    command = checked(command)
    command.analysis = analysis_name  # its own flags are its Params' (checked by parse_text above)
    command.analyses = names
    return command


def register(app: typer.Typer) -> None:
    existing = {c.name or c.callback.__name__ for c in app.registered_commands}
    analyze = typer.Typer(help="Run any registered analysis over a grid of models x revisions x layers.", no_args_is_help=True)
    by_command: dict[str, list[str]] = {}
    for name in sorted(registry.analyses()):
        analyze.command(name=name)(make_command(name))
    for name, analysis in registry.analyses().items():  # in registration order: token_dispersion before slices
        # e.g. convergence runs as `raygeom converge`; analyses naming one command run together (dispersion)
        by_command.setdefault(analysis.command or name, []).append(name)
    for called, names in by_command.items():
        if called not in existing:
            existing.add(called)
            app.command(name=called)(make_command(*names))
    app.add_typer(analyze, name="analyze")
