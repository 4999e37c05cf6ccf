"""The rows a report draws, read from a store: every table and unit directory an analysis writes, each setting in its
one canonical form, the rows of overlaid stores tagged with their store, and the files that could not be read kept
for the page to list (never silently dropped)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from raygeom.errors import RaygeomError
from raygeom.params import canonical_value

# pyarrow and the store are imported where used: every CLI command imports the report.


# Columns that say how a row was produced (the rest are measurements or identifiers). A "run" is one
# distinct combination of the ones a table has; provenance columns added later are picked up by name.
SETTING_COLUMNS = (
    "store",
    "corpus",
    "corpus_fingerprint",
    "n_samples",
    "sample_seed",
    "n",
    "seq_len",
    "pool",
    "skip_first",
    "max_words",
    "batch_size",
    "k",
    "k_per_d",
    "r",
    "n_null",
    "seed",
    "ccr_ranks",
    "sample_ccr",
    "chunk_len",
    "domain_tokens",
    "steps",
    "lr",
    "over",
    "push_layer",
    "workers",
    "raygeom_version",
    "version",
    "settings_key",
    "extraction_key",
)
# Settings that split one model's z profiles into separate traces when a store holds several.
VARIANT_COLUMNS = (
    "store",
    "k",
    "k_per_d",
    "r",
    "n",
    "n_null",
    "seed",
    "pool",
    "seq_len",
    "skip_first",
    "max_words",
    "corpus",
    "corpus_fingerprint",
)


# ----------------------------------------------------------------------------------- reading

# Files a report could not read (corrupt, unverified, being rewritten): shown at the top of the report, never
# silently dropped. Reset by build_sections.
UNREADABLE: list[tuple[Path, str]] = []


# `raygeom report A B ...`: the first store is read as usual and every table is read from the others too, each row
# tagged with its store, which is then one more setting that tells series apart. Set by write_report.
_OVERLAY: dict = {}  # {"primary": Path, "label": str, "others": [(Path, label), ...]} while overlaying


def _overlaid(read):
    def both(path: Path) -> list[dict]:
        if not _OVERLAY:
            return read(path)
        try:
            relative = Path(path).relative_to(_OVERLAY["primary"])
        except ValueError:
            return read(path)
        rows = [{**row, "store": _OVERLAY["label"]} for row in read(path)]
        for other, label in _OVERLAY["others"]:
            rows += [{**row, "store": label} for row in read(other / relative)]
        return rows

    return both


def _read_one(path: Path) -> list[dict]:
    from raygeom.store.tree import read_table

    if not path.is_file():
        return []
    try:
        return read_table(path).to_pylist()
    except RaygeomError as error:
        UNREADABLE.append((path, str(error)))
        return []


def _read_dir_one(directory: Path) -> list[dict]:
    import pyarrow as pa

    from raygeom.store.tree import Store, read_table

    # A unit directory's files are read as units: one copied over another unit's name is not shown twice.
    store = Store(directory.parent.parent)
    read = (lambda path: store.read_unit_file(path, strict=False)) if directory.parent.name == "results" else read_table
    paths = sorted(directory.glob("*.parquet")) if directory.is_dir() else []
    tables = []
    for path in paths:
        try:
            tables.append(read(path))
        except RaygeomError as error:  # a unit being rewritten or a damaged file: the report shows the rest and says so
            UNREADABLE.append((path, str(error)))
    if not tables:
        return []
    return pa.concat_tables(tables, promote_options="permissive").to_pylist()


def _canonical(read):
    """Rows as the report groups them, every setting in its one canonical form (params.canonical_value: a k_per_d
    absent, None or 0 is 0.0 in a row with a k), so rows that spell a setting differently or not at all are one setting, never two lines."""

    def rows(path: Path) -> list[dict]:
        # k_per_d qualifies k: only rows with a k carry it
        return [
            {**row, "k_per_d": canonical_value("k_per_d", row.get("k_per_d"))} if "k" in row or "k_per_d" in row else row
            for row in read(path)
        ]

    return rows


_read = _canonical(_overlaid(_read_one))
_read_dir = _canonical(_overlaid(_read_dir_one))


def _step(revision: str) -> int | None:
    from raygeom.sources.revisions import step_of

    return step_of(revision)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _depth_order(rows: list[dict]) -> list[str]:
    """The rows' layers from the embedding down: by relative_depth where every row has it (the points inside a block
    share the block's layer_index, so that alone would order them by name), else by layer_index."""
    deep = all(_finite(r.get("relative_depth")) for r in rows)
    order = sorted({(r["relative_depth"] if deep else r.get("layer_index", 0), r["layer"]) for r in rows})
    return list(dict.fromkeys(name for _, name in order))


def _num(rows: list[dict], column: str) -> np.ndarray:
    return np.array([r.get(column) if _finite(r.get(column)) else np.nan for r in rows], dtype=float)


def _revision_order(revisions) -> list[str]:
    return sorted(set(revisions), key=lambda v: (_step(v) is None, _step(v) or 0, v))


def _setting_key(value):
    """A setting's value as a set or dict key that tells apart what its JSON tells apart (1 from 1.0 and True, NaN
    equal to NaN), without encoding every scalar: reports of the full Pythia grid key a million cells."""
    if isinstance(value, float):
        return (float, "nan") if value != value else (float, value)
    if value is None or isinstance(value, (str, int)):
        return (type(value), value)
    if isinstance(value, np.integer):
        return (int, int(value))
    return json.dumps(value, default=str)


def pga_rows(root: Path) -> list[dict]:
    """Every PGA row the store holds: the per-unit rows and the PGA table (a run's and a sweep's alike), one row
    per measurement, each with what a sweep's results/revisions.parquet says of its (model, revision): size, step
    and the weights flag. Two units with the same settings and the same rho (e.g. `pga` and `diagnose` on one
    extraction) are one measurement."""
    merged: dict = {}
    sources = [_read_dir(root / "results" / "pga"), _read(root / "results" / "pga.parquet")]
    for rows in sources:
        for row in rows:
            if row.get("z") is None and row.get("rho_readout") is None:
                continue
            rho = row.get("rho_readout")
            key = (
                *(_setting_key(canonical_value(c, row.get(c))) for c in ("model", "revision", "layer", *VARIANT_COLUMNS)),
                round(rho, 9) if _finite(rho) else row.get("unit_key"),
            )
            merged[key] = {**merged.get(key, {}), **{k: v for k, v in row.items() if v is not None}}
    revisions = {(r.get("model"), r.get("revision")): r for r in _read(root / "results" / "revisions.parquet")}
    if not revisions:
        return list(merged.values())
    return [
        {**{k: v for k, v in revisions.get((row.get("model"), row.get("revision")), {}).items() if v is not None}, **row}
        for row in merged.values()
    ]


def _analysis_rows(root: Path, analysis) -> tuple[list[dict], list[Path]]:
    """An analysis's rows: its unit files (``results/<dir>/``), and the rows of its table (``results/<dir>.parquet``,
    which hand-written commands write alone) that no unit file holds."""
    table = root / "results" / f"{analysis.results_dir}.parquet"
    units = _read_dir(root / "results" / analysis.results_dir)
    keys = {(r.get("store"), r.get("unit_key")) for r in units if r.get("unit_key")}  # (store: when overlaying)
    rows = units + [
        r for r in _read(table) if ((r.get("store"), r.get("unit_key")) not in keys if r.get("unit_key") else not units)
    ]
    return rows, [table]
