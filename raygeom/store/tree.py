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
into place, so a reader never sees half a file, and gets a hidden sidecar
``.<name>.sha256`` with the SHA-256 of its bytes; every read checks it. An
extraction counts only once its ``_COMPLETE.json`` exists, its key matches, and
every file it lists (with its hash) has those bytes. ``model``/``revision``
values are percent-encoded (pyarrow's Hive partitioning decodes them back).
One process at a time writes a store (``<root>/.lock``, see ``lock_store``).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote, unquote

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


CHECKSUM_SUFFIX = ".sha256"


class CorruptFile(RaygeomError):
    """A stored file whose bytes do not match the checksum recorded when it was written."""


def file_digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def checksum_path(path: Path) -> Path:
    """The sidecar holding a file's content hash. Hidden, so Hive/Parquet dataset readers skip it."""
    return path.with_name(f".{path.name}{CHECKSUM_SUFFIX}")


def encode_segment(value: str) -> str:
    """A user string (model name, revision) as one path segment, reversibly: percent-encoding as
    pyarrow's Hive partitioning decodes it (``segment_encoding="uri"``), with leading dots encoded
    too, so '..', '/', '=' and '%' can never make a segment point elsewhere."""
    if not value:
        raise RaygeomError("an empty name cannot be stored")
    encoded = quote(value, safe="-_~+@,")
    stripped = encoded.lstrip(".")
    return "%2E" * (len(encoded) - len(stripped)) + stripped


def decode_segment(segment: str) -> str:
    return unquote(segment)


def _write_replacing(data: bytes | memoryview, path: Path) -> str:
    """Write ``data`` and its checksum sidecar, each under a hidden temporary name renamed into place.
    A crash between the two renames leaves a mismatch, which reads as 'not done', never as data."""
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = file_digest(data)
    sidecar = checksum_path(path)
    written = []
    try:
        for target, payload in ((path, data), (sidecar, digest.encode())):
            fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{target.name}.", suffix=".tmp")
            written.append(temporary)
            # mkstemp creates 0600 whatever the umask; a stored file gets the mode open() would give it.
            os.fchmod(fd, 0o666 & ~_umask())
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
        os.replace(written[0], path)
        os.replace(written[1], sidecar)
    except OSError as error:
        for temporary in written:
            Path(temporary).unlink(missing_ok=True)
        raise _os_error(error, f"cannot write {path}") from None
    except BaseException:
        for temporary in written:
            Path(temporary).unlink(missing_ok=True)
        raise
    return digest


def _umask() -> int:
    """The process umask, read from /proc (os.umask can only read it by changing it, which races other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _os_error(error: OSError, what: str) -> RaygeomError:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return RaygeomError(f"{what}: the disk is full (nothing partial was kept; free space and rerun to resume)")
    return RaygeomError(f"{what}: {error.strerror or error}")


IDENTITY = b"raygeom.identity"  # Parquet schema metadata: what a stored file is, checked against where it is


def with_identity(table: pa.Table, identity: dict) -> pa.Table:
    return table.replace_schema_metadata({**(table.schema.metadata or {}), IDENTITY: json.dumps(identity, sort_keys=True).encode()})


def identity_of(table: pa.Table) -> dict | None:
    raw = (table.schema.metadata or {}).get(IDENTITY)
    try:
        found = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError):
        return None
    return found if isinstance(found, dict) else None


def atomic_write_table(table: pa.Table, path: Path) -> str:
    """Write a Parquet file atomically with its checksum sidecar; return the content hash."""
    sink = pa.BufferOutputStream()
    # Dictionary encoding only slows down float vectors.
    pq.write_table(table, sink, use_dictionary=False, compression="zstd")
    return _write_replacing(memoryview(sink.getvalue()), Path(path))


def atomic_write_text(text: str, path: Path) -> str:
    return _write_replacing(text.encode(), Path(path))


def recorded_digest(path: Path) -> str | None:
    try:
        return checksum_path(Path(path)).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def read_verified(path: Path, expected: str | None = None) -> bytes:
    """The bytes of ``path``, checked against ``expected`` (e.g. from a completion marker) or else
    against its sidecar. A file without a recorded hash cannot be trusted and is refused too."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise RaygeomError(f"cannot read {path}: {error.strerror or error}") from None
    expected = expected or recorded_digest(path)
    if expected is None:
        raise CorruptFile(f"{path} has no recorded checksum (written by an older raygeom or damaged); delete it and rerun")
    if file_digest(data) != expected:
        raise CorruptFile(f"{path} does not match the checksum recorded when it was written (corrupt, or changed by another run)")
    return data


def verified(path: Path, expected: str | None = None) -> bool:
    """True when ``path`` exists and its bytes match its recorded checksum."""
    try:
        read_verified(path, expected)
        return True
    except RaygeomError:
        return False


def read_table(path: Path, expected: str | None = None) -> pa.Table:
    return _decode(read_verified(path, expected), path)


def _decode(data: bytes, path: Path, columns: list[str] | None = None) -> pa.Table:
    try:
        return pq.read_table(pa.BufferReader(data), columns=columns)
    except (OSError, pa.ArrowInvalid, KeyError) as error:
        raise CorruptFile(f"corrupt or unreadable Parquet file {path}: {error}") from None


def _row_keys_problem(table: pa.Table, key: str, path: Path) -> str | None:
    if "unit_key" not in table.column_names:
        return None
    found = set(table["unit_key"].to_pylist())
    if found - {key}:
        return f"{path} holds rows of unit {min(map(str, found - {key}))}, not {key} (copied or moved over it)"
    return None


def check_writable(root: Path) -> None:
    """Fail early, with one line, when the output directory cannot be written or another run writes it.

    The calling process becomes the store's one writer until it exits (see :func:`lock_store`)."""
    root = Path(root)
    missing = [d for d in (root.absolute(), *root.absolute().parents) if not d.exists()]
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=root, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise RaygeomError(f"output directory {root} is not writable: {error.strerror or error}") from None
    lock_store(root)
    if missing:
        _made_stores.append(missing)


_made_stores: list[list[Path]] = []  # the directories check_writable made, the store root first


def discard_unused_stores() -> None:
    """For a run refused after check_writable: remove the store directories it made that hold only their lock, so a
    refused run leaves nothing behind. A directory holding anything else, or made by another process, is kept."""
    while _made_stores:
        made = _made_stores.pop()
        root = made[0]
        try:
            if [p.name for p in root.iterdir()] != [LOCK_FILE]:
                continue
            (root / LOCK_FILE).unlink()  # still holding the lock, so no other run is writing here
            unlock_store(root)
            for directory in made:
                directory.rmdir()
        except OSError:
            continue


LOCK_FILE = ".lock"
_held_locks: dict[str, int] = {}


def lock_store(root: Path) -> None:
    """Make this process the one writer of the store at ``root``, until it exits or calls :func:`unlock_store`.

    An advisory ``flock`` on ``<root>/.lock``: the kernel drops it when the process dies, however it
    dies, so a killed run never leaves a stale lock. Reentrant within one process (its Ray workers
    write on its behalf and take no lock)."""
    root = Path(root)
    name = str(root.resolve())
    if name in _held_locks:
        return
    path = root / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise RaygeomError(f"cannot create the store lock {path}: {error.strerror or error}") from None
    try:
        command = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        command = ""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = ""
        for _ in range(10):  # the holder writes its pid just after it takes the lock
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            if holder:
                break
            time.sleep(0.1)
        os.close(fd)
        raise RaygeomError(f"store {root} is in use by another raygeom run ({holder or 'another process'}); wait for it "
                           f"to finish or choose another --out") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}: {' '.join(command.split())[:300]}".encode(), 0)
    _held_locks[name] = fd


