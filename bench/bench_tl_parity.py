"""Parity of raygeom's points inside blocks with TransformerLens 4.3's hooks on SmolLM2-135M-Instruct (Q4_1,
dequantised): ``block_XX.attn_out`` / ``.resid_mid`` / ``.mlp_out`` against ``blocks.XX.hook_attn_out`` /
``hook_resid_mid`` / ``hook_mlp_out``, and ``block_XX`` against ``hook_resid_post``, at every position of every text.

Not part of ``make test``: TransformerLens 4.3 pulls wandb, datasets and more, so it lives in its own venv that
shares torch 2.13.0 (CPU) and transformers 5.24.0 with the project's::

    python3 -m venv /tmp/tlvenv && /tmp/tlvenv/bin/pip install torch==2.13.0 transformers==5.24.0 transformer-lens==4.3.0
    .venv/bin/raygeom pga --model smollm2 -n 12 --layers 0    # once: makes the dequantised copy under ~/.cache/raygeom
    HF_HUB_OFFLINE=1 PYTHONPATH=. /tmp/tlvenv/bin/python bench/bench_tl_parity.py

TransformerLens runs its bridge on raw HF weights (``TransformerBridge.boot_transformers``, no LayerNorm folding and
no weight centring; ``enable_compatibility_mode()`` would centre the residual stream, a different vector). Both
sides run the same fp32 weights in eager attention, one text at a time (no padding). Prints the largest absolute
difference and the largest relative one (||a - b|| / ||b|| per position) of each hook point over all 30 blocks.
"""

from __future__ import annotations

import argparse
import glob
import inspect
import json
import os
import sys
import time
from pathlib import Path

import torch
from markdown_section import section_if_asked  # --markdown


def default_model_dir() -> str:
    found = sorted(glob.glob(str(Path.home() / ".cache" / "raygeom" / "dequantised" / "SmolLM2-135M-Instruct.Q4_1-*")))
    if not found:
        raise SystemExit("no dequantised SmolLM2 copy: run `.venv/bin/raygeom pga --model smollm2 -n 12 --layers 0` once")
    return found[-1]


def stdlib_texts(n: int) -> list[str]:
    """Real English prose on every machine: the docstrings of standard-library modules."""
    import collections
    import email
    import json as json_module
    import logging
    import pathlib
    import subprocess
    import textwrap
    import threading
    import unittest
    import urllib.request

    texts = []
    for module in (collections, email, json_module, logging, pathlib, subprocess, textwrap, threading, unittest, urllib.request):
        for _, member in inspect.getmembers(module):
            doc = inspect.getdoc(member) if callable(member) else None
            if doc and len(doc.split()) > 20:
                texts.append(" ".join(doc.split()))
    texts = sorted(set(texts))
    return texts[:: max(1, len(texts) // n)][:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=None, help="the dequantised SmolLM2 copy (default: raygeom's cache)")
    parser.add_argument("--n-texts", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    import transformer_lens
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from raygeom.replica.extract import capture_layers
    from raygeom.sources import model_surgery

    torch.set_grad_enabled(False)
    directory = args.model_dir or default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    # Two separate copies of the weights: the bridge wraps its own, so raygeom's hooks never sit on its modules.
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
    theirs_model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
    start = time.perf_counter()
    bridge = TransformerBridge.boot_transformers(directory, hf_model=theirs_model, tokenizer=tokenizer, device="cpu")
    boot_seconds = time.perf_counter() - start
    n_blocks = model_surgery.n_blocks(model)
    names = model_surgery.layer_names(model)
    points = {"attn_out": "hook_attn_out", "resid_mid": "hook_resid_mid", "mlp_out": "hook_mlp_out", "": "hook_resid_post"}
    wanted = [f"{block}.{sub}" if sub else block for block in names[1:-1] for sub in points]
    worst = {sub or "block": {"max_abs": 0.0, "max_rel": 0.0, "max_norm": 0.0} for sub in points}
    texts = stdlib_texts(args.n_texts)
    for text in texts:
        ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=args.seq_len)["input_ids"]
        ours: dict[str, torch.Tensor] = {}
        with capture_layers(model, wanted, lambda name, hidden, ours=ours: ours.__setitem__(name, hidden.detach().clone())):
            model_surgery.base_model(model)(input_ids=ids, use_cache=False)
        _, cache = bridge.run_with_cache(ids)
        for index in range(n_blocks):
            for sub, hook in points.items():
                mine = ours[f"{names[index + 1]}.{sub}" if sub else names[index + 1]][0]
                theirs = cache[f"blocks.{index}.{hook}"][0].to(mine.dtype)
                diff = (mine - theirs).norm(dim=-1)
                record = worst[sub or "block"]
                record["max_abs"] = max(record["max_abs"], float((mine - theirs).abs().max()))
                record["max_rel"] = max(record["max_rel"], float((diff / theirs.norm(dim=-1).clamp_min(1e-12)).max()))
                record["max_norm"] = max(record["max_norm"], float(theirs.norm(dim=-1).max()))
    print(
        f"TransformerLens {getattr(transformer_lens, '__version__', '4.3')} TransformerBridge (raw weights, eager attention) "
        f"vs raygeom hooks; {os.path.basename(directory)}; {len(texts)} texts of <= {args.seq_len} tokens, all "
        f"{n_blocks} blocks, every position; bridge boot {boot_seconds:.1f} s"
    )
    for sub, hook in points.items():
        record = worst[sub or "block"]
        print(
            f"  {('block_XX.' + sub) if sub else 'block_XX':<20} vs {hook:<16} max |diff| {record['max_abs']:.3e}   "
            f"max ||diff||/||TL|| {record['max_rel']:.3e}   (largest ||TL|| {record['max_norm']:.1f})"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"texts": len(texts), "seq_len": args.seq_len, "blocks": n_blocks, "points": worst}, indent=2)
        )


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # each figure as it is measured, also into a pipe or a log
    with section_if_asked(__file__):
        main()
