"""The Arrow/Parquet store shared by every stage. Layout (all Hive-partitioned)::

    <root>/activations/model=<slug>/revision=<rev>/extraction=<key>/layer=<name>/part-0.parquet
        sample_id int32, layer_index int16, vector fixed_size_list<float32>[d]
    <root>/activations/model=<slug>/revision=<rev>/extraction=<key>/_COMPLETE.json
        written last: extraction settings key, layer names, weight fingerprint
    <root>/activations/model=<slug>/revision=<rev>/extraction=<key>/_UNITS.json
        the units handed to the engine on this extraction (what ``raygeom gc`` checks)
    <root>/samples/model=<slug>/revision=<rev>/extraction=<key>/part-0.parquet
        sample_id int32, nll float64, n_tokens int32, label string, text_sha1 string
    <root>/readout/model=<slug>/revision=<rev>/part-0.parquet
        component int32, singular_value float64, vector fixed_size_list<float64>[d]
        (W_U's, so one per (model, revision), shared by its extractions)
    <root>/results/<metric>/<unit key>.parquet
        one row per finished unit (model, revision, layer, parameters)

An extraction is one forward pass of one (model, revision) over one sampled corpus with one set of settings;
``<key>`` is its settings key (:func:`raygeom.replica.request.extraction_key`: corpus and its fingerprint, n,
seq_len, pool, skip_first, max_words, alignment, layers), so extractions with other settings live side by side
and each is found by its key. Where: ``extraction=<key>/``; else the place of this revision whose marker has
that key. So a store written before extractions were keyed, whose one extraction per (model, revision) has its
layers and marker in ``revision=<rev>/`` itself and its samples in ``samples/.../revision=<rev>/part-0.parquet``,
is read as it is (and extracting it again with its own settings writes ``extraction=<key>/``); and
``raygeom.write_activations`` writes in ``extraction=write_activations/`` under a key that changes with its bytes.
Reading without a key means the revision's one extraction (an error when it holds several).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raygeom.errors import RaygeomError
from raygeom.names import check_path, check_segment

COMPLETE_MARKER = "_COMPLETE.json"
UNITS_RECORD = "_UNITS.json"
EXTRACTION = "extraction"  # the partition level of one extraction: extraction=<settings key>


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
    # every segment is stored behind a key= prefix (revision= is the longest)
    return check_segment("%2E" * (len(encoded) - len(stripped)) + stripped, "name", "revision=")


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
    return table.replace_schema_metadata(
        {**(table.schema.metadata or {}), IDENTITY: json.dumps(identity, sort_keys=True).encode()}
    )


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
        if columns is None:  # pq.read_table goes through pyarrow.dataset, which imports pandas (0.5 s a command)
            return pq.ParquetFile(pa.BufferReader(data)).read()
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
    root = Path(check_path(root, "output directory"))
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
        raise RaygeomError(
            f"store {root} is in use by another raygeom run ({holder or 'another process'}); wait for it "
            f"to finish or choose another --out"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}: {' '.join(command.split())[:300]}".encode(), 0)
    _held_locks[name] = fd


def unlock_store(root: Path) -> None:
    fd = _held_locks.pop(str(Path(root).resolve()), None)
    if fd is not None:
        os.close(fd)


@dataclass(frozen=True)
class StoredExtraction:
    """One extraction directory of a store, as :meth:`Store.extractions` finds it."""

    model: str
    revision: str
    place: str | None  # its directory's name, extraction=<key>; None: an older store's revision directory
    directory: Path
    marker: dict | None  # None: no marker (interrupted or still running), or a damaged one (then ``problem``)
    problem: str | None

    @property
    def key(self) -> str | None:
        return (self.marker or {}).get("key") or _place_key(self.place)


def _place_key(place: str | None) -> str | None:
    return None if place is None else decode_segment(place.split("=", 1)[1])


class Store:
    """The one place that writes and verifies stored files (see the module docstring for the layout).

    Every write records the file's content hash (a sidecar; for an extraction also its completion
    marker), every read checks it: a damaged or replaced file reads as 'not done' (``is_complete``,
    ``has_result``) or, where it cannot be recomputed, raises one-line :class:`CorruptFile`.
    Model names and revisions are percent-encoded into one path segment each.

    ``key`` names an extraction by its settings key (the module docstring says where it is looked for); writes put
    it in ``extraction=<key>/``. Reads without ``key`` mean the revision's one extraction."""

    def __init__(self, root: str | Path):
        # Absolute: the root is handed to Ray workers and actors, whose working directory is not the driver's (on a
        # cluster, or a Ray started elsewhere), so a relative --out would be read and written somewhere else.
        self.root = Path(root).expanduser().absolute()
        self._digests: dict[Path, str] = {}  # files this instance wrote: the marker records these hashes

    def _partition(self, kind: str, model: str, revision: str) -> Path:
        return self.root / kind / f"model={encode_segment(model)}" / f"revision={encode_segment(revision)}"

    def _write(self, table: pa.Table, path: Path) -> None:
        self._digests[path] = atomic_write_table(table, path)

    # where an extraction is
    def _directory(self, kind: str, model: str, revision: str, place: str | None) -> Path:
        base = self._partition(kind, model, revision)
        return base if place is None else base / place

    def _places(self, model: str, revision: str) -> list[str | None]:
        """The places of this revision that hold a completion marker: extraction=<key> directories, then None for an
        older store's marker in the revision directory itself."""
        base = self._partition("activations", model, revision)
        places: list[str | None] = [path.parent.name for path in sorted(base.glob(f"{EXTRACTION}=*/{COMPLETE_MARKER}"))]
        return places + ([None] if (base / COMPLETE_MARKER).is_file() else [])

    def _place(self, model: str, revision: str, key: str | None) -> str | None:
        """Where the extraction with settings key ``key`` is: ``extraction=<key>`` unless only another place's marker
        has that key (an older store's, or write_activations's); without ``key``, the revision's one extraction."""
        places = self._places(model, revision)
        if key is None:
            if len(places) > 1:
                keys = ", ".join(str((self._marker_at(model, revision, place)[0] or {}).get("key", "?")) for place in places)
                raise RaygeomError(
                    f"{model}@{revision} in {self.root} holds {len(places)} extractions (settings keys {keys}); "
                    "say which one to read by its key"
                )
            if places:
                return places[0]
            partial = sorted(p.name for p in self._partition("activations", model, revision).glob(f"{EXTRACTION}=*"))
            return partial[0] if len(partial) == 1 else None
        named = f"{EXTRACTION}={encode_segment(key)}"
        if named not in places:
            for place in places:
                marker = self._marker_at(model, revision, place)[0]
                if marker is not None and marker.get("key") == key:
                    return place
        return named

    def extraction_dir(self, model: str, revision: str, key: str | None = None) -> Path:
        return self._directory("activations", model, revision, self._place(model, revision, key))

    def extractions(self, model: str | None = None, revision: str | None = None) -> list[StoredExtraction]:
        """Every extraction directory of the store (of one model, or one revision): with a marker, with a damaged one,
        or with layer files and no marker (interrupted, or still being written)."""
        found = []
        models = f"model={encode_segment(model)}" if model is not None else "model=*"
        revisions = f"revision={encode_segment(revision)}" if revision is not None else "revision=*"
        for base in sorted((self.root / "activations").glob(f"{models}/{revisions}")):
            slug, rev = decode_segment(base.parent.name.split("=", 1)[1]), decode_segment(base.name.split("=", 1)[1])
            places: list[str | None] = [p.name for p in sorted(base.glob(f"{EXTRACTION}=*")) if p.is_dir()]
            if (base / COMPLETE_MARKER).is_file() or any(base.glob("layer=*")):
                places.append(None)
            for place in places:
                marker, problem = self._marker_at(slug, rev, place)
                found.append(
                    StoredExtraction(slug, rev, place, self._directory("activations", slug, rev, place), marker, problem)
                )
        return found

    # activations
    def _layer_file(self, model: str, revision: str, place: str | None, layer: str) -> Path:
        return self._directory("activations", model, revision, place) / f"layer={encode_segment(layer)}" / "part-0.parquet"

    def layer_path(self, model: str, revision: str, layer: str, key: str | None = None) -> Path:
        return self._layer_file(model, revision, self._place(model, revision, key), layer)

    def write_layer(
        self, model: str, revision: str, layer: str, layer_index: int, sample_ids: np.ndarray, vectors: np.ndarray, *, key: str
    ) -> None:
        table = pa.table(
            {
                "sample_id": pa.array(np.asarray(sample_ids, dtype=np.int32)),
                "layer_index": pa.array(np.full(len(sample_ids), layer_index, dtype=np.int16)),
                "vector": vector_column(vectors.astype(np.float32)),
            }
        )
        place = self._place(model, revision, key)
        identity = {
            "kind": "layer",
            "model": model,
            "revision": revision,
            "layer": layer,
            "layer_index": int(layer_index),
            **({EXTRACTION: _place_key(place)} if place else {}),
        }
        self._write(with_identity(table, identity), self._layer_file(model, revision, place, layer))

    def _expected(
        self, model: str, revision: str, place: str | None, path: Path, key: str | None
    ) -> tuple[str | None, dict | None]:
        """The hash the completion marker recorded for ``path``, and the marker; with ``key``, the marker must be
        that extraction's, so an analysis never reads activations made for other settings."""
        marker = self._marker_at(model, revision, place)[0]
        if key is not None and (marker is None or marker.get("key") != key):
            found = "none" if marker is None else f"settings key {marker.get('key')}"
            raise RaygeomError(
                f"the stored extraction of {model}@{revision} in {self.root} is not the one this run "
                f"made (expected settings key {key}, found {found}); another run may be writing this store"
            )
        if marker is None:
            return None, None
        return marker.get("files", {}).get(self._relative(path)), marker

    def _relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    @staticmethod
    def layer_problem(
        table: pa.Table, model: str, revision: str, layer: str, path: Path, marker: dict | None, extraction: str | None = None
    ) -> str | None:
        """Why a layer file's content is not the layer its path names (e.g. another layer's file copied over it).
        ``extraction``: the key of the extraction directory it is in (None: an older store's revision directory)."""
        identity = identity_of(table) or {}
        stated = {name: identity.get(name) for name in ("kind", "model", "revision", "layer")}
        if stated != {"kind": "layer", "model": model, "revision": revision, "layer": layer}:
            what = f"{stated['model']}@{stated['revision']} layer {stated['layer']}" if identity else "no stated layer"
            return f"{path} holds {what}, not {model}@{revision} layer {layer} (copied or moved over it)"
        if identity.get(EXTRACTION) != extraction:
            return (
                f"{path} holds layer {layer} of extraction {identity.get(EXTRACTION) or '(none stated)'}, not of "
                f"extraction {extraction or '(none stated)'} (copied or moved over it)"
            )
        indices = set(table["layer_index"].to_pylist()) if "layer_index" in table.column_names else set()
        names = (marker or {}).get("all_layers")
        expected = names.index(layer) if isinstance(names, list) and layer in names else identity.get("layer_index")
        if indices != {expected}:
            return f"{path} holds layer_index {sorted(indices)}, but layer {layer} is index {expected}"
        return None

    def read_layer(self, model: str, revision: str, layer: str, key: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        place = self._place(model, revision, key)
        path = self._layer_file(model, revision, place, layer)
        if not path.is_file():
            raise RaygeomError(f"no activations for {model}@{revision} layer {layer} in {self.root}")
        digest, marker = self._expected(model, revision, place, path, key)
        table = read_table(path, digest)
        problem = self.layer_problem(table, model, revision, layer, path, marker, _place_key(place))
        if problem:
            raise CorruptFile(problem)
        order = np.argsort(table["sample_id"].to_numpy())
        return table["sample_id"].to_numpy()[order], column_to_matrix(table["vector"])[order]

    def _marker_at(self, model: str, revision: str, place: str | None) -> tuple[dict | None, str | None]:
        """The completion marker of one place (None when absent or damaged) and, when it is there but unusable, why."""
        path = self._directory("activations", model, revision, place) / COMPLETE_MARKER
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
        here = {"model": model, "revision": revision, **({EXTRACTION: _place_key(place)} if place else {})}
        if location != here:
            if not isinstance(location, dict):
                where = "no stated place"
            elif (location.get("model"), location.get("revision")) != (model, revision):
                where = f"{location.get('model')}@{location.get('revision')}"
            else:
                where = f"extraction {location.get(EXTRACTION) or '(none stated)'}"
                return None, (
                    f"{path} is the completion marker of {where}, not of extraction "
                    f"{_place_key(place) or '(none stated)'} of {model}@{revision} (copied or moved here)"
                )
            return None, f"{path} is the completion marker of {where}, not of {model}@{revision} (copied or moved here)"
        return info, None

    def _marker(self, model: str, revision: str, key: str | None = None) -> tuple[dict | None, str | None]:
        return self._marker_at(model, revision, self._place(model, revision, key))

    def completion(self, model: str, revision: str, key: str | None = None) -> dict | None:
        """The completion marker of the extraction ``key`` (without it, of the revision's one extraction), or None when
        there is none, it does not match its checksum, or it was written for another place."""
        return self._marker(model, revision, key)[0]

    def _state(self, model: str, revision: str, key: str | None) -> tuple[dict | None, str | None, bool]:
        """(marker, why it cannot be used, whether its layer files were freed): see :meth:`extraction_problem`."""
        place = self._place(model, revision, key)
        marker, problem = self._marker_at(model, revision, place)
        if problem or marker is None or (key is not None and marker.get("key") != key):
            return marker, problem, False
        where = self._directory("activations", model, revision, place) / COMPLETE_MARKER
        files = marker.get("files")
        if not isinstance(files, dict):
            return marker, f"{where} lists no files", False
        layer_files = {self._relative(self._layer_file(model, revision, place, layer)) for layer in marker.get("layers", [])}
        for layer in marker.get("layers", []):
            if self._relative(self._layer_file(model, revision, place, layer)) not in files:
                return marker, f"{where} does not list layer {layer}", False
        freed = bool(layer_files) and not any((self.root / name).is_file() for name in layer_files)
        for name, digest in files.items():
            path = self.root / name
            if freed and name in layer_files:
                continue
            if not path.is_file():
                return marker, f"{path} is missing", False
            try:
                data = read_verified(path, digest)
            except RaygeomError as error:
                return marker, str(error), False
            if path.parent.name.startswith("layer="):
                layer = decode_segment(path.parent.name.split("=", 1)[1])
                try:
                    table = _decode(data, path, ["layer_index"])
                except CorruptFile as error:
                    return marker, str(error), False
                problem = self.layer_problem(table, model, revision, layer, path, marker, _place_key(place))
                if problem:
                    return marker, problem, False
        return marker, None, freed

    def extraction_problem(self, model: str, revision: str, key: str | None = None) -> str | None:
        """Why the stored extraction ``key`` of (model, revision) cannot be used; None when it is complete, absent,
        made with other settings, or its layer files were freed (``raygeom gc``, ``keep_activations = false``): that
        is not damage, it is only to be extracted again when a unit needs it."""
        return self._state(model, revision, key)[1]

    def is_complete(self, model: str, revision: str, key: str) -> bool:
        """Complete means: the marker is this place's and matches ``key``, and every file it lists is there, has the
        bytes it recorded and is the file its path names."""
        marker, problem, freed = self._state(model, revision, key)
        return bool(marker) and marker.get("key") == key and problem is None and not freed

    def is_freed(self, model: str, revision: str, key: str) -> bool:
        """The extraction is intact but for its layer files, which were deleted on purpose (``drop_activations``)."""
        marker, problem, freed = self._state(model, revision, key)
        return bool(marker) and marker.get("key") == key and problem is None and freed

    def mark_complete(self, model: str, revision: str, info: dict, key: str | None = None) -> None:
        """Write the marker last; it records the content hash of every layer, readout and samples file, and
        the place it is written for (a marker copied elsewhere is not that place's). ``key``: the extraction the files
        were written to (default ``info["key"]``; write_activations writes under a name of its own)."""
        place = self._place(model, revision, key or info["key"])
        paths = [self._layer_file(model, revision, place, layer) for layer in info.get("layers", [])]
        paths += [p for p in (self.readout_path(model, revision), self._samples_file(model, revision, place)) if p.is_file()]
        files = {}
        for path in paths:
            digest = self._digests.get(path) or recorded_digest(path)
            if digest is None:
                raise CorruptFile(f"cannot mark {model}@{revision} complete: {path} has no recorded checksum")
            files[self._relative(path)] = digest
        location = {"model": model, "revision": revision, **({EXTRACTION: _place_key(place)} if place else {})}
        record = {**info, "files": files, "location": location}
        atomic_write_text(
            json.dumps(record, indent=2, sort_keys=True), self._directory("activations", model, revision, place) / COMPLETE_MARKER
        )

    def drop_activations(self, model: str, revision: str, key: str | None = None) -> None:
        """Delete the layer files of one extraction once its units are done; its marker, readout and samples stay, so
        those units are read back, and a unit that needs the layers again extracts them again."""
        import shutil

        for layer_dir in self.extraction_dir(model, revision, key).glob("layer=*"):
            shutil.rmtree(layer_dir, ignore_errors=True)

    def partial_extractions(self) -> list[tuple[str, str]]:
        """(model slug, revision) of every revision with an extraction that has layer files but no completion marker:
        interrupted or still running."""
        found = []
        for extraction in self.extractions():
            pair = (extraction.model, extraction.revision)
            if (
                extraction.marker is None
                and extraction.problem is None
                and pair not in found
                and any(extraction.directory.glob("layer=*"))
            ):
                found.append(pair)
        return found

    def invalidate(self, model: str, revision: str, key: str) -> None:
        """Before the extraction ``key`` is made again: it stops counting as complete, and its old layer files (and an
        older store's samples of it) go, with the hidden temporaries of a killed write. Other extractions of the
        revision stay as they are."""
        import shutil

        for place in dict.fromkeys((self._place(model, revision, key), f"{EXTRACTION}={encode_segment(key)}")):
            directory = self._directory("activations", model, revision, place)
            marker = directory / COMPLETE_MARKER
            marker.unlink(missing_ok=True)
            checksum_path(marker).unlink(missing_ok=True)
            for layer_dir in directory.glob("layer=*"):
                shutil.rmtree(layer_dir, ignore_errors=True)
            if place is None:  # an older store's extraction of these settings: made again in extraction=<key>/
                samples = self._samples_file(model, revision, None)
                samples.unlink(missing_ok=True)
                checksum_path(samples).unlink(missing_ok=True)
                record = directory / UNITS_RECORD
                named = self._directory("activations", model, revision, f"{EXTRACTION}={encode_segment(key)}")
                if record.is_file() and checksum_path(record).is_file() and not (named / UNITS_RECORD).is_file():
                    # the units planned on it go with it (raygeom gc)
                    named.mkdir(parents=True, exist_ok=True)
                    os.replace(checksum_path(record), checksum_path(named / UNITS_RECORD))
                    os.replace(record, named / UNITS_RECORD)
            for target in (directory, self._directory("samples", model, revision, place)):
                for leftover in target.glob(".*.tmp"):
                    leftover.unlink(missing_ok=True)
        for leftover in self._partition("readout", model, revision).glob(".*.tmp"):
            leftover.unlink(missing_ok=True)

    # the units planned on an extraction (raygeom gc)
    def _units_file(self, model: str, revision: str, key: str) -> Path:
        return self.extraction_dir(model, revision, key) / UNITS_RECORD

    def planned_units(self, model: str, revision: str, key: str) -> dict[str, list[str]] | None:
        """analysis -> unit keys of every unit handed to the engine on the extraction ``key``; None when the store holds
        no record of them (an older raygeom's extraction, or one no unit was run on) or it cannot be trusted."""
        path = self._units_file(model, revision, key)
        if not path.is_file():
            return None
        try:
            record = json.loads(read_verified(path))
        except (RaygeomError, json.JSONDecodeError, UnicodeDecodeError):
            return None
        units = record.get("units") if isinstance(record, dict) else None
        if (
            record.get("lost")
            or not isinstance(units, dict)
            or not all(isinstance(keys, list) and all(isinstance(k, str) for k in keys) for keys in units.values())
        ):
            return None
        return units

    def record_planned(self, units: Iterable) -> None:
        """Record each unit (``analysis``, ``key``, ``extractions``: the (model, revision, extraction key) it reads) in
        the extractions it reads, before it runs: an extraction whose recorded units are not all stored is still
        needed (``raygeom gc``). Written by the driver, which holds the store's lock."""
        by_extraction: dict[tuple[str, str, str], dict[str, set[str]]] = {}
        for unit in units:
            if not getattr(unit, "store_rows", True):
                continue
            for extraction in getattr(unit, "extractions", ()):
                by_extraction.setdefault(tuple(extraction), {}).setdefault(unit.analysis, set()).add(unit.key)
        for (model, revision, key), planned in by_extraction.items():
            path = self._units_file(model, revision, key)
            known = self.planned_units(model, revision, key)
            lost = known is None and path.is_file()  # a damaged record: what it held is unknown, so gc keeps this one
            known = known or {}
            merged = {name: sorted({*known.get(name, []), *planned.get(name, ())}) for name in sorted({*known, *planned})}
            if merged == known and not lost:
                continue
            atomic_write_text(json.dumps({"units": merged, **({"lost": True} if lost else {})}, indent=1, sort_keys=True), path)

    # readout basis: W_U's, one per (model, revision), shared by its extractions
    def readout_path(self, model: str, revision: str) -> Path:
        return self._partition("readout", model, revision) / "part-0.parquet"

    def write_readout(
        self, model: str, revision: str, basis: np.ndarray, singular_values: np.ndarray, fingerprint: str | None = None
    ) -> None:
        """``fingerprint``: of the weights it was computed from, so a later extraction of the same weights reuses it."""
        table = pa.table(
            {
                "component": pa.array(np.arange(basis.shape[1], dtype=np.int32)),
                "singular_value": pa.array(singular_values.astype(np.float64)),
                "vector": vector_column(basis.T.astype(np.float64)),
            }
        )
        identity = {"kind": "readout", "model": model, "revision": revision, "fingerprint": fingerprint}
        self._write(with_identity(table, identity), self.readout_path(model, revision))

    def stored_readout(self, model: str, revision: str, fingerprint: str) -> int | None:
        """The number of components of the stored readout basis when it is intact and was computed from the weights
        with ``fingerprint`` (as the file states, or, for an older store's, as a marker of those weights that records
        its bytes says); None otherwise. An extraction reuses it rather than write it again: its other extractions'
        markers record its hash."""
        path = self.readout_path(model, revision)
        if not path.is_file():
            return None
        try:
            data = read_verified(path)
            table = _decode(data, path, ["component"])
        except RaygeomError:
            return None
        identity = identity_of(table)
        if identity is not None:
            same = (identity.get("kind"), identity.get("model"), identity.get("revision"), identity.get("fingerprint")) == (
                "readout",
                model,
                revision,
                fingerprint,
            )
        else:
            digest, name = file_digest(data), self._relative(path)
            same = any(
                e.marker.get("fingerprint") == fingerprint and (e.marker.get("files") or {}).get(name) == digest
                for e in self.extractions(model, revision)
                if e.marker
            )
        return table.num_rows if same else None

    def read_readout(self, model: str, revision: str, key: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """With ``key``, checked against the hash that extraction's marker recorded; without, against its sidecar."""
        path = self.readout_path(model, revision)
        digest = None if key is None else self._expected(model, revision, self._place(model, revision, key), path, key)[0]
        table = read_table(path, digest)
        return column_to_matrix(table["vector"]).T.copy(), table["singular_value"].to_numpy()

    # per-sample data, one table per extraction
    def _samples_file(self, model: str, revision: str, place: str | None) -> Path:
        return self._directory("samples", model, revision, place) / "part-0.parquet"

    def samples_path(self, model: str, revision: str, key: str | None = None) -> Path:
        return self._samples_file(model, revision, self._place(model, revision, key))

    def write_samples(self, model: str, revision: str, columns: dict[str, np.ndarray | list], *, key: str) -> None:
        self._write(pa.table(columns), self.samples_path(model, revision, key))

    def read_samples(self, model: str, revision: str, key: str | None = None) -> pa.Table:
        place = self._place(model, revision, key)
        path = self._samples_file(model, revision, place)
        return read_table(path, self._expected(model, revision, place, path, key)[0])

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
        if (strict or identity) and (identity.get("kind"), identity.get("analysis"), identity.get("unit_key")) != (
            "result",
            metric,
            key,
        ):
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


def write_rows(rows: list[dict], path: Path) -> Path:
    """Rows as one Parquet table, written atomically; every column any row has."""
    # Rows read back from older units may lack newer columns; take the union, not the first row's keys.
    columns = list(dict.fromkeys(name for row in rows for name in row))
    atomic_write_table(pa.Table.from_pylist([{name: row.get(name) for name in columns} for row in rows]), path)
    return path
