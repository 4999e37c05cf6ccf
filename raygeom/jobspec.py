"""TOML job files: what to run, validated before anything starts."""

from __future__ import annotations

import itertools
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Optional

from raygeom.analyses.token_dispersion import ChunkParams
from raygeom.errors import RaygeomError
from raygeom.names import check_path
from raygeom.params import (
    LAYERS_HELP,
    MAX_BOOT,
    MAX_COUNT,
    MAX_SEED,
    MAX_WORKERS,
    MAX_Z,
    ChunkSettings,
    Params,
    PGAParams,
    check_value,
    declared_as,
    default_of,
    nearest,
    param,
)
from raygeom.replica.settings import ExtractionSettings
from raygeom.sources.checkpoints import is_run_directory
from raygeom.sources.layers import INSIDE_POINT

DEFAULT_STORE = "runs/default"  # every command's store unless --out or a job names one


@dataclass(frozen=True)
class GridSettings(Params):
    """What the commands take besides their analyses' parameters and no job section declares: the models and
    revisions, layers, sample seed, store and outputs, and the Ray cluster."""

    model: str = param(
        "smollm2",
        "Built-in name, HF hub id, model directory or .gguf file; name@revision picks a revision. Repeatable.",
        nonempty=True,
    )
    revision: str = param(
        "main", "Revision(s) of every --model given without @revision, e.g. step1000. Repeatable.", nonempty=True
    )
    layers: str = param("all", LAYERS_HELP, nonempty=True)
    sample_seed: int = param(0, "Seed of the text sample (default: --seed).", low=0, high=MAX_SEED)
    out: str = param(DEFAULT_STORE, "The store (shared by pga, diagnose, probe and the registry commands).", nonempty=True)
    report: Optional[str] = param(None, "Also copy the tables and plots into this directory.", nonempty=True)
    plots: Optional[str] = param(None, "Where the PNGs go (default: <out>/plots).", nonempty=True)
    address: Optional[str] = param(
        None, "Attach to this Ray cluster (e.g. 'auto' or ray://host:10001) instead of starting a local one.", nonempty=True
    )
    num_cpus: Optional[int] = param(None, "CPUs for a local Ray (default: all).", low=1, high=MAX_WORKERS)


@dataclass(frozen=True)
class ModelEntry:
    source: str
    revisions: tuple[str, ...] = ("main",)
    run_dir: bool = False  # source is a training run's directory: its checkpoints are the revisions

    def specs(self):
        from raygeom.sources.models import resolve_models

        return resolve_models(self.source, self.revisions, self.run_dir)


@dataclass(frozen=True)
class SweepSettings(Params):
    """How a sweep runs; its grid is JobSpec.models (the [sweep] sizes x revisions plus any [[models]])."""

    gpu_memory_gib: float = param(
        80.0, "Memory per GPU; decides how many GPUs one replica asks for.", low=0.0, low_open=True, high=100_000.0
    )
    gpus_per_node: int = param(8, "GPUs per node.", low=1, high=MAX_WORKERS)
    max_in_flight: int = param(
        0,
        "Replicas extracting at once (0: as many as fit); each takes the next revision when its own lands.",
        low=0,
        high=MAX_WORKERS,
    )
    analysis_threads: int = param(4, "Revisions analysed at once.", low=1, high=MAX_WORKERS)
    keep_activations: bool = param(True, "Keep layer files after every unit of a revision is done.")
    collapse_threshold: float = param(0.0, "z below which a late layer counts as collapsed.", high=MAX_Z, low=-MAX_Z)
    positive_z: float = param(2.0, "z above which an earlier layer counts as organised.", high=MAX_Z, low=-MAX_Z)
    plots: bool = param(True, "Write the sweep's PNG plots.")
    weights_budget_gib: float = param(
        0.0,
        "HF cache space the sweep's downloads may hold at once (0: four fifths of the "
        "free disk at the start); downloads run ahead within it.",
        low=0.0,
        high=1e9,
    )
    keep_weights: bool = param(
        False,
        "Keep every revision the sweep downloads; false deletes each once its extraction "
        "is stored (revisions cached before the sweep always stay).",
    )
    download_retries: int = param(
        5, "Tries after the first of a file that fails with a 5xx, a reset or a stall.", low=0, high=100
    )


