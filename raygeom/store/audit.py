"""Check every file of a store, needed now or not: its checksum, and for layer, unit and marker files whether
the content is what its place says (``raygeom verify``). Reads only; takes no lock.

Each file is announced to ``watch`` before it is read, so that a caller can bound the time one read may take (a hung
mount, a library wait that never returns): ``raygeom verify`` runs the audit on a thread of its own and gives up on a
read after ``RAYGEOM_READ_TIMEOUT`` seconds. Only regular files are opened: a FIFO (or a device) in a file's place
would block its reader forever, so it is damage, never read."""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from raygeom.errors import RaygeomError
from raygeom.store.tree import (
    COMPLETE_MARKER,
    EXTRACTION,
    Store,
    _decode,
    checksum_path,
    decode_segment,
    encode_segment,
    read_verified,
)


@dataclass
class Audit:
    checked: int = 0  # files whose checksum (and identity, where they state one) was checked
    unrecorded: int = 0  # files the store did not write (plots, Ray Train's own files): nothing to check them against
    damaged: list[tuple[Path, str]] = field(default_factory=list)


def _value(segment: str) -> str:
    return decode_segment(segment.split("=", 1)[1])


def _not_regular(path: Path) -> str | None:
    """Why ``path`` must not be opened (it is there, but not a regular file), or None."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return f"{path} is not a regular file (a FIFO, socket or device in a stored file's place); reading it would block"


def audit(root: str | Path, watch: Callable[[Path], None] = lambda path: None) -> Audit:
    """``watch(path)`` is called before each file is read."""
    store = Store(root)
    root = store.root
    if not root.is_dir():
        raise RaygeomError(f"store {root} not found")
    result = Audit()
    recorded: dict[Path, tuple[str, dict]] = {}  # an extraction's files: the marker's hash is the one that counts
    for marker in sorted(
        [
            *root.glob(f"activations/model=*/revision=*/{COMPLETE_MARKER}"),
            *root.glob(f"activations/model=*/revision=*/{EXTRACTION}=*/{COMPLETE_MARKER}"),
        ]
    ):
        keyed = marker.parent.name.startswith(f"{EXTRACTION}=")
        revision_dir = marker.parent.parent if keyed else marker.parent
        model, revision = _value(revision_dir.parent.name), _value(revision_dir.name)
        watch(marker)
        info, problem = store._marker_at(model, revision, marker.parent.name if keyed else None)
        result.checked += 1
        if problem:
            result.damaged.append((marker, problem))
            continue
        files = info.get("files") if info else None
        for name, digest in (files if isinstance(files, dict) else {}).items():
            recorded[root / name] = (digest, info)
    for path, problem in _missing_listed(recorded):
        result.checked += 1
        result.damaged.append((path, problem))
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts):
            continue  # sidecars, temporaries, the lock
        odd = _not_regular(path)
        if odd:
            result.checked += 1
            result.damaged.append((path, odd))
            continue
        if not path.is_file():
            continue
        parts = relative.parts
        if parts[0] == "activations" and path.name == COMPLETE_MARKER:
            continue  # checked above
        # activations/model=/revision=/[extraction=/]layer=/part-0.parquet: an older store's have no extraction= level
        extraction = _value(parts[3]) if len(parts) == 6 and parts[3].startswith(f"{EXTRACTION}=") else None
        layer = parts[0] == "activations" and len(parts) == (6 if extraction else 5) and parts[-2].startswith("layer=")
        unit = len(parts) == 3 and parts[0] == "results" and path.suffix == ".parquet"
        keyed = layer or unit or (parts[0] in ("readout", "samples") and path.suffix == ".parquet")
        digest, marker = recorded.get(path, (None, None))
        if digest is None and not checksum_path(path).is_file():
            if keyed:
                result.damaged.append((path, f"{path} has no recorded checksum"))
            else:
                result.unrecorded += 1
            continue
        result.checked += 1
        watch(path)
        try:
            data = read_verified(path, digest)
            problem = None
            if layer:
                table = _decode(data, path, ["layer_index"])
                problem = Store.layer_problem(
                    table, _value(parts[1]), _value(parts[2]), _value(parts[-2]), path, marker, extraction
                )
            elif unit:
                store.read_unit_file(path)
        except RaygeomError as error:
            problem = str(error)
        if problem:
            result.damaged.append((path, problem))
    for table, units in sorted(_tables_of_units(root)):
        if _not_regular(table):
            continue  # reported above
        result.checked += 1
        problem = _table_problem(store, table, units, watch)
        if problem:
            result.damaged.append((table, problem))
    return result


def _missing_listed(recorded: dict[Path, tuple[str, dict]]) -> list[tuple[Path, str]]:
    """Files a completion marker lists that are gone. An extraction whose layer files are all gone was freed (``raygeom
    gc``, ``keep_activations = false``); one missing only some of them, or its readout or samples, lost them."""
    by_extraction: dict[int, list[Path]] = {}
    markers = {}
    for path, (_, marker) in recorded.items():
        by_extraction.setdefault(id(marker), []).append(path)
        markers[id(marker)] = marker
    missing = []
    for _key, paths in by_extraction.items():
        layers = [p for p in paths if p.parent.name.startswith("layer=")]
        freed = bool(layers) and not any(p.exists() for p in layers)
        for path in sorted(paths):
            if not path.exists() and not (freed and path in layers):
                missing.append((path, f"{path} is listed by its extraction's {COMPLETE_MARKER} but missing (deleted?)"))
    return missing


def _tables_of_units(root: Path) -> list[tuple[Path, Path]]:
    """(results/<name>.parquet, results/<name>/): each table that gathers the rows of a directory of unit files."""
    results = root / "results"
    return [(table, table.with_suffix("")) for table in results.glob("*.parquet") if table.with_suffix("").is_dir()]


def _canonical(row: dict, columns) -> tuple:
    import math

    def value(v):
        if isinstance(v, float) and math.isnan(v):
            return "nan"
        return repr(v)

    return tuple(value(row.get(c)) for c in columns)


def _table_problem(store: Store, table: Path, units: Path, watch: Callable[[Path], None] = lambda path: None) -> str | None:
    """A results table compared with the unit files it was gathered from (with or without its checksum sidecar):
    every row of a stored unit must be that unit's row, value for value, and every row of a unit must have its unit
    file (a row whose unit file is gone was kept by nothing: deleted, it is computed again by a rerun). A row that
    says why it was not scored (``note``) was never stored as a unit, so it has none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    watch(table)
    try:
        # One thread: a read on Arrow's pools waits in C++, where no signal handler runs.
        rows = pq.read_table(pa.BufferReader(table.read_bytes()), use_threads=False).to_pylist()
    except Exception as error:  # noqa: BLE001 - any unreadable table is damage
        return f"{table} cannot be read: {error}"
    by_key: dict[str, list[dict]] = {}
    present: set[str] = set()
    for path in sorted(units.glob("*.parquet")):
        present.add(decode_segment(path.name[: -len(".parquet")]))
        if _not_regular(path):
            continue  # reported on its own
        watch(path)
        try:
            for row in store.read_unit_file(path).to_pylist():
                by_key.setdefault(row.get("unit_key"), []).append(row)
        except RaygeomError:
            continue  # a damaged unit file is reported on its own
    mine: dict[str, list[dict]] = {}
    for row in rows:
        key = row.get("unit_key")
        if key in by_key:
            mine.setdefault(key, []).append(row)
        elif isinstance(key, str) and key not in present and not row.get("note"):
            return (
                f"{table} holds a row of unit {key} ({row.get('layer', '?')}), whose unit file "
                f"{units / (encode_segment(key) + '.parquet')} is gone (deleted?); rerun the job to compute it again"
            )
    for key, stored in by_key.items():
        given = mine.get(key)
        if given is None:
            continue  # a unit stored after this table was written (another job's): not this table's
        columns = sorted(set(given[0]) & set(stored[0]))
        if sorted(_canonical(r, columns) for r in given) != sorted(_canonical(r, columns) for r in stored):
            layer = given[0].get("layer", "?")
            return (
                f"{table} does not match its unit files: the rows of unit {key} ({layer}) differ from "
                f"{units.name}/ (edited?); rerun the job to rewrite it"
            )
    return None
