"""The one table writer: an analysis's unit rows as ``results/<analysis>.parquet``, for a run, a sweep and the library
(raygeom.api's store_* functions) alike, so their tables have the same columns, in the same order, with the same types.

Every row the store holds of the analysis is in it (all jobs on the store, each row with the settings that made it;
raygeom.engine.units.accumulated_rows), in canonical form (raygeom.params.canonical_rows). Column types do not depend
on which values a table happens to hold: the columns every per-layer row starts with (raygeom.analyses.provenance)
have fixed types, an analysis's settings the types its ``Params`` declare, and the rest the type of their values. A
table of rows made from the pooled extraction holds every provenance column, ``source`` included (null where the
vectors are raygeom's own), and is ordered by model, step, revision, settings and depth; every table holds every
column its analysis declares (null where no row has it). Nullable booleans are marked
for pandas, so a column of true/false with nulls reads as pandas' ``boolean``, not ``object``, and tables of a run,
a sweep and the library concatenate without object columns that are not strings.
"""

from __future__ import annotations

import json
import typing
from dataclasses import fields
from pathlib import Path

import pyarrow as pa

# Columns every per-layer row starts with (raygeom.analyses.provenance.layer_row, extraction_columns) and the
# engine's: their one type, whatever the values of one table are.
FIXED_TYPES: dict[str, pa.DataType] = {
    "model": pa.string(),
    "revision": pa.string(),
    "step": pa.int64(),
    "layer": pa.string(),
    "layer_index": pa.int64(),
    "relative_depth": pa.float64(),
    "d": pa.int64(),
    "note": pa.string(),
    "n": pa.int64(),
    "corpus": pa.string(),
    "corpus_fingerprint": pa.string(),
    "seq_len": pa.int64(),
    "pool": pa.string(),
    "skip_first": pa.bool_(),
    "max_words": pa.int64(),
    "fingerprint": pa.string(),
    "source": pa.string(),
    "raygeom_version": pa.string(),
    "unit_key": pa.string(),
    "cpu_seconds": pa.float64(),
}
FRONT = ("model", "revision", "step", "layer", "layer_index", "relative_depth", "d")
# extraction_columns' keys: a table of rows made from an extraction holds all of them
PROVENANCE = ("n", "corpus", "corpus_fingerprint", "seq_len", "pool", "skip_first", "max_words", "raygeom_version", "source")
BACK = ("fingerprint", *PROVENANCE, "unit_key", "cpu_seconds")
_PYTHON_TYPES = {int: pa.int64(), float: pa.float64(), bool: pa.bool_(), str: pa.string()}


def settings_types(analysis) -> dict[str, pa.DataType]:
    """Column -> Arrow type of each setting ``analysis.Params`` declares as a number, a flag or a string."""
    if analysis is None:
        return {}
    hints = typing.get_type_hints(analysis.Params)
    out = {}
    for spec in fields(analysis.Params):
        hint = hints.get(spec.name)
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        kind = hint if hint in _PYTHON_TYPES else args[0] if len(args) == 1 else None
        if kind in _PYTHON_TYPES:
            out[spec.name] = _PYTHON_TYPES[kind]
    return out


def setting_columns(analysis) -> tuple[str, ...]:
    """The columns of ``analysis``'s rows that are settings, not results: its declared Params fields."""
    return tuple(f.name for f in fields(analysis.Params)) if analysis is not None else ()


# extraction_columns' settings: how the vectors were made (constant within one extraction)
EXTRACTION_SETTINGS = ("n", "corpus", "seq_len", "pool", "skip_first", "max_words", "source")


def setting_names(analysis) -> tuple[str, ...]:
    """The columns of ``analysis``'s rows that say how a row was made, never what it measured: the extraction's
    settings and the analysis's declared Params fields, less the declared columns that are measurements under a
    parameter's name (``Analysis.measured``)."""
    measured = set(getattr(analysis, "measured", ()))
    return tuple(dict.fromkeys(c for c in (*EXTRACTION_SETTINGS, *setting_columns(analysis)) if c not in measured))


def row_settings(analysis, row: dict) -> dict:
    """The settings of one row of ``analysis`` (:func:`setting_names`), in canonical form: a setting the row lacks
    that has a value meaning "as before it existed" (raygeom.params.ABSENT_MEANS) takes it, and a Params field whose
    value in the row is not of its declared type (kNN-LM's temperature: 'auto' in Params, the number chosen in a
    row) is a measurement under the setting's name, not the setting."""
    from raygeom.params import ABSENT_MEANS, canonical_value

    declared = {**settings_types(analysis), **{c: FIXED_TYPES[c] for c in EXTRACTION_SETTINGS}}
    out = {}
    for name in setting_names(analysis):
        if name not in row and name not in ABSENT_MEANS:
            continue
        value = canonical_value(name, row.get(name))
        if value is None or _fits(value, declared.get(name)):
            out[name] = value
    return out


def _fits(value, kind: pa.DataType | None) -> bool:
    if kind is None:
        return True
    if pa.types.is_boolean(kind):
        return isinstance(value, bool)
    if pa.types.is_integer(kind):
        return isinstance(value, int) and not isinstance(value, bool)
    if pa.types.is_floating(kind):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if pa.types.is_string(kind):
        return isinstance(value, str)
    return True


