"""The hand-written commands' flags, each checked by one declaration before anything starts.

A flag is made with :func:`option` from a declared parameter (a :func:`raygeom.params.param` field of a Params
class: its type, range, help and default), and a command wrapped in :func:`checked` parses and checks every such
flag by its declaration before its body runs: a float where an int belongs, a value out of range, NaN, or an empty
string is refused with one line naming the flag and what it allows, exit 2, before any store, Ray, torch or model
code. The commands' declarations are attached to them (``callback.declared``), so a test walks every flag.

``--job FILE`` (:data:`JobOption`) gives a command its grid (models and revisions, corpus, sample, extraction,
layers, store) from a job file; the flags given on the command line override it (:func:`grid_job`).

Torch-free: this module imports only the declarations.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from raygeom.analyses.train import TrainRuns
from raygeom.errors import RaygeomError
from raygeom.jobspec import DEFAULT_STORE, CorpusSection, GridSettings, check_corpus_file
from raygeom.params import (
    PGAParams,
    allowed,
    check_value,
    declared_type,
    default_of,
)
from raygeom.replica.settings import ExtractionSettings

errors = Console(stderr=True)


def fail(message: str) -> None:
    """A refusal: one line on stderr, exit 2."""
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


TrainFlags = TrainRuns  # train's own flags: the training runs' one declaration (raygeom.analyses.train)


@dataclass(frozen=True)
class Declared:
    """What one command-line flag is checked by: the field ``name`` of ``cls``."""

    cls: type
    name: str
    flag: str
    default: Any
    words: tuple[str, ...] = ()  # values taken as they are, e.g. 'auto'
    path: bool = False  # the value is a path
    many: bool = False  # a repeatable flag: each value is checked

    def allowed(self) -> str:
        declared = next(f for f in fields(self.cls) if f.name == self.name).metadata.get("words", ())
        return allowed(self.cls, self.name) + "".join(f" or '{word}'" for word in self.words if word not in declared)

    def parse(self, value: Any) -> Any:
        """The flag's text, parsed to its declared type and checked."""
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in self.words:
            return value.strip().lower()
        kind = declared_type(self.cls, self.name)
        if isinstance(value, str) and kind in (int, float):
            try:
                value = int(value.strip()) if kind is int else float(value.strip())
            except ValueError:
                raise RaygeomError(f"{self.flag} must be {self.allowed()}, got {value!r}") from None
        try:
            value = check_value(self.cls, self.name, value, label=self.flag)
        except RaygeomError:
            raise RaygeomError(f"{self.flag} must be {self.allowed()}, got {value!r}") from None
        return Path(value) if self.path else value


_MISSING = object()


def option(
    cls: type,
    name: str,
    *aliases: str,
    flag: str | None = None,
    names: str | None = None,
    default: Any = _MISSING,
    words: tuple[str, ...] = (),
    help: str | None = None,
    path: bool = False,
    many: bool = False,
):
    """A typer option checked by the declaration ``cls.name``. Its value arrives as text (annotate the parameter
    ``Optional[str]``, or ``Optional[list[str]]`` when ``many``; ``Optional[bool]`` for a true/false flag) and None
    when not given; :func:`checked` parses it and fills in the default (``default``: this command's, if it differs)."""
    spec = next(f for f in fields(cls) if f.name == name)
    flag = flag or spec.metadata.get("flag") or "--" + name.replace("_", "-")
    value = default_of(cls, name) if default is _MISSING else default
    if many and not isinstance(value, (list, tuple)):
        value = [] if value is None else [value]
    declared = Declared(cls, name, flag, value, tuple(words) or spec.metadata.get("words", ()), path, many)
    shown = ", ".join(map(str, value)) if many else value
    text = (
        (help or spec.metadata["help"])
        + ("" if declared_type(cls, name) is bool else f" Allowed: {declared.allowed()}.")
        + (f" (default: {shown})" if shown not in (None, "", []) else "")
    )
    info = typer.Option(None, names or flag, *aliases, help=text, metavar=metavar(cls, name, words, path))
    info.declared = declared
    return info


def metavar(cls: type, name: str, words: tuple[str, ...] = (), path: bool = False) -> str | None:
    """The type column of --help from the declaration (the value arrives as text, which typer would show as <str>):
    <int>, <float>, <last|mean>, <int|auto>, <path>; None for a true/false flag."""
    import typing

    kind = declared_type(cls, name)
    if kind is bool:
        return None
    meta = next(f for f in fields(cls) if f.name == name).metadata
    words = (*words, *(word for word in meta.get("words", ()) if word not in words))
    shown = (
        "path"
        if path
        else "|".join(map(str, meta["choices"]))
        if meta.get("choices")
        else {int: "int", float: "float", str: "str"}.get(kind, getattr(kind, "__name__", "str"))
    )
    rule = meta["rule"][1] if meta.get("rule") else ""  # a text checked by a rule: what the rule says it takes
    if "integer" in rule or "number" in rule:
        shown = "int" if "integer" in rule else "float"
    if "comma-separated" in rule or typing.get_origin(typing.get_type_hints(cls)[name]) is tuple:
        shown += ",..."
    if "auto" in rule and "auto" not in words:
        words = (*words, "auto")
    return "<" + "|".join([shown, *words]) + ">"


