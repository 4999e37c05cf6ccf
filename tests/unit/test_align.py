"""Texts cut so that tokenizers with different vocabularies read them to the same character."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from raygeom.errors import RaygeomError
from raygeom.sources.align import common_prefix, kept_characters
from raygeom.sources.corpus import Corpus


def word_tokenizer(words, bos=False):
    vocab = {"[UNK]": 0, "<bos>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if bos:
        from tokenizers.processors import TemplateProcessing

        tok.post_processor = TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<bos>")


def char_tokenizer():
    tok = Tokenizer(
        models.WordLevel({"[UNK]": 0, **{c: i + 1 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}}, unk_token="[UNK]")
    )
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def test_kept_characters_counts_what_survives_truncation_including_bos():
    words = word_tokenizer(["alpha", "beta", "gamma"], bos=True)
    assert kept_characters(words, "alpha beta gamma", 3) == len("alpha beta")  # <bos> takes one of the 3
    assert kept_characters(words, "alpha beta gamma", 10) == len("alpha beta gamma")


def test_texts_are_cut_where_every_tokenizer_reads_them_whole():
    words = word_tokenizer(["alpha", "beta", "gamma", "delta"])
    chars = char_tokenizer()
    text = "alpha beta gamma delta"
    corpus, n_cut = common_prefix(Corpus("c", [text, "beta"], ["x", "y"]), {"words": words, "chars": chars}, seq_len=12)
    # every character (spaces too, as [UNK]) is one token of the char tokenizer: it keeps 12 characters,
    # which end inside "gamma"; the word tokenizer keeps all 4 words, so the char tokenizer decides
    assert corpus.texts[0] == "alpha beta g"
    assert corpus.texts[1] == "beta" and n_cut == 1 and corpus.labels == ["x", "y"]
    for tok in (words, chars):
        assert kept_characters(tok, corpus.texts[0], 12) == len(corpus.texts[0])
    assert corpus.name == "c[aligned@12]"


def test_a_text_no_tokenizer_can_start_is_refused():
    with pytest.raises(RaygeomError, match="keep no characters"):
        common_prefix(Corpus("c", ["alpha beta"]), {"bos": word_tokenizer(["alpha"], bos=True)}, seq_len=1)
