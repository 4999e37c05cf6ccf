"""Cross-model convergence as units of the engine (METRICS.md, "Cross-model convergence").

For every pair of models (each a complete extraction in one store) and every
pair of their layers, the Spearman correlation of the two models' pairwise
cosine distances over the same inputs: (a) in full space, (b) each model in
its own top-k readout subspace, (c) each in random k-dim subspaces (mean and
std over ``n_null`` draws; draw ``i`` is seeded by (seed, i), B's by
(seed + 2**32, i)).

Sample alignment. Models with different tokenizers cannot share token
positions, so they share texts: every model is extracted from the same
seeded sample of the corpus, each text pooled in that model's own tokens
(the last token of the text by default). Rows are matched by the SHA-1 of the
text stored beside each sample (``samples/.../text_sha1``), never by
position, and the j-th copy of a duplicated text in A with the j-th copy in
B; texts only one model saw are dropped, and the number matched is reported
as ``n``. A text longer than ``seq_len`` tokens is cut at a different place
by each tokenizer, so the "last token" would end different text in each
model; ``raygeom converge`` therefore first cuts every text at the longest
character prefix that every model's tokenizer reads within ``seq_len`` tokens
(raygeom.sources.align), so that all models pool the end of exactly the same
text (``--max-words`` still cuts by words first).

Work split. The ranks of a layer's distances in a given space do not depend
on the other model's layer (see :mod:`raygeom.numerics.convergence_grid`), so
each layer is prepared once (CCR-r) as a prepare step, and the null draws of a
model pair fan out as ``null_chunks`` parts that each score their draws
for the whole layer grid. Results are identical however the draws are split.
One Parquet unit per model pair under ``results/converge/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Callable

import numpy as np

from raygeom.analyses.provenance import extraction_columns
from raygeom.engine.contract import PREPARED, Step, Unit
from raygeom.errors import InputError, RaygeomError
from raygeom.numerics.limits import MIN_SAMPLES
from raygeom.params import PGAParams
from raygeom.store.tree import Store, content_key


def _grid():
    """raygeom.numerics.convergence_grid (torch): imported by the units that compute, not when the registry's
    discovery imports this module for the CLI, which must refuse bad input before torch loads."""
    from raygeom.numerics import convergence_grid

    return convergence_grid


CONVERGE_VERSION = 4  # 2: z's Monte-Carlo interval and p-values; 3: intervals over texts; 4: correlations' on Fisher's z


@dataclass(frozen=True)
class ConvergeParams:
    k: int = 100
    r: int = 1
    n_null: int = 100
    seed: int = 0
    null_chunks: int = 4
    depths: int | None = None  # None: every extracted layer; n: the layers nearest n evenly spaced relative depths
    text_halves: int = 10  # half-samples of the texts behind each cell's intervals over texts; 0: none

    def __post_init__(self):
        # The parameters it shares with PGA get PGA's checks and messages.
        PGAParams(k=self.k, r=self.r, n_null=self.n_null, seed=self.seed, null_chunks=self.null_chunks)
        if not 0 <= self.seed < 2**32:
            raise RaygeomError(f"seed must satisfy 0 <= seed < 2**32, got {self.seed}")
        if self.depths is not None and self.depths < 2:
            raise RaygeomError(f"depths must be at least 2, got {self.depths}")
        if self.text_halves == 1 or self.text_halves < 0:
            raise RaygeomError(f"text_halves must be 0 (no interval over texts) or at least 2, got {self.text_halves}")


@dataclass(frozen=True)
class ModelSide:
    model: str
    revision: str
    info: dict
    layers: list[str]
    sample_ids: np.ndarray  # sorted
    text_sha1: list[str]

    @property
    def label(self) -> str:
        return f"{self.model}@{self.revision}"


def _side(store: Store, model: str, revision: str, depths: int | None, k: int, key: str | None = None) -> ModelSide:
    info = store.completion(model, revision, key)
    if info is None or (key is not None and info.get("key") != key):
        raise RaygeomError(f"no complete extraction of {model}@{revision} in {store.root}")
    if not 0 < k < info["d"]:
        raise RaygeomError(f"k must satisfy 0 < k < d; got k={k}, d={info['d']} for {model}")
    samples = store.read_samples(model, revision, info["key"])
    if "text_sha1" not in samples.column_names:
        raise RaygeomError(f"samples of {model}@{revision} carry no text_sha1, so they cannot be aligned with another model")
    order = np.argsort(samples["sample_id"].to_numpy())
    layers = [name for name in info["all_layers"] if name in info["layers"]]
    if depths is not None:
        positions = [info["all_layers"].index(name) for name in layers]
        relative = np.array(positions) / max(1, len(info["all_layers"]) - 1)
        targets = np.linspace(0.0, 1.0, depths)
        layers = [layers[i] for i in sorted({int(np.argmin(np.abs(relative - t))) for t in targets})]
    return ModelSide(
        model,
        revision,
        info,
        layers,
        samples["sample_id"].to_numpy()[order],
        [samples["text_sha1"].to_pylist()[i] for i in order],
    )


def _aligned_layer(
    root: str, model: str, revision: str, layer: str, sample_ids: np.ndarray, rows: np.ndarray, key: str
) -> np.ndarray:
    from raygeom.analyses.pga import read_keyed_layer

    h = read_keyed_layer(root, model, revision, layer, key)
    ids = Store(root).read_layer(model, revision, layer, key)[0]
    if not np.array_equal(ids, sample_ids):
        raise RaygeomError(f"{model}@{revision} layer {layer} holds different sample ids than its samples table")
    return h[rows]


def _prepare(
    root: str, model: str, revision: str, layer: str, sample_ids: np.ndarray, rows: np.ndarray, r: int, key: str
) -> np.ndarray:
    return _grid().prepare_layer(_aligned_layer(root, model, revision, layer, sample_ids, rows, key), r)


def _texts(
    root: str, reads_a: list[tuple], reads_b: list[tuple], basis_a: np.ndarray, basis_b: np.ndarray, params: "ConvergeParams"
) -> dict:
    """Every cell's standard errors over texts (half-samples); each side's layers are read again in raw form,
    since every half-sample is corrected afresh."""
    raw_a = [_aligned_layer(root, *read) for read in reads_a]
    raw_b = [_aligned_layer(root, *read) for read in reads_b]
    try:
        return _grid().grid_text_spread(raw_a, raw_b, basis_a, basis_b, params.k, params.r, params.seed, params.text_halves)
    except InputError:  # too few texts to halve: the rows carry no interval over texts
        return {}


def _observed(n_a: int, basis_a: np.ndarray, basis_b: np.ndarray, k: int, *layers) -> dict:
    return _grid().observed_grid(layers[:n_a], layers[n_a:], basis_a, basis_b, k)


def _nulls(n_a: int, k: int, seed: int, indices: list[int], *layers) -> np.ndarray:
    return _grid().null_grids(layers[:n_a], layers[n_a:], k, seed, indices)


def align(a: ModelSide, b: ModelSide) -> tuple[np.ndarray, np.ndarray]:
    from raygeom.numerics import layer_geometry  # torch (see _grid)

    rows_a, rows_b = layer_geometry.align_by_key(a.text_sha1, b.text_sha1)
    if len(rows_a) < MIN_SAMPLES:
        raise RaygeomError(
            f"{a.label} and {b.label} share only {len(rows_a)} texts (by SHA-1); need at least {MIN_SAMPLES}. "
            "Extract both from the same corpus, n-samples and seed"
        )
    return rows_a, rows_b


def pair_key(a: ModelSide, b: ModelSide, rows_a: np.ndarray, rows_b: np.ndarray, params: ConvergeParams) -> str:
    matched = content_key([a.text_sha1[i] for i in rows_a])
    return content_key(
        "converge",
        CONVERGE_VERSION,
        a.info["key"],
        b.info["key"],
        a.layers,
        b.layers,
        params.k,
        params.r,
        params.n_null,
        params.seed,
        matched,
        params.text_halves,
    )


def units(sides_layers: list[int], params: ConvergeParams) -> int:
    """Progress units :func:`run_converge` reports for models with these layer counts."""
    chunks = min(params.null_chunks, params.n_null) + (1 if params.text_halves else 0)
    return sum(la + lb + 1 + chunks for la, lb in combinations(sides_layers, 2))


def model_sides(store: Store, models: list[tuple[str, ...]], params: ConvergeParams) -> list[ModelSide]:
    """``models``: (slug, revision), or (slug, revision, extraction key) where the store holds several extractions."""
    if len(models) < 2:
        raise RaygeomError("convergence needs at least two models")
    if len({tuple(m[:2]) for m in models}) != len(models):
        raise RaygeomError("each model (and revision) may be given only once")
    return [_side(store, *model[:2], params.depths, params.k, *model[2:]) for model in models]


def planned_pairs(store: Store, models: list[tuple[str, ...]], params: ConvergeParams) -> tuple[int, int]:
    """(units, done) of :func:`run_converge`: one unit per pair of models; a pair is done when its stored rows
    exist (pairs whose extractions are not stored yet are not)."""
    pairs = len(models) * (len(models) - 1) // 2
    try:
        sides = model_sides(store, models, params)
    except RaygeomError:
        return pairs, 0
    done = 0
    for a, b in combinations(sides, 2):
        rows_a, rows_b = align(a, b)
        done += store.has_result("converge", pair_key(a, b, rows_a, rows_b, params))
    return pairs, done


def run_converge(
    store: Store, models: list[tuple[str, ...]], params: ConvergeParams, progress: Callable[[int], None] | None = None
) -> list[dict]:
    """Convergence rows for every pair of ``models`` (``(slug, revision)`` or ``(slug, revision, extraction key)``)
    and every pair of their layers."""
    from raygeom.engine.units import run_units

    sides = model_sides(store, models, params)
    root = str(store.root)
    chunks = [list(map(int, c)) for c in np.array_split(np.arange(params.n_null), min(params.null_chunks, params.n_null))]
    units = []
    for a, b in combinations(sides, 2):
        rows_a, rows_b = align(a, b)
        prepare = [
            Step(_prepare, (root, side.model, side.revision, layer, side.sample_ids, rows, params.r, side.info["key"]))
            for side, rows in ((a, rows_a), (b, rows_b))
            for layer in side.layers
        ]
        basis_a = store.read_readout(a.model, a.revision, a.info["key"])[0][:, : params.k]
        basis_b = store.read_readout(b.model, b.revision, b.info["key"])[0][:, : params.k]
        n_a = len(a.layers)

        def finish(values, a=a, b=b, n=len(rows_a)) -> list[dict]:
            observed, *nulls = values
            spread = nulls.pop() if params.text_halves else {}
            return _rows(a, b, n, observed, np.concatenate(nulls), params, spread)

        reads = [
            [(side.model, side.revision, layer, side.sample_ids, rows, side.info["key"]) for layer in side.layers]
            for side, rows in ((a, rows_a), (b, rows_b))
        ]
        texts = [Step(_texts, (root, reads[0], reads[1], basis_a, basis_b, params))] if params.text_halves else []
        units.append(
            Unit(
                analysis="converge",
                key=pair_key(a, b, rows_a, rows_b, params),
                label=f"convergence {a.label} vs {b.label}",
                prepare=prepare,
                parts=[Step(_observed, (n_a, basis_a, basis_b, params.k, PREPARED))]
                + [Step(_nulls, (n_a, params.k, params.seed, chunk, PREPARED)) for chunk in chunks]
                + texts,
                finish=finish,
                extractions=tuple((side.model, side.revision, side.info["key"]) for side in (a, b)),
            )
        )
    results = run_units(store, units, progress)
    order = {tuple(model[:2]): i for i, model in enumerate(models)}
    return sorted(
        results,
        key=lambda r: (
            order.get((r["model_a"], r["revision_a"]), 0),
            order.get((r["model_b"], r["revision_b"]), 0),
            r["layer_index_a"],
            r["layer_index_b"],
        ),
    )


def _text_intervals(grid: dict, spread: dict) -> dict:
    """95% intervals over texts from the half-sample standard errors, for each cell: normal for the differences, on
    Fisher's z scale (delta method) for the two correlations."""
    if not spread:
        return {}
    from raygeom.numerics.uncertainty import LEVEL, bounded_normal_interval, level_quantile

    q = level_quantile(LEVEL)
    centres = {
        "rho_full": grid["rho_full"],
        "rho": grid["rho_readout"],
        "excess": grid["rho_readout"] - grid["rho_full"],
        "margin": grid["rho_readout"] - grid["null_mean"],
    }
    ses = {
        "rho_full": spread["rho_full_texts_se"],
        "rho": spread["rho_readout_texts_se"],
        "excess": spread["excess_texts_se"],
        "margin": spread["margin_texts_se"],
    }
    out = {}
    for name, centre in centres.items():
        # correlations: Fisher's z (the logit of (rho + 1) / 2), so the interval stays inside [-1, 1]
        if name in ("rho_full", "rho"):
            bounded = np.vectorize(lambda value, se: bounded_normal_interval(value, se, -1.0, 1.0), otypes=[float, float])
            out[f"{name}_texts_lo"], out[f"{name}_texts_hi"] = bounded(centre, ses[name])
        else:
            out[f"{name}_texts_lo"], out[f"{name}_texts_hi"] = centre - q * ses[name], centre + q * ses[name]
    return out


