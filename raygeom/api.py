"""The Python API for notebooks: the CLI's analysis, in process, on objects you already hold.

    import raygeom
    model, tokenizer = raygeom.load_builtin("smollm2")        # the CLI's loader, offline
    texts, labels = raygeom.load_texts("bbc", n=40)           # the CLI's corpora
    result = raygeom.subspace_pga(H, W_U, k=100)              # arrays you have (numpy or torch, any dtype/device)
    layers, nll = raygeom.layer_activations(model, tokenizer, texts, layers="embed,5,-1")  # an HF model you have
    table = raygeom.pga_by_layer(model, tokenizer, texts, k=100)
    raygeom.write_activations("runs/mine", model="my-model", revision="main", layer="block_05", vectors=H, readout=W_U)
    rows = raygeom.store_pga("runs/mine", "my-model")        # PGA rows stored as the CLI stores them
    rows = raygeom.store_analysis("runs/mine", "my-model", "main", "twonn")  # any registered analysis, the same way

Every array argument takes numpy arrays or torch tensors of any float dtype, on any device, with or without
``requires_grad`` (see :func:`as_array`). No Ray is started here; use the CLI to fan work out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raygeom.errors import InputError, RaygeomError
from raygeom.numerics import pga
from raygeom.numerics.arrays import as_array  # noqa: F401 - raygeom.as_array
from raygeom.numerics.checks import shown
from raygeom.replica.extract import ExtractionSettings, extract_batches
from raygeom.sources import layers as layer_position
from raygeom.sources import model_surgery
from raygeom.store.activations import checked_path


def matrix(x, name: str, dtype=np.float64) -> np.ndarray:
    """``x`` as a finite 2-D array (rows x d), or one line saying what it is instead."""
    array = as_array(x, dtype, name)
    if array.ndim != 2:
        raise InputError(f"{name} must be a 2-D array (rows x d), got shape {array.shape}")
    if not np.isfinite(array).all():
        raise InputError(f"{name} holds NaN or Inf ({int((~np.isfinite(array)).sum())} of {array.size} values)")
    return array


def declared(cls, name: str, value, label: str):
    """``value`` checked by the declaration ``cls.name`` that the CLI's flag and the job key are checked by."""
    from raygeom.params import allowed, check_value

    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise InputError(f"{label} holds a lone surrogate U+{ord(value[error.start]):04X}, which is not text") from None
        control = next((c for c in value if c in "\n\r\x00\x0b\x0c\x85\u2028\u2029"), None)
        if control is not None:  # a name never holds one; a refusal that quoted it would not be one line
            raise InputError(f"{label} must be one line (no line break or NUL), got {value!r:.80}")
    try:
        return check_value(cls, name, value, label=label)
    except RaygeomError:
        raise InputError(f"{label} must be {allowed(cls, name)}, got {shown(value)}") from None


def checked_strings(values, name: str, what: str = "strings") -> list[str]:
    """``values`` as a non-empty list of non-empty strings (a str is one value, not a list of characters)."""
    if isinstance(values, str) or not isinstance(values, (list, tuple)):
        raise InputError(f"{name} must be a non-empty list of {what}, got {type(values).__name__}")
    bad = next((i for i, value in enumerate(values) if not isinstance(value, str) or not value.strip()), None)
    if not values or bad is not None:
        text = f"{name}[{bad}] = {shown(values[bad])}" if values else "an empty list"
        raise InputError(f"{name} must be a non-empty list of {what}, got {text}")
    return list(values)


_NO_TOKENIZER = object()


def checked_model(model, tokenizer=_NO_TOKENIZER):
    """``model`` as a Hugging Face causal LM (what load_model returns); with ``tokenizer``, it too."""
    import torch

    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise InputError(
            "model must be a Hugging Face causal LM (a torch.nn.Module with .config, as raygeom.load_model returns), "
            f"got {type(model).__name__}"
        )
    if tokenizer is not _NO_TOKENIZER:
        from transformers import PreTrainedTokenizerBase

        if not isinstance(tokenizer, PreTrainedTokenizerBase):
            raise InputError(
                f"tokenizer must be a Hugging Face tokenizer (as raygeom.load_model returns), got {type(tokenizer).__name__}"
            )
    return model


