"""A synthetic store of the full Pythia sweep's PGA table (10 sizes x 154 revisions x every layer =
32,956 PGA units), to measure how big the HTML report of the largest grid gets and to render it in a
browser. The z values are made up (a smooth depth profile plus noise); only the shape is real.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from raygeom.sources import revisions as pythia
from raygeom.store.tree import atomic_write_table, atomic_write_text


def pythia_grid_rows(
    sizes: list[str] | None = None, revisions: list[str] | None = None, seed: int = 0, intervals: bool = True
) -> list[dict]:
    rng = np.random.default_rng(seed)
    sizes = sizes or list(pythia.PYTHIA_SIZES)
    revisions = revisions or list(pythia.PYTHIA_REVISIONS)
    rows = []
    for size_name in sizes:
        size = pythia.PYTHIA_SIZES[size_name]
        repo = pythia.repo_id(size_name)
        names = ["embed", *[f"block_{i:02d}" for i in range(size.n_blocks)], "final_norm"]
        for revision in revisions:
            step = pythia.step_of(revision)
            progress = np.log1p(step) / np.log1p(143_000)
            depth = np.linspace(0.0, 1.0, len(names))
            # Readout alignment grows with training, dips late in the network (a "collapse zone"), recovers at the end.
            z = progress * (12 * np.sin(np.pi * depth) - 18 * np.exp(-(((depth - 0.8) / 0.08) ** 2)) + 10 * depth**8)
            z = z + rng.normal(0.0, 1.0, len(names))
            se = np.sqrt((1 + z**2 / 2) / 100)
            for index, (layer, value, error) in enumerate(zip(names, z, se)):
                row = {
                    "model": repo.replace("/", "--"),
                    "repo": repo,
                    "size": size_name,
                    "deduped": False,
                    "params": size.params,
                    "d": size.d,
                    "revision": revision,
                    "step": step,
                    "layer": layer,
                    "layer_index": index,
                    "relative_depth": float(depth[index]),
                    "k": 100,
                    "r": 1,
                    "n": 2000,
                    "n_null": 100,
                    "seed": 0,
                    "rho_readout": float(0.3 + 0.01 * value),
                    "null_mean": 0.3,
                    "null_std": 0.01,
                    "z": float(value),
                    "fingerprint": f"{size_name}-{revision}",
                    "weights_flag": None,
                    "known_bad_note": None,
                    "unit_key": f"{size_name}-{revision}-{layer}",
                }
                if intervals:
                    row.update(z_lo=float(value - 1.96 * error), z_hi=float(value + 1.96 * error), z_se=float(error))
                if size_name == "2.8b" and 0 < (step or 0) <= 512:
                    row["weights_flag"] = "same weights as step143000"
                rows.append(row)
    return rows


# What a sweep's results/revisions.parquet holds of a (model, revision), beside its PGA rows
REVISION_COLUMNS = ("model", "revision", "repo", "size", "deduped", "params", "step", "weights_flag", "known_bad_note")


def write_pythia_grid_store(root: str | Path, **kwargs) -> Path:
    """A store holding only ``results/pga.parquet`` and ``results/revisions.parquet`` (and a manifest), the tables a
    finished sweep leaves (its unit files aside)."""
    from raygeom.analyses import registry
    from raygeom.analyses.results_table import typed_table

    root = Path(root)
    rows = pythia_grid_rows(**kwargs)
    joined = set(REVISION_COLUMNS) - {"model", "revision", "step"}
    pga = [{k: v for k, v in row.items() if k not in joined} for row in rows]
    atomic_write_table(typed_table(pga, registry.get("pga")), root / "results" / "pga.parquet")
    revisions = list({(r["model"], r["revision"]): {c: r[c] for c in REVISION_COLUMNS} for r in rows}.values())
    atomic_write_table(pa.Table.from_pylist(revisions), root / "results" / "revisions.parquet")
    atomic_write_text(
        '{"corpus": "synthetic", "n_samples": 2000, "sample_seed": 0, "fingerprint": "synthetic"}',
        root / "sweep" / "manifest.json",
    )
    return root


def job_store_rows(
    models: tuple[str, ...] = ("EleutherAI--pythia-14m", "EleutherAI--pythia-31m"),
    revisions: tuple[str, ...] = ("step1000", "step143000"),
    ranks: tuple[int, ...] = (0, 1, 5),
    seed: int = 0,
) -> dict[str, list[dict]]:
    """Rows a job over ``models`` x ``revisions`` leaves (PGA at each CCR rank, spectral metrics, linear probes), by
    analysis, each row with its ``unit_key``. The values are made up; only the shape is real."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[dict]] = {"pga": [], "spectral": [], "probe": []}
    for m, model in enumerate(models):
        names = ["embed", *[f"block_{i:02d}" for i in range(3 + m)], "final_norm"]
        depth = np.linspace(0.0, 1.0, len(names))
        for revision in revisions:
            base = {
                "model": model,
                "revision": revision,
                "step": pythia.step_of(revision),
                "n": 40,
                "d": 64 + 32 * m,
                "corpus": "bbc",
                "pool": "last",
                "seq_len": 32,
            }
            for index, layer in enumerate(names):
                where = {**base, "layer": layer, "layer_index": index, "relative_depth": float(depth[index])}
                for r in ranks:
                    z = float(rng.normal(2.0 - r * 0.5, 1.0))
                    out["pga"].append(
                        {
                            **where,
                            "k": 8,
                            "k_per_d": 0.0,
                            "r": r,
                            "n_null": 20,
                            "seed": 0,
                            "rho_readout": 0.3 + 0.01 * z,
                            "null_mean": 0.3,
                            "null_std": 0.01,
                            "z": z,
                            "z_lo": z - 0.5,
                            "z_hi": z + 0.5,
                            "unit_key": f"pga-{model}-{revision}-{layer}-r{r}",
                        }
                    )
                out["spectral"].append(
                    {
                        **where,
                        "k": 8,
                        "k_per_d": 0.0,
                        "rankme": float(20 + index + rng.random()),
                        "alpha_req": float(1 + rng.random()),
                        "isotropy": float(rng.random()),
                        "condition_number": float(10 + 10 * rng.random()),
                        "unit_key": f"spectral-{model}-{revision}-{layer}",
                    }
                )
                accuracy = float(rng.uniform(0.3, 0.9))
                out["probe"].append(
                    {
                        **where,
                        "seed": 0,
                        "test_fraction": 0.25,
                        "c": 1.0,
                        "accuracy": accuracy,
                        "accuracy_lo": accuracy - 0.1,
                        "accuracy_hi": accuracy + 0.1,
                        "chance": 0.3,
                        "n_test": 10,
                        "unit_key": f"probe-{model}-{revision}-{layer}",
                    }
                )
    return out


