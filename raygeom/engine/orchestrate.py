"""Ray orchestration: extraction actors, PGA fan-out tasks. The only module that imports Ray.

Call :func:`raygeom.engine.ray_env.prepare_local_ray_environment` before importing
this module when the cluster is local (the CLI does).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import ray

from raygeom.sources import model_surgery
from raygeom.sources.corpus import Corpus, text_sha1
from raygeom.errors import RaygeomError
from raygeom.replica.extract import ExtractionSettings, extract_batch
from raygeom.sources.models import ModelSpec, load_model, weight_fingerprint
from raygeom.numerics import pga
from raygeom.params import PGAParams
from raygeom.engine.units import UnitRunner, run_units
from raygeom.store.tree import Store, content_key
# Unit keys and requests are pure and live in raygeom.analyses.sweep, so plan/status need no Ray; re-exported here.
from raygeom.analyses.sweep import (EXTRACTION_VERSION, PGA_VERSION, READOUT_COMPONENTS, ExtractionRequest,  # noqa: F401
                           pga_unit_key, select_layers)

CONNECT_TIMEOUT_ENV = "RAYGEOM_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT_S = 30.0


def connect_timeout(seconds: float | None = None) -> float:
    if seconds is None:
        raw = os.environ.get(CONNECT_TIMEOUT_ENV, "")
        try:
            seconds = float(raw) if raw else DEFAULT_CONNECT_TIMEOUT_S
        except ValueError:
            raise RaygeomError(f"{CONNECT_TIMEOUT_ENV} must be a number of seconds, got {raw!r}") from None
    if not seconds > 0:
        raise RaygeomError(f"the Ray connect timeout must be positive, got {seconds}")
    return float(seconds)


def start_ray(address: str | None = None, num_cpus: int | None = None, timeout_s: float | None = None) -> None:
    """Start a local Ray, or connect to ``address`` within ``timeout_s`` (default 30 s, or
    $RAYGEOM_CONNECT_TIMEOUT) and otherwise fail with one line; never hang."""
    if num_cpus is not None and num_cpus <= 0:
        raise RaygeomError(f"--num-cpus must be at least 1, got {num_cpus}")
    if ray.is_initialized():
        return
    # Refs of a layer dropped as degenerate are never fetched; Ray would print each one's traceback.
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    if address is None:
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     configure_logging=True, logging_level="ERROR")
        except Exception as error:  # ray.init raises a bare Exception when the node times out
            raise RaygeomError(f"could not start a local Ray: {_first_line(error)}") from None
        return
    _connect(address, connect_timeout(timeout_s))


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame


def _probe(address: str, timeout_s: float) -> None:
    """Before ray.init (whose retries run for minutes, logging to stderr): the port must accept a TCP
    connection and answer an HTTP/2 preface with a SETTINGS frame, as Ray's gRPC servers (GCS, client
    server) do. A closed port, a dead host or a server that never answers fails here, in seconds."""
    import socket

    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return  # 'auto' and the like: Ray resolves it and fails fast by itself
    wait = min(timeout_s, 10.0)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=wait) as connection:
            connection.sendall(HTTP2_PREFACE)
            answer = connection.recv(9)
    except socket.timeout:
        raise RaygeomError(f"could not connect to Ray at {address} within {wait:g} s: the port accepted a connection "
                           "but nothing answered as a Ray (gRPC) server") from None
    except OSError as error:
        raise RaygeomError(f"cannot reach Ray at {address}: {error.strerror or _first_line(error)}") from None
    if len(answer) < 4 or answer[3] != 4:
        raise RaygeomError(f"no Ray cluster at {address}: the port answered, but not as a Ray (gRPC) server")


def _connect(address: str, timeout_s: float) -> None:
    _probe(address, timeout_s)
    outcome: dict = {}

    def connect() -> None:
        try:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
            outcome["ok"] = True
        except BaseException as error:  # noqa: BLE001 - reported below as one line
            outcome["error"] = error

    # ray.init blocks signals while it retries; on a thread, the main thread keeps Ctrl-C and the deadline.
    thread = threading.Thread(target=connect, name="ray-connect", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.1)
    if thread.is_alive():
        raise RaygeomError(f"could not connect to Ray at {address} within {timeout_s:g} s "
                           f"(set ${CONNECT_TIMEOUT_ENV} to wait longer)")
    if "error" in outcome:
        raise RaygeomError(f"could not connect to Ray at {address}: {_first_line(outcome['error'])}")


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
        ordered = [self.batches[i] for i in sorted(self.batches)]
        info = _store_extraction(Store(root), self.spec, revision, self.model, self.layers, ordered, key, layers, sample_ids,
                                 columns, readout_components, extra)
        self.batches.clear()
        return info


def tensor_digests(model, samples_per_tensor: int = 1024) -> dict[str, str]:
    """Per-matrix fingerprints (strided samples, like weight_fingerprint). They find a revision that is
    partly another's, such as one serving the final model's first shard; vectors are left out because
    norms and biases can legitimately stay equal across steps."""
    digests = {}
    for name, tensor in sorted(model.state_dict().items()):
        if tensor.ndim < 2:
            continue
        flat = tensor.detach().reshape(-1)
        stride = max(1, flat.numel() // samples_per_tensor)
        digest = hashlib.sha1(str(tuple(tensor.shape)).encode())
        digest.update(flat[::stride].float().cpu().numpy().tobytes())
        digests[name] = digest.hexdigest()[:16]
    return digests


def _store_extraction(store: Store, spec: ModelSpec, revision: str, model, all_layers: list[str], ordered: list,
                      key: str, layers: list[str], sample_ids: list[int], columns: dict, readout_components: int,
                      extra: dict) -> dict:
    """Write layers, readout basis and per-sample data, then the completion marker last."""
    import torch

    slug = spec.slug
    for layer in layers:
        vectors = np.concatenate([b.pooled[layer] for b in ordered])
        store.write_layer(slug, revision, layer, all_layers.index(layer), np.asarray(sample_ids), vectors)
    w_u = model_surgery.unembedding(model).detach()
    gram = (w_u.double().T @ w_u.double()).cpu().numpy()
    d = gram.shape[0]
    basis, singular_values = pga.readout_basis_from_gram(gram, min(d - 1, readout_components))
    del gram
    store.write_readout(slug, revision, basis, singular_values)
    nll = np.concatenate([b.nll for b in ordered])
    n_tokens = np.concatenate([b.n_tokens for b in ordered])
    store.write_samples(slug, revision, {"sample_id": np.asarray(sample_ids, dtype=np.int32), "nll": nll.astype(np.float64),
                                         "n_tokens": n_tokens.astype(np.int32), **columns})
    info = {"key": key, "all_layers": all_layers, "n_samples": len(sample_ids), "fingerprint": weight_fingerprint(model),
            "tensor_fingerprints": tensor_digests(model), "params": int(sum(p.numel() for p in model.parameters())),
            "d": model_surgery.hidden_size(model), "n_blocks": model_surgery.n_blocks(model),
            "tied": model_surgery.is_tied(model), "model_type": model.config.model_type, **extra, "layers": layers}
    store.mark_complete(slug, revision, info)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return info


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
                 "corpus_fingerprint": request.corpus.fingerprint(), "step": request.spec.step,
                 "settings": asdict(request.settings)}
        return ray.get(worker.write.remote(str(store.root), request.spec.revision, key, layers,
                                           list(range(len(texts))), columns, request.readout_components, extra))
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, RaygeomError):
            raise RaygeomError(str(error.cause)) from None
        raise
    finally:
        ray.kill(worker)


def run_pga(store: Store, model: str, revision: str, layers: list[str], params: PGAParams,
            progress: Callable[[int], None] | None = None, warn: Callable[[str], None] | None = None) -> list[dict]:
    """PGA for every layer of one extraction, through the unit engine (finished layers are read back)."""
    from raygeom.analyses import pga as pga_analysis

    return run_units(store, pga_analysis.units(store, model, revision, layers, params), progress, warn)


# ---------------------------------------------------------------------------------------------
# Sweeps: one Ray task per (model, revision) extraction, PGA of each revision as soon as it lands.
# Tasks, not actors: a task lost with its node is simply rerun elsewhere (max_retries), and Ray
# places each by its num_gpus/num_cpus request, so there is no queue of our own beyond a bound
# on how many extraction tasks are submitted at once.

@dataclass(frozen=True)
class SweepItem:
    request: ExtractionRequest
    gpus: float = 0.0  # GPUs per replica: 0 = CPU, 0.5 = two revisions share a GPU, >1 = sharded (device_map)
    prefetch: str | None = None  # the next revision of the same model, downloaded while this one runs


def _load_tokenizer(spec: ModelSpec):
    if spec.kind not in ("hub", "local"):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(spec.source, revision=spec.revision if spec.kind == "hub" else None)
    except (OSError, ValueError):
        return None  # the extraction task reports the loading error with its own message


@ray.remote(max_retries=3, num_cpus=1)
def _tokenise_corpus(spec: ModelSpec, texts: list[str], settings: ExtractionSettings) -> list[dict] | None:
    """Every revision of a Pythia model shares its tokenizer, so the corpus is tokenised once per model."""
    from raygeom.replica.extract import tokenize

    _quiet_transformers()
    tokenizer = _load_tokenizer(spec)
    if tokenizer is None:
        return None
    size = settings.batch_size
    return [{name: value.numpy() for name, value in tokenize(tokenizer, texts[s:s + size], settings.seq_len, "cpu").items()}
            for s in range(0, len(texts), size)]


def _download(spec: ModelSpec, revision: str) -> None:
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(spec.source, revision=revision, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"])
    except Exception:  # noqa: BLE001 - a failed prefetch only means the next task downloads itself
        pass


@ray.remote(max_retries=3)
def _extract_revision(root: str, request: ExtractionRequest, key: str, device: str, device_map: str | None,
                      encoded: list[dict] | None, prefetch: str | None) -> dict:
    _quiet_transformers()
    import torch

    start = time.perf_counter()  # after the imports, which only the first task of a worker pays
    # Fixed thread count: results must not depend on which node or how many cores ran the task.
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    fetcher = None
    if prefetch and request.spec.kind == "hub" and not offline:
        fetcher = threading.Thread(target=_download, args=(request.spec, prefetch), daemon=True)
        fetcher.start()
    try:
        model, tokenizer = load_model(request.spec, device=device, device_map=device_map)
        all_layers = model_surgery.layer_names(model)
        layers = select_layers(all_layers, request.layer_selection)
        loaded = time.perf_counter()
        texts, size = request.corpus.texts, request.settings.batch_size
        batches = [extract_batch(model, tokenizer, texts[s:s + size], request.settings, layers,
                                 encoded=encoded[i] if encoded is not None else None)
                   for i, s in enumerate(range(0, len(texts), size))]
        computed = time.perf_counter()
        columns = {"text_sha1": [text_sha1(t) for t in texts]}
        if request.corpus.labels is not None:
            columns["label"] = list(request.corpus.labels)
        extra = {"model": request.spec.name, "revision": request.spec.revision, "corpus": request.corpus.name,
                 "corpus_fingerprint": request.corpus.fingerprint(), "step": request.spec.step,
                 "settings": asdict(request.settings), "device": device, "gpus": torch.cuda.device_count() if device == "cuda" else 0,
                 "load_seconds": loaded - start, "forward_seconds": computed - loaded,
                 "tokens": int(sum(int(b.n_tokens.sum()) for b in batches))}
        info = _store_extraction(Store(root), request.spec, request.spec.revision, model, all_layers, batches, key, layers,
                                 list(range(len(texts))), columns, request.readout_components, extra)
        del model
        return info
    finally:
        if fetcher is not None:
            fetcher.join()


def extraction_options(gpus: float) -> tuple[dict, str, str | None]:
    """Ray options, device and device_map of one extraction replica."""
    if gpus <= 0:
        return {"num_cpus": 1}, "cpu", None
    # GPU extraction asks for no CPU, so queued analysis tasks can never hold it back.
    return {"num_gpus": gpus, "num_cpus": 0}, "cuda", ("auto" if gpus > 1 else None)


def run_sweep(store: Store, items: list[SweepItem], params: PGAParams, progress: Callable[[str, int], None] | None = None,
              max_in_flight: int | None = None, pga_threads: int = 4, keep_activations: bool = True) -> list[dict]:
    """Extract every item not already complete and run PGA on every layer of every item.

    Extraction tasks go to Ray as resources allow, at most ``max_in_flight`` submitted at once; each
    finished revision's PGA units join the one unit engine at once (their tasks run on the CPUs), so
    extraction never waits for analysis. ``progress(kind, n)`` gets kind ``extract`` or ``pga``.
    """
    progress = progress or (lambda kind, n: None)
    if max_in_flight is None:
        slots = max(1, int(ray.cluster_resources().get("CPU", 1)))
        gpu_items = [i.gpus for i in items if i.gpus > 0]
        if gpu_items:
            slots = max(1, int(cluster_gpus() / max(min(gpu_items), 1e-9)))
        max_in_flight = 2 * slots
    tokens: dict[tuple, ray.ObjectRef] = {}
    pending: dict[ray.ObjectRef, SweepItem] = {}
    queue: list[SweepItem] = []
    # One driver loop: a revision's PGA units join the engine the moment its extraction lands, and
    # run while the next revisions extract (each revision used to get its own driver thread).
    runner = UnitRunner(store, progress=lambda n: progress("pga", n), units_in_flight=4 * pga_threads)
    revision_units: dict[tuple[str, str], list[str]] = {}

    def analyse(item: SweepItem, info: dict) -> None:
        spec = item.request.spec
        from raygeom.analyses import pga as pga_analysis

        units = pga_analysis.units(store, spec.slug, spec.revision, info["layers"], params, info=info)
        revision_units[(spec.slug, spec.revision)] = [unit.key for unit in units]
        runner.add(units)

    def drop_finished() -> None:
        for (slug, revision), keys in list(revision_units.items()):
            if all(key in runner.rows for key in keys):
                del revision_units[(slug, revision)]
                if not keep_activations:
                    store.drop_activations(slug, revision)

    for item in items:
        spec = item.request.spec
        key = item.request.key()
        info = store.completion(spec.slug, spec.revision)
        done_units = info is not None and info.get("key") == key and all(
            store.has_result("pga", pga_unit_key(key, layer, params)) for layer in info["layers"])
        if done_units or store.is_complete(spec.slug, spec.revision, key):
            progress("extract", 1)
            analyse(item, info)
        else:
            queue.append(item)

    def submit(item: SweepItem) -> None:
        request = item.request
        token_key = (request.spec.source, request.corpus.fingerprint(), asdict(request.settings))
        token_key = content_key(*token_key)
        if token_key not in tokens:
            tokens[token_key] = _tokenise_corpus.remote(request.spec, request.corpus.texts, request.settings)
        options, device, device_map = extraction_options(item.gpus)
        store.invalidate(request.spec.slug, request.spec.revision)
        ref = _extract_revision.options(**options).remote(str(store.root), request, request.key(), device, device_map,
                                                          tokens[token_key], item.prefetch)
        pending[ref] = item

    # A revision that cannot be loaded (not on the hub, not in an offline cache) must not stop a
    # days-long sweep: the rest finishes, then one error names every failed revision.
    failed: list[str] = []
    while queue or pending or runner.busy:
        while queue and len(pending) < max_in_flight:
            submit(queue.pop(0))
        for ref in runner.step(list(pending)):
            item = pending.pop(ref)
            try:
                info = ray.get(ref)
            except ray.exceptions.RayTaskError as error:
                if isinstance(error.cause, RaygeomError):
                    failed.append(str(error.cause))
                    progress("extract", 1)
                    continue
                raise
            progress("extract", 1)
            analyse(item, info)
        drop_finished()
    drop_finished()
    rows = [row for unit_rows in runner.rows.values() for row in unit_rows]
    if failed:
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise RaygeomError(f"{len(failed)} of {len(items)} revisions failed, the others are stored; first: {failed[0]}{more}")
    return rows
