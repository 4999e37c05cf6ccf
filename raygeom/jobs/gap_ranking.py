"""The dispersion gap G's ranking of a run's checkpoints against their held-out perplexity: Spearman(G, -perplexity)
over every checkpoint and over the late ones, with intervals where the points allow one (numerics.uncertainty), and
which checkpoint G picks. Shared by the trajectory page and the width ladder's page."""

from __future__ import annotations

import math

import numpy as np


def rank_interval(x, y, n_boot: int, seed: int) -> dict:
    """Spearman with two 95% intervals (numerics.uncertainty): Fisher z with the Bonett-Wright variance, and a
    percentile bootstrap over the pairs (here: over checkpoints). Over fewer than 10 points or at |rho| = 1 there is
    no interval (NaN bounds): ``note`` says why and ``p_perm`` is the exact permutation p-value."""
    from raygeom.numerics.uncertainty import spearman_with_ci

    fisher = spearman_with_ci(x, y, seed=seed, method="fisher")
    boot = spearman_with_ci(x, y, seed=seed, method="bootstrap", n_boot=n_boot)
    return {
        "spearman": fisher["rho"],
        "fisher_lo": fisher["lo"],
        "fisher_hi": fisher["hi"],
        "boot_lo": boot["lo"],
        "boot_hi": boot["hi"],
        "n_boot": n_boot,
        "note": fisher["note"],
        "p_perm": fisher["p_perm"],
        "p_method": fisher["p_method"],
    }


def agreement(rows: list[dict], late_from: int, n_boot: int, seed: int) -> list[dict]:
    """Spearman(G, -held-out perplexity) over every checkpoint and over the late ones; and whether G's top
    checkpoint is the lowest-perplexity one."""
    out = []
    subsets = [("all checkpoints", rows), (f"steps >= {late_from}", [r for r in rows if (r["step"] or 0) >= late_from])]
    for name, part in subsets:
        row = {"subset": name, "n": len(part)}
        if len(part) >= 4:
            row.update(rank_interval([r["gap"] for r in part], [-r["heldout_perplexity"] for r in part], n_boot, seed))
        else:
            row.update(
                spearman=float("nan"),
                fisher_lo=float("nan"),
                fisher_hi=float("nan"),
                boot_lo=float("nan"),
                boot_hi=float("nan"),
                n_boot=0,
                note="fewer than 4 checkpoints",
                p_perm=float("nan"),
                p_method="",
            )
        if part:
            by_gap = max(part, key=lambda r: r["gap"])
            by_ppl = min(part, key=lambda r: r["heldout_perplexity"])
            top3 = {r["revision"] for r in sorted(part, key=lambda r: -r["gap"])[:3]}
            row.update(
                select_pick=by_gap["revision"],
                select_pick_step=by_gap["step"],
                select_pick_perplexity=by_gap["heldout_perplexity"],
                best_by_perplexity=by_ppl["revision"],
                best_perplexity=by_ppl["heldout_perplexity"],
                pick_is_best=by_gap["revision"] == by_ppl["revision"],
                best_in_select_top3=by_ppl["revision"] in top3,
                pick_perplexity_rank=int(
                    np.searchsorted(sorted(r["heldout_perplexity"] for r in part), by_gap["heldout_perplexity"]) + 1
                ),
            )
        out.append(row)
    return out


def fmt(value, digits: int = 2) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:+.{digits}f}"


def correlation_text(s: dict, what: str = "checkpoints") -> str:
    """``-0.80 [-0.97, -0.26] over 9 checkpoints`` where there is an interval, else the exact permutation p-value."""
    if not math.isfinite(s.get("spearman", float("nan"))):
        return f"no correlation over {s['n']} {what} ({s.get('note') or 'undefined'})"
    if s.get("note"):
        return f"{fmt(s['spearman'])} over {s['n']} {what} ({s['note']}; {s['p_method']} permutation p = {s['p_perm']:.3g})"
    return f"{fmt(s['spearman'])} [{fmt(s['fisher_lo'])}, {fmt(s['fisher_hi'])}] over {s['n']} {what}"


def step_name(step) -> str:
    """A checkpoint's step in words: step 0 is the random initialisation, before any training."""
    return "step 0 (the initialisation)" if step == 0 else f"step {step}"


def claim_verdict(s: dict, claim_sign: int = 1, alpha: float = 0.05) -> str:
    """The verdict on a claim that this correlation is of sign ``claim_sign``: reproduced, contradicted (the sign
    opposite to the paper's, said in words) or undecided; from the 95% interval, or from the exact permutation
    p-value where there is no interval."""
    rho = s.get("spearman", float("nan"))
    if not math.isfinite(rho):
        return f"undecided ({s.get('note') or 'no correlation'})"
    if s.get("note"):
        decided = s["p_perm"] < alpha
        reason = f"{s['p_method']} permutation p = {s['p_perm']:.3g}"
    else:
        decided = s["fisher_lo"] > 0 or s["fisher_hi"] < 0
        reason = "the 95% interval excludes 0" if decided else "the 95% interval holds 0"
    if not decided:
        return f"undecided ({reason})" + ("; its sign is the opposite of the paper's" if rho * claim_sign < 0 else "")
    if rho * claim_sign > 0:
        return f"reproduced ({reason})"
    return f"contradicted: the sign is the opposite of the paper's ({reason})"