def write_job_store(root: str | Path, **kwargs) -> Path:
    """A store as jobs leave it: PGA and spectral rows as unit files (``k_per_d = 0.0``) and tables, the PGA table
    as a store from before k_per_d left it (no ``k_per_d`` column), and the probes only as ``results/probe.parquet``
    (as ``raygeom probe`` writes them)."""
    from raygeom.store.tree import Store

    root = Path(root)
    store = Store(root)
    rows = job_store_rows(**kwargs)
    for name in ("pga", "spectral"):
        for row in rows[name]:
            store.write_result(name, row["unit_key"], row)
        table = rows[name] if name != "pga" else [{k: v for k, v in row.items() if k != "k_per_d"} for row in rows[name]]
        atomic_write_table(pa.Table.from_pylist(table), root / "results" / f"{name}.parquet")
    atomic_write_table(pa.Table.from_pylist(rows["probe"]), root / "results" / "probe.parquet")
    return root


def declared_rows(
    analysis,
    models: tuple[str, ...] = ("EleutherAI--pythia-14m", "EleutherAI--pythia-31m"),
    revisions: tuple[str, ...] = ("step1000", "step143000"),
    n_layers: int = 4,
    seed: int = 0,
) -> list[dict]:
    """Rows shaped as ``analysis`` declares them, per model, revision and layer (a comparison of models: per pair of
    layers of the first two (model, revision)s): its columns that are parameters at their defaults, each metric
    inside its 95 % interval and above its chance level, made-up numbers for the rest. Only the shape is real."""
    from dataclasses import fields

    rng = np.random.default_rng(seed)
    defaults = analysis.Params()
    parameters = {f.name for f in fields(defaults)}
    metric_columns = {c for m in analysis.metrics for c in (m.column, m.lo, m.hi, m.chance) if c}
    names = ["embed", *[f"block_{i:02d}" for i in range(n_layers - 2)], "final_norm"]
    others = {c: int(rng.integers(2, 50)) for c in analysis.columns if c not in parameters and c not in metric_columns}

    def values() -> dict:
        row = {}
        for column in analysis.columns:
            if column in parameters:
                row[column] = getattr(defaults, column)
            elif column == "note" or column.endswith("_warning"):
                row[column] = None
            elif column in others:
                row[column] = others[column]
        for metric in analysis.metrics:
            value = float(rng.uniform(0.3, 0.7))
            row[metric.column] = value
            row.update({c: v for c, v in ((metric.lo, value - 0.1), (metric.hi, value + 0.1), (metric.chance, 0.1)) if c})
        return row

    if analysis.extraction == "aligned":  # one row per pair of layers of two (model, revision)s
        (a, ra), (b, rb) = (models[0], revisions[-1]), (models[-1], revisions[-1])
        return [
            {
                **values(),
                "model_a": a,
                "revision_a": ra,
                "model_b": b,
                "revision_b": rb,
                "layer_a": la,
                "layer_b": lb,
                "layer_index_a": i,
                "layer_index_b": j,
                **{c: float(rng.uniform(0.1, 0.9)) for c in ("rho_full", "rho_readout", "null_mean")},
                "unit_key": f"{analysis.name}-{la}-{lb}",
            }
            for i, la in enumerate(names)
            for j, lb in enumerate(names)
        ]
    rows = []
    for model in models:
        for revision in revisions:
            for index, layer in enumerate(names):
                at = {"model": model, "revision": revision, "step": pythia.step_of(revision), "n": 40, "corpus": "bbc"}
                rows.append(
                    {
                        **at,
                        "layer": layer,
                        "layer_index": index,
                        "relative_depth": index / (len(names) - 1),
                        **values(),
                        "unit_key": f"{analysis.results_dir}-{model}-{revision}-{layer}",
                    }
                )
    return rows


def write_analysis_store(root: str | Path, analyses: dict, **kwargs) -> Path:
    """A store holding the rows of each of ``analyses`` (name -> Analysis; see :func:`declared_rows`) in its table
    ``results/<dir>.parquet``, as a job writes it; analyses that share a directory (one unit computes them together)
    share each row."""
    tables: dict = {}
    for analysis in analyses.values():
        table = tables.setdefault(analysis.results_dir, {})
        for row in declared_rows(analysis, **kwargs):
            table[row["unit_key"]] = {**table.get(row["unit_key"], {}), **row}
    for directory, rows in tables.items():
        atomic_write_table(pa.Table.from_pylist(list(rows.values())), Path(root) / "results" / f"{directory}.parquet")
    return Path(root)
