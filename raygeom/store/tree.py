"""The Arrow/Parquet store shared by every stage. Layout (all Hive-partitioned)::

    <root>/activations/model=<slug>/revision=<rev>/layer=<name>/part-0.parquet
        sample_id int32, layer_index int16, vector fixed_size_list<float32>[d]
    <root>/activations/model=<slug>/revision=<rev>/_COMPLETE.json
        written last: extraction settings key, layer names, weight fingerprint
    <root>/readout/model=<slug>/revision=<rev>/part-0.parquet
        component int32, singular_value float64, vector fixed_size_list<float64>[d]
    <root>/samples/model=<slug>/revision=<rev>/part-0.parquet
        sample_id int32, nll float64, n_tokens int32, label string, text_sha1 string
    <root>/results/<metric>/<unit key>.parquet
        one row per finished unit (model, revision, layer, parameters)

Every file is written to a hidden temporary name in its directory and renamed
into place, so a reader never sees half a file. An extraction counts only once
its ``_COMPLETE.json`` exists and its key matches.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raygeom.errors import RaygeomError

COMPLETE_MARKER = "_COMPLETE.json"


def content_key(*parts: Any) -> str:
    """A stable short hash of JSON-serialisable parts."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def vector_column(matrix: np.ndarray) -> pa.FixedSizeListArray:
    matrix = np.ascontiguousarray(matrix)
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])


def column_to_matrix(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    width = column.type.list_size
    return column.values.to_numpy(zero_copy_only=False).reshape(-1, width)


def atomic_write_table(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        # Dictionary encoding only slows down float vectors.
        pq.write_table(table, temporary, use_dictionary=False, compression="zstd")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def atomic_write_text(text: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


def read_table(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as error:
        raise RaygeomError(f"corrupt or unreadable Parquet file {path}: {error}") from None


def check_writable(root: Path) -> None:
    """Fail early, with one line, when the output directory cannot be written."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=root, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise RaygeomError(f"output directory {root} is not writable: {error.strerror or error}") from None


class Store:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _partition(self, kind: str, model: str, revision: str) -> Path:
        return self.root / kind / f"model={model}" / f"revision={revision}"

    # activations
    def layer_path(self, model: str, revision: str, layer: str) -> Path:
        return self._partition("activations", model, revision) / f"layer={layer}" / "part-0.parquet"

    def write_layer(self, model: str, revision: str, layer: str, layer_index: int, sample_ids: np.ndarray, vectors: np.ndarray) -> None:
        table = pa.table(
            {
                "sample_id": pa.array(np.asarray(sample_ids, dtype=np.int32)),
                "layer_index": pa.array(np.full(len(sample_ids), layer_index, dtype=np.int16)),
                "vector": vector_column(vectors.astype(np.float32)),
            }
        )
        atomic_write_table(table, self.layer_path(model, revision, layer))

    def read_layer(self, model: str, revision: str, layer: str) -> tuple[np.ndarray, np.ndarray]:
        path = self.layer_path(model, revision, layer)
        if not path.is_file():
            raise RaygeomError(f"no activations for {model}@{revision} layer {layer} in {self.root}")
        table = read_table(path)
        order = np.argsort(table["sample_id"].to_numpy())
        return table["sample_id"].to_numpy()[order], column_to_matrix(table["vector"])[order]

    def completion(self, model: str, revision: str) -> dict | None:
        marker = self._partition("activations", model, revision) / COMPLETE_MARKER
        if not marker.is_file():
            return None
        try:
            return json.loads(marker.read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def is_complete(self, model: str, revision: str, key: str) -> bool:
        """Complete means: the marker matches ``key`` and every layer file it lists reads back whole."""
        marker = self.completion(model, revision)
        if not marker or marker.get("key") != key:
            return False
        for layer in marker["layers"]:
            path = self.layer_path(model, revision, layer)
            try:
                if pq.ParquetFile(path).metadata.num_rows != marker["n_samples"]:
                    return False
            except (OSError, pa.ArrowInvalid):
                return False
        return True

    def mark_complete(self, model: str, revision: str, info: dict) -> None:
        atomic_write_text(json.dumps(info, indent=2, sort_keys=True), self._partition("activations", model, revision) / COMPLETE_MARKER)

    def drop_activations(self, model: str, revision: str) -> None:
        """Delete one revision's layer files once its analysis is done; marker, readout and samples stay."""
        import shutil

        for layer_dir in self._partition("activations", model, revision).glob("layer=*"):
            shutil.rmtree(layer_dir, ignore_errors=True)

    def partial_extractions(self) -> list[tuple[str, str]]:
        """(model slug, revision) with layer files but no completion marker: interrupted or still running."""
        found = []
        for revision_dir in sorted((self.root / "activations").glob("model=*/revision=*")):
            if not (revision_dir / COMPLETE_MARKER).is_file() and any(revision_dir.glob("layer=*")):
                found.append((revision_dir.parent.name.split("=", 1)[1], revision_dir.name.split("=", 1)[1]))
        return found

    def invalidate(self, model: str, revision: str) -> None:
        """Before this revision is extracted again: it stops counting as complete, and the hidden
        temporaries of a write that was killed before its rename (possibly GBs of layer data) go."""
        marker = self._partition("activations", model, revision) / COMPLETE_MARKER
        marker.unlink(missing_ok=True)
        for kind in ("activations", "readout", "samples"):
            for leftover in self._partition(kind, model, revision).rglob(".*.tmp"):
                leftover.unlink(missing_ok=True)

    # readout basis
    def write_readout(self, model: str, revision: str, basis: np.ndarray, singular_values: np.ndarray) -> None:
        table = pa.table(
            {
                "component": pa.array(np.arange(basis.shape[1], dtype=np.int32)),
                "singular_value": pa.array(singular_values.astype(np.float64)),
                "vector": vector_column(basis.T.astype(np.float64)),
            }
        )
        atomic_write_table(table, self._partition("readout", model, revision) / "part-0.parquet")

    def read_readout(self, model: str, revision: str) -> tuple[np.ndarray, np.ndarray]:
        table = read_table(self._partition("readout", model, revision) / "part-0.parquet")
        return column_to_matrix(table["vector"]).T.copy(), table["singular_value"].to_numpy()

    # per-sample data
    def write_samples(self, model: str, revision: str, columns: dict[str, np.ndarray | list]) -> None:
        atomic_write_table(pa.table(columns), self._partition("samples", model, revision) / "part-0.parquet")

    def read_samples(self, model: str, revision: str) -> pa.Table:
        return read_table(self._partition("samples", model, revision) / "part-0.parquet")

    # unit results
    def result_path(self, metric: str, key: str) -> Path:
        return self.root / "results" / metric / f"{key}.parquet"

    def has_result(self, metric: str, key: str) -> bool:
        path = self.result_path(metric, key)
        if not path.is_file():
            return False
        try:
            pq.ParquetFile(path)
            return True
        except (OSError, pa.ArrowInvalid):
            return False

    def write_result(self, metric: str, key: str, rows: list[dict] | dict) -> None:
        rows = [rows] if isinstance(rows, dict) else rows
        atomic_write_table(pa.Table.from_pylist(rows), self.result_path(metric, key))

    def read_results(self, metric: str, keys: Iterable[str] | None = None) -> pa.Table:
        directory = self.root / "results" / metric
        paths = sorted(directory.glob("*.parquet")) if keys is None else [self.result_path(metric, k) for k in keys]
        tables = [read_table(p) for p in paths if p.is_file()]
        return pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
