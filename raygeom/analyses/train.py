"""Push-away training on Ray: ``L = L_LM - lambda * D_batch`` on a small GPT-NeoX trained from scratch.

``D_batch`` is the differentiable dispersion (``numerics.dispersion.push_away_loss``)
of one layer's representations in the batch. ``raygeom.engine.ray_train`` (driven by
``raygeom.jobs.train.run_training``; no Ray here) runs one worker as one Ray task, and
``workers`` > 1 as data-parallel TorchTrainer workers (DDP; one GPU each on a cluster, CPU
processes here); every worker draws the same global batch indices and takes
its own slice, so a run depends on (settings, seed) and the worker count only.
With several workers ``D_batch`` is each worker's own slice's dispersion (the
gradients, not the representations, are averaged), which is why the worker
count is part of a run's key. On a cluster ``--out`` must be on storage that
every node can write: rank 0 writes the per-step log there.

Data: the corpus is split by article (a fixed split, the same for every run),
a byte-level BPE tokenizer is trained on the training articles, and both
sides are cut into ``seq_len``-token sequences. Rank 0 evaluates held-out
perplexity and held-out dispersion every ``eval_every`` steps and writes the
per-step log (loss, perplexity, dispersion) as Parquet.

Trajectories: given a :class:`CheckpointPlan`, rank 0 also saves the model and
tokenizer (``save_pretrained``, loadable by ``from_pretrained``) as
``<run_dir>/step<N>/`` on a Pythia-like schedule (:func:`checkpoint_steps`),
each with its held-out evaluation, and the driver writes the held-out articles
as ``<run_dir>/heldout.jsonl``: the run directory is a sweep source
(raygeom.sources.checkpoints).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Optional

import numpy as np

from raygeom.errors import RaygeomError
from raygeom.params import MAX_BATCH, MAX_COUNT, MAX_SEED, MAX_TOKENS, MAX_WIDTH, MAX_WORKERS, Params, number_list, param
from raygeom.store.tree import Store, content_key, write_rows

TRAIN_VERSION = 1
DATA_SEED = 0


@dataclass(frozen=True)
class TrainSettings(Params):
    corpus: str = param("bbc", "Training corpus (as --corpus).", nonempty=True)
    steps: int = param(600, "Optimiser steps.", low=1, high=MAX_COUNT)
    batch_size: int = param(16, "Sequences per step (a multiple of workers).", low=2, high=MAX_BATCH)
    seq_len: int = param(128, "Tokens per training sequence.", low=2, high=MAX_TOKENS)
    lr: float = param(2e-3, "Peak learning rate.", low=0.0, low_open=True, high=10.0)
    warmup: int = param(50, "Linear warm-up steps.", low=0, high=MAX_COUNT)
    weight_decay: float = param(0.01, "AdamW weight decay.", low=0.0, high=10.0)
    hidden_size: int = param(128, "Model width d (a multiple of n_heads).", low=1, high=MAX_WIDTH)
    n_layers: int = param(4, "Blocks.", low=1, high=10_000)
    n_heads: int = param(4, "Attention heads.", low=1, high=MAX_WIDTH)
    vocab_size: int = param(4096, "BPE vocabulary (at least the 260-symbol byte alphabet).", low=260, high=10_000_000)
    push_layer: str = param("final_norm", "Layer whose dispersion the push-away loss raises.", nonempty=True)
    over: str = param(
        "tokens", "What D_batch spreads: tokens, or last/mean pooled sequences.", choices=("tokens", "last", "mean")
    )
    lam: float = param(0.0, "Push-away weight lambda (0: plain LM loss).", low=0.0, high=1e6)
    seed: int = param(0, "Seed of the initialisation and batches.", low=0, high=MAX_SEED)
    eval_every: int = param(100, "Steps between held-out evaluations.", low=1, high=MAX_COUNT)
    eval_sequences: int = param(128, "Held-out sequences per evaluation.", low=1, high=MAX_COUNT)
    heldout_fraction: float = param(0.1, "Share of the articles held out.", low=0.0, high=1.0, low_open=True, high_open=True)
    max_texts: int = param(0, "Texts of the corpus used (0: all).", low=0, high=MAX_COUNT)
    workers: int = param(1, "Data-parallel workers (Ray Train); one runs as a single Ray task.", low=1, high=MAX_WORKERS)
    use_gpu: bool = param(False, "One GPU per worker.")
    cpus_per_worker: float = param(1.0, "CPUs each worker asks Ray for.", low=0.0, low_open=True, high=1024.0)

    def __post_init__(self):
        super().__post_init__()
        if self.steps < 1 or self.batch_size < 2 or self.seq_len < 2:
            raise RaygeomError("steps must be >= 1, batch-size >= 2 and seq-len >= 2")
        if self.workers < 1 or self.batch_size % self.workers:
            raise RaygeomError(f"batch-size ({self.batch_size}) must be a positive multiple of workers ({self.workers})")
        if self.hidden_size % self.n_heads:
            raise RaygeomError(f"hidden-size {self.hidden_size} must be divisible by the {self.n_heads} heads")
        if self.over not in ("tokens", "last", "mean"):
            raise RaygeomError(f"over must be tokens, last or mean, got '{self.over}'")
        if self.over != "tokens" and self.batch_size // self.workers < 2:
            raise RaygeomError("pooled D_batch needs at least 2 sequences per worker")
        if not math.isfinite(self.lam) or self.lam < 0:
            raise RaygeomError(f"lambda must be a non-negative number, got {self.lam}")
        if self.lr <= 0 or self.eval_every < 1 or self.eval_sequences < 1 or self.vocab_size < 260:
            raise RaygeomError("lr and eval-every must be positive, vocab-size at least 260 (the byte alphabet)")
        if self.cpus_per_worker <= 0:
            raise RaygeomError("cpus-per-worker must be positive")

    def with_run(self, lam: float, seed: int) -> "TrainSettings":
        return replace(self, lam=float(lam), seed=int(seed))

    def data_fields(self) -> tuple:
        return (self.corpus, self.seq_len, self.vocab_size, self.eval_sequences, self.heldout_fraction, self.max_texts)

    def key(self) -> str:
        fields = asdict(self)
        for name in ("use_gpu", "cpus_per_worker"):
            fields.pop(name)
        return content_key("train", TRAIN_VERSION, fields)


@dataclass(frozen=True)
class TrainData:
    train: np.ndarray  # (n, seq_len) int64
    heldout: np.ndarray  # (m, seq_len) int64
    vocab_size: int
    eos_id: int
    tokenizer: object = None  # what checkpoints save beside the weights
    heldout_texts: tuple = ()  # the held-out articles, whole, with their labels
    heldout_labels: tuple | None = None
    corpus_fingerprint: str | None = None  # of the corpus as loaded, before the split (provenance)


LOG_SAVES_UNTIL = 512
CHECKPOINT_INFO = "raygeom_checkpoint.json"


def checkpoint_steps(steps: int, save_every: int, log_until: int = LOG_SAVES_UNTIL) -> tuple[int, ...]:
    """Pythia's schedule fitted to a run of ``steps``: step 0, the powers of two up to ``log_until``
    (1, 2, 4, ..., 512), then every ``save_every`` steps after that, and the last step."""
    if steps < 1 or save_every < 1 or log_until < 0:
        raise RaygeomError("checkpoint schedule: steps and save-every must be positive, log-until non-negative")
    chosen = {0}
    power = 1
    while power <= min(log_until, steps):
        chosen.add(power)
        power *= 2
    start = max(chosen)
    chosen.update(range((start // save_every + 1) * save_every, steps + 1, save_every))
    chosen.add(steps)
    return tuple(sorted(chosen))


@dataclass(frozen=True)
class CheckpointPlan:
    run_dir: str  # absolute: Ray Train workers do not run in the driver's working directory
    steps: tuple[int, ...]

    def key(self, settings: "TrainSettings") -> str:
        return content_key("trajectory", settings.key(), list(self.steps))


def _write_checkpoint(run_dir: Path, step: int, core, tokenizer, info: dict) -> None:
    """``<run_dir>/step<N>/`` written under a temporary name and renamed into place."""
    final = run_dir / f"step{step}"
    staging = run_dir / f".staging-step{step}"
    shutil.rmtree(staging, ignore_errors=True)
    core.save_pretrained(staging, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(staging)
    (staging / CHECKPOINT_INFO).write_text(json.dumps(info, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on ``texts`` (deterministic for given texts)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def sequences(tokenizer, texts: list[str], seq_len: int) -> np.ndarray:
    """Texts joined by EOS, cut into consecutive full ``seq_len`` sequences."""
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        stream.extend(ids)
        stream.append(eos)
    n = len(stream) // seq_len
    return np.asarray(stream[: n * seq_len], dtype=np.int64).reshape(n, seq_len)


@lru_cache(maxsize=4)
def prepare_data(data_fields: tuple) -> TrainData:
    """The fixed article split, tokenizer and sequences shared by every run with these data settings."""
    from raygeom.sources.corpus import load_corpus

    corpus_name, seq_len, vocab_size, eval_sequences, heldout_fraction, max_texts = data_fields
    corpus = load_corpus(corpus_name)
    order = np.random.default_rng([DATA_SEED, 0x7E57]).permutation(len(corpus.texts))
    if max_texts:
        order = order[:max_texts]
    n_heldout = max(1, int(round(heldout_fraction * len(order))))
    if len(order) - n_heldout < 1:
        raise RaygeomError(f"corpus '{corpus_name}' has too few texts to hold some out")
    heldout_index = sorted(order[:n_heldout])
    heldout_texts = [corpus.texts[i] for i in heldout_index]
    train_texts = [corpus.texts[i] for i in sorted(order[n_heldout:])]
    tokenizer = train_tokenizer(train_texts, vocab_size)
    train, heldout = sequences(tokenizer, train_texts, seq_len), sequences(tokenizer, heldout_texts, seq_len)[:eval_sequences]
    if len(train) < 2 or len(heldout) < 1:
        raise RaygeomError(f"corpus '{corpus_name}' gives too little text for {seq_len}-token sequences")
    labels = tuple(corpus.labels[i] for i in heldout_index) if corpus.labels is not None else None
    return TrainData(
        train, heldout, len(tokenizer), tokenizer.eos_token_id, tokenizer, tuple(heldout_texts), labels, corpus.fingerprint()
    )


def build_model(settings: TrainSettings, vocab_size: int, eos_id: int):
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(settings.seed)
    config = GPTNeoXConfig(
        vocab_size=vocab_size,
        hidden_size=settings.hidden_size,
        num_hidden_layers=settings.n_layers,
        num_attention_heads=settings.n_heads,
        intermediate_size=4 * settings.hidden_size,
        max_position_embeddings=settings.seq_len,
        tie_word_embeddings=False,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    return GPTNeoXForCausalLM(config)


def lm_and_dispersion(model, core, batch, layer: str, over: str):
    """(mean next-token NLL, D_batch of ``layer``) from one forward pass; both carry gradients."""
    from raygeom.numerics.dispersion import push_away_loss
    from raygeom.replica.tokens import capture_token_layers

    captured = {}
    with capture_token_layers(core, [layer], lambda name, hidden, captured=captured: captured.__setitem__(name, hidden)):
        output = model(input_ids=batch, labels=batch, use_cache=False)
    return output.loss, push_away_loss(captured[layer], over=over)


def evaluate(core, heldout, layer: str, batch_size: int = 16) -> dict:
    """Held-out perplexity (exp of mean token NLL) and mean per-sequence token dispersion at ``layer``."""
    import torch

    from raygeom.numerics.dispersion import token_dispersion
    from raygeom.replica.tokens import capture_token_layers

    was_training = core.training
    core.eval()
    total, count, dispersions = 0.0, 0, []
    device = next(core.parameters()).device
    with torch.no_grad():
        for start in range(0, len(heldout), batch_size):
            batch = heldout[start : start + batch_size].to(device)
            captured = {}
            with capture_token_layers(core, [layer], lambda name, hidden, captured=captured: captured.__setitem__(name, hidden)):
                logits = core(input_ids=batch, use_cache=False).logits
            nll = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1), reduction="sum"
            )
            total += float(nll)
            count += batch[:, 1:].numel()
            dispersions.append(token_dispersion(captured[layer].float()))
    core.train(was_training)
    return {
        "heldout_loss": total / count,
        "heldout_perplexity": math.exp(total / count),
        "heldout_dispersion": float(np.nanmean(np.concatenate(dispersions))),
    }


def estimate_training_seconds(settings: TrainSettings, checkpoints: int, probe_steps: int = 5) -> float:
    """Wall seconds a run should take on this machine, from timing ``probe_steps`` optimiser steps in this process
    (with the run's threads): its steps, plus one held-out evaluation per checkpoint and per ``eval_every`` steps,
    each costing about a third of a training step (forward only) per batch of held-out sequences."""
    data = prepare_data(settings.data_fields())
    quick = replace(settings, warmup=0, eval_every=MAX_COUNT)  # no evaluation inside the pilot
    heldout = replace(data, heldout=data.heldout[:1])

    def seconds(steps: int) -> float:
        started = time.perf_counter()
        fit(replace(quick, steps=steps), heldout)
        return time.perf_counter() - started

    seconds(1 + probe_steps)  # warms up (allocator, kernels, lazy imports); not counted
    # The fastest of two of each: one stall (a page fault, another process) would otherwise count for every step.
    per_step = max(min(seconds(1 + probe_steps) for _ in range(2)) - min(seconds(1) for _ in range(2)), 1e-3) / probe_steps
    evaluations = checkpoints + settings.steps // settings.eval_every
    return per_step * (settings.steps + evaluations * max(1.0, len(data.heldout) / settings.batch_size) / 3)


def fit(
    settings: TrainSettings,
    data: TrainData,
    rank: int = 0,
    world: int = 1,
    prepare=None,
    report=None,
    checkpoints: CheckpointPlan | None = None,
) -> list[dict]:
    """The training loop, shared by the Ray workers and in-process use; returns the per-step log.

    ``prepare`` wraps the model for data parallelism (Ray Train's ``prepare_model``),
    ``report`` receives the metrics every ``eval_every`` steps on every rank; with
    ``checkpoints``, rank 0 saves and evaluates the model at each of its steps (0 = the initial weights).
    """
    import torch
    import torch.distributed as dist

    from raygeom.replica.tokens import token_layer_names

    if not settings.use_gpu:
        torch.set_num_threads(max(1, int(settings.cpus_per_worker)))
    model = build_model(settings, data.vocab_size, data.eos_id)
    names = token_layer_names(model)
    if settings.push_layer not in names:
        raise RaygeomError(f"push layer '{settings.push_layer}' not in this model: {', '.join(names)}")
    model = prepare(model) if prepare else model
    core = model.module if hasattr(model, "module") else model
    device = next(core.parameters()).device
    train = torch.from_numpy(data.train)
    heldout = torch.from_numpy(data.heldout)
    decay = [p for p in core.parameters() if p.ndim >= 2]
    no_decay = [p for p in core.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr,
        betas=(0.9, 0.95),
    )

    def schedule(step: int) -> float:
        if step < settings.warmup:
            return (step + 1) / settings.warmup
        progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    rng = np.random.default_rng([settings.seed, 0xDA7A])
    per_worker = settings.batch_size // world
    history = []
    saves = set(checkpoints.steps) if checkpoints is not None and rank == 0 else set()
    plan_key = checkpoints.key(settings) if saves else None

    def save(step: int, evaluation: dict | None = None) -> dict:
        evaluation = evaluation or evaluate(core, heldout, settings.push_layer)
        _write_checkpoint(
            Path(checkpoints.run_dir),
            step,
            core,
            data.tokenizer,
            {"key": plan_key, "step": step, "lam": settings.lam, "seed": settings.seed, **evaluation},
        )
        return evaluation

    if 0 in saves:
        save(0)
    model.train()
    for step in range(1, settings.steps + 1):
        indices = rng.integers(0, len(train), settings.batch_size)[rank * per_worker : (rank + 1) * per_worker]
        batch = train[torch.from_numpy(indices)].to(device)
        lm, d_batch = lm_and_dispersion(model, core, batch, settings.push_layer, settings.over)
        loss = lm - settings.lam * d_batch
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(core.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        values = torch.tensor([float(loss.detach()), float(lm.detach()), float(d_batch.detach())], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(values)
            values /= world
        row = {
            "step": step,
            "loss": float(values[0]),
            "lm_loss": float(values[1]),
            "perplexity": math.exp(float(values[1])),
            "dispersion": float(values[2]),
            "lr": float(scheduler.get_last_lr()[0]),
            "heldout_loss": None,
            "heldout_perplexity": None,
            "heldout_dispersion": None,
        }
        due = step % settings.eval_every == 0 or step == settings.steps
        if rank == 0 and (due or step in saves):
            row.update(evaluate(core, heldout, settings.push_layer))
        if step in saves:
            save(step, {k: row[k] for k in ("heldout_loss", "heldout_perplexity", "heldout_dispersion")})
        history.append(row)
        if report and due:
            report({k: v for k, v in row.items() if v is not None})
    return history


def checkpoint_evaluations(run_dir: str | Path) -> list[dict]:
    """Each saved checkpoint's held-out evaluation (loss, perplexity, dispersion), in step order."""
    rows = []
    for path in Path(run_dir).glob(f"step*/{CHECKPOINT_INFO}"):
        try:
            rows.append({"revision": path.parent.name, **json.loads(path.read_text())})
        except (OSError, json.JSONDecodeError):
            continue
    return sorted(rows, key=lambda r: r["step"])


PROVENANCE = ("model", "corpus", "corpus_fingerprint", "chunk_len", "step", "raygeom_version")


def summarise(rows: list[dict]) -> list[dict]:
    """Per lambda over seeds: held-out perplexity mean/std, and against lambda=0 on the same seeds the paired
    difference with its paired t-test (t, two-sided p, 95 % t-interval) and how many seeds went lower / higher."""

    from raygeom.errors import InputError
    from raygeom.numerics.distributions import t_quantile
    from raygeom.numerics.uncertainty import paired_t

    plain = {r["seed"]: r["heldout_perplexity"] for r in rows if r["lam"] == 0.0}
    out = []
    for lam in sorted({r["lam"] for r in rows}):
        part = sorted((r for r in rows if r["lam"] == lam), key=lambda r: r["seed"])
        ppl = np.array([r["heldout_perplexity"] for r in part])
        disp = np.array([r["heldout_dispersion"] for r in part])
        paired = [r for r in part if r["seed"] in plain]
        try:
            test = paired_t([r["heldout_perplexity"] for r in paired], [plain[r["seed"]] for r in paired])
            half = t_quantile(0.975, test["df"]) * test["se"]
            test.update(lo=test["mean_diff"] - half, hi=test["mean_diff"] + half)
        except InputError:  # fewer than 2 paired seeds
            test = {"t": float("nan"), "p": float("nan"), "df": 0, "lo": float("nan"), "hi": float("nan")}
        deltas = np.array([r["heldout_perplexity"] - plain[r["seed"]] for r in paired])
        out.append(
            {
                "lam": lam,
                "n_seeds": len(part),
                "heldout_perplexity_mean": float(ppl.mean()),
                "heldout_perplexity_std": float(ppl.std(ddof=1)) if len(ppl) > 1 else float("nan"),
                "heldout_dispersion_mean": float(disp.mean()),
                "heldout_dispersion_std": float(disp.std(ddof=1)) if len(disp) > 1 else float("nan"),
                "paired_delta_mean": float(deltas.mean()) if len(deltas) else float("nan"),
                "paired_delta_std": float(deltas.std(ddof=1)) if len(deltas) > 1 else float("nan"),
                "paired_delta_lo": test["lo"],
                "paired_delta_hi": test["hi"],
                "paired_t": test["t"],
                "paired_df": test["df"],
                "paired_p": test["p"],
                "n_lower": int((deltas < 0).sum()),
                "n_higher": int((deltas > 0).sum()),
                "seeds": ",".join(str(r["seed"]) for r in part),
                "heldout_perplexities": " / ".join(f"{r['heldout_perplexity']:.2f}" for r in part),
                **{name: part[0].get(name) for name in PROVENANCE if name in part[0]},
                **_shared_settings(part),
            }
        )
    return out


def _shared_settings(part: list[dict]) -> dict:
    """The settings every run of a summary row shares (a run's own, without its lambda and seed)."""
    if not part[0].get("settings"):
        return {}
    fields = json.loads(part[0]["settings"])
    for name in ("lam", "seed"):
        fields.pop(name, None)
    return {"settings": json.dumps(fields, sort_keys=True)}


@dataclass(frozen=True)
class TrainRuns(Params):
    """What makes training runs of TrainSettings, declared once for `raygeom train` and [train]: the seed list and
    the checkpoint schedule."""

    seeds: str = param(
        "0",
        "Comma-separated seeds; each lambda runs with each seed.",
        nonempty=True,
        rule=number_list(low=0, high=MAX_SEED, integers=True),
    )
    save_every: int = param(
        0,
        "Save HF checkpoints (model + tokenizer): step 0, 1, 2, 4, ... --log-until, then every N steps. 0: no checkpoints.",
        low=0,
        high=MAX_COUNT,
    )
    log_until: int = param(512, "Last log-spaced checkpoint step.", low=0, high=MAX_COUNT)
    run_dir: Optional[str] = param(
        None,
        "Where checkpoints go (one run only); default "
        "<out>/checkpoints/lam<lambda>-seed<seed>. A sweep source: [[models]] run_dir = ...",
        nonempty=True,
    )


RUN_COLUMNS = (
    "lam",
    "seed",
    "steps",
    "workers",
    "push_layer",
    "over",
    "final_train_loss",
    "heldout_perplexity",
    "heldout_dispersion",
    "n_train_sequences",
    "n_heldout_sequences",
    "wall_s",
)


def write_tables(store: Store, rows: list[dict], summary: list[dict]) -> dict:
    """``results/train_runs.parquet`` (every run stored in this store) and ``results/train_summary.parquet`` (this
    job's lambdas over its seeds); raygeom.report.dispersion_plots.plot_training draws them."""
    from raygeom.engine.units import accumulated_rows

    job_rows = [{k: v for k, v in r.items() if k != "cached"} for r in rows]
    runs = write_rows(accumulated_rows(store, "train_runs", job_rows), store.root / "results" / "train_runs.parquet")
    table = write_rows(summary, store.root / "results" / "train_summary.parquet")
    return {"table": table, "runs": runs}
