"""Tiny random-weight GPT-NeoX models written into a Hugging Face hub cache under real Pythia repo ids and ``stepN``
revisions, so the real hub-loading path runs offline: what the tests build, and what ``raygeom tiny-pythia DIR``
writes for trying a sweep without downloads (``HF_HUB_CACHE=DIR HF_HUB_OFFLINE=1``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

TINY_TEXT = (
    "the market rose as investors bought shares in technology firms . "
    "the minister said the government would publish the report next week . "
    "the team won the final after a late goal in extra time . "
    "the film opened to strong reviews and record ticket sales . "
    "new phones and laptops went on sale with faster chips . 0 1 2 3 4 5 6 7 8 9"
)


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([TINY_TEXT] * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>", bos_token="<|endoftext|>"
    )


def tiny_gpt_neox(vocab_size: int, seed: int, hidden_size: int = 64, layers: int = 3):
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(seed)
    config = GPTNeoXConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=hidden_size * 2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=0,
        bos_token_id=0,
        pad_token_id=0,
    )
    return GPTNeoXForCausalLM(config).eval()


def write_tiny_pythia(
    cache: Path,
    repo_id: str = "EleutherAI/pythia-14m",
    revisions: dict[str, int] | list[str] = ("step0", "step1000", "step143000"),
    hidden_size: int = 64,
    layers: int = 3,
) -> Path:
    """Write one snapshot per revision into an HF hub cache folder (the HF_HUB_CACHE layout).

    ``revisions`` maps a revision to a weight seed; revisions sharing a seed serve
    identical weights, like Pythia's known bad checkpoints. A list seeds by position.
    """
    if not isinstance(revisions, dict):
        revisions = {revision: index for index, revision in enumerate(revisions)}
    repo_dir = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    tokenizer = tiny_tokenizer()
    for revision, seed in revisions.items():
        commit = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
        snapshot = repo_dir / "snapshots" / commit
        if not (snapshot / "config.json").is_file():
            model = tiny_gpt_neox(len(tokenizer), 1000 + seed, hidden_size, layers)
            model.save_pretrained(snapshot)
            tokenizer.save_pretrained(snapshot)
        (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / revision).write_text(commit)
    (repo_dir / "raygeom-tiny.json").write_text(json.dumps({"revisions": revisions}))
    return repo_dir
