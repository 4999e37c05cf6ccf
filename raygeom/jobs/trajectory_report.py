"""What a trajectory run says of its checkpoints: the layers it follows (:func:`pick_layers`), when the readout
organisation appears (:func:`organisation_summary`, :func:`verdict_early`). Its page, docs/results/trajectory.md, is
the repository's write-up (tools/trajectory_page.py), built from the rows the job exports."""

from __future__ import annotations

import math

from raygeom.jobs.gap_ranking import step_name


def _f(value, digits: int = 2, sign: bool = False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def pick_layers(layers: list[str]) -> dict[str, str]:
    """Early, middle and late blocks, and the final norm, of a model's layer list (embed ... final_norm)."""
    blocks = [name for name in layers if name.startswith("block_")]
    if not blocks:
        return {"final": layers[-1]}
    return {"early": blocks[0], "middle": blocks[len(blocks) // 2], "late": blocks[-1], "final": layers[-1]}


def organisation_summary(z_rows: list[dict], layers: dict[str, str], positive_z: float = 2.0) -> list[dict]:
    """Per picked layer: z at the first and last checkpoint, its peak and where, the first step at which z
    reached half of its peak and the first at which it exceeded ``positive_z`` (how early organisation is set)."""
    out = []
    for role, layer in layers.items():
        series = sorted((r for r in z_rows if r["layer"] == layer and r["z"] == r["z"]), key=lambda r: r["step"])
        if not series:
            continue
        peak = max(series, key=lambda r: r["z"])
        half = next((r["step"] for r in series if peak["z"] > 0 and r["z"] >= peak["z"] / 2), None)
        before = max((r["step"] for r in series if half is not None and r["step"] < half), default=None)
        organised = next((r["step"] for r in series if r["z"] > positive_z), None)
        out.append(
            {
                "role": role,
                "layer": layer,
                "z_first": series[0]["z"],
                "z_last": series[-1]["z"],
                "z_peak": peak["z"],
                "peak_step": peak["step"],
                "half_peak_step": half,
                "checkpoint_before_half": before,
                "first_organised_step": organised,
                "last_step": series[-1]["step"],
                "drop_from_peak": peak["z"] - series[-1]["z"],
            }
        )
    return out


def verdict_early(organisation: list[dict], last_step: int, share: float = 0.25) -> tuple[str, str]:
    """'Set early' read as: the middle layer reaches half of its peak z within the first quarter of the run. Decided
    only where the checkpoints bracket the quarter: half reached at a checkpoint at or before it (reproduced), or still
    below half at a checkpoint at or after it (contradicted); a gap across the quarter leaves it undecided."""
    middle = next((o for o in organisation if o["role"] == "middle"), None)
    if middle is None or middle["z_peak"] is None or middle["z_peak"] <= 2:
        return "undecided", "the middle layer never reaches z > 2, so there is no organisation to date"
    half, before = middle["half_peak_step"], middle["checkpoint_before_half"]
    threshold = share * last_step
    first = middle.get("first_organised_step")
    where = (
        f"the middle layer ({middle['layer']}) reaches half of its peak z ({_f(middle['z_peak'])}, at step "
        f"{middle['peak_step']}) at step {half} ({half / last_step:.0%} of the {last_step} steps); the checkpoint "
        f"before is {step_name(before)}; it first exceeds z = 2 at step {first if first is not None else 'never'}; "
        f"'early' is read as within the first quarter (step {threshold:g})"
    )
    if half <= threshold:
        return "reproduced", where
    if before is not None and before >= threshold:
        return "contradicted", where
    return "undecided", where + (
        f"; no checkpoint lies between step {before} and step {half}, so the data cannot say "
        "on which side of the quarter half of the peak was reached"
    )