JobOption = typer.Option(
    None,
    "--job",
    help="Take the models and revisions, corpus, sample, extraction settings, layers "
    "and store from this job file; the flags given override it.",
)


def given_value(value: Any) -> bool:
    return value is not None and not (isinstance(value, (list, tuple)) and not value)


# Flags that only a Ray raygeom starts itself reads: with --address they would be ignored, so they are refused.
LOCAL_ONLY = {"num_cpus": "--num-cpus"}


def check_local_only(kwargs: dict) -> None:
    if not given_value(kwargs.get("address")):
        return
    for name, flag in LOCAL_ONLY.items():
        if given_value(kwargs.get(name)):
            raise RaygeomError(
                f"{flag} sets the CPUs of the local Ray raygeom starts; with --address the cluster's nodes have their "
                f"own, so it would be ignored: drop {flag} (or --address)"
            )


def checked(func=None, *, grid: tuple[str, ...] = ()):
    """``func`` with every flag made by :func:`option` parsed and checked by its declaration before its body runs;
    a refusal is one line and exit 2. ``grid``: the shared options (:data:`SHARED_OPTIONS`) the command takes
    besides its own parameters, handed to ``func``'s ``**grid``; a parameter of its own by the same name replaces
    one. A ``given`` parameter of ``func`` (hidden from the command line) receives the names of the flags given on
    the command line (for ``--job``: only those override the job)."""
    if func is None:
        return functools.partial(checked, grid=grid)
    signature = inspect.signature(func)
    keyword = inspect.Parameter.KEYWORD_ONLY
    added = {name: SHARED_OPTIONS[name] for name in grid if name not in signature.parameters}
    parameters = [
        inspect.Parameter(name, keyword, default=info, annotation=annotation) for name, (annotation, info) in added.items()
    ]
    parameters += [
        p.replace(kind=keyword)
        for n, p in signature.parameters.items()
        if n != "given" and p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    declared = {p.name: p.default.declared for p in parameters if isinstance(getattr(p.default, "declared", None), Declared)}

    @functools.wraps(func)
    def command(**kwargs):
        values = dict(kwargs)
        try:
            for name, declared_flag in declared.items():
                value = kwargs.get(name)
                if not given_value(value):
                    values[name] = (
                        list(declared_flag.default)
                        if declared_flag.many
                        else Path(declared_flag.default)
                        if declared_flag.path and declared_flag.default is not None
                        else declared_flag.default
                    )
                elif declared_flag.many:
                    values[name] = [declared_flag.parse(item) for item in value]
                else:
                    values[name] = declared_flag.parse(value)
            check_local_only(kwargs)
        except RaygeomError as error:
            fail(str(error))
        if "given" in signature.parameters:
            values["given"] = frozenset(name for name in kwargs if given_value(kwargs[name]))
        return func(**values)

    command.__signature__ = inspect.Signature(parameters)
    command.__annotations__ = {**func.__annotations__, **{name: annotation for name, (annotation, _) in added.items()}}
    command.declared = declared
    return command


# The grid flags of every analysis command: one declaration each (raygeom.cli.flags.option), one default each.
ModelOption = option(GridSettings, "model", "-m", many=True)
RevisionOption = option(GridSettings, "revision", "-r", many=True)
CorpusOption = option(
    CorpusSection, "name", "-c", flag="--corpus", help="Built-in name, .txt/.jsonl/.parquet file, or hf:<dataset>[:<split>]."
)
NSamplesOption = option(CorpusSection, "n_samples", "-n", help="Texts.")
SampleSeedOption = option(GridSettings, "sample_seed")
SeqLenOption = option(ExtractionSettings, "seq_len")
PoolOption = option(ExtractionSettings, "pool")
SkipFirstOption = option(ExtractionSettings, "skip_first", names="--skip-first/--keep-first")
BatchSizeOption = option(ExtractionSettings, "batch_size")
LayersOption = option(GridSettings, "layers")
StoreOption = option(
    GridSettings,
    "out",
    "-o",
    path=True,
    help="The store (shared by pga, diagnose, probe and the registry commands); with --job, the job's out.",
)
AddressOption = option(GridSettings, "address")
NumCpusOption = option(GridSettings, "num_cpus")
ReportOption = option(GridSettings, "report", path=True)
# PGA's parameters, as pga, run and diagnose take them (PGAParams declares them).
KOption = option(PGAParams, "k")
CcrOption = option(PGAParams, "r")
NNullOption = option(PGAParams, "n_null")
ZHalfWidthOption = option(PGAParams, "z_half_width")
ZRelWidthOption = option(PGAParams, "z_rel_width")
NNullCapOption = option(PGAParams, "n_null_cap")
NNullDecideOption = option(PGAParams, "n_null_decide")
NullChunksOption = option(PGAParams, "null_chunks")
SeedOption = option(PGAParams, "seed")

# name -> (annotation, option): the grid options the analysis commands share (checked(grid=...) adds them).
GRID_OPTIONS = {
    "job": (Optional[Path], JobOption),
    "model": (Optional[list[str]], ModelOption),
    "revision": (Optional[list[str]], RevisionOption),
    "corpus": (Optional[str], CorpusOption),
    "n_samples": (Optional[str], NSamplesOption),
    "sample_seed": (Optional[str], SampleSeedOption),
    "seq_len": (Optional[str], SeqLenOption),
    "pool": (Optional[str], PoolOption),
    "skip_first": (Optional[bool], SkipFirstOption),
    "batch_size": (Optional[str], BatchSizeOption),
    "layers": (Optional[str], LayersOption),
    "out": (Optional[str], StoreOption),
    "address": (Optional[str], AddressOption),
    "num_cpus": (Optional[str], NumCpusOption),
}
# PGA's parameters, as pga, run and diagnose take them (PGAParams declares them).
PGA_OPTIONS = {
    "k": (Optional[str], KOption),
    "ccr": (Optional[str], CcrOption),
    "n_null": (Optional[str], NNullOption),
    "z_half_width": (Optional[str], ZHalfWidthOption),
    "z_rel_width": (Optional[str], ZRelWidthOption),
    "n_null_cap": (Optional[str], NNullCapOption),
    "n_null_decide": (Optional[str], NNullDecideOption),
    "null_chunks": (Optional[str], NullChunksOption),
    "seed": (Optional[str], SeedOption),
}
SHARED_OPTIONS = {**GRID_OPTIONS, **PGA_OPTIONS}
TEXT_GRID = tuple(GRID_OPTIONS)  # a command of one vector per text takes them all

# The grid flags every analysis command takes, by the name of its parameter: what a job file can give.
GRID = ("model", "revision", "corpus", "n_samples", "sample_seed", "seq_len", "pool", "skip_first", "batch_size", "layers", "out")


def model_entries(models: list[str], revisions: list[str]) -> tuple:
    """``name`` or ``name@revision``; plain names get every ``--revision``."""
    from raygeom.jobspec import ModelEntry

    entries = []
    for model in models:
        name, _, revision = model.partition("@")
        entries.append(ModelEntry(name, (revision,)) if revision and name else ModelEntry(model, tuple(revisions)))
    return tuple(entries)


def grid_job(name: str, values: dict):
    """The job a command runs (a raygeom.jobspec.JobSpec): the ``--job`` file's, with the grid flags given on the
    command line (``values['given']``) over it; without ``--job``, the flags' values (given or default) alone.
    ``values``: the command's parameters (``locals()`` at the top of its body). ``--seed`` is also the sample's seed
    unless ``--sample-seed`` is given (a job's own sample seed stays, unless ``--seed`` is given)."""
    from raygeom.jobspec import JobSpec, load_job
    from raygeom.replica.settings import ExtractionSettings

    job_file, given = values.get("job"), values.get("given", frozenset())
    chosen = {key: values[key] for key in GRID if key in values and (job_file is None or key in given)}
    if "sample_seed" not in given and "seed" in values and (job_file is None or "seed" in given):
        chosen["sample_seed"] = values["seed"]
    models, revisions = chosen.pop("model", None), chosen.pop("revision", None)
    if job_file is not None:
        if revisions is not None and models is None:
            raise RaygeomError("--revision needs --model (the job file names the revisions of each of its models)")
        job = load_job(job_file)
    else:
        job = JobSpec(name=name, out=DEFAULT_STORE, models=(), extraction=ExtractionSettings())
    if models is not None:
        chosen["models"] = model_entries(models, revisions or [default_of(GridSettings, "revision")])
    if "out" in chosen:
        chosen["out"] = str(chosen["out"])
    if isinstance(chosen.get("corpus"), str):
        check_corpus_file(chosen["corpus"], chosen["corpus"], f"the current folder {Path.cwd()}")
    return job.with_overrides(**chosen)
