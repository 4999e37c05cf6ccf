"""One model replica: every forward-pass product raygeom needs, from one loaded model. No Ray.

A replica holds a model on one GPU, on a ``device_map`` shard group, or on CPU
threads, and serves pooled layer vectors (with the readout basis of ``W_U``,
weight fingerprints and a description), token-level chunk statistics, kNN-LM
features and per-sample NLL. All of them tokenize through
``raygeom.replica.tokenize``. ``raygeom.engine.replica_actor`` makes this class
a Ray actor; tests and scripts use it directly.

Methods take and return plain arrays and dicts so they cross process
boundaries. The ``@serving`` ones take ``spec=``, so one replica can be handed
from one (model, revision) to the next without a new process. State is only a cache: ``run_batches`` keeps pooled batches until
``write_extraction``, which recomputes any batch it does not hold (an actor
restarted on another node after its node died holds none).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import time
from typing import TYPE_CHECKING

import numpy as np

from raygeom.errors import RaygeomError
from raygeom.replica import tokenize
from raygeom.replica.settings import ExtractionSettings
from raygeom.sources import download
from raygeom.sources import layers as layer_position
from raygeom.sources.models import ModelSpec, load_model, weight_fingerprint

if TYPE_CHECKING:  # torch is imported where a model is loaded, not by a driver that only names replicas
    from raygeom.replica.extract import BatchActivations


def quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


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


def serving(method):
    """A method that takes ``spec=``: the model the call is for. A replica handed on to the next (model, revision)
    loads it at its first call, and a call retried on an actor that Ray restarted (with its first spec) names
    its model again, so no call ever runs on another model's weights. Without ``spec`` it is the held one."""

    def call(self, *args, spec: ModelSpec | None = None, **kwargs):
        if spec is not None and spec != self.spec:
            self._load(spec)
        return method(self, *args, **kwargs)

    # No functools.wraps: Ray checks a call's arguments against inspect.signature, which would follow __wrapped__
    # to the signature without ``spec``.
    call.__name__, call.__qualname__, call.__doc__ = method.__name__, method.__qualname__, method.__doc__
    return call


READOUT_BLOCK_ROWS = 4096