@dataclass(frozen=True)
class JobSection(Params):
    """[job]: its name and its store."""

    name: str = param("", "Name shown in titles (default: the file's name).")
    out: str = param(
        "runs/default",
        "The store directory, relative to the job file's folder (without it: runs/<file name> there).",
        nonempty=True,
    )


@dataclass(frozen=True)
class CorpusSection(Params):
    """[corpus]: the texts every model reads, sampled in a seeded order."""

    name: str = param("bbc", "Built-in name, .txt/.jsonl/.parquet file, hf:<dataset>[:<split>], or 'heldout'.", nonempty=True)
    n_samples: int = param(500, "Texts.", low=3, high=MAX_COUNT)
    seed: int = param(0, "Seed of the sample.", low=0, high=MAX_SEED)


@dataclass(frozen=True)
class TrajectorySettings(ChunkSettings):
    """[trajectory]: the dispersion side of a trajectory job (its chunks declared once, as every chunk analysis's),
    and where its report goes."""

    # token_dispersion's declarations; smaller groups suit the few held-out articles a trained run has
    gap_layer: str = declared_as(ChunkParams, "gap_layer")
    group_size: int = declared_as(ChunkParams, "group_size", default=10)
    n_groups: int = declared_as(ChunkParams, "n_groups", default=20)
    late_from: int = param(
        512, "Checkpoints from this step on are 'late' (ranked again among themselves).", low=0, high=MAX_COUNT
    )
    bootstrap: int = param(2000, "Bootstrap draws of the ranking intervals.", low=100, high=MAX_BOOT)
    seed: int = param(0, "Seed of the bootstrap.", low=0, high=MAX_SEED)
    report: str = param(
        "",
        "A page whose rows the run exports into <page>/ (python -m tools.results_pages builds it), e.g. docs/results/trajectory.md.",
    )


@dataclass(frozen=True)
class WidthSettings(Params):
    """[width]: the page a width ladder (a [train] grid over hidden_size) regenerates, and how it decides."""

    report: str = param(
        "",
        "A page whose rows the run exports into <page>/ (python -m tools.results_pages builds it), e.g. docs/results/width.md.",
    )
    positive_z: float = param(2.0, "z whose whole interval lies above this counts as organised.", high=MAX_Z, low=-MAX_Z)
    collapse_z: float = param(0.0, "z whose whole interval lies below this counts as collapsed.", high=MAX_Z, low=-MAX_Z)
    seed: int = param(0, "Seed of the bootstrap intervals.", low=0, high=MAX_SEED)
    note: str = param("", "What the page should say about this run of the job (how it ran, what it left out).")


@dataclass(frozen=True)
class TrainJob:
    """[train]: train a model first, saving checkpoints into ``run_dir`` on a Pythia-like schedule
    (``raygeom.analyses.train.checkpoint_steps``); skipped when they exist and match."""

    settings: object  # raygeom.analyses.train.TrainSettings
    run_dir: str
    save_every: int
    log_until: int  # as TrainRuns declares it (raygeom.analyses.train)
    variant: str = ""  # the name of this grid point of [train] (e.g. d64-seed1); "" when [train] is one run

    def plan(self):
        from raygeom.analyses.train import CheckpointPlan, checkpoint_steps

        return CheckpointPlan(
            str(Path(self.run_dir).expanduser().resolve()), checkpoint_steps(self.settings.steps, self.save_every, self.log_until)
        )


