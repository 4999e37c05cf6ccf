"""Tiny random-weight GPT-NeoX models written into a Hugging Face hub cache under real
Pythia repo ids and ``stepN`` revisions (raygeom.sources.tiny_pythia), corpora and jobs the tests build.

Used by the tests and benchmarks; handy for trying a sweep without downloads.
"""

from __future__ import annotations

import json
from pathlib import Path

from raygeom.sources.tiny_pythia import TINY_TEXT, tiny_gpt_neox, tiny_tokenizer, write_tiny_pythia  # noqa: F401 - the tests' names


def varied_text(i: int) -> str:
    """Line ``i`` of a test corpus: two words of TINY_TEXT and a letter, at most 11 tokens of the tiny tokenizer, so it
    is whole within any test's seq_len and its tokens, the last one included, differ from line to line. PGA scores a
    layer only with rank k + 2 left after CCR-r, and the embedding layer sees only the last token: a corpus whose
    texts share their first seq_len tokens, or their last token, has too few distinct rows to be scored."""
    words = list(dict.fromkeys(TINY_TEXT.replace(".", " ").split()))
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return f"{words[i % len(words)]} {words[(5 * i + 3) % len(words)]} {letters[(7 * i) % len(letters)]}"


def write_labelled_corpus(path: Path, n: int, labels: int = 3) -> Path:
    """A .jsonl corpus of ``n`` distinct labelled articles in the manner of BBC News (years and numbers give the
    digit tokens the dispersion gap needs); what a tiny [train] job trains on and holds out."""
    path.write_text(
        "".join(
            json.dumps({"text": f"in {1990 + i} about {i * 7} {varied_text(i)} . " * 2, "label": f"topic{i % labels}"}) + "\n"
            for i in range(n)
        )
    )
    return path


TINY_JOB_SETTINGS = """[corpus]
name = "{corpus}"
n_samples = 40
[extract]
seq_len = 32
batch_size = 8
[pga]
k = 8
n_null = 12
null_chunks = 2
"""


def write_tiny_job(path: Path, name: str, out, corpus, sweep: str = "", models: str = "", extra: str = "") -> Path:
    """A job file for a tiny sweep: 40 texts of 32 tokens, PGA with k=8 and 12 nulls in 2 chunks.

    ``sweep`` is the body of its [sweep] table, ``models`` its [[models]] tables, ``extra`` any further tables.
    """
    path.write_text(
        f'[job]\nname = "{name}"\nout = "{out}"\n[sweep]\n{sweep}\n{models}\n' + TINY_JOB_SETTINGS.format(corpus=corpus) + extra
    )
    return path


def tiny_bos_tokenizer(padding_side: str = "right"):
    """The tiny tokenizer, but adding ``<bos>`` before every text as Gemma's and Llama's do."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    base = tiny_tokenizer()
    inner = base.backend_tokenizer
    inner.add_special_tokens(["<bos>"])
    bos = inner.token_to_id("<bos>")
    inner.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=inner, eos_token="<|endoftext|>", pad_token="<|endoftext|>", bos_token="<bos>", padding_side=padding_side
    )


def tiny_llama(vocab_size: int, seed: int, hidden_size: int = 32, layers: int = 2):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=0,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


def write_tiny_bos_model(directory: Path, padding_side: str = "left", seed: int = 3) -> Path:
    """A tiny Llama whose tokenizer adds BOS, saved as a local model directory."""
    tokenizer = tiny_bos_tokenizer(padding_side)
    model = tiny_llama(len(tokenizer), seed)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return Path(directory)


def tiny_causal_lm(family: str, vocab_size: int = 320, seed: int = 0, hidden_size: int = 64, layers: int = 3, **extra):
    """A tiny random-weight causal LM of one of the families raygeom knows (``llama``, ``gemma3_text``,
    ``gpt_neox``, ``qwen2``, ...), for tests of hooks and layer names. ``extra`` goes to the config
    (e.g. ``use_parallel_residual=False`` for a sequential GPT-NeoX)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    heads = {"num_attention_heads": 4}
    sizes = {"gpt2": {"n_embd": hidden_size, "n_layer": layers, "n_head": 4, "n_positions": 512}}.get(
        family,
        {
            "hidden_size": hidden_size,
            "num_hidden_layers": layers,
            "intermediate_size": hidden_size * 2,
            "max_position_embeddings": 512,
            "num_key_value_heads": 4,
            **heads,
        },
    )
    if family.startswith("gemma"):
        sizes["head_dim"] = hidden_size // 4
    config = AutoConfig.for_model(
        family, vocab_size=vocab_size, tie_word_embeddings=False, pad_token_id=0, bos_token_id=0, eos_token_id=0, **sizes, **extra
    )
    return AutoModelForCausalLM.from_config(config).eval()


def _fresh_for_next_run(replica) -> None:
    """What a run leaves in a replica: batches held for its write, and the forward time its marker records."""
    replica.held.clear()
    replica.forward_seconds = 0.0


def _set_threads(replica, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    replica.threads = torch.get_num_threads()


class WarmReplicas:
    """Replica actors kept loaded between runs in one driver, for tests that rerun a job many times on one model.

    Starting a replica is a new Ray worker process that imports torch and transformers and loads the model: about
    7 s here, whatever the model's size. While this is active (``with WarmReplicas():``, in the driver only),
    ``raygeom.engine.replica_actor.create`` hands back a replica that an earlier run stopped, for the same spec and GPU
    share (with its torch threads set to what a new one would get), and ``stop`` clears what the run left in it and keeps
    it instead of killing it. Everything a replica does for a
    run (describe, run_batches, write_extraction) still runs; only the process and the loaded weights are reused.
    Kept replicas reserve no CPU (``num_cpus=0``, with the thread count the product gives them), so an idle one
    never holds back the analysis tasks of the next run."""

    def __init__(self):
        self.idle: dict[tuple, list] = {}
        self.keys: dict = {}
        self.started = 0
        self._saved = None

    def create(self, spec, gpus: float, cpus: int = 1, reserve_cpus: bool = True):
        """``replica_actor.create``'s signature; a kept replica reserves no CPU whatever ``reserve_cpus`` says."""
        from raygeom.engine import replica_actor

        key = (spec, float(gpus))
        options, device, device_map = replica_actor.replica_options(gpus, cpus)
        threads = options["num_cpus"] if device == "cpu" else None
        if self.idle.get(key):
            actor = self.idle[key].pop()
            if threads:  # as a new replica of these CPUs would have it
                actor.__ray_call__.remote(_set_threads, threads)
        else:
            actor = replica_actor.ReplicaActor.options(**{**options, "num_cpus": 0}).remote(spec, device, device_map, threads)
            self.started += 1
        self.keys[actor] = key
        return actor

    def stop(self, actor) -> None:
        import ray

        key = self.keys.pop(actor, None)
        if key is None:
            ray.kill(actor)
            return
        try:  # after any call still queued on it (an actor runs its calls in order)
            ray.get(actor.__ray_call__.remote(_fresh_for_next_run))
        except ray.exceptions.RayError:
            ray.kill(actor)
            return
        self.idle.setdefault(key, []).append(actor)

    def __enter__(self) -> "WarmReplicas":
        from raygeom.engine import replica_actor

        self._saved = (replica_actor.create, replica_actor.stop)
        replica_actor.create, replica_actor.stop = self.create, self.stop
        return self

    def __exit__(self, *exc) -> None:
        import ray

        from raygeom.engine import replica_actor

        replica_actor.create, replica_actor.stop = self._saved
        for actors in self.idle.values():
            for actor in actors:
                ray.kill(actor)
        self.idle.clear()
