"""Texts that every model reads to the same end, whatever its tokenizer.

Each tokenizer truncates a long text to ``seq_len`` tokens at a different character, so the "last token"
pooled by two models would end different text. :func:`common_prefix` cuts every text at the longest
character prefix that every tokenizer keeps whole within ``seq_len`` tokens (special tokens as the model
was trained), then checks that each tokenizer reads each cut text to its last character.
"""

from __future__ import annotations

from raygeom.errors import RaygeomError
from raygeom.sources.corpus import Corpus


def kept_characters(tokenizer, text: str, seq_len: int) -> int:
    """How many leading characters of ``text`` the tokenizer keeps within ``seq_len`` tokens."""
    if not getattr(tokenizer, "is_fast", False):
        raise RaygeomError(f"aligning texts needs a fast tokenizer (character offsets); {type(tokenizer).__name__} is not")
    encoded = tokenizer(text, truncation=True, max_length=seq_len, return_offsets_mapping=True)
    ends = [end for start, end in encoded["offset_mapping"] if end > start]
    return max(ends, default=0)


def common_prefix(corpus: Corpus, tokenizers: dict[str, object], seq_len: int, passes: int = 4) -> tuple[Corpus, int]:
    """``corpus`` with each text cut where every tokenizer still reads all of it; and how many texts were cut."""
    texts = list(corpus.texts)
    cut = [False] * len(texts)
    for _ in range(passes):
        changed = False
        for i, text in enumerate(texts):
            # Trailing whitespace is not a token end in every tokenizer; the prefix ends on a character all keep.
            end = min(kept_characters(t, text, seq_len) for t in tokenizers.values())
            if end < len(text.rstrip()):
                texts[i] = text[:end].rstrip()
                cut[i] = changed = True
        if not changed:
            break
    else:
        names = ", ".join(tokenizers)
        raise RaygeomError(f"could not cut the texts so that {names} read them to the same end within {seq_len} tokens")
    empty = [i for i, text in enumerate(texts) if not text.strip()]
    if empty:
        raise RaygeomError(f"{len(empty)} texts keep no characters within {seq_len} tokens; raise --seq-len")
    return Corpus(f"{corpus.name}[aligned@{seq_len}]", texts, corpus.labels), sum(cut)