@dataclass(frozen=True)
class JobSpec:
    name: str
    out: str
    models: tuple[ModelEntry, ...]
    corpus: str = "bbc"
    n_samples: int = 500
    sample_seed: int = 0
    layers: str = "all"
    extraction: ExtractionSettings = field(default_factory=ExtractionSettings)
    pga: PGAParams = field(default_factory=PGAParams)
    sweep: SweepSettings | None = None
    trains: tuple[TrainJob, ...] = ()  # [train]: one run, or one per grid point of its list values
    trajectory: TrajectorySettings | None = None
    width: WidthSettings | None = None
    # [analyses.<name>] tables (raygeom.analyses.registry), one Planned per grid point; empty: PGA with [pga]'s settings
    analyses: tuple = ()
    path: str = ""  # the job file it was read from ("" for a job made of flags): refusals name its own words
    flags: frozenset = frozenset()  # the settings given on the command line over it (refusals name those flags)
    gpus: bool = False  # its [sweep] says what GPUs it runs on (gpu_memory_gib or gpus_per_node): plan shows GPU lines

    def __post_init__(self):
        check_layer_selection(self.layers)

    @property
    def train(self) -> TrainJob | None:
        """The first (often the only) run of [train]; every run shares its data and held-out texts."""
        return self.trains[0] if self.trains else None

    @property
    def corpus_pending(self) -> bool:
        """The corpus is the held-out texts [train] writes and has not written yet: checks that read it wait for it."""
        return bool(self.trains) and not Path(self.corpus).exists()

    def model_specs(self) -> list:
        """Every (model, revision) of the job (raygeom.sources.models.ModelSpec). The run directory of the job's
        [train] gives the checkpoints the trainer writes (its plan), so a job can be checked and planned before
        training has made the directory."""
        return [spec for entry in self.models for spec in (self._trained_specs(entry) or entry.specs())]

    def _trained_specs(self, entry) -> list | None:
        from raygeom.sources.checkpoints import Checkpoint, RunDirectory
        from raygeom.sources.models import ModelSpec

        if not entry.run_dir:
            return None
        source = Path(entry.source).expanduser().resolve()
        plan = next((p for p in (run.plan() for run in self.trains) if Path(p.run_dir) == source), None)
        if plan is None:
            return None
        root = Path(plan.run_dir)
        run = RunDirectory(root, tuple(Checkpoint(f"step{step}", step, root / f"step{step}") for step in plan.steps), ())
        return [ModelSpec(str(root), "checkpoint", checkpoint.label) for checkpoint in run.select(entry.revisions)]

    def planned(self) -> tuple:
        """Every (analysis, parameters) this job runs on each extraction."""
        from raygeom.analyses.registry import Planned

        return self.analyses or (Planned("pga", self.pga),)

    def with_planned(self, planned: tuple) -> "JobSpec":
        """This job running ``planned`` (a command's analyses); its PGA settings follow a planned PGA's, so what reads
        them (progress, plan) reads what runs."""
        pga = next((item.params for item in planned if item.analysis == "pga"), self.pga)
        return replace(self, analyses=tuple(planned), pga=pga)

    def with_overrides(self, **overrides) -> "JobSpec":
        """Apply CLI options (None means 'not given') to the job, its extraction and PGA settings."""
        top, extraction, analysis = {}, {}, {}
        extraction_names = {f.name for f in fields(ExtractionSettings)}
        pga_names = {f.name for f in fields(PGAParams)}
        for name, value in overrides.items():
            if value is None:
                continue
            if name in extraction_names:
                extraction[name] = value
            elif name in pga_names:
                analysis[name] = value
            else:
                top[name] = value
        if "layers" in top:
            check_layer_selection(top["layers"])
        top["flags"] = self.flags | {name for name, value in overrides.items() if value is not None}
        # A flag of `raygeom run` (--k, --seed, ...) overrides that parameter of every listed analysis that declares it.
        planned = tuple(
            replace(p, params=replace(p.params, **{k: v for k, v in analysis.items() if k in {f.name for f in fields(p.params)}}))
            for p in self.analyses
        )
        return replace(
            self, **top, extraction=replace(self.extraction, **extraction), pga=replace(self.pga, **analysis), analyses=planned
        )


