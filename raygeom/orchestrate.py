"""Ray orchestration: extraction actors, PGA fan-out tasks. The only module that imports Ray.

Call :func:`raygeom.ray_env.prepare_local_ray_environment` before importing
this module when the cluster is local (the CLI does).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import ray

from raygeom import model_surgery
from raygeom.corpus import Corpus, text_sha1
from raygeom.errors import RaygeomError
from raygeom.extract import ExtractionSettings, extract_batch
from raygeom.models import ModelSpec, load_model, weight_fingerprint
from raygeom.numerics import pga
from raygeom.params import PGAParams
from raygeom.store import Store, content_key

EXTRACTION_VERSION = 1
PGA_VERSION = 1
READOUT_COMPONENTS = 256
# Prepared layers alive at once in the object store; bounds memory, keeps both stages busy.
LAYERS_IN_FLIGHT = 4


def start_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    if ray.is_initialized():
        return
    if address is None:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 configure_logging=True, logging_level="ERROR")
    else:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")


def cluster_gpus() -> float:
    return float(ray.cluster_resources().get("GPU", 0.0))


def _quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


@ray.remote(max_restarts=1, max_task_retries=-1)
class ExtractionWorker:
    """Holds one model replica (one GPU when there is one) and extracts batches into memory."""

    def __init__(self, spec: ModelSpec, settings: ExtractionSettings, device: str, device_map: str | None = None):
        _quiet_transformers()
        import torch

        if device == "cpu":
            torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        self.spec, self.settings = spec, settings
        self.batches: dict[int, object] = {}
        # A constructor that raises kills the actor and hides the reason; keep it for the first call.
        self.error: RaygeomError | None = None
        try:
            self.model, self.tokenizer = load_model(spec, device=device, device_map=device_map)
            self.layers: list[str] = model_surgery.layer_names(self.model)
        except RaygeomError as error:
            self.error = error

    def describe(self) -> dict:
        if self.error is not None:
            raise self.error
        return {
            "layers": self.layers,
            "d": model_surgery.hidden_size(self.model),
            "n_blocks": model_surgery.n_blocks(self.model),
            "tied": model_surgery.is_tied(self.model),
            "model_type": self.model.config.model_type,
        }

    def fingerprint(self) -> str:
        return weight_fingerprint(self.model)

    def run_batch(self, index: int, texts: list[str], layers: list[str]) -> int:
        self.batches[index] = extract_batch(self.model, self.tokenizer, texts, self.settings, layers)
        return len(texts)

    def write(self, root: str, revision: str, key: str, layers: list[str], sample_ids: list[int],
              columns: dict, readout_components: int, extra: dict) -> dict:
        import torch

        store = Store(root)
        ordered = [self.batches[i] for i in sorted(self.batches)]
        slug = self.spec.slug
        for layer in layers:
            vectors = np.concatenate([b.pooled[layer] for b in ordered])
            store.write_layer(slug, revision, layer, self.layers.index(layer), np.asarray(sample_ids), vectors)
        w_u = model_surgery.unembedding(self.model).detach()
        gram = (w_u.double().T @ w_u.double()).cpu().numpy()
        d = gram.shape[0]
        basis, singular_values = pga.readout_basis_from_gram(gram, min(d - 1, readout_components))
        store.write_readout(slug, revision, basis, singular_values)
        nll = np.concatenate([b.nll for b in ordered])
        n_tokens = np.concatenate([b.n_tokens for b in ordered])
        store.write_samples(slug, revision, {"sample_id": np.asarray(sample_ids, dtype=np.int32), "nll": nll.astype(np.float64),
                                             "n_tokens": n_tokens.astype(np.int32), **columns})
        info = {"key": key, "layers": layers, "all_layers": self.layers, "n_samples": len(sample_ids),
                "fingerprint": weight_fingerprint(self.model), "d": d, **self.describe(), **extra}
        info["layers"] = layers
        store.mark_complete(slug, revision, info)
        self.batches.clear()
        del gram
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        return info


@dataclass(frozen=True)
class ExtractionRequest:
    spec: ModelSpec
    corpus: Corpus  # already sampled: every model sees these texts in this order
    settings: ExtractionSettings
    layer_selection: str = "all"
    readout_components: int = READOUT_COMPONENTS

    def key(self) -> str:
        return content_key("extract", EXTRACTION_VERSION, self.spec.kind, self.spec.source, self.spec.revision,
                           self.corpus.fingerprint(), asdict(self.settings), self.layer_selection, self.readout_components)


def select_layers(all_layers: list[str], selection: str) -> list[str]:
    """``all``, or comma-separated names, indices (negative allowed) and ``a:b`` index ranges."""
    if selection.strip() in ("", "all"):
        return list(all_layers)
    chosen: list[str] = []
    for part in (p.strip() for p in selection.split(",")):
        try:
            if part in all_layers:
                picks = [part]
            elif ":" in part:
                start, _, stop = part.partition(":")
                picks = all_layers[slice(int(start) if start else None, int(stop) if stop else None)]
            else:
                picks = [all_layers[int(part)]]
        except (ValueError, IndexError):
            raise RaygeomError(f"layer '{part}' not found; this model has {len(all_layers)} layers: {all_layers[0]} ... {all_layers[-1]}") from None
        chosen.extend(p for p in picks if p not in chosen)
    return sorted(chosen, key=all_layers.index)


def extract(store: Store, request: ExtractionRequest, progress: Callable[[int], None] | None = None,
            gpus_per_model: float | None = None) -> dict:
    """Extract one (model, revision) into the store with a Ray actor; skip it when already complete."""
    key = request.key()
    if store.is_complete(request.spec.slug, request.spec.revision, key):
        if progress:
            progress(len(request.corpus.texts))
        return store.completion(request.spec.slug, request.spec.revision)
    store.invalidate(request.spec.slug, request.spec.revision)
    gpus = (1.0 if cluster_gpus() >= 1 else 0.0) if gpus_per_model is None else gpus_per_model
    device = "cuda" if gpus > 0 else "cpu"
    device_map = "auto" if gpus > 1 else None
    worker = ExtractionWorker.options(num_gpus=gpus, num_cpus=1).remote(request.spec, request.settings, device, device_map)
    try:
        described = ray.get(worker.describe.remote())
        layers = select_layers(described["layers"], request.layer_selection)
        texts = request.corpus.texts
        size = request.settings.batch_size
        pending = [worker.run_batch.remote(i, texts[s:s + size], layers) for i, s in enumerate(range(0, len(texts), size))]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            count = ray.get(done[0])
            if progress:
                progress(count)
        columns = {"text_sha1": [text_sha1(t) for t in texts]}
        if request.corpus.labels is not None:
            columns["label"] = list(request.corpus.labels)
        extra = {"model": request.spec.name, "revision": request.spec.revision, "corpus": request.corpus.name,
                 "settings": asdict(request.settings)}
        return ray.get(worker.write.remote(str(store.root), request.spec.revision, key, layers,
                                           list(range(len(texts))), columns, request.readout_components, extra))
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, RaygeomError):
            raise RaygeomError(str(error.cause)) from None
        raise
    finally:
        ray.kill(worker)


@ray.remote(max_retries=3)
def _prepare_layer(root: str, model: str, revision: str, layer: str, r: int) -> pga.PreparedLayer:
    _, h = Store(root).read_layer(model, revision, layer)
    return pga.prepare_layer(h, r)


@ray.remote(max_retries=3)
def _readout_rho(layer: pga.PreparedLayer, basis: np.ndarray, device: str | None) -> float:
    return pga.subspace_rho(layer, basis, device)


@ray.remote(max_retries=3)
def _null_chunk(layer: pga.PreparedLayer, k: int, seed: int, indices: list[int], device: str | None) -> np.ndarray:
    return pga.null_rhos(layer, k, seed, indices, device)


def pga_unit_key(extraction_key: str, layer: str, params: PGAParams) -> str:
    return content_key("pga", PGA_VERSION, extraction_key, layer, params.k, params.r, params.n_null, params.seed)


def run_pga(store: Store, model: str, revision: str, layers: list[str], params: PGAParams,
            progress: Callable[[int], None] | None = None) -> list[dict]:
    """PGA for every layer of one extraction; nulls fan out as Ray tasks in ``null_chunks`` chunks per layer.

    Null ``i`` is seeded by (seed, i), so z is identical however the chunks are split.
    Finished layers are read back from the store instead of recomputed.
    """
    info = store.completion(model, revision)
    if info is None:
        raise RaygeomError(f"no complete extraction of {model}@{revision} in {store.root}")
    if not 0 < params.k < info["d"]:
        raise RaygeomError(f"k must satisfy 0 < k < d; got k={params.k}, d={info['d']} for {model}")
    if params.n_null < 2:
        raise RaygeomError(f"n-null must be at least 2, got {params.n_null}")
    if info["n_samples"] < pga.MIN_SAMPLES:
        raise RaygeomError(f"need at least {pga.MIN_SAMPLES} samples, got N={info['n_samples']}")
    basis, _ = store.read_readout(model, revision)
    if params.k > basis.shape[1]:
        raise RaygeomError(f"k={params.k} exceeds the {basis.shape[1]} readout components stored for {model}")
    basis_ref = ray.put(np.ascontiguousarray(basis[:, :params.k]))
    device = "cuda" if params.gpus_per_task > 0 else "cpu"
    options = {"num_gpus": params.gpus_per_task} if params.gpus_per_task > 0 else {}
    chunks = [list(map(int, c)) for c in np.array_split(np.arange(params.n_null), max(1, min(params.null_chunks, params.n_null)))]
    relative = {name: i / (len(info["all_layers"]) - 1) for i, name in enumerate(info["all_layers"])}

    rows: dict[str, dict] = {}
    todo = []
    for layer in layers:
        key = pga_unit_key(info["key"], layer, params)
        if store.has_result("pga", key):
            rows[layer] = store.read_results("pga", [key]).to_pylist()[0]
            if progress:
                progress(len(chunks) + 1)
        else:
            todo.append((layer, key))

    in_flight: dict = {}

    def submit(layer: str, key: str) -> None:
        prepared = _prepare_layer.remote(str(store.root), model, revision, layer, params.r)
        readout = _readout_rho.options(**options).remote(prepared, basis_ref, device)
        nulls = [_null_chunk.options(**options).remote(prepared, params.k, params.seed, c, device) for c in chunks]
        in_flight[readout] = (layer, -1)
        for index, ref in enumerate(nulls):
            in_flight[ref] = (layer, index)

    parts: dict[str, dict] = {}
    queue = list(todo)
    active: set[str] = set()
    while queue or in_flight:
        while queue and len(active) < LAYERS_IN_FLIGHT:
            layer, key = queue.pop(0)
            active.add(layer)
            parts[layer] = {"key": key, "readout": None, "nulls": {}, "remaining": len(chunks) + 1}
            submit(layer, key)
        done, _ = ray.wait(list(in_flight), num_returns=1)
        ref = done[0]
        layer, chunk_index = in_flight.pop(ref)
        try:
            value = ray.get(ref)
        except ray.exceptions.RayTaskError as error:
            if isinstance(error.cause, RaygeomError):
                raise RaygeomError(f"{model}@{revision} {layer}: {error.cause}") from None
            raise
        part = parts[layer]
        if chunk_index >= 0:
            part["nulls"][chunk_index] = value
        else:
            part["readout"] = value
        part["remaining"] -= 1
        if progress:
            progress(1)
        if part["remaining"] == 0:
            nulls = np.concatenate([part["nulls"][i] for i in range(len(chunks))])
            rows[layer] = _pga_row(model, revision, layer, info, relative[layer], params, part["readout"], nulls)
            store.write_result("pga", part["key"], rows[layer])
            active.discard(layer)
    return [rows[layer] for layer in layers]


def _pga_row(model, revision, layer, info, depth, params: PGAParams, rho, nulls) -> dict:
    if not np.isfinite(rho) or not np.isfinite(nulls).all():
        raise RaygeomError(f"{model}@{revision} {layer}: distances are constant after CCR-{params.r}, so rank correlation is undefined")
    stats = pga.summarize_null(rho, nulls)
    return {"model": model, "revision": revision, "layer": layer, "layer_index": info["all_layers"].index(layer),
            "relative_depth": depth, "k": params.k, "r": params.r, "n": info["n_samples"], "n_null": params.n_null,
            "seed": params.seed, "rho_readout": float(rho), **stats, "d": info["d"], "fingerprint": info["fingerprint"]}