def checked_params(**values) -> None:
    """The API's analysis arguments checked by the same declarations as the CLI's flags and job keys."""
    from raygeom.params import PGAParams

    for name, value in values.items():  # each by its flag's declaration: a value, never a word such as 'auto'
        declared(PGAParams, name, value, name)
    try:
        PGAParams.from_mapping(values)
    except RaygeomError as error:
        raise InputError(str(error)) from None


def checked_device(device: str | None) -> str | None:
    """``device`` if torch can use it here (None: the default), else one line; not torch's AssertionError."""
    from raygeom.numerics.checks import device as usable

    return usable("device", device)


def load_model(name: str = "smollm2", revision: str | None = None, device: str = "cpu"):
    """``(model, tokenizer)`` of anything ``--model`` takes (built-in name, HF hub id, model directory, .gguf
    file), loaded exactly as the CLI loads it; a GGUF is dequantised once and cached (see the README)."""
    from raygeom.jobspec import GridSettings
    from raygeom.sources.models import load_model as load
    from raygeom.sources.models import resolve_model

    declared(GridSettings, "model", name, "name")
    if revision is not None:
        declared(GridSettings, "revision", revision, "revision")
    device = checked_device("cpu" if device is None else device)
    return load(resolve_model(name, revision), device=device)


def load_builtin(name: str = "smollm2", device: str = "cpu"):
    """``(model, tokenizer)`` of a built-in offline model: ``smollm2`` (``smollm2-135m-instruct-q4_1``: SmolLM2-135M-Instruct,
    Q4_1-quantised, dequantised to fp32) or ``gemma3-270m`` (``gemma3-270m-q4_k_m``: Gemma 3 270M base, Q4_K_M)."""
    from raygeom.jobspec import GridSettings
    from raygeom.sources.models import builtin_names, resolve_model

    declared(GridSettings, "model", name, "name")
    spec = resolve_model(name) if "/" not in name and not name.endswith(".gguf") else None
    if spec is None or spec.kind != "builtin":
        raise InputError(
            f"'{name}' is not a built-in model; built in: {builtin_names()} "
            "(raygeom.load_model takes hub ids, directories and .gguf files)"
        )
    return load_model(spec.source, device=device)


def load_texts(source: str = "bbc", n: int | None = None, seed: int = 0) -> tuple[list[str], list[str] | None]:
    """``(texts, labels)`` of a corpus the CLI's ``--corpus`` takes; ``n`` texts in the CLI's seeded order."""
    from raygeom.jobspec import CorpusSection
    from raygeom.sources.corpus import load_corpus

    declared(CorpusSection, "name", source, "source")
    if n is not None:
        declared(CorpusSection, "n_samples", n, "n")
    declared(CorpusSection, "seed", seed, "seed")
    corpus = load_corpus(source)
    if n is not None:
        corpus = corpus.sample(n, seed)
    return list(corpus.texts), (list(corpus.labels) if corpus.labels is not None else None)


