"""Bring your own activations: vectors captured elsewhere (TransformerLens or nnsight hooks, another framework, a
GPU run in bf16) written into a store as an extraction, so that every analysis of a store and ``raygeom report``
read them as they read raygeom's own extractions.

    import raygeom
    raygeom.write_activations("runs/mine", model="pythia-70m-tl", revision="step1000", layer="block_03",
                              vectors=H, texts=texts, labels=labels, readout=model.embed_out.weight, n_blocks=6)
    rows = raygeom.store_pga("runs/mine", "pythia-70m-tl", "step1000", k=100)

What is written is what an extraction writes (raygeom/store/tree.py): one Parquet file per layer, the readout basis
of ``W_U``, the per-sample table (text hashes, labels; NLL is NaN: raygeom never saw the model) and the completion
marker, last, with the content hash of every file, in ``extraction=write_activations/``. The marker says where the
vectors came from (``source``) and its settings key hashes the bytes of every file, so results computed on other
vectors are never read back as these.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raygeom.errors import InputError, RaygeomError
from raygeom.numerics.checks import shown
from raygeom.params import MAX_BLOCKS
from raygeom.sources import layers as layer_position

BYO_VERSION = 1
SOURCE = "write_activations"
PLACE = "write_activations"  # the extraction=<name> directory: one per (model, revision), its key changes with its bytes
READOUT_COMPONENTS = 256  # as an extraction stores (raygeom.replica.request.READOUT_COMPONENTS)


def _all_layers(layer_names: list[str], n_blocks: int | None, previous: list[str] | None) -> list[str]:
    """The model's depth-ordered layer list: the standard one with ``n_blocks``, else the names written so far."""
    from raygeom.sources.layers import layer_names as standard

    if n_blocks is not None:
        if not isinstance(n_blocks, int) or isinstance(n_blocks, bool) or n_blocks <= 0:
            raise InputError(f"n_blocks must be a positive integer, got {n_blocks!r}")
        names = standard(n_blocks)
    else:
        names = list(previous or [])
    for layer in layer_names:
        block, sub = layer_position.split(layer)
        if sub is not None and block not in names:
            raise InputError(
                f"layer {layer} is inside {block}, which this model does not have "
                f"({'give n_blocks' if n_blocks is None else f'{n_blocks} blocks'})"
            )
        if sub is None and layer not in names:
            if n_blocks is not None:
                raise InputError(
                    f"layer '{layer}' is not one of this model's layers (embed, block_00 .. "
                    f"{names[-2]}, final_norm, or a point inside a block such as {names[1]}.mlp_out)"
                )
            names.append(layer)
    return names