class Replica:
    """Holds one model. ``threads`` (CPU), normally the CPUs Ray gave the actor: the batches it runs at once, one torch
    thread each."""

    def __init__(self, spec: ModelSpec, device: str = "cpu", device_map: str | None = None, threads: int | None = None):
        import torch

        quiet_transformers()
        if device == "cpu" and threads:
            torch.set_num_threads(max(1, int(threads)))
        self.device, self.device_map = device, device_map
        self.threads = torch.get_num_threads()
        self._load(spec)

    def _load(self, spec: ModelSpec) -> None:
        """Holds ``spec``'s model from now on: what the last one left (batches, fingerprint, error) goes with it."""
        self.spec = spec
        handed_on = getattr(self, "model", None) is not None
        self.model = self.tokenizer = None
        if handed_on:  # the last model's tensors go before the next one loads
            gc.collect()
        self.held: dict[int, BatchActivations] = {}
        self.forward_seconds = 0.0
        self._gap_ids: tuple[str, list[int]] | None = None
        self._fingerprint: str | None = None
        self._release_cache()
        # A constructor that raises kills an actor and hides the reason; keep it for the first call.
        self.error: RaygeomError | None = None
        start = time.perf_counter()
        try:
            # Online, a hub revision loads from its whole, checked snapshot (a sweep's driver fetched it ahead; else here).
            snapshot = download.fetch(spec.source, spec.revision).path if spec.kind == "hub" and download.online() else None
            self.model, self.tokenizer = load_model(spec, device=self.device, device_map=self.device_map, snapshot=snapshot)
            tokenize.prepare(self.tokenizer)
        except RaygeomError as error:
            self.error = error
        self.load_seconds = time.perf_counter() - start

    def _ready(self) -> None:
        if self.error is not None:
            raise self.error

    # ------------------------------------------------------------------ description
    @serving
    def describe(self) -> dict:
        """Layers (pooled extraction), token layers (adds ``attn_last``), shapes and the weight fingerprint."""
        from raygeom.replica.tokens import token_layer_names
        from raygeom.sources import model_surgery

        self._ready()
        return {
            "layers": model_surgery.layer_names(self.model),
            "token_layers": token_layer_names(self.model),
            "d": model_surgery.hidden_size(self.model),
            "n_blocks": model_surgery.n_blocks(self.model),
            "tied": model_surgery.is_tied(self.model),
            "model_type": self.model.config.model_type,
            "vocab_size": int(self.model.get_output_embeddings().weight.shape[0]),
            "params": int(sum(p.numel() for p in self.model.parameters())),
            "fingerprint": self.fingerprint(),
            "threads": self.threads,
            "device": self.device,
            "special_prefix": tokenize.special_prefix(self.tokenizer),
        }

    def fingerprint(self) -> str:
        self._ready()
        if self._fingerprint is None:
            self._fingerprint = weight_fingerprint(self.model)
        return self._fingerprint

    def readout_basis(self, components: int) -> tuple[np.ndarray, np.ndarray]:
        """Top right singular vectors of ``W_U`` (d x k, float64) and their singular values."""
        import torch

        from raygeom.numerics import pga
        from raygeom.replica.extract import one_thread_each
        from raygeom.sources import model_surgery

        self._ready()
        w_u = model_surgery.unembedding(self.model).detach()
        # W_U^T W_U summed over fixed blocks of the vocabulary, each on one thread, in order: a multi-threaded GEMM
        # splits the long vocabulary axis by thread count, and the basis would change in its last bits with the CPUs.
        blocks = [w_u[start : start + READOUT_BLOCK_ROWS] for start in range(0, w_u.shape[0], READOUT_BLOCK_ROWS)]
        partial = one_thread_each(self.model, lambda block: block.double().T @ block.double(), blocks, self.threads)
        gram = functools.reduce(torch.add, partial)  # in block order
        return pga.readout_basis_from_gram(gram.cpu().numpy(), min(gram.shape[0] - 1, components))

    # ------------------------------------------------------------------ pooled vectors and NLL
    def encode(self, texts: list[str], seq_len: int) -> dict[str, np.ndarray]:
        self._ready()
        return tokenize.encode(self.tokenizer, texts, seq_len)

    def pooled(
        self, texts: list[str], settings: ExtractionSettings, layers: list[str] | None = None, nll: bool = False
    ) -> BatchActivations:
        """Pooled vectors of one batch of texts; NLL only when asked (NaN otherwise)."""
        return self.pooled_batches([texts], settings, layers, nll)[0]

    def pooled_batches(
        self, parts: list[list[str]], settings: ExtractionSettings, layers: list[str] | None = None, nll: bool = False
    ) -> list[BatchActivations]:
        """``pooled`` of several batches, ``threads`` of them at once on CPU, each on one torch thread, so that the
        numbers do not depend on the CPUs this replica was given (:func:`raygeom.replica.extract.extract_batches`)."""
        from raygeom.replica.extract import extract_batches

        self._ready()
        start = time.perf_counter()
        out = extract_batches(self.model, self.tokenizer, parts, settings, layers, nll=nll, threads=self.threads)
        self.forward_seconds += time.perf_counter() - start
        return out

    @serving
    def run_batches(self, first: int, parts: list[list[str]], settings: ExtractionSettings, layers: list[str], nll: bool) -> int:
        """Batches ``first``, ``first + 1``, ... at once (``pooled_batches``), kept for ``write_extraction``; returns
        the number of texts."""
        for offset, batch in enumerate(self.pooled_batches(parts, settings, layers, nll)):
            self.held[first + offset] = batch
        return sum(len(part) for part in parts)

    @serving
    def write_extraction(
        self,
        root: str,
        key: str,
        texts: list[str],
        labels: list[str] | None,
        corpus_name: str,
        settings: ExtractionSettings,
        layers: list[str],
        readout_components: int,
        nll: bool,
        extra: dict | None = None,
    ) -> dict:
        """Layers, readout basis and per-sample data of this revision into the store, the completion marker last.

        Batches not held (never run here, or lost with a restarted actor) are computed first."""
        from raygeom.sources import model_surgery
        from raygeom.sources.corpus import text_sha1
        from raygeom.store.tree import Store

        self._ready()
        size = settings.batch_size
        starts = list(range(0, len(texts), size))
        missing = [index for index in range(len(starts)) if index not in self.held]
        parts = [texts[starts[index] : starts[index] + size] for index in missing]
        self.held.update(zip(missing, self.pooled_batches(parts, settings, layers, nll)))
        ordered = [self.held[i] for i in range(len(starts))]
        store, slug, revision = Store(root), self.spec.slug, self.spec.revision
        all_layers = model_surgery.layer_names(self.model)
        sample_ids = np.arange(len(texts))
        for layer in layers:
            vectors = np.concatenate([b.pooled[layer] for b in ordered])
            store.write_layer(slug, revision, layer, layer_position.index(all_layers, layer), sample_ids, vectors, key=key)
        # W_U's basis is the same for every extraction of these weights; writing it again would change the bytes the
        # revision's other extractions recorded.
        d = int(model_surgery.unembedding(self.model).shape[1])
        if store.stored_readout(slug, revision, self.fingerprint()) != min(d - 1, readout_components):
            basis, singular_values = self.readout_basis(readout_components)
            store.write_readout(slug, revision, basis, singular_values, self.fingerprint())
        n_tokens = np.concatenate([b.n_tokens for b in ordered])
        columns = {
            "sample_id": sample_ids.astype(np.int32),
            "nll": np.concatenate([b.nll for b in ordered]).astype(np.float64),
            "n_tokens": n_tokens.astype(np.int32),
            "text_sha1": [text_sha1(t) for t in texts],
        }
        if labels is not None:
            columns["label"] = list(labels)
        store.write_samples(slug, revision, columns, key=key)
        described = self.describe()
        info = {
            "key": key,
            "all_layers": all_layers,
            "n_samples": len(texts),
            "fingerprint": described["fingerprint"],
            "tensor_fingerprints": tensor_digests(self.model),
            "params": described["params"],
            "d": described["d"],
            "n_blocks": described["n_blocks"],
            "tied": described["tied"],
            "model_type": described["model_type"],
            "model": self.spec.name,
            "revision": revision,
            "corpus": corpus_name,
            "settings": _settings_dict(settings),
            "device": self.device,
            "gpus": _gpu_count(self.device),
            "threads": self.threads,
            "nll": bool(nll),
            "load_seconds": self.load_seconds,
            "forward_seconds": self.forward_seconds,
            "tokens": int(n_tokens.sum()),
            **(extra or {}),
            "layers": layers,
        }
        store.mark_complete(slug, revision, info)
        self.held.clear()
        self._release_cache()
        return info

    @serving
    def add_nll(self, root: str, key: str, texts: list[str], settings: ExtractionSettings) -> dict:
        """Per-sample NLL for the complete extraction ``key`` stored without it (a PGA-only run); the layers stay as stored."""
        from raygeom.store.tree import Store

        self._ready()
        store, slug, revision = Store(root), self.spec.slug, self.spec.revision
        size = settings.batch_size
        parts = [texts[s : s + size] for s in range(0, len(texts), size)]
        losses = np.concatenate([batch.nll for batch in self.pooled_batches(parts, settings, [], nll=True)])
        import pyarrow as pa

        samples = store.read_samples(slug, revision, key)
        ids = samples["sample_id"].to_numpy()
        if len(ids) != len(texts) or ids.min() < 0 or ids.max() >= len(texts):
            raise RaygeomError(f"{slug}@{revision}: the stored samples do not match the corpus; extract it again")
        columns = {name: samples[name] for name in samples.column_names}
        columns["nll"] = pa.array(losses[ids].astype(np.float64))
        store.write_samples(slug, revision, columns, key=key)
        info = {**store.completion(slug, revision, key), "nll": True}
        store.mark_complete(slug, revision, info)
        self._release_cache()
        return info

    # ------------------------------------------------------------------ token level
    @serving
    def chunks(
        self, texts: list[str], labels: list[str] | None, chunk_len: int, per_domain: int, seed: int
    ) -> tuple[np.ndarray, list[str]]:
        self._ready()
        return tokenize.make_chunks(self.tokenizer, texts, labels, chunk_len, per_domain, seed)

    @serving
    def statistics_batches(self, parts: list[np.ndarray], layers: list[str], gap_spec: str | None) -> list[tuple]:
        """Per batch of chunks: token dispersion, pooled vectors and NLL, and each chunk's dispersion-gap sums;
        ``threads`` batches at once on one torch thread each (as ``pooled_batches``)."""
        import torch

        from raygeom.replica.extract import one_thread_each
        from raygeom.replica.tokens import ChunkGaps, chunk_statistics, domain_token_ids

        self._ready()
        if gap_spec and (self._gap_ids is None or self._gap_ids[0] != gap_spec):
            self._gap_ids = (gap_spec, domain_token_ids(self.tokenizer, gap_spec))

        def one(chunks: np.ndarray) -> tuple:
            gaps = {layer: ChunkGaps(self._gap_ids[1]) for layer in layers} if gap_spec else None
            stats = chunk_statistics(self.model, torch.from_numpy(np.ascontiguousarray(chunks)), layers, gaps)
            gap_parts = {name: g.parts() for name, g in (gaps or {}).items()}
            return stats.token_dispersion, stats.pooled, stats.nll, stats.n_predicted, gap_parts

        start = time.perf_counter()
        out = one_thread_each(self.model, one, parts, self.threads)
        self.forward_seconds += time.perf_counter() - start
        return out

    @serving
    def chunk_bytes(self, chunks: np.ndarray) -> np.ndarray:
        """UTF-8 bytes of each chunk's predicted text (bits per byte)."""
        self._ready()
        return tokenize.predicted_bytes(self.tokenizer, chunks)

    @serving
    def features_batches(self, parts: list[np.ndarray], layers: list[str]) -> list[tuple]:
        """Per batch of chunks, the kNN-LM features: per-layer vectors at positions with a next token, those tokens,
        their LM log-probs; ``threads`` batches at once on one torch thread each."""
        import torch

        from raygeom.replica.extract import one_thread_each
        from raygeom.replica.tokens import token_features

        self._ready()

        def one(chunks: np.ndarray) -> tuple:
            return token_features(self.model, torch.from_numpy(np.ascontiguousarray(chunks)), layers)

        return one_thread_each(self.model, one, parts, self.threads)

    # ------------------------------------------------------------------ housekeeping
    def _release_cache(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _settings_dict(settings: ExtractionSettings) -> dict:
    from dataclasses import asdict

    return asdict(settings)


def _gpu_count(device: str) -> int:
    import torch

    return torch.cuda.device_count() if device == "cuda" else 0