def _rows(
    a: ModelSide, b: ModelSide, n: int, observed: dict, nulls: np.ndarray, params: ConvergeParams, spread: dict | None = None
) -> list[dict]:
    grid = _grid().summarize_grid(observed["rho_full"], observed["rho_readout"], nulls)
    if not np.isfinite(grid["rho_full"]).all():
        raise RaygeomError(f"{a.label} vs {b.label}: some layer's distances are constant after CCR-{params.r}")
    grid.update(_grid().grid_uncertainty(observed["rho_readout"], nulls, params.seed))
    grid.update(_text_intervals(grid, spread or {}))
    rows = []
    shared = {name: value for name, value in extraction_columns(a.info).items() if name not in ("step", "n")}
    span_a, span_b = max(1, len(a.info["all_layers"]) - 1), max(1, len(b.info["all_layers"]) - 1)
    for i, layer_a in enumerate(a.layers):
        index_a = a.info["all_layers"].index(layer_a)
        for j, layer_b in enumerate(b.layers):
            index_b = b.info["all_layers"].index(layer_b)
            rows.append(
                {
                    "model_a": a.model,
                    "revision_a": a.revision,
                    "model_b": b.model,
                    "revision_b": b.revision,
                    "layer_a": layer_a,
                    "layer_b": layer_b,
                    "layer_index_a": index_a,
                    "layer_index_b": index_b,
                    "relative_depth_a": index_a / span_a,
                    "relative_depth_b": index_b / span_b,
                    **{name: float(values[i, j]) for name, values in grid.items()},
                    **shared,
                    "step_a": a.info.get("step"),
                    "step_b": b.info.get("step"),
                    "k": params.k,
                    "r": params.r,
                    "n": n,
                    "n_null": int(nulls.shape[0]),
                    "seed": params.seed,
                    "n_half_samples": params.text_halves if spread else 0,
                    "d_a": a.info["d"],
                    "d_b": b.info["d"],
                }
            )
    return rows