def unlock_store(root: Path) -> None:
    fd = _held_locks.pop(str(Path(root).resolve()), None)
    if fd is not None:
        os.close(fd)


class Store:
    """The one place that writes and verifies stored files (see the module docstring for the layout).

    Every write records the file's content hash (a sidecar; for an extraction also its completion
    marker), every read checks it: a damaged or replaced file reads as 'not done' (``is_complete``,
    ``has_result``) or, where it cannot be recomputed, raises one-line :class:`CorruptFile`.
    Model names and revisions are percent-encoded into one path segment each."""

    def __init__(self, root: str | Path):
        # Absolute: the root is handed to Ray workers and actors, whose working directory is not the driver's (on a
        # cluster, or a Ray started elsewhere), so a relative --out would be read and written somewhere else.
        self.root = Path(root).expanduser().absolute()
        self._digests: dict[Path, str] = {}  # files this instance wrote: the marker records these hashes

    def _partition(self, kind: str, model: str, revision: str) -> Path:
        return self.root / kind / f"model={encode_segment(model)}" / f"revision={encode_segment(revision)}"

    def _write(self, table: pa.Table, path: Path) -> None:
        self._digests[path] = atomic_write_table(table, path)

    # activations
    def layer_path(self, model: str, revision: str, layer: str) -> Path:
        return self._partition("activations", model, revision) / f"layer={encode_segment(layer)}" / "part-0.parquet"

    def write_layer(self, model: str, revision: str, layer: str, layer_index: int, sample_ids: np.ndarray, vectors: np.ndarray) -> None:
        table = pa.table(
            {
                "sample_id": pa.array(np.asarray(sample_ids, dtype=np.int32)),
                "layer_index": pa.array(np.full(len(sample_ids), layer_index, dtype=np.int16)),
                "vector": vector_column(vectors.astype(np.float32)),
            }
        )
        identity = {"kind": "layer", "model": model, "revision": revision, "layer": layer, "layer_index": int(layer_index)}
        self._write(with_identity(table, identity), self.layer_path(model, revision, layer))

    def _expected(self, model: str, revision: str, path: Path, key: str | None) -> tuple[str | None, dict | None]:
        """The hash the completion marker recorded for ``path``, and the marker; with ``key``, the marker must be
        that extraction's, so an analysis never reads activations made for other settings."""
        marker = self.completion(model, revision)
        if key is not None and (marker is None or marker.get("key") != key):
            found = "none" if marker is None else f"settings key {marker.get('key')}"
            raise RaygeomError(f"the stored extraction of {model}@{revision} in {self.root} is not the one this run "
                               f"made (expected settings key {key}, found {found}); another run may be writing this store")
        if marker is None:
            return None, None
        return marker.get("files", {}).get(self._relative(path)), marker

    def _relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    @staticmethod
    def layer_problem(table: pa.Table, model: str, revision: str, layer: str, path: Path, marker: dict | None) -> str | None:
        """Why a layer file's content is not the layer its path names (e.g. another layer's file copied over it)."""
        identity = identity_of(table) or {}
        stated = {name: identity.get(name) for name in ("kind", "model", "revision", "layer")}
        if stated != {"kind": "layer", "model": model, "revision": revision, "layer": layer}:
            what = f"{stated['model']}@{stated['revision']} layer {stated['layer']}" if identity else "no stated layer"
            return f"{path} holds {what}, not {model}@{revision} layer {layer} (copied or moved over it)"
        indices = set(table["layer_index"].to_pylist()) if "layer_index" in table.column_names else set()
        names = (marker or {}).get("all_layers")
        expected = names.index(layer) if isinstance(names, list) and layer in names else identity.get("layer_index")
        if indices != {expected}:
            return f"{path} holds layer_index {sorted(indices)}, but layer {layer} is index {expected}"
        return None

    def read_layer(self, model: str, revision: str, layer: str, key: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        path = self.layer_path(model, revision, layer)
        if not path.is_file():
            raise RaygeomError(f"no activations for {model}@{revision} layer {layer} in {self.root}")
        digest, marker = self._expected(model, revision, path, key)
        table = read_table(path, digest)
        problem = self.layer_problem(table, model, revision, layer, path, marker)
        if problem:
            raise CorruptFile(problem)
        order = np.argsort(table["sample_id"].to_numpy())
        return table["sample_id"].to_numpy()[order], column_to_matrix(table["vector"])[order]

    def marker_path(self, model: str, revision: str) -> Path:
        return self._partition("activations", model, revision) / COMPLETE_MARKER

    def _marker(self, model: str, revision: str) -> tuple[dict | None, str | None]:
        """The completion marker (None when absent or damaged) and, when it is there but unusable, why."""
        path = self.marker_path(model, revision)
        if not path.is_file():
            return None, None
        try:
            info = json.loads(read_verified(path))
        except RaygeomError as error:
            return None, str(error)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None, f"{path} is not a readable completion marker"
        if not isinstance(info, dict):
            return None, f"{path} is not a readable completion marker"
        location = info.get("location")
        if location != {"model": model, "revision": revision}:
            where = f"{location.get('model')}@{location.get('revision')}" if isinstance(location, dict) else "no stated place"
            return None, f"{path} is the completion marker of {where}, not of {model}@{revision} (copied or moved here)"
        return info, None

    def completion(self, model: str, revision: str) -> dict | None:
        """The completion marker, or None when there is none, it does not match its checksum, or it was written
        for another model or revision."""
        return self._marker(model, revision)[0]

    def extraction_problem(self, model: str, revision: str, key: str | None = None) -> str | None:
        """Why the stored extraction of (model, revision) cannot be used; None when it is complete (for ``key``,
        when given), absent, or made with other settings (that is not damage, only another job's)."""
        marker, problem = self._marker(model, revision)
        if problem or marker is None or (key is not None and marker.get("key") != key):
            return problem
        where = self.marker_path(model, revision)
        files = marker.get("files")
        if not isinstance(files, dict):
            return f"{where} lists no files"
        for layer in marker.get("layers", []):
            if self._relative(self.layer_path(model, revision, layer)) not in files:
                return f"{where} does not list layer {layer}"
        for name, digest in files.items():
            path = self.root / name
            if not path.is_file():
                return f"{path} is missing"
            try:
                data = read_verified(path, digest)
            except RaygeomError as error:
                return str(error)
            if path.parent.name.startswith("layer="):
                layer = decode_segment(path.parent.name.split("=", 1)[1])
                try:
                    table = _decode(data, path, ["layer_index"])
                except CorruptFile as error:
                    return str(error)
                problem = self.layer_problem(table, model, revision, layer, path, marker)
                if problem:
                    return problem
        return None

    def is_complete(self, model: str, revision: str, key: str) -> bool:
        """Complete means: the marker is this place's and matches ``key``, and every file it lists has the bytes
        it recorded and is the file its path names."""
        marker = self.completion(model, revision)
        return bool(marker) and marker.get("key") == key and self.extraction_problem(model, revision, key) is None

    def mark_complete(self, model: str, revision: str, info: dict) -> None:
        """Write the marker last; it records the content hash of every layer, readout and samples file, and
        the place it is written for (a marker copied elsewhere is not that place's)."""
        paths = [self.layer_path(model, revision, layer) for layer in info.get("layers", [])]
        paths += [p for p in (self.readout_path(model, revision), self.samples_path(model, revision)) if p.is_file()]
        files = {}
        for path in paths:
            digest = self._digests.get(path) or recorded_digest(path)
            if digest is None:
                raise CorruptFile(f"cannot mark {model}@{revision} complete: {path} has no recorded checksum")
            files[self._relative(path)] = digest
        record = {**info, "files": files, "location": {"model": model, "revision": revision}}
        atomic_write_text(json.dumps(record, indent=2, sort_keys=True), self.marker_path(model, revision))

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
                found.append((decode_segment(revision_dir.parent.name.split("=", 1)[1]),
                              decode_segment(revision_dir.name.split("=", 1)[1])))
        return found

    def invalidate(self, model: str, revision: str) -> None:
        """Before this revision is extracted again: it stops counting as complete, its old layer files go
        (a store reused with other settings must never hold layers of two settings side by side, where a
        glob over activations/ would mix them), and so do the hidden temporaries of a killed write."""
        import shutil

        marker = self.marker_path(model, revision)
        marker.unlink(missing_ok=True)
        checksum_path(marker).unlink(missing_ok=True)
        for layer_dir in self._partition("activations", model, revision).glob("layer=*"):
            shutil.rmtree(layer_dir, ignore_errors=True)
        for kind in ("activations", "readout", "samples"):
            for leftover in self._partition(kind, model, revision).rglob(".*.tmp"):
                leftover.unlink(missing_ok=True)

    # readout basis
    def readout_path(self, model: str, revision: str) -> Path:
        return self._partition("readout", model, revision) / "part-0.parquet"

    def write_readout(self, model: str, revision: str, basis: np.ndarray, singular_values: np.ndarray) -> None:
        table = pa.table(
            {
                "component": pa.array(np.arange(basis.shape[1], dtype=np.int32)),
                "singular_value": pa.array(singular_values.astype(np.float64)),
                "vector": vector_column(basis.T.astype(np.float64)),
            }
        )
        self._write(table, self.readout_path(model, revision))

    def read_readout(self, model: str, revision: str, key: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        path = self.readout_path(model, revision)
        table = read_table(path, self._expected(model, revision, path, key)[0])
        return column_to_matrix(table["vector"]).T.copy(), table["singular_value"].to_numpy()

    # per-sample data
    def samples_path(self, model: str, revision: str) -> Path:
        return self._partition("samples", model, revision) / "part-0.parquet"

    def write_samples(self, model: str, revision: str, columns: dict[str, np.ndarray | list]) -> None:
        self._write(pa.table(columns), self.samples_path(model, revision))

    def read_samples(self, model: str, revision: str, key: str | None = None) -> pa.Table:
        path = self.samples_path(model, revision)
        return read_table(path, self._expected(model, revision, path, key)[0])

    # unit results
    def result_path(self, metric: str, key: str) -> Path:
        return self.root / "results" / encode_segment(metric) / f"{encode_segment(key)}.parquet"

    def has_result(self, metric: str, key: str) -> bool:
        """Done means: the unit's file is there, matches the checksum recorded when it was written, and holds
        this unit's rows (its stated analysis and key, and every row's ``unit_key``, are the ones asked for)."""
        return self.result_path(metric, key).is_file() and self.result_problem(metric, key) is None

    def result_problem(self, metric: str, key: str) -> str | None:
        """Why the stored unit (metric, key) is damaged, or None when it is intact or absent."""
        path = self.result_path(metric, key)
        if not path.is_file():
            return None
        try:
            self._read_result(path, metric, key)
        except RaygeomError as error:
            return str(error)
        return None

    def read_unit_file(self, path: Path, strict: bool = True) -> pa.Table:
        """The rows of ``results/<metric>/<key>.parquet``, checked against the metric and key its path names. With
        ``strict=False`` (showing a store, not resuming from it) a file that states no unit, as an older raygeom wrote
        them, is read when its rows' ``unit_key`` (if any) agree with its name."""
        path = Path(path)
        return self._read_result(path, decode_segment(path.parent.name), decode_segment(path.name[: -len(".parquet")]), strict)

    def _read_result(self, path: Path, metric: str, key: str, strict: bool = True) -> pa.Table:
        table = read_table(path)
        identity = identity_of(table) or {}
        if (strict or identity) and (identity.get("kind"), identity.get("analysis"), identity.get("unit_key")) != ("result", metric, key):
            what = f"{identity.get('analysis')} unit {identity.get('unit_key')}" if identity else "no stated unit"
            raise CorruptFile(f"{path} holds {what}, not {metric} unit {key} (copied or moved over it)")
        problem = _row_keys_problem(table, key, path)
        if problem:
            raise CorruptFile(problem)
        return table.replace_schema_metadata(None)

    def write_result(self, metric: str, key: str, rows: list[dict] | dict) -> None:
        """The file states its analysis and key (and the engine's rows carry ``unit_key``), so a file that is not
        where it belongs (copied over another unit's name) is found on read."""
        rows = [rows] if isinstance(rows, dict) else rows
        if any(row.get("unit_key", key) != key for row in rows):
            raise RaygeomError(f"rows of {metric} unit {key} carry another unit_key")
        table = pa.Table.from_pylist(rows)
        self._write(with_identity(table, {"kind": "result", "analysis": metric, "unit_key": key}), self.result_path(metric, key))

    def read_results(self, metric: str, keys: Iterable[str] | None = None) -> pa.Table:
        """The rows of the named units (a damaged one raises :class:`CorruptFile`), or with ``keys=None`` of
        every intact unit: a damaged unit, or one whose rows are not the unit its name says, is not done, so it
        is left out until it is recomputed."""
        directory = self.root / "results" / encode_segment(metric)
        if keys is None:
            tables = []
            for path in sorted(directory.glob("*.parquet")):
                try:
                    tables.append(self.read_unit_file(path))
                except RaygeomError:
                    continue
        else:
            tables = [self._read_result(p, metric, k) for k, p in ((k, self.result_path(metric, k)) for k in keys) if p.is_file()]
        return pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