def column_order(analysis, rows: list[dict]) -> list[str]:
    """The table's columns: identity, settings, the analysis's declared columns, any others, then provenance."""
    present = list(dict.fromkeys(name for row in rows for name in row))
    pooled = analysis is None or analysis.extraction == "pooled"  # an extraction of its own has its own provenance
    from_extraction = pooled and any(name in PROVENANCE for name in present)
    wanted = set(present) | (set(PROVENANCE) if from_extraction else set())
    wanted |= set(analysis.columns) if analysis is not None and rows else set()
    settings = setting_columns(analysis)
    declared = analysis.columns if analysis is not None else ()
    order = [*FRONT, *settings, *declared, *(c for c in present if c not in BACK), *BACK]
    return [c for c in dict.fromkeys(order) if c in wanted]


def _column(values: list, declared: pa.DataType | None) -> pa.Array:
    if declared is not None:
        try:
            return pa.array(values, type=declared)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            pass  # a value the declaration does not fit (an older row's): the type of the values
    array = pa.array(values)
    return array.cast(pa.float64()) if pa.types.is_null(array.type) else array


def typed_table(rows: list[dict], analysis=None) -> pa.Table:
    """``rows`` of ``analysis`` (an Analysis, or None) as the Arrow table every results/<analysis>.parquet is."""
    columns = column_order(analysis, rows)
    declared = {**settings_types(analysis), **FIXED_TYPES}
    arrays = [_column([row.get(name) for row in rows], declared.get(name)) for name in columns]
    table = pa.Table.from_arrays(arrays, names=columns) if columns else pa.table({})
    return _with_pandas_types(table)


def _with_pandas_types(table: pa.Table) -> pa.Table:
    """Mark every boolean column as pandas' nullable ``boolean``: without it pandas reads a boolean column with a null
    as ``object`` and one without as ``bool``, so two tables of the same column would concatenate as ``object``."""
    flags = [name for name, kind in zip(table.column_names, table.schema.types) if pa.types.is_boolean(kind)]
    if not flags:
        return table
    metadata = {
        "index_columns": [],
        "column_indexes": [],
        "columns": [
            {"name": name, "field_name": name, "pandas_type": "bool", "numpy_type": "boolean", "metadata": None} for name in flags
        ],
        "creator": {"library": "raygeom"},
        "pandas_version": "",
    }
    return table.replace_schema_metadata({**(table.schema.metadata or {}), b"pandas": json.dumps(metadata).encode()})


def _order(analysis, row: dict) -> tuple:
    """Rows by model, training step, revision, settings, then depth, whichever job wrote them first."""

    def text(value) -> str:
        return "" if value is None else str(value)

    step = row.get("step")
    return (
        text(row.get("model")),
        step is None,
        step if isinstance(step, int) else 0,
        text(row.get("revision")),
        tuple(text(row.get(name)) for name in setting_names(analysis)),
        row.get("layer_index") if isinstance(row.get("layer_index"), int) else -1,
        row.get("relative_depth") if isinstance(row.get("relative_depth"), float) else 0.0,
        text(row.get("layer")),
        text(row.get("unit_key")),
    )


def write_results_table(store, analysis, job_rows: list[dict], write_empty: bool = True) -> Path | None:
    """``results/<analysis>.parquet``: every row of ``analysis`` (an Analysis or its name) the store holds, then this
    job's rows that were not stored (degenerate units, with their ``note``), as :func:`typed_table` types them.
    Without a row at all: an empty table, or nothing (None) unless ``write_empty``."""
    from raygeom.analyses import registry
    from raygeom.engine.units import accumulated_rows
    from raygeom.store.tree import atomic_write_table

    spec = registry.get(analysis) if isinstance(analysis, str) else analysis
    rows = accumulated_rows(store, spec.results_dir, job_rows)
    if spec.extraction != "pooled":  # stores from before the unit engine kept summaries there, with no key
        rows = [row for row in rows if row.get("unit_key")]
    if not rows and not write_empty:
        return None
    path = store.root / "results" / f"{spec.results_dir}.parquet"
    if spec.extraction == "pooled":  # an analysis with an extraction of its own keeps its rows' order (e.g. a ranking)
        rows = sorted(rows, key=lambda row: _order(spec, row))
    atomic_write_table(typed_table(rows, spec), path)
    record_asked(store.root, spec.name)
    return path


ASKED = "analyses.json"  # results/analyses.json: the analyses a job asked for, so far, in this store


def record_asked(root: Path, name: str) -> None:
    """Note in the store that a job asked for the analysis ``name``: analyses that share a results directory (token
    dispersion and its slices) each get their report section only where asked for, not wherever the shared rows are."""
    from raygeom.store.tree import atomic_write_text

    names = asked(root) or set()
    if name not in names:
        atomic_write_text(json.dumps({"asked": sorted(names | {name})}, indent=2) + "\n", Path(root) / "results" / ASKED)


def asked(root: Path) -> set[str] | None:
    """The analyses jobs asked for in the store at ``root`` (:func:`record_asked`); None where no job said (a store
    written before this record, or a damaged one)."""
    try:
        return set(json.loads((Path(root) / "results" / ASKED).read_text())["asked"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