def write_activations(
    store,
    *,
    model: str,
    revision: str = "main",
    layer: str | None = None,
    vectors=None,
    texts: list[str] | None = None,
    labels: list[str] | None = None,
    readout=None,
    n_blocks: int | None = None,
    source: str | None = None,
    corpus: str | None = None,
    settings: dict | None = None,
    step: int | None = None,
) -> dict:
    """Write vectors you captured into the store at ``store`` as an extraction of ``model`` at ``revision``;
    returns its completion marker (a dict).

    Args:
        store: the store directory (a run's ``--out``); created if missing, locked while this process writes it.
        model, revision: the names the store and every table use for these vectors.
        layer, vectors: one layer's name and its N x d vectors, one row per text; or ``layer=None`` and ``vectors``
            a dict of name -> N x d. Names as in ``--layers``: ``embed``, ``block_05``, ``final_norm``,
            ``block_05.mlp_out`` (or any name, placed in the order written, when ``n_blocks`` is not given).
            numpy or torch, any float dtype and device (bf16, fp16, CUDA, ``requires_grad``); stored as float32.
        texts: the N texts (their SHA-1 is stored, as for an extraction); optional.
        labels: N labels (topics, domains) for the analyses that group by them; optional.
        readout: ``W_U`` (V x d), e.g. ``model.lm_head.weight``; its top right singular vectors are the readout basis
            PGA scores against. Needed on the first write of a (model, revision); later writes may omit it.
        n_blocks: the model's number of blocks, so standard names get their depth (``relative_depth``).
        source: where the vectors came from (stored in the marker; default: "write_activations").
        corpus, settings: free-form provenance: the corpus name and e.g. ``{"pool": "last", "seq_len": 128}``.
        step: the training step of these weights, kept in every row (``step`` column); without it, the step a
            revision named ``step<N>`` spells, else the one an earlier write gave, else none (no step is invented:
            "main" is a step only for Pythia, whose extractions raygeom makes itself).

    Calling it again for the same (model, revision) adds or replaces layers; every layer must have the same N, and
    ``texts`` (when given) must be the same texts. A (model, revision) that raygeom extracted itself in this store is
    refused, so the two are never mixed. Everything given is checked before anything is written, and a write that
    fails all the same leaves nothing behind (see :class:`_undone_on_failure`)."""

    if not isinstance(model, str) or not model or not isinstance(revision, str) or not revision:
        raise InputError("model and revision must be non-empty strings")
    _checked_arguments(store, model=model, revision=revision, layer=layer, source=source, corpus=corpus)
    if n_blocks is not None and (
        isinstance(n_blocks, bool) or not isinstance(n_blocks, (int, np.integer)) or not 1 <= n_blocks <= MAX_BLOCKS
    ):
        raise InputError(
            f"n_blocks must be an integer >= 1 and <= {MAX_BLOCKS:,} (the model's blocks) or None, got {shown(n_blocks)}"
        )
    if settings is not None:
        import json

        try:
            json.dumps(settings if isinstance(settings, dict) else None, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise InputError(f"settings must be a dict of JSON values (str, numbers, lists, dicts), got {error}") from None
        if not isinstance(settings, dict):
            raise InputError(f"settings must be a dict of JSON values or None, got {type(settings).__name__}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0):
        raise InputError(f"step must be a training step (an integer >= 0) or None, got {step!r}")
    arrays, n, d = _given_arrays(layer, vectors)
    texts = _checked_texts(texts, "texts", n)
    labels = _checked_texts(labels, "labels", n)

    root = Path(store)
    with _undone_on_failure(root, model, revision):
        return _write(root, model, revision, arrays, n, d, texts, labels, readout, n_blocks, source, corpus, settings, step)


def checked_path(value, name: str):
    """A path argument: str or os.PathLike, not empty."""
    import os

    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise InputError(f"{name} must be a path (a non-empty str or os.PathLike), got {shown(value)}")
    try:
        Path(value).exists()
    except (OSError, ValueError) as error:  # a name too long, a NUL byte
        raise InputError(f"{name} {str(value)!r:.60} is not a usable path: {getattr(error, 'strerror', None) or error}") from None
    return value


def _checked_arguments(store, **names) -> None:
    """The store a path; each of ``names`` (model, revision, layer, source, corpus) a non-empty string that UTF-8
    can spell (it becomes a file name or a marker field), or None where None is allowed."""

    checked_path(store, "store")
    for what, value in names.items():
        if value is None and what in ("layer", "source", "corpus"):
            continue
        if not isinstance(value, str) or not value.strip():
            raise InputError(f"{what} must be a non-empty string, got {type(value).__name__} {shown(value)}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise InputError(f"{what} holds a lone surrogate U+{ord(value[error.start]):04X}, which is not text") from None


def _checked_texts(values, what: str, n: int) -> list[str] | None:
    """``texts`` or ``labels``: a list of N strings, each one UTF-8 can hold (a lone surrogate, e.g. from JSON's
    \\ud800 escape, cannot be hashed or stored); checked before anything is written. A label may be any value
    that prints (it is stored as ``str(label)``)."""
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise InputError(f"{what} must be a list of {n} strings, got {type(values).__name__}")
    values = list(values)
    if len(values) != n:
        raise InputError(f"{len(values)} {what} for {n} vectors; give one per row")
    for index, value in enumerate(values):
        if what == "texts" and not isinstance(value, str):
            raise InputError(f"texts[{index}] must be a string, got {type(value).__name__} {shown(value)}")
        text = value if what == "texts" else str(value)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise InputError(
                f"{what}[{index}] holds a lone surrogate U+{ord(text[error.start]):04X} at character {error.start}, "
                "which is not text (no UTF-8 can spell it)"
            ) from None
    return values if what == "texts" else [str(value) for value in values]


class _undone_on_failure:
    """A write that fails leaves the store as it found it: the files and directories this call made under the
    (model, revision) go again, and so do the store directory, its lock and the parents it made when it was new. A
    file the call replaced stays replaced (the marker no longer matches it, so the extraction is not complete)."""

    def __init__(self, root: Path, model: str, revision: str):
        from raygeom.store.tree import LOCK_FILE, Store

        self.root = root.absolute()
        store = Store(self.root)
        self.places = [store._partition(kind, model, revision) for kind in ("activations", "readout", "samples")]
        self.missing = [d for d in (self.root, *self.root.parents) if not d.exists()]
        self.lock = self.root / LOCK_FILE
        self.had_lock = self.lock.exists()
        self.before: set[Path] = set()
        for place in self.places:
            for directory in (place, *place.parents):
                if directory == self.root:
                    break
                if directory.exists():
                    self.before.add(directory)
            if place.is_dir():
                self.before.update(place.rglob("*"))

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        if kind is None:
            return False
        import shutil

        from raygeom.store.tree import unlock_store

        if self.missing:  # a new store: nothing in it is anyone else's (this process holds its lock)
            unlock_store(self.root)
            shutil.rmtree(self.root, ignore_errors=True)
            for directory in self.missing[1:]:
                try:
                    directory.rmdir()
                except OSError:
                    break
            return False
        made: list[Path] = []
        for place in self.places:
            for directory in (place, *place.parents):
                if directory == self.root:
                    break
                if directory.exists() and directory not in self.before:
                    made.append(directory)
            if place.is_dir():
                made.extend(path for path in place.rglob("*") if path not in self.before)
        for path in sorted(set(made), key=lambda p: len(p.parts), reverse=True):
            try:
                path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
            except OSError:
                pass
        if not self.had_lock and self.lock.exists():
            unlock_store(self.root)
            self.lock.unlink(missing_ok=True)
        return False


def _write(root, model, revision, arrays, n, d, texts, labels, readout, n_blocks, source, corpus, settings, step) -> dict:
    from raygeom.sources.corpus import text_sha1
    from raygeom.store.tree import Store, check_writable, content_key, recorded_digest

    check_writable(root)
    tree = Store(root)
    markers = [found.marker for found in tree.extractions(model, revision) if found.marker is not None]
    if any(marker.get("source") is None for marker in markers):
        raise RaygeomError(
            f"{root} already holds raygeom's own extraction of {model}@{revision}; write your vectors "
            "under another model name or revision, or into another store"
        )
    previous = next((marker for marker in markers if marker.get("source") is not None), None)
    place = previous["key"] if previous is not None else PLACE  # an earlier write's, wherever it is (an older store's)
    if previous is not None:
        if previous.get("n_samples") != n or previous.get("d") != d:
            raise InputError(
                f"{model}@{revision} in {root} holds N={previous.get('n_samples')}, d={previous.get('d')}; "
                f"these vectors are {n} x {d}"
            )
        if texts is not None and previous.get("texts_sha1") not in (None, content_key([text_sha1(t) for t in texts])):
            raise InputError(f"these texts are not the texts {model}@{revision} in {root} was written with")

    readout_info = _write_readout(tree, model, revision, readout, d, previous)

    all_layers = _all_layers(
        list(arrays),
        n_blocks if n_blocks is not None else previous and previous.get("n_blocks"),
        previous and previous.get("all_layers"),
    )
    sample_ids = np.arange(n, dtype=np.int32)
    for name, array in arrays.items():
        tree.write_layer(model, revision, name, layer_position.index(all_layers, name), sample_ids, array, key=place)
    if previous is None or texts is not None or labels is not None or not tree.samples_path(model, revision, place).is_file():
        _write_samples(tree, model, revision, place, previous, texts, labels, sample_ids)
    layers = sorted({*(previous or {}).get("layers", []), *arrays}, key=lambda name: layer_position.position(all_layers, name))
    files = [tree.layer_path(model, revision, name, place) for name in layers]
    files += [tree.readout_path(model, revision), tree.samples_path(model, revision, place)]
    digests = [recorded_digest(path) for path in files]
    blocks = sum(1 for name in all_layers if name.startswith("block_") and layer_position.split(name)[1] is None)
    info = {
        **(previous or {}),
        "key": content_key("activations", BYO_VERSION, model, revision, digests),
        "source": source or (previous or {}).get("source") or SOURCE,
        "written_by": "raygeom.write_activations",
        "model": model,
        "revision": revision,
        "step": _given_step(step, revision, previous),
        "step_given": step is not None or bool((previous or {}).get("step_given")),
        "all_layers": all_layers,
        "layers": layers,
        "n_samples": n,
        "d": d,
        "n_blocks": blocks or None,
        "nll": False,
        "fingerprint": content_key(digests),
        "corpus": corpus or (previous or {}).get("corpus") or SOURCE,
        "settings": settings if settings is not None else (previous or {}).get("settings", {}),
        **readout_info,
    }
    if texts is not None:
        info["texts_sha1"] = content_key([text_sha1(t) for t in texts])
        info["corpus_fingerprint"] = info["texts_sha1"]
    info.pop("files", None)
    tree.mark_complete(model, revision, info, key=place)
    return tree.completion(model, revision, info["key"])


def _given_arrays(layer, vectors) -> tuple[dict, int, int]:
    """``write_activations``'s vectors as float32 N x d arrays by layer name, with N and d, or the input refused."""
    from raygeom.numerics.arrays import as_array

    if isinstance(vectors, dict):
        if layer is not None:
            raise InputError("give either layer= and one array, or vectors= as a dict of layer -> array")
        given = dict(vectors)
    else:
        if layer is None or vectors is None:
            raise InputError("write_activations needs layer= and vectors= (N x d), or vectors= as a dict of layer -> array")
        given = {layer: vectors}
    if not given:
        raise InputError("no vectors given")
    arrays = {}
    for name, value in given.items():
        if not isinstance(name, str) or not name:
            raise InputError(f"layer names must be non-empty strings, got {name!r}")
        array = as_array(value, np.float32, f"vectors of {name}")
        if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] < 2:
            raise InputError(f"vectors of {name} must be N x d (one row per text), got shape {array.shape}")
        if not np.isfinite(array).all():
            raise InputError(f"vectors of {name} contain NaN or inf values")
        arrays[name] = np.ascontiguousarray(array)
    shapes = {a.shape for a in arrays.values()}
    if len(shapes) > 1:
        raise InputError(f"every layer needs the same N x d, got {sorted(shapes)}")
    n, d = next(iter(shapes))
    return arrays, n, d


def _write_readout(tree, model: str, revision: str, readout, d: int, previous: dict | None) -> dict:
    """Store the readout basis of ``readout`` (W_U, V x d) where given; returns what the marker says of it (an earlier
    write's where it is not)."""
    from raygeom.numerics import pga
    from raygeom.numerics.arrays import as_array
    from raygeom.numerics.rank import check_readout_rank

    if readout is not None:
        w_u = as_array(readout, np.float64, "readout (W_U)")
        if w_u.ndim != 2 or w_u.shape[1] != d:
            raise InputError(f"readout must be W_U (V x d) with d={d}, got shape {w_u.shape}")
        if not np.isfinite(w_u).all():
            raise InputError("readout contains NaN or inf values")
        basis, singular_values = pga.readout_basis_from_gram(w_u.T @ w_u, min(d - 1, READOUT_COMPONENTS))
        check_readout_rank(singular_values, 1, w_u.shape, "readout (W_U)")  # a k-rank check waits for the analysis's k
        tree.write_readout(model, revision, basis, singular_values)
        return {"vocab_size": int(w_u.shape[0]), "readout_components": int(basis.shape[1])}
    elif previous is None or not tree.readout_path(model, revision).is_file():
        raise InputError("the first write of a model needs readout=W_U (V x d), e.g. model.lm_head.weight")
    else:
        return {key: previous.get(key) for key in ("vocab_size", "readout_components")}


def _write_samples(tree, model: str, revision: str, place: str, previous, texts, labels, sample_ids) -> None:
    """The samples table: each row's text hash and label (an earlier write's where not given again)."""
    from raygeom.sources.corpus import text_sha1

    n = len(sample_ids)
    old = tree.read_samples(model, revision, place).to_pydict() if previous is not None else {}
    hashes = [text_sha1(t) for t in texts] if texts is not None else old.get("text_sha1", [""] * n)
    columns = {
        "sample_id": sample_ids,
        "nll": np.full(n, np.nan),
        "n_tokens": np.zeros(n, dtype=np.int32),
        "text_sha1": hashes,
    }
    chosen_labels = [str(label) for label in labels] if labels is not None else old.get("label")
    if chosen_labels is not None:
        columns["label"] = chosen_labels
    tree.write_samples(model, revision, columns, key=place)


def _given_step(step: int | None, revision: str, previous: dict | None) -> int | None:
    """The step the caller gave, or the one a revision named ``step<N>`` spells, or an earlier write's; else None."""
    import re

    if step is not None:
        return int(step)
    spelled = re.fullmatch(r"step(\d+)", revision)
    if spelled:
        return int(spelled[1])
    return (previous or {}).get("step") if (previous or {}).get("step_given") else None