def check_layer_selection(selection: str) -> None:
    """Refuse, before any work, a layer selection that picks nothing whatever the model (e.g. ``10:5``)."""
    if not isinstance(selection, str):
        raise RaygeomError(f'layers must be a string such as "all" or "0,5:10,-1", got {selection!r}')
    parts = [p.strip() for p in selection.split(",")]
    if selection.strip() == "all":
        return
    if not selection.strip():  # only "all" means every layer: an empty value is a mistake, not a choice
        raise RaygeomError('layers is empty; give "all" (every layer) or a selection such as "0,5:10,-1"')
    if any(not p for p in parts):
        raise RaygeomError(f"layer selection '{selection}' has an empty item; use e.g. 'embed,5:10,-1'")
    for part in parts:
        inside = INSIDE_POINT.fullmatch(part)  # 0:4.attn_out is the range 0:4, at a point inside each block
        start, colon, stop = (inside.group(1) if inside else part).partition(":")
        if not colon:
            continue
        try:
            first, last = int(start) if start.strip() else None, int(stop) if stop.strip() else None
        except ValueError:
            raise RaygeomError(f"layer range '{part}' must be two integers like 5:10") from None
        if first is not None and last is not None and (first >= 0) == (last >= 0) and first >= last:
            raise RaygeomError(f"layer range '{part}' selects no layer (start must be below stop), so there is nothing to run")


def _section(data: dict, name: str, path: Path) -> dict:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise RaygeomError(f"{path}: [{name}] must be a table")
    return value


def _known(section: dict, allowed: set[str], where: str, path: Path) -> None:
    """Every word of a job file is one raygeom reads: an unknown one is refused with the nearest known one."""
    unknown = sorted(set(section) - allowed, key=str)
    if not unknown:
        return
    if where == "top level":
        word = unknown[0]
        tables = [f"[{name}]" for name in sorted(allowed)]
        if isinstance(section[word], dict) and word in ("analysis", "analyse", "analyze", "analyzes"):
            inner = next(iter(section[word]), None)
            hint = f" (did you mean [analyses.{inner}]?)" if inner is not None else " (did you mean [analyses.<name>]?)"
        else:
            hint = nearest(f"[{word}]", tables)
        kind = "section" if isinstance(section[word], dict) else "key"
        raise RaygeomError(
            f"{path}: unknown top-level {kind} {'[' + word + ']' if kind == 'section' else word!r}{hint}; "
            f"known: {', '.join(tables)}"
        )
    raise RaygeomError(f"{path}: unknown key(s) in [{where}]: {', '.join(map(str, unknown))}" + nearest(unknown[0], allowed))


# The keys of job-file sections that are not a Params class's fields, with their help (docs/job-files.md is made
# from these and the declarations; load_job reads exactly these).
MODEL_KEYS = {
    "id": "A built-in name (smollm2, gemma3-270m), a hub id (EleutherAI/pythia-70m), a model folder or .gguf file, "
    "or a training run's directory (paths relative to the job file's folder).",
    "revisions": 'The revisions (hub branches such as "step1000", or "main"); in a job with [sweep] also a rule as in '
    '[sweep] revisions; for a run directory "all" (default), a label or stepN.',
    "run_dir": "A training run's directory, whose checkpoints are the revisions (instead of id; or true with an id).",
}
SWEEP_EXTRA_KEYS = {
    "sizes": 'Pythia sizes, e.g. ["14m", "70m"]: one [[models]] entry each (EleutherAI/pythia-<size>).',
    "deduped": 'false | true | "only": also (or only) the -deduped models.',
    "revisions": 'all | log | linear | every:N | stepA:stepB | a list such as ["step0", "step1000"] (default: all).',
}
TRAIN_EXTRA_KEYS = {
    "head_dim": "n_heads = hidden_size / head_dim for each run of a grid (instead of n_heads).",
    "skip": "Tables of grid keys whose grid points are left out, e.g. skip = [{hidden_size = 512, n_layers = 12}].",
}

