"""The one way raygeom turns text into token ids, for every forward pass it makes.

Special tokens are added exactly as the tokenizer adds them for the model it was
trained with (``add_special_tokens=True``): Gemma's ``<bos>`` is kept, a
GPT-NeoX or SmolLM2 tokenizer adds nothing. Fixed-length token chunks start
with the same prefix. Padding follows the tokenizer's side unless asked
otherwise; a tokenizer without a pad token pads with its EOS token (padding is
always masked out).
"""

from __future__ import annotations

import numpy as np

from raygeom.errors import RaygeomError

SEPARATOR = "\n\n"
PADDING_SIDES = ("left", "right")
_PROBE = "Probe text 12"


def prepare(tokenizer, padding_side: str | None = None):
    """Give the tokenizer a pad token and, if asked, a padding side; returns it."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise RaygeomError("the tokenizer has neither a pad nor an EOS token to pad batches with")
        tokenizer.pad_token = tokenizer.eos_token
    if padding_side is not None:
        if padding_side not in PADDING_SIDES:
            raise RaygeomError(f"padding side must be left or right, got '{padding_side}'")
        tokenizer.padding_side = padding_side
    return tokenizer


def special_prefix(tokenizer) -> list[int]:
    """Ids the tokenizer puts before any text (e.g. ``[<bos>]``), found by encoding a probe with and without them."""
    plain = tokenizer(_PROBE, add_special_tokens=False)["input_ids"]
    full = tokenizer(_PROBE, add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return list(full[:start])
    return []


def encode(tokenizer, texts: list[str], seq_len: int, padding_side: str | None = None) -> dict[str, np.ndarray]:
    """(B, T) int64 ``input_ids`` and ``attention_mask`` of a batch, T <= seq_len, special tokens as trained.

    Long texts keep their beginning (and so their BOS)."""
    prepare(tokenizer)
    side = tokenizer.padding_side
    try:
        if padding_side is not None:
            prepare(tokenizer, padding_side)
        encoded = tokenizer(
            list(texts), add_special_tokens=True, padding=True, truncation=True, max_length=seq_len, return_tensors="np"
        )
    finally:
        tokenizer.padding_side = side
    return {
        "input_ids": np.asarray(encoded["input_ids"], dtype=np.int64),
        "attention_mask": np.asarray(encoded["attention_mask"], dtype=np.int64),
    }


def text_ids(tokenizer, text: str) -> list[int]:
    """A text's own tokens, without special tokens: a piece of a longer token stream."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def make_chunks(
    tokenizer, texts: list[str], labels: list[str] | None, chunk_len: int, chunks_per_domain: int, seed: int
) -> tuple[np.ndarray, list[str]]:
    """(n, chunk_len) int64 token chunks and their domain labels.

    Per domain (one domain ``all`` without labels), texts in a seeded order are
    tokenized without special tokens, joined with a blank line and cut into
    consecutive pieces; each chunk is the tokenizer's special prefix (BOS, when
    it adds one) followed by ``chunk_len - len(prefix)`` tokens of that stream.
    The first ``chunks_per_domain`` chunks are kept; only as many texts as
    needed are tokenized.
    """
    if chunk_len < 2 or chunks_per_domain < 1:
        raise RaygeomError(f"need chunk-len >= 2 and chunks-per-domain >= 1, got {chunk_len}, {chunks_per_domain}")
    prefix = special_prefix(tokenizer)
    body = chunk_len - len(prefix)
    if body < 2:
        raise RaygeomError(
            f"chunk-len {chunk_len} leaves fewer than 2 text tokens after the tokenizer's {len(prefix)} special tokens"
        )
    labels = labels if labels is not None else ["all"] * len(texts)
    separator = text_ids(tokenizer, SEPARATOR)
    chunks, domains = [], []
    for domain in sorted(set(labels)):
        members = [i for i, label in enumerate(labels) if label == domain]
        order = np.random.default_rng([seed, 0xD15]).permutation(len(members))
        need = body * chunks_per_domain
        stream: list[int] = []
        for position in order:
            stream.extend(text_ids(tokenizer, texts[members[position]]))
            if len(stream) >= need:
                break
            stream.extend(separator)
        have = min(chunks_per_domain, len(stream) // body)
        if have < chunks_per_domain:
            raise RaygeomError(
                f"domain '{domain}' yields {have} chunks of {chunk_len} tokens, fewer than the {chunks_per_domain} asked for"
            )
        pieces = np.asarray(stream[:need], dtype=np.int64).reshape(chunks_per_domain, body)
        head = np.tile(np.asarray(prefix, dtype=np.int64), (chunks_per_domain, 1))
        chunks.append(np.concatenate([head, pieces], axis=1))
        domains += [domain] * chunks_per_domain
    return np.concatenate(chunks), domains


def predicted_bytes(tokenizer, chunks: np.ndarray) -> np.ndarray:
    """(n,) UTF-8 bytes of the text each chunk's model predicts (its tokens after the first), for bits per byte.

    Decoded without special tokens. A character cut at a chunk's edge decodes as the replacement character,
    and a SentencePiece decoder drops a leading space: a few bytes in a chunk of thousands."""
    return np.array(
        [
            len(
                tokenizer.decode([int(t) for t in row[1:]], skip_special_tokens=True, clean_up_tokenization_spaces=False).encode(
                    "utf-8"
                )
            )
            for row in np.asarray(chunks)
        ],
        dtype=np.int64,
    )
