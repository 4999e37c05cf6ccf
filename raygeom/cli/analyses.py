"""Commands built from the analysis registry: `raygeom analyze <name>` for every registered analysis, and
`raygeom <name>` for those without a command of their own. Each takes the same grid options (models,
revisions, corpus, extraction, layers, store) and its analysis's declared parameters as flags; `--job FILE`
takes the grid from a job file instead. Nothing here names an analysis."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from raygeom.analyses import registry
from raygeom.errors import RaygeomError
from raygeom.params import LAYERS_HELP, allowed, declared_type, default_of, parse_text

DEFAULT_STORE = "runs/default"

# name -> (annotation, typer option): the grid every registry command shares, with one default each.
GRID = {
    "job": (Optional[Path], typer.Option(None, "--job", help="Take models, corpus, extraction and store from this job file "
                                                             "(the flags below override it).")),
    "model": (Optional[list[str]], typer.Option(None, "--model", "-m", help="Built-in name, HF hub id, model directory or "
                                                                             ".gguf file. Repeatable. (default: smollm2)")),
    "revision": (Optional[list[str]], typer.Option(None, "--revision", "-r", help="Revision(s) of every --model. "
                                                                                   "Repeatable. (default: main)")),
    "corpus": (Optional[str], typer.Option(None, "--corpus", "-c", help="Built-in name, .txt/.jsonl/.parquet file, or "
                                                                         "hf:<dataset>[:<split>]. (default: bbc)")),
    "n_samples": (Optional[int], typer.Option(None, "--n-samples", "-n", help="Texts. (default: 500)")),
    "sample_seed": (Optional[int], typer.Option(None, "--sample-seed", help="Seed of the text sample. (default: 0)")),
    "seq_len": (Optional[int], typer.Option(None, "--seq-len", help="(default: 128)")),
    "pool": (Optional[str], typer.Option(None, "--pool", help="last | mean (default: last)")),
    "skip_first": (Optional[bool], typer.Option(None, "--skip-first/--keep-first", help="With --pool mean, drop each "
                                                                                        "text's first token.")),
    "batch_size": (Optional[int], typer.Option(None, "--batch-size", help="(default: 16)")),
    "layers": (Optional[str], typer.Option(None, "--layers", help=LAYERS_HELP + " (default: all)")),
    "out": (Optional[Path], typer.Option(None, "--out", "-o", help=f"The store. (default: the job's out, else {DEFAULT_STORE})")),
    "address": (Optional[str], typer.Option(None, "--address", help="Attach to this Ray cluster instead of starting a local one.")),
    "num_cpus": (Optional[int], typer.Option(None, "--num-cpus", help="CPUs for a local Ray (default: all).")),
}


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
        options[spec.name] = (Optional[bool] if kind is bool else Optional[str], typer.Option(None, *names, help=text))
    return options


def _field(params_cls, name: str):
    return next(spec for spec in params_cls.declared() if spec.name == name)


def build_job(analysis_name: str, grid: dict, values: dict):
    """The job a registry command runs: the job file's (or the defaults') grid with this one analysis."""
    from raygeom.jobspec import JobSpec, ModelEntry, load_job
    from raygeom.replica.settings import ExtractionSettings

    analysis = registry.get(analysis_name)
    if grid["revision"] and not grid["model"]:
        raise RaygeomError("--revision needs --model (a job file names the revisions of each of its models)")
    planned = (registry.Planned(analysis_name, analysis.Params.from_mapping(values)),)
    models = tuple(ModelEntry(m, tuple(grid["revision"] or ["main"])) for m in grid["model"] or ())
    if grid["job"] is not None:
        job = replace(load_job(grid["job"]), analyses=planned)
    else:
        job = JobSpec(name=analysis_name, out=DEFAULT_STORE, models=models or (ModelEntry("smollm2"),),
                      extraction=ExtractionSettings(), analyses=planned)
    return job.with_overrides(out=str(grid["out"]) if grid["out"] else None, models=models or None, corpus=grid["corpus"],
                              n_samples=grid["n_samples"], sample_seed=grid["sample_seed"], layers=grid["layers"],
                              seq_len=grid["seq_len"], pool=grid["pool"], skip_first=grid["skip_first"],
                              batch_size=grid["batch_size"])


def make_command(analysis_name: str):
    analysis = registry.get(analysis_name)
    param_options = _param_options(analysis.Params)
    options = {**GRID, **param_options}

    def command(**kwargs):
        from raygeom.cli.root import _fail, _run

        grid = {name: kwargs[name] for name in GRID}
        try:
            values = {name: kwargs[name] if isinstance(kwargs[name], bool)
                      else parse_text(analysis.Params, name, kwargs[name], _flag(_field(analysis.Params, name)))
                      for name in param_options if kwargs[name] is not None}
            job = build_job(analysis_name, grid, values)
            _run(job, grid["address"], grid["num_cpus"])
        except RaygeomError as error:
            _fail(str(error))

    command.__signature__ = inspect.Signature([
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)
        for name, (annotation, option) in options.items()])
    command.__annotations__ = {name: annotation for name, (annotation, _) in options.items()}
    command.__doc__ = (f"{analysis.title} of every chosen layer, per model and revision "
                       f"({analysis.name}, version {analysis.version}). Rows go to <out>/results/{analysis.name}.parquet.")
    return command


def register(app: typer.Typer) -> None:
    existing = {c.name or c.callback.__name__ for c in app.registered_commands}
    analyze = typer.Typer(help="Run any registered analysis over a grid of models x revisions x layers.",
                          no_args_is_help=True)
    for name in sorted(registry.analyses()):
        command = make_command(name)
        analyze.command(name=name)(command)
        if name not in existing:
            app.command(name=name)(command)
    app.add_typer(analyze, name="analyze")