def layer_activations(
    model,
    tokenizer,
    texts: list[str],
    settings: ExtractionSettings | None = None,
    layers: str | list[str] | None = None,
    nll: bool = True,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Pooled hidden states (layer name -> N x d float32) and per-text mean NLL of ``model`` on ``texts``.

    ``layers``: None or ``"all"`` for every layer, else a ``--layers`` string (``"embed,5,-1,final_norm"``,
    ``"block_05.mlp_out"``) or a list of such parts, parsed by :func:`select_layers` exactly as the CLI parses it.
    ``nll=False`` skips the full-vocabulary LM head and returns NaN NLLs. ``settings`` defaults to the CLI's
    (128 tokens, last-token pooling, batches of 16)."""
    checked_model(model, tokenizer)
    texts = checked_strings(texts, "texts", "texts (strings)")
    if settings is not None and not isinstance(settings, ExtractionSettings):
        raise InputError(f"settings must be a raygeom.ExtractionSettings or None, got {type(settings).__name__}")
    if not isinstance(nll, bool):
        raise InputError(f"nll must be true or false, got {shown(nll)}")
    settings = settings or ExtractionSettings()
    chosen = _chosen_layers(model, layers)
    # As the CLI's replicas extract: one torch thread per batch, as many batches at once as torch has threads here.
    parts = [texts[i : i + settings.batch_size] for i in range(0, len(texts), settings.batch_size)]
    batches = extract_batches(model, tokenizer, parts, settings, chosen, nll=nll)
    if not batches:
        raise InputError("no texts given")
    return ({n: np.concatenate([b.pooled[n] for b in batches]) for n in chosen}, np.concatenate([b.nll for b in batches]))


def _chosen_layers(model, layers: str | list[str] | tuple[str, ...] | None) -> list[str]:
    return select_layers(model_surgery.layer_names(checked_model(model)), "all" if layers is None else layers)


def layer_names(model) -> list[str]:
    """Every layer name raygeom extracts by default from ``model``, in depth order: ``embed`` (the first block's
    input), ``block_XX`` (each block's output) and ``final_norm``. Points inside blocks (``block_XX.attn_out``,
    ``block_XX.mlp_out``, ``block_XX.resid_mid``) are extracted when named (see :func:`select_layers`)."""
    return model_surgery.layer_names(checked_model(model))


def select_layers(all_layers: list[str], selection: str | list[str] = "all") -> list[str]:
    """The layers a ``--layers`` value names, the one parser the CLI, job files and this API share.

    ``all``, or comma-separated parts: layer names, block numbers (``5`` is ``block_05``, ``-1`` the last block),
    ``a:b`` block ranges (blocks a to b-1), and points inside a block (``block_05.mlp_out``, ``5.attn_out``,
    ``-1.resid_mid``). Integers count blocks only; ``embed`` and ``final_norm`` are named. An unknown part raises
    :class:`InputError`-style :class:`RaygeomError` with one line."""
    from raygeom.jobspec import GridSettings
    from raygeom.sources.layers import select_layers as select

    all_layers = checked_strings(all_layers, "all_layers", "layer names")
    if isinstance(selection, (list, tuple)):  # block numbers may be ints, as in a --layers string
        selection = [str(part) if isinstance(part, int) and not isinstance(part, bool) else part for part in selection]
    if not isinstance(selection, str):
        selection = ",".join(checked_strings(selection, "layers", "layer names or block numbers"))
    return select(all_layers, declared(GridSettings, "layers", selection, "layers"))


def unembedding_matrix(model) -> np.ndarray:
    """``W_U`` (V x d, float32 numpy) of an HF causal LM; the input embedding when the model ties them."""
    return as_array(model_surgery.unembedding(checked_model(model)), np.float32, "W_U")


def readout_basis(w_u, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` right singular vectors (``d x k``, float64) and singular values of ``W_U`` (``V x d``), the readout
    subspace Subspace PGA scores against. ``w_u`` may be a torch tensor (e.g. ``model.lm_head.weight``)."""
    from raygeom.params import PGAParams

    declared(PGAParams, "k", k, "k")
    return pga.readout_basis(matrix(w_u, "W_U", np.float64), k)


@dataclass(frozen=True)
class PGAResult(pga.PGAResult):
    """Subspace PGA of one layer: how much better the readout subspace of ``W_U`` preserves the layer's distance
    ranking than random subspaces of the same dimension do.

    Attributes:
        rho_readout: Spearman correlation between the pairwise cosine distances of the layer (after centring and
            removing its top ``r`` principal components, CCR-r) and of its projection on the top-``k`` readout subspace.
        null_mean, null_std: mean and standard deviation of the same correlation over ``n_null`` random k-subspaces.
        z: ``(rho_readout - null_mean) / null_std``.
        k, r, n, n_null, seed: readout dimension, components removed, texts, random subspaces, seed of the nulls.
        z_se, z_lo, z_hi, z_half_width: z's Monte-Carlo standard error from the finite null and its 95 % interval
            ``z +- 1.96 z_se`` (the CLI's ``z_lo``/``z_hi`` columns).
        p_upper, p_lower: empirical one-sided p-values of rho_readout against the nulls.
        rho_texts_lo, rho_texts_hi, margin_texts_lo, margin_texts_hi, n_half_samples: the 95 % interval over texts
            of rho_readout and of the margin ``rho_readout - null_mean``, from ``n_half_samples`` seeded half-samples
            of the texts (the CLI's ``--text-halves``, 10 by default); it is the margin at this N, which shifts with N
            (docs/METRICS.md, "It is the margin at that N"); NaN and 0 where not computed
            (``text_halves=0``) or not computable (too few texts).
    """

    rho_texts_lo: float = float("nan")
    rho_texts_hi: float = float("nan")
    margin_texts_lo: float = float("nan")
    margin_texts_hi: float = float("nan")
    n_half_samples: int = 0

    def to_dict(self) -> dict:
        """Every field, as the columns of a results row."""
        return super().to_dict()


def subspace_pga(
    h,
    w_u=None,
    *,
    readout=None,
    k: int = 100,
    r: int = 1,
    n_null: int = 100,
    seed: int = 0,
    text_halves: int = 10,
    device: str | None = None,
) -> PGAResult:
    """Subspace PGA z of one layer ``h`` (N x d) against ``w_u`` (V x d), or against ``readout`` (the d x k' basis
    from :func:`readout_basis`, k' >= k, to reuse one basis across layers), with every interval the CLI stores:
    z's Monte-Carlo error and p-values, and with ``text_halves`` >= 2 the interval over texts (0 skips it).

    Arrays may be numpy or torch of any float dtype and device (bf16, CUDA, ``requires_grad``). The numbers are
    those of :func:`raygeom.numerics.pga.subspace_pga` and of ``raygeom pga`` on the same vectors."""
    from raygeom.analyses.pga import texts_columns
    from raygeom.numerics import rank
    from raygeom.numerics.pga_texts import half_sample_spread

    checked_params(k=k, r=r, n_null=n_null, seed=seed, text_halves=text_halves)
    device = checked_device(device)
    h = matrix(h, "H", np.float32)
    if (readout is None) == (w_u is None):
        raise InputError(
            "give either W_U or a readout basis, not both" if w_u is not None else "give either W_U or a readout basis"
        )
    if h.shape[1] <= k:
        raise InputError(f"k must be below d = {h.shape[1]} (H's width), got {k}")
    if readout is None:
        w_u = matrix(w_u, "W_U", np.float64)
        if w_u.shape[1] != h.shape[1]:
            raise InputError(f"W_U has shape {w_u.shape} but H has shape {h.shape}; both need the same d")
        readout, _ = pga.readout_basis(w_u, k)
    readout = matrix(readout, "readout", np.float64)
    if readout.shape[0] != h.shape[1] or readout.shape[1] < k:
        raise InputError(
            f"readout must be a d x k' basis with d = {h.shape[1]} (H's) and k' >= k = {k}, got shape {readout.shape}"
        )
    rank.check_readout_rank(np.linalg.svd(readout[:, :k], compute_uv=False), k, (h.shape[1], k), "readout")
    # What the CLI would not score is not scored here either: one InputError with the store's "not scored" reason.
    if h.shape[0] < 3:
        raise InputError(f"not scored: pairwise geometry needs at least 3 rows of H, got {h.shape[0]}")
    info = rank.layer_rank(h)
    try:
        if info.rank > 0:
            rank.check_rank(info, r, k)
        prepared = pga.prepare_layer(h, r)
        n = prepared.n_samples
        rank.check_distinct_distances(prepared.centred_full_ranks, n * (n - 1) // 2, info, r)
    except InputError as error:
        raise InputError(f"not scored: {error}") from None
    base = pga.subspace_pga(h, readout=readout, k=k, r=r, n_null=n_null, seed=seed, device=device)
    if not (np.isfinite(base.rho_readout) and np.isfinite(base.null_std) and base.null_std > 0):
        # the store's rule (raygeom.analyses.pga): e.g. rows on one line, which float16 rounding lifts above rank 1
        raise InputError(f"not scored: distances are constant after CCR-{r} or the nulls have no spread, so z is undefined")
    texts = {}
    if text_halves and np.isfinite(base.z):
        try:
            spread = half_sample_spread(h, np.ascontiguousarray(readout[:, :k]), r, k, seed, n_half=text_halves, device=device)
        except InputError:
            spread = None
        texts = texts_columns(base.rho_readout, base.rho_readout - base.null_mean, spread)
    return PGAResult(**base.to_dict(), **texts)


def dispersion(h) -> float:
    """Representation dispersion of ``h`` (N x d): the mean pairwise cosine distance of its rows, in float64
    (numpy or torch of any dtype and device)."""
    from raygeom.numerics.dispersion import dispersion as mean_cosine_distance

    h = matrix(h, "H", np.float64)
    zero = np.flatnonzero(~h.any(axis=1))
    if zero.size:
        raise InputError(
            f"H row {zero[0]} is a zero vector ({zero.size} of {h.shape[0]} rows): it has no direction, so its cosine "
            "distance to the others is undefined; every row of H must be nonzero"
        )
    return mean_cosine_distance(h)


def pga_by_layer(
    model,
    tokenizer,
    texts: list[str],
    *,
    k: int = 100,
    r: int = 1,
    n_null: int = 100,
    seed: int = 0,
    text_halves: int = 0,
    settings: ExtractionSettings | None = None,
    layers: str | list[str] = "all",
) -> list[dict]:
    """Subspace PGA of every layer of ``model`` on ``texts`` (or of ``layers``: names, or a ``--layers`` string
    such as ``"embed,5,-1,final_norm"`` or ``"block_05.mlp_out"``): one dict per layer, in depth order, with its
    index, relative depth and the fields of :class:`PGAResult` (``text_halves`` >= 2 adds the interval over texts).
    A degenerate layer (e.g. every text has the same vector) gets NaN z and its reason in ``note``."""
    checked_model(model, tokenizer)
    checked_params(k=k, r=r, n_null=n_null, seed=seed, text_halves=text_halves)
    all_layers = model_surgery.layer_names(model)
    chosen = _chosen_layers(model, layers)
    basis, _ = pga.readout_basis(unembedding_matrix(model), k)  # k against d and W_U's rank before any forward pass
    activations, _ = layer_activations(model, tokenizer, texts, settings, chosen, nll=False)
    rows = []
    for name, h in activations.items():
        try:
            result = subspace_pga(h, readout=basis, k=k, r=r, n_null=n_null, seed=seed, text_halves=text_halves).to_dict()
        except InputError as error:  # one degenerate layer (e.g. every text ends in the same token) is not fatal
            result = {"rho_readout": np.nan, "null_mean": np.nan, "null_std": np.nan, "z": np.nan, "note": str(error)}
        rows.append(
            {
                "layer": name,
                "layer_index": layer_position.index(all_layers, name),
                "relative_depth": layer_position.relative_depth(all_layers, name),
                **result,
            }
        )
    return rows


def _call(step, prepared: list, marker, seconds: list[float]):
    from raygeom.engine.contract import timed

    args = []
    for value in step.args:
        if value is marker:
            args.extend(prepared)
        else:
            args.append(value)
    value, taken = timed(step.fn, *args)
    seconds.append(taken)
    return value


def _run_units_here(store, units) -> list[dict]:
    """The unit engine's contract, run in this process (no Ray): prepare, parts, finish (asking for more parts where
    ``finish`` does), each unit's rows written as ``results/<analysis>/<key>.parquet``; stored units are read back."""
    from raygeom.engine.contract import PREPARED, More, finished_rows

    rows = []
    store.record_planned(units)
    for unit in units:
        if unit.store_rows and store.has_result(unit.analysis, unit.key):
            rows += store.read_results(unit.analysis, [unit.key]).to_pylist()
            continue
        seconds: list[float] = []
        try:
            prepared = [_call(step, [], PREPARED, seconds) for step in unit.prepare]
            values = [_call(step, prepared, PREPARED, seconds) for step in unit.parts]
            produced = unit.finish(values)
            while isinstance(produced, More):
                values += [_call(step, prepared, PREPARED, seconds) for step in produced.parts]
                produced = unit.finish(values)
        except InputError as error:
            if unit.degenerate is None:
                raise
            produced = unit.degenerate(str(error))
            rows += [produced] if isinstance(produced, dict) else list(produced)
            continue
        produced = finished_rows(produced, unit.key, sum(seconds))
        if unit.store_rows:
            store.write_result(unit.analysis, unit.key, produced)
        rows += produced
    return rows


def store_pga(
    store,
    model: str,
    revision: str = "main",
    *,
    layers: str | list[str] = "all",
    k: int = 100,
    r: int = 1,
    n_null: int = 100,
    seed: int = 0,
    text_halves: int = 10,
    extraction: str | None = None,
) -> list[dict]:
    """Subspace PGA of the layers of one extraction in ``store`` (raygeom's own, or vectors written with
    :func:`write_activations`), in this process, without Ray: the same units ``raygeom pga`` runs, so the rows
    (one per layer, with z's interval, p-values and the interval over texts) are the CLI's, and they are stored
    under ``results/pga/`` where ``raygeom report STORE`` shows them, with the CLI's table ``results/pga.parquet``
    (every PGA row of the store) and plot ``plots/pga_z_vs_depth.png``. Finished layers are read back, not
    recomputed. ``layers`` selects among the stored layers (a ``--layers`` string or a list); ``extraction``: as in
    :func:`store_analysis`."""
    return store_analysis(
        store,
        model,
        revision,
        "pga",
        layers=layers,
        k=k,
        r=r,
        n_null=n_null,
        seed=seed,
        null_chunks=1,
        text_halves=text_halves,
        extraction=extraction,
    )


def store_analysis(
    store, model: str, revision: str, analysis: str, *, layers: str | list[str] = "all", extraction: str | None = None, **params
) -> list[dict]:
    """Any registered analysis of stored vectors (``pga``, ``spectral``, ``pc1``, ``twonn``, ``probe``, ...: the names
    ``raygeom.analyses.registry.analyses()`` lists whose ``extraction`` is "pooled"; the others are made from the
    model and are refused here) of the layers of one extraction in ``store`` (raygeom's own, or
    vectors written with :func:`write_activations`), in this process, without Ray. ``params`` are the analysis's
    parameters, as in a job file's ``[analyses.<name>]`` table (e.g. ``k=6``), checked the same way; the units are
    the ones a job runs, so the rows (a list of dicts, per layer) are the CLI's, stored under
    ``results/<analysis>/`` where ``raygeom report STORE`` shows them, with the table and plots a job writes
    (``results/<analysis>.parquet``: every row of it the store holds; ``plots/``). Finished layers are read back, not
    recomputed. ``layers`` selects among the stored layers (a ``--layers`` string or a list). ``extraction``: the
    settings key of the extraction to analyse, where the store holds several of this (model, revision) (the report's
    settings table lists them); without it, the one there is."""
    from pathlib import Path

    from raygeom.analyses import registry
    from raygeom.jobspec import GridSettings
    from raygeom.store.tree import Store, lock_store

    checked_path(store, "store")
    declared(GridSettings, "model", model, "model")
    declared(GridSettings, "revision", revision, "revision")
    if extraction is not None and (not isinstance(extraction, str) or not extraction.strip()):
        raise InputError(f"extraction must be a settings key (a non-empty string) or None, got {type(extraction).__name__}")
    if not isinstance(analysis, str):
        raise InputError(f"analysis must be a registered analysis's name (a string), got {type(analysis).__name__}")
    spec = registry.get(analysis)
    if spec.extraction != "pooled":
        raise InputError(
            f"{analysis} reads an extraction of its own ({spec.extraction}), made from the model, not the "
            f"stored vectors; run it in a job ([analyses.{analysis}]) or as `raygeom analyze {analysis}`"
        )
    planned = registry.Planned(analysis, spec.Params.from_mapping(params, f"{analysis}: "))
    root = Path(store)
    tree = Store(root)
    if extraction is None:
        keys = [found.key for found in tree.extractions(model, revision) if found.marker]
        if len(keys) > 1:
            raise InputError(
                f"{root} holds {len(keys)} extractions of {model}@{revision}; choose one with extraction= "
                f"(their settings keys: {', '.join(keys)})"
            )
    info = tree.completion(model, revision, extraction)
    if info is None or (extraction is not None and info.get("key") != extraction):
        which = f" with settings key {extraction}" if extraction else ""
        raise InputError(f"no complete extraction of {model}@{revision}{which} in {root}")
    stored = list(info.get("layers", []))
    chosen = (
        stored
        if layers is None or (isinstance(layers, str) and layers == "all")
        else select_layers([*info["all_layers"], *stored], layers)
    )
    missing = [name for name in chosen if name not in stored]
    if missing:
        raise InputError(f"{model}@{revision} in {root} stores no layer {missing[0]} (stored: {', '.join(stored)})")
    lock_store(root)
    rows = _run_units_here(tree, registry.units_for(tree, model, revision, chosen, info, [planned]))
    _write_outputs(tree, spec, rows)
    return rows


def _write_outputs(store, spec, rows: list[dict]) -> None:
    """What a job writes after an analysis, so a store filled from Python holds what one filled by the CLI holds:
    ``results/<dir>.parquet`` with every row of the analysis the store holds (all calls, each with its settings) and
    the plots of this call's rows under ``plots/``."""
    from raygeom.analyses.results_table import write_results_table
    from raygeom.report.tables import analysis_files

    write_results_table(store, spec, rows, write_empty=False)  # the CLI's writer: its columns and types
    analysis_files(spec, rows, store.root)  # and its figures and documents