CORPUS_FILES = (".txt", ".jsonl", ".parquet")
JOB_SECTIONS = {"job", "models", "corpus", "extract", "pga", "sweep", "analyses", "train", "trajectory", "width"}


def job_relative(path: Path):
    """A job file's relative paths (out, run_dir, model folders, corpus files, report pages) name places beside the
    job file, wherever the shell is: ``out = "../runs/laptop"`` in jobs/laptop.toml is runs/laptop of the checkout."""
    base = path.parent

    def resolve(value: str, what: str = "path") -> str:
        given = Path(check_path(value, f"{path}: {what}")).expanduser()
        return str(given) if given.is_absolute() else os.path.normpath(base / given)

    return resolve


def _local_model(entry: dict, resolve) -> str:
    """A [[models]] id that names a folder or file beside the job (a run directory, a model folder, a .gguf) is
    resolved; a hub id or built-in name is kept."""
    source = entry["id"]
    local = resolve(source, "[[models]] id")
    if entry.get("run_dir") is True or source.endswith(".gguf") or source.startswith((".", "~", "/")) or Path(local).exists():
        return local
    return source


def looks_like_a_file(name: str) -> bool:
    """A corpus name that can only be a file: a .txt/.jsonl/.parquet name or a path (not hf:<dataset>)."""
    return not name.startswith("hf:") and (name.endswith(CORPUS_FILES) or "/" in name or name.startswith((".", "~")))


def check_corpus_file(name: str, resolved: str, base: str, where: str = "") -> None:
    """Refuse a corpus file that is not there, naming the folder (``base``, in words) a relative name was read from."""
    full = Path(os.path.abspath(Path(resolved).expanduser()))
    if looks_like_a_file(name) and not full.exists():
        origin = "" if Path(name).expanduser().is_absolute() else f" resolved from {base} to {full}"
        raise RaygeomError(
            f"{where}corpus file not found: '{name}'{origin}; give an existing .txt, .jsonl or .parquet file, "
            "a built-in corpus (bbc) or hf:<dataset>"
        )


def _local_corpus(name: str, resolve) -> str:
    if name.startswith("hf:") or name == "heldout":
        return name
    local = resolve(name, "[corpus] name")
    return local if name.endswith(CORPUS_FILES) or Path(local).exists() else name