# ---------------------------------------------------------------- what a run prints and writes (its declaration's
# console and documents)


def depth_matched(rows: list[dict]) -> list[dict]:
    """For each layer of the model with fewer layers, the cell whose other layer is nearest in relative depth."""
    by_a: dict[str, list[dict]] = {}
    by_b: dict[str, list[dict]] = {}
    for r in rows:
        by_a.setdefault(r["layer_a"], []).append(r)
        by_b.setdefault(r["layer_b"], []).append(r)
    if len(by_a) <= len(by_b):
        picks = [
            min(cells, key=lambda r: (abs(r["relative_depth_a"] - r["relative_depth_b"]), r["layer_index_b"]))
            for cells in by_a.values()
        ]
    else:
        picks = [
            min(cells, key=lambda r: (abs(r["relative_depth_a"] - r["relative_depth_b"]), r["layer_index_a"]))
            for cells in by_b.values()
        ]
    return sorted(picks, key=lambda r: (r["relative_depth_a"], r["relative_depth_b"]))


def _excess_text(row: dict) -> str:
    excess = row["rho_readout"] - row["rho_full"]
    lo, hi = row.get("excess_texts_lo"), row.get("excess_texts_hi")
    return f"{excess:+.3f}" + (f" [{lo:+.3f}, {hi:+.3f}]" if lo is not None and lo == lo else "")


