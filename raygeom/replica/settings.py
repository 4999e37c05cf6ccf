"""How texts become one vector per layer: the extraction settings, declared once (type, range, help) for the CLI
flags, the ``[extract]`` section and validation. No torch here, so a bad value is refused before any model code loads."""

from __future__ import annotations

from dataclasses import dataclass

from raygeom.params import MAX_BATCH, MAX_TOKENS, Params, param

POOLS = ("last", "mean")


@dataclass(frozen=True)
class ExtractionSettings(Params):
    """How texts become one vector per layer: truncated to ``seq_len`` tokens, pooled by the ``last`` real token
    or the ``mean`` over tokens (``skip_first`` drops each text's first token from the mean: its activation is
    orders of magnitude larger in many LMs), in forward batches of ``batch_size``. The CLI's ``--seq-len``,
    ``--pool``, ``--skip-first/--keep-first`` and ``--batch-size``."""

    seq_len: int = param(128, "Tokens per text (longer texts are cut).", low=1, flag="--seq-len", high=MAX_TOKENS)
    pool: str = param("last", "last | mean: the last real token, or the mean over tokens.", choices=POOLS)
    skip_first: bool = param(True, "With pool mean, drop each text's first token.", flag="--skip-first")
    batch_size: int = param(16, "Texts per forward batch.", low=1, flag="--batch-size", high=MAX_BATCH)


def batches_at_once(described: dict) -> int:
    """How many batches to hand a replica per call: as many as it runs at once (its CPU threads; one on a GPU)."""
    return max(1, int(described.get("threads") or 1)) if described.get("device") == "cpu" else 1