def load_job(path: str | Path) -> JobSpec:
    path = Path(path)
    resolve = job_relative(path)
    if path.is_dir():
        raise RaygeomError(f"job file {path} is a directory; give a TOML file such as jobs/laptop.toml")
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise RaygeomError(f"job file not found: {path}") from None
    except UnicodeDecodeError as error:
        line = path.read_bytes()[: error.start].count(b"\n") + 1
        raise RaygeomError(f"{path}: not a text TOML job file (undecodable UTF-8 at line {line})") from None
    except OSError as error:
        raise RaygeomError(f"cannot read job file {path}: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise RaygeomError(f"{path}: malformed TOML: {str(error).splitlines()[0]}") from None
    _known(data, JOB_SECTIONS, "top level", path)
    job = _section(data, "job", path)
    corpus = _section(data, "corpus", path)
    extract = _section(data, "extract", path)
    analysis = _section(data, "pga", path)
    _known(job, {"name", "out"}, "job", path)
    _known(corpus, {"name", "n_samples", "seed"}, "corpus", path)
    _known(extract, {"seq_len", "pool", "skip_first", "batch_size", "layers"}, "extract", path)
    JobSection.from_mapping(job, f"{path}: [job] ")  # types and ranges, one line naming the key
    CorpusSection.from_mapping(corpus, f"{path}: [corpus] ")
    _known(analysis, {f.name for f in fields(PGAParams)}, "pga", path)
    sweep_section = data.get("sweep")
    train_section = _section(data, "train", path)
    if isinstance(train_section.get("run_dir"), str) and train_section["run_dir"].strip():
        train_section = {**train_section, "run_dir": resolve(train_section["run_dir"])}
    trains = _train(train_section, path) if "train" in data else ()
    train = trains[0] if trains else None
    trajectory = _trajectory(_section(data, "trajectory", path), path) if "trajectory" in data else None
    width = WidthSettings.from_mapping(_section(data, "width", path), f"{path}: [width] ") if "width" in data else None
    if trajectory is not None and trajectory.report:
        trajectory = replace(trajectory, report=resolve(trajectory.report))
    if width is not None and width.report:
        width = replace(width, report=resolve(width.report))
    if width is not None and len({run.settings.hidden_size for run in trains}) < 2:
        raise RaygeomError(f"{path}: [width] reads a width ladder: [train] needs hidden_size = [a list of widths]")
    models = data.get("models", [] if sweep_section is not None or train is not None else None)
    if not isinstance(models, list) or (not models and sweep_section is None and train is None):
        raise RaygeomError(f"{path}: needs at least one [[models]] entry with an 'id'")
    entries = []
    for entry in models:
        if isinstance(entry, dict) and isinstance(entry.get("run_dir"), str) and "id" not in entry:
            entry = {**entry, "id": entry["run_dir"], "run_dir": True}
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise RaygeomError(f"{path}: every [[models]] entry needs a string 'id' (or a 'run_dir')")
        _known(entry, set(MODEL_KEYS), "models", path)
        if entry.get("run_dir", False) not in (True, False):
            raise RaygeomError(f"{path}: 'run_dir' of a [[models]] entry is a path (or true with an 'id')")
        entry = {**entry, "id": _local_model(entry, resolve)}
        run_dir = bool(entry.get("run_dir")) or is_run_directory(entry["id"])
        revisions = entry.get("revisions", "all" if run_dir else ["main"])
        if run_dir and isinstance(revisions, str):
            revisions = [revisions]  # all, a label or stepN: resolved against the directory when the job runs
        elif sweep_section is not None and isinstance(revisions, str):
            revisions = _expand(revisions, path)
        if not isinstance(revisions, list) or not all(isinstance(r, str) for r in revisions) or not revisions:
            raise RaygeomError(f"{path}: 'revisions' of model {entry['id']} must be a non-empty list of strings")
        entries.append(ModelEntry(entry["id"], tuple(revisions), run_dir))
    for run in trains:  # what [train] writes is what the job sweeps
        if not any(e.run_dir and _same_path(e.source, run.run_dir) for e in entries):
            entries.append(ModelEntry(run.run_dir, ("all",), True))
    sweep = None
    if sweep_section is not None:
        sweep, generated = _sweep(_section(data, "sweep", path), path)
        entries += [e for e in generated if e.source not in {x.source for x in entries}]
        if not entries:
            raise RaygeomError(f"{path}: [sweep] needs 'sizes' or at least one [[models]] entry")
    corpus_name = _local_corpus(str(corpus.get("name", "bbc")), resolve)
    if corpus_name == "heldout":
        if train is None:
            raise RaygeomError(f"{path}: corpus 'heldout' means the held-out articles of [train]; this job has no [train]")
        corpus_name = str(Path(train.run_dir) / "heldout.jsonl")
    analyses = ()
    if "analyses" in data:
        from raygeom.analyses.registry import parse_analyses

        analyses = parse_analyses(data["analyses"], f"{path}: ")
    try:
        layers = extract.pop("layers", "all")
        if isinstance(layers, list):  # layers = [0, 5, -1] means "0,5,-1"
            if not layers:
                raise RaygeomError(f'{path}: [extract] layers is an empty list; give "all" or the layers, e.g. [0, 5, -1]')
            layers = ",".join(str(item) for item in layers)
        out = job.get("out", f"runs/{path.stem}")
        if not isinstance(out, str) or not out.strip():
            raise RaygeomError(f"[job] out must be a directory path (a string), got {out!r}")
        out = resolve(out, "[job] out")
        spec = JobSpec(
            name=str(job.get("name", path.stem)),
            out=str(out),
            models=tuple(entries),
            corpus=corpus_name,
            n_samples=int(corpus.get("n_samples", 500)),
            sample_seed=int(corpus.get("seed", 0)),
            layers=str(layers),
            extraction=ExtractionSettings.from_mapping(extract, f"{path}: [extract] "),
            pga=PGAParams.from_mapping(analysis, f"{path}: [pga] "),
            sweep=sweep,
            trains=trains,
            trajectory=trajectory,
            width=width,
            analyses=analyses,
            path=str(path),
            gpus=isinstance(sweep_section, dict) and bool({"gpu_memory_gib", "gpus_per_node"} & set(sweep_section)),
        )
        if not trains:  # a [train] job's texts may be written by its run; the other keys are refused first
            name = str(corpus.get("name", "bbc"))
            check_corpus_file(name, corpus_name, f"the job file's folder {path.parent.resolve()}", f"{path}: [corpus] ")
        for item in analyses:
            item.spec.check_job(item.params, spec)
        return spec
    except RaygeomError as error:
        raise RaygeomError(error.args[0] if str(error).startswith(str(path)) else f"{path}: {error}") from None
    except (TypeError, ValueError) as error:
        raise RaygeomError(f"{path}: {error}") from None


SWEEP_KEYS = {*SWEEP_EXTRA_KEYS, *(f.name for f in fields(SweepSettings))}


def _expand(revisions, path: Path) -> list[str]:
    from raygeom.sources.revisions import expand_revisions

    try:
        return expand_revisions(revisions)
    except RaygeomError as error:
        raise RaygeomError(f"{path}: {error}") from None


def _sweep(section: dict, path: Path) -> tuple[SweepSettings, list[ModelEntry]]:
    """[sweep]: ``sizes`` (Pythia sizes), ``deduped`` (false | true: also the -deduped models | "only"),
    ``revisions`` (all | log | linear | every:N | stepA:stepB | a list) and the SweepSettings fields."""
    from raygeom.sources.revisions import repo_id

    _known(section, SWEEP_KEYS, "sweep", path)
    sizes = section.get("sizes", [])
    if not isinstance(sizes, list) or not all(isinstance(x, str) for x in sizes):
        raise RaygeomError(f'{path}: [sweep] sizes must be a list of Pythia sizes such as "70m"')
    deduped = section.get("deduped", False)
    if deduped not in (False, True, "only"):
        raise RaygeomError(f'{path}: [sweep] deduped must be false, true or "only"')
    revisions = _expand(section.get("revisions", "all"), path)
    variants = {False: (False,), True: (False, True), "only": (True,)}[deduped]
    try:
        entries = [ModelEntry(repo_id(size, d), tuple(revisions)) for size in sizes for d in variants]
        settings = SweepSettings(**{k: v for k, v in section.items() if k not in ("sizes", "deduped", "revisions")})
    except RaygeomError as error:
        raise RaygeomError(f"{path}: [sweep] {error}") from None
    except TypeError as error:
        raise RaygeomError(f"{path}: [sweep] {error}") from None
    return settings, entries


def _same_path(a: str, b: str) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


TRAIN_KEYS = {"run_dir", "save_every", "log_until", *TRAIN_EXTRA_KEYS}
# Every run of a [train] grid is trained and evaluated on the same articles, split and tokenizer.
SHARED_DATA = ("corpus", "seq_len", "vocab_size", "eval_sequences", "heldout_fraction", "max_texts")
VARIANT_PREFIX = {"hidden_size": "d", "n_layers": "l", "seed": "seed", "lam": "lam"}


def _train(section: dict, path: Path) -> tuple[TrainJob, ...]:
    """[train]: the TrainSettings fields, plus run_dir (where checkpoints go), save_every and log_until. A list value
    (``hidden_size = [64, 128]``, ``seed = [0, 1]``) makes a grid: one run per combination, each in its own
    ``run_dir/<variant>`` (e.g. ``d64-seed1``); ``head_dim`` sets n_heads = hidden_size / head_dim for each.
    ``skip = [{hidden_size = 512, n_layers = 12}]`` leaves out every grid point that matches one of its tables."""
    from raygeom.analyses.train import TrainRuns, TrainSettings

    _known(section, TRAIN_KEYS | {f.name for f in fields(TrainSettings)}, "train", path)
    if not isinstance(section.get("run_dir"), str) or not isinstance(section.get("save_every"), int):
        raise RaygeomError(
            f"{path}: [train] needs run_dir (a directory) and save_every (steps between checkpoints after the log-spaced ones)"
        )
    if not section["run_dir"].strip():  # "" would train into the folder the command runs from
        raise RaygeomError(f'{path}: [train] run_dir = "" names no directory; give the folder its checkpoints go to')
    grid = {k: v for k, v in section.items() if isinstance(v, list) and k not in TRAIN_KEYS}
    shared = [k for k in grid if k in SHARED_DATA]
    if shared:
        raise RaygeomError(
            f"{path}: [train] {shared[0]} cannot be a list: every run of a grid shares its data ({', '.join(SHARED_DATA)})"
        )
    empty = [k for k, v in grid.items() if not v or len(set(map(repr, v))) != len(v)]
    if empty:
        raise RaygeomError(f"{path}: [train] {empty[0]} must list distinct values, got {section[empty[0]]!r}")
    head_dim = section.get("head_dim")
    if head_dim is not None and (not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim < 1):
        raise RaygeomError(f"{path}: [train] head_dim must be a positive integer, got {head_dim!r}")
    skip = section.get("skip", [])
    if not isinstance(skip, list) or not all(isinstance(s, dict) and s and set(s) <= set(grid) for s in skip):
        raise RaygeomError(f"{path}: [train] skip must list tables of grid keys ({', '.join(grid) or 'none'}), got {skip!r}")
    runs = []
    for values in itertools.product(*grid.values()):
        point = dict(zip(grid, values))
        if any(all(point[k] == v for k, v in s.items()) for s in skip):
            continue
        variant = "-".join(f"{VARIANT_PREFIX.get(k, k)}{v}" for k, v in point.items())
        fields_ = {k: v for k, v in {**section, **point}.items() if k not in TRAIN_KEYS}
        try:
            if head_dim is not None:
                width = fields_.get("hidden_size", TrainSettings().hidden_size)
                if not isinstance(width, int) or width % head_dim:
                    raise RaygeomError(f"hidden_size {width!r} is not a multiple of head_dim {head_dim}")
                fields_["n_heads"] = width // head_dim
            settings = TrainSettings(**fields_)
            run_dir = str(Path(section["run_dir"]) / variant) if variant else section["run_dir"]
            log_until = check_value(TrainRuns, "log_until", section.get("log_until", default_of(TrainRuns, "log_until")))
            job = TrainJob(settings, run_dir, section["save_every"], log_until, variant)
            job.plan()  # validates the schedule
        except RaygeomError as error:
            raise RaygeomError(f"{path}: [train]{' ' + variant if variant else ''} {error}") from None
        except (TypeError, ValueError) as error:
            raise RaygeomError(f"{path}: [train]{' ' + variant if variant else ''} {error}") from None
        runs.append(job)
    return tuple(runs)


def _trajectory(section: dict, path: Path):
    _known(section, {f.name for f in fields(TrajectorySettings)}, "trajectory", path)
    try:
        return TrajectorySettings(**section)
    except RaygeomError as error:
        raise RaygeomError(f"{path}: [trajectory] {error}") from None
    except (TypeError, ValueError) as error:
        raise RaygeomError(f"{path}: [trajectory] {error}") from None