def convergence_markdown(rows: list[dict]) -> str:
    first = rows[0]
    full = np.array([r["rho_full"] for r in rows])
    readout = np.array([r["rho_readout"] for r in rows])
    z = np.array([r["z"] for r in rows])
    z_lo = np.array([r.get("z_lo", np.nan) for r in rows])
    z_hi = np.array([r.get("z_hi", np.nan) for r in rows])
    nulls = np.array([r["null_mean"] for r in rows])
    lines = [
        f"### {first['model_a']}@{first['revision_a']} vs {first['model_b']}@{first['revision_b']}  "
        f"(N={first['n']} shared texts, k={first['k']}, CCR-{first['r']}, {first['n_null']} nulls, seed {first['seed']})",
        "",
        f"All {len(rows)} layer pairs: readout > full space in {np.mean(readout > full):.0%}"
        + (
            f" ({np.mean(np.array([r.get('excess_texts_lo', np.nan) for r in rows]) > 0):.0%} with the whole 95% interval "
            f"over texts above 0, {np.mean(np.array([r.get('excess_texts_hi', np.nan) for r in rows]) < 0):.0%} below)"
            if rows[0].get("excess_texts_lo") is not None
            else ""
        )
        + ", "
        f"readout > null mean in {np.mean(readout > nulls):.0%}, z > 2 in {np.mean(z > 2):.0%} ({np.mean(z_lo > 2):.0%} with the whole "
        f"95% interval above 2), z < -2 in {np.mean(z < -2):.0%} ({np.mean(z_hi < -2):.0%}); "
        f"median rho full {np.median(full):.3f}, readout {np.median(readout):.3f}, null mean {np.median(nulls):.3f}.",
        "",
        "Layers matched by relative depth:",
        "",
        "| layer A | layer B | depth A | depth B | rho full | rho readout | null mean ± std | z ± 95% half-width | p_upper "
        "| readout − full [95% over texts] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in depth_matched(rows):
        half, p_upper = r.get("z_half_width"), r.get("p_upper")
        z_text = f"{r['z']:+.1f}" + (f" ± {half:.1f}" if half is not None and half == half else "")
        p_text = f"{p_upper:.2g}" if p_upper is not None and p_upper == p_upper else ""
        lines.append(
            f"| {r['layer_a']} | {r['layer_b']} | {r['relative_depth_a']:.2f} | {r['relative_depth_b']:.2f} | {r['rho_full']:.3f} | "
            f"{r['rho_readout']:.3f} | {r['null_mean']:.3f} ± {r['null_std']:.3f} | {z_text} | {p_text} | {_excess_text(r)} |"
        )
    lines.append("")
    return "\n".join(lines)


def pairs(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model_a"], row["revision_a"], row["model_b"], row["revision_b"]), []).append(row)
    return groups
