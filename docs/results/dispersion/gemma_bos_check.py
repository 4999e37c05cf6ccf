# Run: HF_HUB_OFFLINE=1 PYTHONPATH=. python docs/results/dispersion/gemma_bos_check.py
"""Gemma-3-270M next-token NLL on the dispersion page's first chunk of each BBC topic, the same 511 text
tokens with and without <bos> in front (the old chunk path dropped it); perplexity and bits per byte."""

import math
import time

import torch

from raygeom.replica import tokenize
from raygeom.sources.corpus import load_corpus
from raygeom.sources.models import load_model, resolve_model

torch.set_num_threads(2)
t0 = time.time()
spec = resolve_model("gemma3", "main")
model, tok = load_model(spec, device="cpu")
model.eval()
print("loaded", round(time.time() - t0), "s", flush=True)
corpus = load_corpus("bbc")
chunks, domains = tokenize.make_chunks(tok, corpus.texts, corpus.labels, 512, 25, 0)
first = [domains.index(d) for d in sorted(set(domains))]
res = []
for i in first:
    new = chunks[i]  # [bos] + 511 text tokens
    text = new[1:]
    for label, ids in (("with_bos", new), ("without_bos", text)):
        x = torch.tensor(ids[None, :])
        with torch.inference_mode():
            logits = model(input_ids=x).logits[0, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="none").numpy()
        # score only the predictions of the same targets in both: text tokens 2..511 (the first text token
        # has no context without <bos>)
        tail = nll[-(len(text) - 1) :]
        nbytes = len(tok.decode(list(text[1:]), skip_special_tokens=True).encode("utf-8"))
        res.append(
            {
                "chunk": int(i),
                "domain": domains[i],
                "kind": label,
                "nats": float(tail.sum()),
                "tokens": int(tail.size),
                "bytes": nbytes,
            }
        )
        print(res[-1], round(time.time() - t0), "s", flush=True)
for kind in ("with_bos", "without_bos"):
    r = [x for x in res if x["kind"] == kind]
    nats, toks, byts = sum(x["nats"] for x in r), sum(x["tokens"] for x in r), sum(x["bytes"] for x in r)
    print(
        kind,
        "ppl",
        round(math.exp(nats / toks), 2),
        "bits/byte",
        round(nats / math.log(2) / byts, 3),
        "tokens",
        toks,
        "bytes",
        byts,
    )

print("total", round(time.time() - t0), "s")
