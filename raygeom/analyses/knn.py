"""kNN-LM layer selection: which layer's representations make the best datastore, and does dispersion pick it?

Stages, with Parquet between them:

1. one replica actor (``raygeom.engine.replica_actor``) cuts datastore text and held-out text into
   chunks, runs them through the model once and writes, per candidate layer,
   the datastore keys (the representation at every position) and the held-out
   queries; shared files hold the values (next tokens), the held-out targets
   and the base LM's log-probability of each target;
2. one unit of the engine (``raygeom.engine.units``) per layer searches the datastore exactly
   (chunked torch matmuls, ``numerics.knnlm.ExactIndex``), chooses the temperature scale and the
   interpolation weight on a tuning half of the held-out chunks and reports the interpolated
   perplexity on the other half, with the dispersion of the layer's keys. Its row goes to
   ``results/knn/<key>.parquet`` and its per-token log-probabilities to ``results/knn_tokens/``;
   ``results/knn.parquet`` accumulates every stored unit of the store.

Uncertainty: the perplexity difference (kNN-LM minus base LM, on the evaluation half) gets a seeded
percentile bootstrap interval over blocks of ``bootstrap_block`` consecutive held-out tokens inside
each chunk (tokens in one article are not independent; 1 = single tokens, >= the chunk length = whole
chunks). Every layer resamples the same blocks, so the best layer is compared with the runner-up on
paired draws: separated when the interval of their difference excludes 0. Below ``BLOCK_MIN`` (10) blocks there is no
interval: NaN bounds and a ``note`` (the settings give the block count, so the command refuses them before Ray starts).
The rank correlations over layers carry a Fisher interval, or their permutation p-value over fewer than 10 layers.

Exact search holds the keys of one layer in memory (n_keys x d float32). For
datastores that outgrow memory an approximate index (e.g. faiss IVF-PQ) is
swapped in through the same interface as ``ExactIndex`` (``search(queries, k)
-> (squared distances, ids)``, ``__len__``, ``.keys`` for the dispersion); it
is not a dependency here because no run in this repository needs it.
No Ray here: the engine runs the units.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from raygeom.engine.contract import Step, Unit
from raygeom.errors import InputError, RaygeomError
from raygeom.params import KNN_LAMS, KNN_SCALES, ChunkShape, default_of
from raygeom.replica.settings import batches_at_once
from raygeom.sources.corpus import Corpus
from raygeom.sources.models import ModelSpec
from raygeom.store.tree import (
    Store,
    atomic_write_table,
    atomic_write_text,
    column_to_matrix,
    content_key,
    read_table,
    vector_column,
    write_rows,
)

FEATURES_VERSION = 2  # 2: chunks come from the one tokenize module (BOS as the model was trained)
# 2: one engine unit per layer, bootstrap interval of the perplexity difference; 3: no interval below BLOCK_MIN blocks
# (NaN bounds and a note), k never clamped to the datastore, lam at 0 or 1 is no grid edge; 4: choose_tuning_point (lam 0
# compared always, ties within TUNE_RTOL go to the interior, an edge only when the optimum lies beyond; a selection column)
KNN_VERSION = 4
MARKER = "_COMPLETE.json"


@dataclass(frozen=True)
class KnnSettings:
    """The kNN-LM run as the engine's units take it; the chunks' defaults are the declaration's (ChunkShape)."""

    chunk_len: int = default_of(ChunkShape, "chunk_len")
    train_chunks: int = 40
    test_chunks: int = 8
    layers: str = "all"
    k: int = 64
    temperature: str = "auto"
    temperature_scales: str = KNN_SCALES
    lams: str = KNN_LAMS
    batch_size: int = default_of(ChunkShape, "batch_size")
    seed: int = 0
    heldout_fraction: float = 0.2
    gpus_per_task: float = 0.0
    bootstrap_block: int = 64  # held-out tokens per resampled block (1: tokens; >= chunk_len: whole chunks)
    n_boot: int = 2000

    def __post_init__(self):
        if self.chunk_len < 2 or self.train_chunks < 1 or self.batch_size < 1:
            raise RaygeomError("chunk-len must be >= 2, train-chunks and batch-size positive")
        if self.test_chunks < 2:
            raise RaygeomError(f"test-chunks must be at least 2 (a tuning half and an evaluation half), got {self.test_chunks}")
        if self.k < 1:
            raise RaygeomError(f"k must be positive, got {self.k}")
        if self.k > self.n_keys():
            raise RaygeomError(
                f"k {self.k} is more than the {self.n_keys()} keys the datastore holds (train_chunks {self.train_chunks} "
                f"x (chunk_len {self.chunk_len} - 1) next-token positions): use k <= {self.n_keys()} or more train_chunks"
            )
        if not 0.0 < self.heldout_fraction < 1.0:
            raise RaygeomError(f"held-out fraction must be in (0, 1), got {self.heldout_fraction}")
        if self.bootstrap_block < 1:
            raise RaygeomError(f"bootstrap block must be at least 1 token, got {self.bootstrap_block}")
        if self.n_boot < 100:
            raise RaygeomError(f"n-boot must be at least 100 for a 95 % percentile interval, got {self.n_boot}")
        self.lam_values()
        self.temperature_value()
        self.scale_values()

    def n_keys(self) -> int:
        """Datastore keys: every position of every datastore chunk that has a next token (make_chunks gives exactly
        train_chunks chunks or refuses)."""
        return self.train_chunks * (self.chunk_len - 1)

    def evaluation_chunks(self) -> int:
        """Held-out chunks of the evaluation half (the first test_chunks // 2 tune temperature and lam)."""
        return self.test_chunks - self.test_chunks // 2

    def evaluation_blocks(self) -> int:
        """Blocks the bootstrap resamples: each evaluation chunk's chunk_len - 1 predicted tokens in runs of
        bootstrap_block (as token_blocks cuts them)."""
        return self.evaluation_chunks() * -(-(self.chunk_len - 1) // self.bootstrap_block)

    def check_blocks(self) -> None:
        """Refuse settings whose evaluation half is cut into fewer than BLOCK_MIN blocks: no interval could be given."""
        from raygeom.numerics.uncertainty import BLOCK_MIN

        blocks = self.evaluation_blocks()
        if blocks < BLOCK_MIN:
            raise RaygeomError(
                f"bootstrap_block {self.bootstrap_block} cuts the evaluation half ({self.evaluation_chunks()} of "
                f"test_chunks {self.test_chunks}, chunk_len {self.chunk_len} - 1 predicted tokens each) into {blocks} "
                f"block(s); a 95 % interval needs at least {BLOCK_MIN}: use a smaller bootstrap_block or more test_chunks"
            )

    def lam_values(self) -> list[float]:
        try:
            values = [float(x) for x in self.lams.split(",") if x.strip()]
        except ValueError:
            raise RaygeomError(f"lam must be comma-separated numbers, got '{self.lams}'") from None
        if not values or not all(0.0 <= v <= 1.0 for v in values):
            raise RaygeomError(f"lam values must lie in [0, 1], got '{self.lams}'")
        return values

    def scale_values(self) -> list[float]:
        try:
            values = [float(x) for x in self.temperature_scales.split(",") if x.strip()]
        except ValueError:
            values = []
        if not values or not all(v > 0 and np.isfinite(v) for v in values):
            raise RaygeomError(f"temperature scales must be positive numbers, got '{self.temperature_scales}'")
        return values

    def temperature_value(self) -> float | None:
        if self.temperature == "auto":
            return None
        try:
            value = float(self.temperature)
        except ValueError:
            raise RaygeomError(f"temperature must be a positive number or 'auto', got '{self.temperature}'") from None
        if not value > 0 or not np.isfinite(value):
            raise RaygeomError(f"temperature must be a positive number or 'auto', got '{self.temperature}'")
        return value

    def extraction(self) -> dict:
        return {
            "chunk_len": self.chunk_len,
            "train_chunks": self.train_chunks,
            "test_chunks": self.test_chunks,
            "layers": self.layers,
            "seed": self.seed,
            "heldout_fraction": self.heldout_fraction,
        }

    def evaluation(self) -> tuple:
        """What a layer's unit depends on beyond the features."""
        return (self.k, self.temperature, self.temperature_scales, self.lams, self.seed, self.bootstrap_block, self.n_boot)


def split_corpus(corpus: Corpus, heldout_fraction: float, seed: int) -> tuple[Corpus, Corpus]:
    """Datastore and held-out texts from different articles, in a seeded split.

    Exact duplicate texts are dropped first (BBC News holds 100), so no held-out
    article has a copy in the datastore.
    """
    texts = list(dict.fromkeys(corpus.texts))
    if len(texts) < 2:
        raise RaygeomError(f"corpus '{corpus.name}' needs at least 2 distinct texts to split into datastore and held-out text")
    order = np.random.default_rng([seed, 0x4E4E]).permutation(len(texts))
    n_test = min(len(order) - 1, max(1, int(round(heldout_fraction * len(order)))))
    test, train = sorted(order[:n_test].tolist()), sorted(order[n_test:].tolist())
    return (
        Corpus(corpus.name + ":datastore", [texts[i] for i in train]),
        Corpus(corpus.name + ":heldout", [texts[i] for i in test]),
    )


def features_key(spec: ModelSpec, train_text: Corpus, test_text: Corpus, settings: KnnSettings) -> str:
    return content_key(
        "knn",
        FEATURES_VERSION,
        spec.kind,
        spec.source,
        spec.revision,
        train_text.fingerprint(),
        test_text.fingerprint(),
        settings.extraction(),
    )


def planned_units(store: Store, spec: ModelSpec, corpus: Corpus, settings: KnnSettings) -> tuple[int, int]:
    """(units, done) of ``run_knn`` on ``corpus`` split by article: one per layer of the stored features; before
    they exist, the layers the model's config gives (block outputs of the selection, then attn_last)."""
    train_text, test_text = split_corpus(corpus, settings.heldout_fraction, settings.seed)
    key = features_key(spec, train_text, test_text, settings)
    marker = _features_dir(store, spec, key) / MARKER
    if marker.is_file():
        info = json.loads(marker.read_text())
        keys = [layer_key(info["key"], layer, settings) for layer in info["layers"]]
        return len(keys), sum(store.has_result("knn", k) for k in keys)
    from raygeom.sources.layers import layer_names, select_layers
    from raygeom.sources.models import cached_config

    config = cached_config(spec) or {}
    if "num_hidden_layers" not in config:
        return 0, 0
    selection = ",".join(p for p in settings.layers.split(",") if p.strip() != "attn_last") or "all"
    return len(select_layers(layer_names(config["num_hidden_layers"]), selection)) + 1, 0


def _features_dir(store: Store, spec: ModelSpec, key: str) -> Path:
    return store.root / "knn" / f"model={spec.slug}" / f"revision={spec.revision}" / key


def _write_features(
    directory: Path,
    worker,
    train_chunks: np.ndarray,
    test_chunks: np.ndarray,
    layers: list[str],
    batch_size: int,
    progress,
    at_once: int = 1,
    spec: ModelSpec | None = None,
) -> None:
    """``spec``: the model every call names (a replica handed on from another model loads it at its first call)."""
    from raygeom.analyses.dispersion import _get

    parts: dict[str, dict[str, list]] = {"train": {}, "test": {}}
    tokens: dict[str, list] = {"train": [], "test": []}
    logprobs: list = []
    for which, chunks in (("train", train_chunks), ("test", test_chunks)):
        batches = [chunks[start : start + batch_size] for start in range(0, len(chunks), batch_size)]
        for first in range(0, len(batches), at_once):
            some = batches[first : first + at_once]
            for features, next_tokens, lm_logprob in _get(worker.features_batches.remote(some, layers, spec=spec)):
                for layer in layers:
                    parts[which].setdefault(layer, []).append(features[layer])
                tokens[which].append(next_tokens)
                if which == "test":
                    logprobs.append(lm_logprob)
            if progress:
                progress(sum(len(batch) for batch in some))
    per_chunk = train_chunks.shape[1] - 1
    for layer in layers:
        for which, name in (("train", "keys"), ("test", "queries")):
            atomic_write_table(
                pa.table({"vector": vector_column(np.concatenate(parts[which].pop(layer)))}),
                directory / f"layer={layer}" / f"{name}.parquet",
            )
    atomic_write_table(pa.table({"value": np.concatenate(tokens["train"]).astype(np.int64)}), directory / "values.parquet")
    test_tokens = np.concatenate(tokens["test"]).astype(np.int64)
    atomic_write_table(
        pa.table(
            {
                "target": test_tokens,
                "lm_logprob": np.concatenate(logprobs),
                "chunk": np.repeat(np.arange(len(test_chunks)), per_chunk).astype(np.int32),
            }
        ),
        directory / "targets.parquet",
    )


class _Searched:
    """An index whose search over the full query set was already run, so several temperatures reuse it."""

    def __init__(self, index, distances, ids):
        self.index, self.distances, self.ids = index, distances, ids
        self.device, self.keys = index.device, index.keys

    def __len__(self) -> int:
        return len(self.index)

    def search(self, queries, k: int):
        if len(queries) != len(self.distances) or k > self.distances.shape[1]:
            return self.index.search(queries, k)
        return self.distances[:, :k], self.ids[:, :k]


def grid_edge(value: float, grid: list[float], bounds: tuple[float, float] | None = None) -> str:
    """'lower' or 'upper' when ``value`` is the smallest or largest of a grid of several values, else ''; a value on
    one of ``bounds`` (the range the quantity can take: lam = 0 or 1) is no edge, since no optimum lies beyond it."""
    if len(set(grid)) < 2 or (bounds is not None and value in bounds):
        return ""
    return "lower" if value == min(grid) else "upper" if value == max(grid) else ""


LAM_BOUNDS = (0.0, 1.0)
# Tuning perplexities within this relative distance of the best count as equal when (temperature scale, lam) is chosen:
# 1e-4 (0.01 %, 0.004 at a perplexity of 40) is far above float noise (about 1e-13 here) and far below what could change a
# reported result: the evaluation half's interval of the perplexity difference is 0.1-1.5 % of the base perplexity
# wide on the built-in models (delta_se), and the block-bootstrap SE of the tuning difference of two neighbouring grid
# points is itself 1e-5 to 1e-3. Below it the tuning half cannot tell two points apart in any way that matters.
TUNE_RTOL = 1e-4


def choose_tuning_point(tuning, base: float, scales: list[float], lams: list[float], rtol: float = TUNE_RTOL) -> dict:
    """The (temperature scale, lam) a layer uses, from ``tuning`` (n_scales, n_lams): the tuning half's perplexity at
    each grid point (NaN: not tried), and ``base``, the base LM's (lam = 0, the bound of lam's range).

    - lam = 0 (no kNN) when ``base`` is within ``rtol`` (relative) of the best point: kNN does not help at this layer,
      the temperature is undetermined (``scale_index`` None) and neither grid has an edge.
    - else, of the points within ``rtol`` of the best, the one on the fewest grid edges, then the lowest: a flat
      objective that reaches an edge is no optimum beyond it. An edge is flagged (``scale_edge``/``lam_edge``
      'lower'/'upper') only when the edge point is better than every interior point by more than ``rtol``, so the
      optimum lies beyond the grid. lam = 1 is a bound as well (no edge).

    Returns scale_index, lam_index (None for lam = 0), tuning_perplexity, scale_edge, lam_edge and ``selection``: what
    was chosen and why, in words ('' for the plain best of the grid inside both grids)."""
    grid = np.asarray(tuning, dtype=np.float64)
    if grid.shape != (len(scales), len(lams)):
        raise InputError(f"tuning grid of shape {grid.shape} for {len(scales)} scales and {len(lams)} lams")
    log_grid = np.log(np.where(np.asarray(lams)[None, :] > 0, grid, np.nan))
    tried = sorted({lams[j] for j in range(len(lams)) if np.isfinite(grid[:, j]).any()})
    if not np.isfinite(log_grid).any() or np.log(base) - np.nanmin(log_grid) <= rtol:
        best = float(np.exp(np.nanmin(log_grid))) if np.isfinite(log_grid).any() else float("nan")
        return {
            "scale_index": None,
            "lam_index": None,
            "tuning_perplexity": float(base),
            "scale_edge": "",
            "lam_edge": "",
            "selection": f"lam 0, the base LM: kNN does not help at this layer (no point of the grid lowers the tuning "
            f"perplexity {base:.6g} by more than {rtol:g} relative; best {best:.6g}); the temperature is undetermined",
        }
    low = np.nanmin(log_grid)
    candidates = []
    for i, j in zip(*np.nonzero(np.isfinite(log_grid) & (log_grid - low <= rtol))):
        edges = (grid_edge(scales[i], scales), grid_edge(lams[j], tried, LAM_BOUNDS))
        candidates.append((sum(bool(e) for e in edges), log_grid[i, j], int(i), int(j), edges))
    n_edges, _, i, j, (scale_edge, lam_edge) = min(candidates)
    a, b = np.unravel_index(np.nanargmin(log_grid), log_grid.shape)
    if n_edges:
        where = " and ".join(
            f"{name} at the {edge} edge" for name, edge in (("temperature scale", scale_edge), ("lam", lam_edge)) if edge
        )
        selection = f"{where}: better than every interior point by more than {rtol:g} relative; the optimum may lie beyond"
    elif (a, b) != (i, j):
        selection = (
            f"scale {scales[i]:g}, lam {lams[j]:g}: within {rtol:g} relative of the grid's best (scale {scales[a]:g}, "
            f"lam {lams[b]:g}, on an edge), a flat objective there; the interior point is kept"
        )
    else:
        selection = ""
    return {
        "scale_index": i,
        "lam_index": j,
        "tuning_perplexity": float(grid[i, j]),
        "scale_edge": scale_edge,
        "lam_edge": lam_edge,
        "selection": selection,
    }


def _difference_interval(base, other, blocks: np.ndarray, settings: KnnSettings) -> dict:
    """Bootstrap over the blocks of exp(-mean other) - exp(-mean base): a perplexity difference, paired per token.
    Below BLOCK_MIN blocks no interval (NaN se, lo and hi) and ``note`` says why; else ``note`` is ""."""
    from raygeom.numerics.uncertainty import block_interval_note, bootstrap_ci

    n_units = int(len(np.unique(blocks)))
    nan = float("nan")
    estimate = float(np.exp(-np.mean(other)) - np.exp(-np.mean(base)))
    note = block_interval_note(n_units)
    if note:
        return {"estimate": estimate, "se": nan, "lo": nan, "hi": nan, "n_units": n_units, "note": note}
    try:
        result = bootstrap_ci(
            (np.asarray(base), np.asarray(other)),
            lambda a, b: np.exp(-b.mean()) - np.exp(-a.mean()),
            seed=settings.seed,
            n_boot=settings.n_boot,
            clusters=blocks,
        )
    except InputError as error:
        return {"estimate": estimate, "se": nan, "lo": nan, "hi": nan, "n_units": n_units, "note": f"no interval: {error}"}
    return {
        "estimate": result["estimate"],
        "se": result["se"],
        "lo": result["lo"],
        "hi": result["hi"],
        "n_units": n_units,
        "note": "",
    }


def evaluate_layer(directory: str, layer: str, settings: KnnSettings, vocab_size: int, device: str) -> dict:
    """One candidate layer: exact kNN search, (T, lam) tuned on the first half of the held-out chunks, perplexity on
    the rest with its bootstrap interval; returns the row and the evaluation half's per-token log-probabilities."""
    import torch

    from raygeom.numerics.dispersion import dispersion, token_dispersion
    from raygeom.numerics.knnlm import ExactIndex, interpolated_log_probs, interpolated_perplexity, knn_log_probs
    from raygeom.numerics.uncertainty import token_blocks

    base = Path(directory)
    keys = column_to_matrix(read_table(base / f"layer={layer}" / "keys.parquet")["vector"])
    queries = column_to_matrix(read_table(base / f"layer={layer}" / "queries.parquet")["vector"])
    values = read_table(base / "values.parquet")["value"].to_numpy()
    targets_table = read_table(base / "targets.parquet")
    targets, lm, chunk = (targets_table[c].to_numpy() for c in ("target", "lm_logprob", "chunk"))
    k = settings.k
    if k > len(keys):  # never clamped: a stored k is the k used (KnnSettings refuses this before any work)
        raise RaygeomError(f"layer {layer}: k {k} is more than the {len(keys)} keys of its datastore; use k <= {len(keys)}")
    index = ExactIndex(keys, device=device)
    searched = _Searched(index, *index.search(queries, k))
    base_temperature = settings.temperature_value()
    if base_temperature is None:
        # Distance scales differ by orders of magnitude across layers; one fixed T would favour some layers.
        base_temperature = float(searched.distances.double().mean(dim=1).median())
        if not base_temperature > 0:
            base_temperature = 1.0
    n_chunks = int(chunk.max()) + 1
    tune, held = chunk < n_chunks // 2, chunk >= n_chunks // 2
    # (temperature, lam) are chosen on the tuning half only; the other half is reported.
    scales, lams = settings.scale_values(), settings.lam_values()
    tuning_grid = np.full((len(scales), len(lams)), np.nan)
    knn_by_scale = []
    for i, scale in enumerate(scales):
        knn = knn_log_probs(
            queries, searched, values, vocab_size, k, base_temperature * scale, chunk_size=len(queries), targets=targets
        )
        knn_by_scale.append(knn)
        for j, lam in enumerate(lams):
            if lam == 1.0 and not np.isfinite(knn).all():
                continue  # lam = 1 gives the target probability 0 where no neighbour holds it
            tuning_grid[i, j] = interpolated_perplexity(lm[tune], knn[tune], lam)
    if np.isnan(tuning_grid).all():
        raise RaygeomError(f"layer {layer}: lam=1 needs every target among the neighbours; add a lam below 1")
    choice = choose_tuning_point(tuning_grid, float(np.exp(-lm[tune].mean())), scales, lams)
    i, j = choice["scale_index"], choice["lam_index"]
    if i is None:  # lam = 0: the base LM, the temperature plays no part
        lam, scale, temperature, knn = 0.0, float("nan"), float("nan"), knn_by_scale[0]
    else:
        lam, scale, temperature, knn = lams[j], scales[i], base_temperature * scales[i], knn_by_scale[i]
    tuning = choice["tuning_perplexity"]
    mixed = interpolated_log_probs(lm[held], knn[held], lam)
    knn_ppl = float(np.exp(-mixed.mean()))
    base_ppl = float(np.exp(-lm[held].mean()))
    blocks = token_blocks(chunk[held], settings.bootstrap_block)
    interval = _difference_interval(lm[held], mixed, blocks, settings)
    # Retrieval quality without the interpolation: is the next token among the neighbours' values, or the nearest one's?
    neighbour_values = torch.as_tensor(values)[searched.ids.cpu()]
    target_tensor = torch.as_tensor(targets)[:, None]
    held_rows = torch.from_numpy(held)
    target_in_neighbours = float((neighbour_values == target_tensor).any(dim=1)[held_rows].double().mean())
    nearest_is_target = float((neighbour_values[:, 0] == target_tensor[:, 0])[held_rows].double().mean())
    per_chunk = queries.shape[0] // n_chunks
    chunked = torch.from_numpy(queries.reshape(n_chunks, per_chunk, -1))
    row = {
        "layer": layer,
        "dispersion": dispersion(keys),
        "query_token_dispersion": float(np.nanmean(token_dispersion(chunked))),
        "temperature": temperature,
        "temperature_scale": scale,
        "lam": lam,
        "tuning_perplexity": float(tuning),
        "knn_perplexity": knn_ppl,
        "base_perplexity": base_ppl,
        "improvement": base_ppl - knn_ppl,
        "delta": interval["estimate"],
        "delta_se": interval["se"],
        "delta_lo": interval["lo"],
        "delta_hi": interval["hi"],
        "bootstrap_units": interval["n_units"],
        "note": interval["note"],
        "lam_edge": choice["lam_edge"],
        "scale_edge": choice["scale_edge"],
        "selection": choice["selection"],
        "target_in_neighbours": target_in_neighbours,
        "nearest_is_target": nearest_is_target,
        "k": k,
        "n_keys": int(len(keys)),
        "n_test": int(held.sum()),
    }
    return {"row": row, "chunk": chunk[held].astype(np.int32), "lm_logprob": lm[held], "mixed_logprob": mixed}


def _settings_columns(spec: ModelSpec, corpus: Corpus, train_text: Corpus, test_text: Corpus, settings: KnnSettings) -> dict:
    from raygeom import __version__

    return {
        "model": spec.name,
        "revision": spec.revision,
        "step": spec.step,
        "corpus": corpus.name,
        "corpus_fingerprint": corpus.fingerprint(),
        "datastore_fingerprint": train_text.fingerprint(),
        "heldout_fingerprint": test_text.fingerprint(),
        "chunk_len": settings.chunk_len,
        "train_chunks": settings.train_chunks,
        "test_chunks": settings.test_chunks,
        "seed": settings.seed,
        "lams": settings.lams,
        "temperature_scales": settings.temperature_scales,
        "bootstrap_block": settings.bootstrap_block,
        "n_boot": settings.n_boot,
        "settings": json.dumps({n: v for n, v in asdict(settings).items() if n != "gpus_per_task"}, sort_keys=True),
        "raygeom_version": __version__,
    }


def layer_key(features: str, layer: str, settings: KnnSettings) -> str:
    return content_key("knn", KNN_VERSION, features, layer, settings.evaluation())


def units(store: Store, directory: Path, info: dict, settings: KnnSettings, provenance: dict) -> list[Unit]:
    """One engine unit per candidate layer of one stored feature set."""
    device = "cuda" if settings.gpus_per_task > 0 else "cpu"
    options = {"num_gpus": settings.gpus_per_task} if settings.gpus_per_task > 0 else {"num_cpus": 1}
    order = {name: i for i, name in enumerate(info["all_layers"])}
    out = []
    for layer in info["layers"]:
        key = layer_key(info["key"], layer, settings)

        def finish(values, layer=layer, key=key) -> dict:
            result = values[0]
            # The per-token table goes first, so a stored row always has it (the best-vs-runner-up comparison reads it).
            store.write_result(
                "knn_tokens",
                key,
                pa.table(
                    {
                        "layer": [layer] * len(result["chunk"]),
                        "chunk": result["chunk"],
                        "lm_logprob": result["lm_logprob"],
                        "mixed_logprob": result["mixed_logprob"],
                    }
                ).to_pylist(),
            )
            return {**result["row"], **provenance, "layer_index": order[layer], "unit_key": key, "features_key": info["key"]}

        out.append(
            Unit(
                analysis="knn",
                key=key,
                label=f"kNN-LM {provenance['model']}@{provenance['revision']} {layer}",
                parts=[Step(evaluate_layer, (str(directory), layer, settings, info["vocab_size"], device), options)],
                finish=finish,
            )
        )
    return out


def best_against_runner_up(store: Store, rows: list[dict], settings: KnnSettings) -> dict:
    """The lowest-perplexity layer, the runner-up, and the bootstrap interval of their perplexity difference on
    the same resampled blocks; ``separated`` when that interval excludes 0."""
    from raygeom.numerics.uncertainty import token_blocks

    ranked = sorted(rows, key=lambda r: (r["knn_perplexity"], r["layer_index"]))
    out = {
        "best_layer": ranked[0]["layer"],
        "runner_up": ranked[1]["layer"] if len(ranked) > 1 else None,
        "difference": float("nan"),
        "lo": float("nan"),
        "hi": float("nan"),
        "separated": None,
        "note": "",
    }
    if len(ranked) < 2:
        return out
    tables = [store.read_results("knn_tokens", [r["unit_key"]]) for r in ranked[:2]]
    if any(t.num_rows == 0 for t in tables) or tables[0].num_rows != tables[1].num_rows:
        return {**out, "note": "the per-token log-probabilities of the two layers are not in the store"}
    best, second = (t.to_pydict() for t in tables)
    interval = _difference_interval(
        second["mixed_logprob"],
        best["mixed_logprob"],
        token_blocks(np.asarray(best["chunk"]), settings.bootstrap_block),
        settings,
    )
    separated = bool(interval["hi"] < 0) if np.isfinite(interval["hi"]) else None
    return {
        **out,
        "difference": interval["estimate"],
        "lo": interval["lo"],
        "hi": interval["hi"],
        "separated": separated,
        "note": interval["note"],
    }


def edge_warnings(rows: list[dict], settings: KnnSettings) -> list[str]:
    """One line per grid (lambda, temperature scale) whose chosen value sits at an edge in some layer."""
    lines = []
    for column, name, grid, option in (
        ("lam_edge", "lambda", settings.lams, "--lam"),
        ("scale_edge", "temperature scale", settings.temperature_scales, "--temperature-scales"),
    ):
        for edge in ("lower", "upper"):
            layers = [r["layer"] for r in rows if r.get(column) == edge]
            if layers:
                lines.append(
                    f"{name} sits at the {edge} edge of its grid ({grid}) in {len(layers)} of {len(rows)} layers "
                    f"({', '.join(layers)}): the optimum may lie outside it; widen {option}"
                )
    return lines


def extract_features(
    store: Store,
    spec: ModelSpec,
    corpus: Corpus,
    settings: KnnSettings,
    test_corpus: Corpus | None = None,
    features_progress: Callable[[int], Callable[[int], None]] | None = None,
    replicas=None,
) -> tuple[Path, dict, Corpus, Corpus]:
    """``run_knn``'s datastore features of ``spec``, extracted unless the store holds them: (their directory, their
    marker's info, datastore text, held-out text). ``replicas`` (``dispersion.handover()``): the replica is taken from
    it and parked in it for the next (model, revision), instead of a new replica process for each.
    """
    from raygeom.analyses.dispersion import _get, release_worker, start_worker

    train_text, test_text = (
        (corpus, test_corpus) if test_corpus is not None else split_corpus(corpus, settings.heldout_fraction, settings.seed)
    )
    key = features_key(spec, train_text, test_text, settings)
    directory = _features_dir(store, spec, key)
    marker = directory / MARKER
    if marker.is_file():
        info = json.loads(marker.read_text())
    else:
        worker, described = start_worker(spec, 1.0 if settings.gpus_per_task > 0 else None, replicas)
        handed_on = False
        try:
            selection = ",".join(p for p in settings.layers.split(",") if p.strip() != "attn_last") or "all"
            from raygeom.sources.layers import select_layers

            layers = select_layers(described["layers"][:-1], selection) + ["attn_last"]
            inside = [name for name in layers if "." in name]
            if inside:
                raise RaygeomError(
                    f"knn takes block outputs, not points inside a block ({inside[0]}); "
                    "those are for pga, sweeps, diagnose and dispersion"
                )
            train = _get(
                worker.chunks.remote(train_text.texts, None, settings.chunk_len, settings.train_chunks, settings.seed, spec=spec)
            )[0]
            test = _get(
                worker.chunks.remote(test_text.texts, None, settings.chunk_len, settings.test_chunks, settings.seed, spec=spec)
            )[0]
            # The chunks have their own count: on the units' bar they ran it past its total (9/3).
            advance = features_progress(len(train) + len(test)) if features_progress else None
            _write_features(
                directory, worker, train, test, layers, settings.batch_size, advance, batches_at_once(described), spec
            )
            handed_on = True
        finally:
            release_worker(worker, replicas, handed_on)
        info = {
            "key": key,
            "layers": layers,
            "all_layers": described["layers"],
            "vocab_size": described["vocab_size"],
            "model": spec.name,
            "revision": spec.revision,
            "settings": asdict(settings),
        }
        atomic_write_text(json.dumps(info, indent=2), marker)
    return directory, info, train_text, test_text


def run_knn(
    store: Store,
    spec: ModelSpec,
    corpus: Corpus,
    settings: KnnSettings,
    test_corpus: Corpus | None = None,
    progress: Callable[[int], None] | None = None,
    features_progress: Callable[[int], Callable[[int], None]] | None = None,
) -> dict:
    """Datastore features (once, cached by content key), then one engine unit per layer; a table of layers.

    With ``test_corpus`` the datastore is built from all of ``corpus`` and the
    held-out text comes from ``test_corpus``; otherwise ``corpus`` is split by article.
    ``progress`` advances by the units' steps (its total is set from them); ``features_progress(total)``, called only
    when the features are extracted, gives what advances by chunks forwarded, out of ``total`` chunks.
    The features' replica is stopped before the units run (a parked one would hold the CPUs they need).
    """
    from raygeom.engine.units import accumulated_rows, run_units

    directory, info, train_text, test_text = extract_features(store, spec, corpus, settings, test_corpus, features_progress)
    provenance = _settings_columns(spec, corpus if test_corpus is None else train_text, train_text, test_text, settings)
    rows = run_units(store, units(store, directory, info, settings, provenance), progress)
    table = write_rows(accumulated_rows(store, "knn", rows), store.root / "results" / "knn.parquet")
    return {**summarise(store, rows, settings), "table": table}


def summarise(store: Store, rows: list[dict], settings: KnnSettings) -> dict:
    """The layer rows of one (model, revision) and what they decide: the best layer against the runner-up, the
    max-dispersion layer, the rank correlations over layers of dispersion with -perplexity and with retrieval, and
    a warning per grid whose chosen value sits at its edge."""
    most = max(rows, key=lambda r: (r["dispersion"], -r["layer_index"]))["layer"]

    def rank_correlation(column: str, sign: float = 1.0) -> dict:
        """Spearman over layers with its 95 % Fisher interval; over fewer than 10 layers, at |rho| = 1 or with a
        constant column, the exact permutation p-value and a note instead (spearman_with_ci)."""
        from raygeom.numerics.uncertainty import spearman_with_ci  # scipy.special: not when discovery imports this

        x = [r["dispersion"] for r in rows]
        y = [sign * r[column] for r in rows]
        if len(rows) < 4 or not np.isfinite(x).all() or not np.isfinite(y).all():
            nan = float("nan")
            note = "fewer than 4 layers" if len(rows) < 4 else "a non-finite value"
            return {"rho": nan, "lo": nan, "hi": nan, "note": note, "p_perm": nan, "p_method": ""}
        return spearman_with_ci(x, y, seed=settings.seed, method="fisher")

    comparison = best_against_runner_up(store, rows, settings)
    return {
        "layers": rows,
        "best_layer": comparison["best_layer"],
        "best_vs_runner_up": comparison,
        "max_dispersion_layer": most,
        "spearman": rank_correlation("knn_perplexity", -1.0),
        "spearman_retrieval": rank_correlation("target_in_neighbours"),
        "n_keys": rows[0]["n_keys"],
        "n_test": rows[0]["n_test"],
        "warnings": edge_warnings(rows, settings),
    }


def _interval(value, lo, hi, note: str = "") -> str:
    """``+0.12 [-0.03, +0.27]``; where the bounds are NaN, the estimate with why there is none (``note``)."""
    if not isinstance(value, float) or not np.isfinite(value):
        return "nan" + (f" ({note})" if note else "")
    known = all(isinstance(b, float) and np.isfinite(b) for b in (lo, hi))
    return f"{value:+.2f}" + (f" [{lo:+.2f}, {hi:+.2f}]" if known else f" ({note or 'no interval'})")


def _correlation(fit: dict) -> str:
    """A Spearman over layers with its interval, or with its permutation p-value and why there is no interval."""
    if fit["note"] and np.isfinite(fit["p_perm"]):
        return f"{fit['rho']:+.3f} (permutation p = {fit['p_perm']:.2g}; {fit['note']})"
    if fit["note"]:
        return f"{fit['rho']:+.3f} ({fit['note']})"
    return f"{fit['rho']:+.3f} [{fit['lo']:+.3f}, {fit['hi']:+.3f}]"


def _cell(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _on_edge(value, edge) -> str:
    """A chosen grid value, marked where it sits at an edge of its grid (the optimum may lie beyond it)."""
    return _cell(value) + (f" ({edge} edge)" if edge else "")


def summary_lines(store: Store, rows: list[dict]) -> list[str]:
    """What a kNN-LM run prints, per (model, revision): its layers with the perplexity difference and its interval
    (or why there is none), lam and the temperature scale marked where they sit at an edge of their grid, the best
    layer against the runner-up, the max-dispersion layer with the rank correlations and their intervals, the grid
    warnings."""
    from raygeom.numerics.uncertainty import BLOCK_MIN

    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["revision"]), []).append(row)
    lines = []
    for (model, revision), group in groups.items():
        group = sorted(group, key=lambda r: r["layer_index"])
        settings = KnnSettings(**json.loads(group[0]["settings"]))
        result = summarise(store, group, settings)
        first = group[0]
        columns = [
            "layer",
            "dispersion",
            "temperature",
            "T scale",
            "lam",
            "knn_perplexity",
            "ppl difference [95% CI]",
            "target_in_neighbours",
            "nearest_is_target",
        ]
        blocks = first.get("bootstrap_units")
        few = f"; fewer than {BLOCK_MIN}: no interval" if isinstance(blocks, int) and blocks < BLOCK_MIN else ""
        lines += [
            f"kNN-LM  {model}@{revision}  ({result['n_keys']} keys, {result['n_test']} held-out tokens, "
            f"k={first.get('k', settings.k)}, base perplexity {first['base_perplexity']:.2f}; interval: bootstrap over "
            f"blocks of {settings.bootstrap_block} held-out tokens, {blocks} blocks{few})",
            "",
            "| " + " | ".join(columns) + " |",
            "|" + "---|" * len(columns),
        ]
        for row in group:
            cells = {
                **row,
                "T scale": _on_edge(row.get("temperature_scale"), row.get("scale_edge")),
                "lam": _on_edge(row["lam"], row.get("lam_edge")),
                "ppl difference [95% CI]": _interval(row["delta"], row.get("delta_lo"), row.get("delta_hi"), row.get("note", "")),
            }
            lines.append("| " + " | ".join(_cell(cells.get(c, "")) for c in columns) + " |")
        lines.append("")
        no_help = [r["layer"] for r in group if r["lam"] == 0 and "kNN does not help" in (r.get("selection") or "")]
        if no_help:
            lines += [
                f"kNN does not help at {len(no_help)} of {len(group)} layers ({', '.join(no_help)}): no (temperature, "
                f"lam) of the grid lowers the tuning perplexity by more than {TUNE_RTOL:g} relative, so lam is 0 (the "
                "base LM) and the temperature undetermined",
                "",
            ]
        versus = result["best_vs_runner_up"]
        if versus["runner_up"] is not None:
            verdict = {True: "separated", False: "NOT separated (the interval contains 0)", None: "not compared"}[
                versus["separated"]
            ]
            lines.append(
                f"best kNN-LM layer: {versus['best_layer']}   runner-up: {versus['runner_up']}   perplexity "
                f"difference {_interval(versus['difference'], versus['lo'], versus['hi'], versus['note'])} "
                f"(paired bootstrap): {verdict}"
            )
        agrees = result["best_layer"] == result["max_dispersion_layer"]
        undecided = "" if versus["separated"] or versus["runner_up"] is None else " (the best layer is not separated)"
        lines.append(
            f"max-dispersion layer: {result['max_dispersion_layer']}   agrees with the best layer: {agrees}{undecided}   "
            f"Spearman over layers [95% CI]: dispersion vs -perplexity {_correlation(result['spearman'])}, "
            f"dispersion vs target-among-neighbours {_correlation(result['spearman_retrieval'])}"
        )
        lines += [f"warning: {line}" for line in result["warnings"]]
    return lines


def features_stored(store: Store, spec: ModelSpec, corpus: Corpus, settings: KnnSettings) -> bool:
    """Whether the store holds ``run_knn``'s datastore features of ``spec`` on ``corpus`` (split by article)."""
    train_text, test_text = split_corpus(corpus, settings.heldout_fraction, settings.seed)
    return (_features_dir(store, spec, features_key(spec, train_text, test_text, settings)) / MARKER).is_file()
