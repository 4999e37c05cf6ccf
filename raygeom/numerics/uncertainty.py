"""Uncertainty of the numbers raygeom reports: pure functions, arrays in, numbers out.

Every method, its assumptions and why it was chosen are in ../METRICS.md
("Uncertainty"). All randomness comes from generators seeded by the caller's
``seed`` plus a fixed tag and, where work may be split, an index, so every
result is reproducible bit for bit.

- :func:`z_uncertainty`: Monte-Carlo error of a PGA z from its finite null
  (bootstrap over the null draws; :func:`z_delta_se` is the Gaussian delta
  method beside it), and the empirical p-values.
- :func:`null_target_reached`, :func:`auto_null_count`, :func:`null_blocks`:
  the ``--n-null auto`` stopping rule on a fixed schedule of blocks.
- :func:`half_sample_spread`, :func:`pga_text_interval`: how much rho_readout,
  the margin rho - null mean, and z move with the sample of texts (delete-d
  jackknife: seeded subsamples without replacement).
- :func:`wilson_interval`, :func:`bootstrap_ci`, :func:`spearman_with_ci`,
  :func:`paired_t`, :func:`normal_interval`: intervals for probe accuracy,
  differences over test tokens, correlations, paired comparisons across seeds,
  and an estimate with a standard error.
- :func:`permutation_spearman_p`: the exact permutation p-value of a rank correlation, what a
  correlation over fewer than ``RANK_INTERVAL_MIN_N`` points (or at |rho| = 1) reports instead of an interval.
- :func:`bounded_mean_interval`: the mean over training seeds of a quantity with bounds (a share, an accuracy,
  a correlation) with an interval that stays inside them and never has zero width where each seed has an interval.
- :func:`token_blocks`, :func:`block_interval_note`: the blocks of a block bootstrap over held-out tokens, and the
  note that stands for its interval below ``BLOCK_MIN`` blocks.
- :func:`bounds_of`: the range a reported quantity can take, read from its column name.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from raygeom.errors import InputError
from raygeom.numerics.distributions import normal_quantile, rank_rows, spearman, t_quantile, t_sf

LEVEL = 0.95
N_BOOT = 2000
NULL_BLOCK = 100  # as the CLI's --n-null auto (raygeom.params.AUTO_NULL_BLOCK)
NULL_CAP = 1000
NULL_MIN = 100
TARGET_HALF_WIDTH = 0.25
DECISION_THRESHOLDS = (-2.0, 0.0, 2.0)  # the decisions read off z: its sign, and |z| > 2
# Fewest null draws that carry an interval for z (METRICS.md, "No interval below 20 nulls").
Z_MIN_NULL = 20
# A null spread below this is float rounding of rho (float32 cosines), not a distribution: no interval.
NULL_SD_FLOOR = 1e-6
# Second seed words keep each use of a caller's seed on its own random stream, apart from the null
# subspaces (seeded by (seed, i) with i < 2**32 - 1 in practice).
BOOT_STREAM = 0xB007  # z's bootstrap over the null draws
_TEXT_TAG = 0x7E47
_BOOT_TAG = 0xB0C1  # bootstrap_ci and spearman_with_ci
_PERM_TAG = 0x9E43  # permutation_spearman_p's Monte-Carlo permutations
# Below this many points a rank correlation's interval (Fisher or bootstrap over pairs) means little: the bootstrap
# over 5 checkpoints is [-1, 1] or collapses onto one value, and Fisher's variance assumes n of about 10 or more.
RANK_INTERVAL_MIN_N = 10
TOO_FEW_POINTS = "too few points for an interval"
# Fewest resampled blocks (clusters) that carry a block-bootstrap interval (METRICS.md, "No interval below 10 blocks"):
# a percentile interval of a mean over B i.i.d. normal blocks covers 50 % at B = 2, 76 % at 3, 82 % at 5 and 89 % at 10.
BLOCK_MIN = 10
AT_THE_BOUND = "|rho| = 1: no interval (every resample and Fisher's transform sit on the bound)"
CONSTANT = "one variable is constant: no rank correlation"
EXACT_PERMUTATIONS_UP_TO = 9  # 9! = 362,880 orderings enumerated; above, seeded Monte-Carlo permutations
MONTE_CARLO_PERMUTATIONS = 20000


def level_quantile(level: float) -> float:
    """The normal quantile of a two-sided interval of coverage ``level`` (1.96 for 0.95)."""
    if not 0.0 < level < 1.0:
        raise InputError(f"level must lie in (0, 1); got {level}")
    return normal_quantile(0.5 + level / 2.0)


def _finite_1d(name: str, values) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64).ravel()
    if not np.isfinite(values).all():
        raise InputError(f"{name} contains NaN or inf values")
    return values


# ----------------------------------------------------------------------------- z from a finite null


def empirical_p_values(rho: float, nulls: Sequence[float]) -> dict[str, float]:
    """``p_upper = (1 + #{null >= rho}) / (1 + n)`` and ``p_lower = (1 + #{null <= rho}) / (1 + n)``.

    The +1s count the observed value as one draw of the null (Davison & Hinkley 1997, eq. 4.11;
    North et al. 2002), so p is never 0 and is a valid p-value for any n.
    """
    nulls = _finite_1d("nulls", nulls)
    n = nulls.size
    return {
        "p_upper": float((1 + np.count_nonzero(nulls >= rho)) / (1 + n)),
        "p_lower": float((1 + np.count_nonzero(nulls <= rho)) / (1 + n)),
    }


def summarize_null(rho_readout: float, rhos: Sequence[float]) -> dict[str, float]:
    rhos = np.asarray(rhos, dtype=np.float64)
    if rhos.size < 2:
        raise InputError("need at least 2 null subspaces to estimate a standard deviation")
    mean, std = float(rhos.mean()), float(rhos.std(ddof=1))
    z = (rho_readout - mean) / std if std > 0 else float("nan")
    return {"null_mean": mean, "null_std": std, "z": float(z)}


def z_delta_se(z: float, n: int) -> float:
    """Delta-method standard error of ``z = (rho - mean) / sd`` from ``n`` Gaussian null draws:
    ``sqrt((1 + z^2 / 2) / n)`` (the mean contributes ``1/n``, the sd ``z^2 / (2n)``)."""
    return float(np.sqrt((1.0 + z * z / 2.0) / n)) if n > 0 else float("nan")


def z_jackknife_bias(rho: float, nulls) -> np.ndarray | float:
    """Jackknife estimate of the small-sample bias of ``z = (rho - mean) / sd`` over the null draws.

    ``bias = (n - 1) (mean_i z_(-i) - z)`` (Quenouille 1956; Efron & Tibshirani 1993, ch. 11), with
    ``z_(-i)`` the z of the ``n - 1`` draws left when draw ``i`` is deleted, in closed form: the deleted
    mean is ``(n m - x_i) / (n - 1)`` and the deleted sum of squares ``S - n (x_i - m)^2 / (n - 1)``.
    ``nulls`` may be 2-D (one set of draws per row; one answer per row). The bias is O(1/n): for
    Gaussian draws ``E[z] = z_true E[sigma / sd]`` = ``z_true (1 + 3 / (4 n) + ...)``, outward; heavier
    tails (excess kurtosis ``g``) make it about ``z_true (3/8) (2 + g) / n``.
    """
    x = np.asarray(nulls, dtype=np.float64)
    n = x.shape[-1]
    if n < 3:
        raise InputError("the jackknife of z needs at least 3 null draws")
    m = x.mean(axis=-1, keepdims=True)
    dev = x - m
    ss = (dev * dev).sum(axis=-1, keepdims=True)
    z = (rho - m[..., 0]) / np.sqrt(ss[..., 0] / (n - 1))
    m_del = (n * m - x) / (n - 1)
    ss_del = np.maximum(ss - n * dev * dev / (n - 1), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        z_del = (rho - m_del) / np.sqrt(ss_del / (n - 2))
    bias = (n - 1) * (z_del.mean(axis=-1) - z)
    return float(bias) if np.ndim(bias) == 0 else bias


def _no_interval() -> dict[str, float]:
    nan = float("nan")
    return {"z_se": nan, "z_lo": nan, "z_hi": nan, "z_half_width": nan}


def z_uncertainty(
    rho: float, nulls: Sequence[float], seed: int = 0, n_boot: int = N_BOOT, level: float = LEVEL
) -> dict[str, float]:
    """z and its Monte-Carlo error from the finite null, including z's small-sample bias.

    ``z_se``: the root-mean-square error of z as an estimate of the true z, ``sqrt(sd_boot^2 + bias^2)``.
    ``sd_boot`` is the standard deviation of z recomputed on ``n_boot`` bootstrap resamples of the null
    draws (with replacement, ``rho`` held fixed; generator seeded by ``(seed, BOOT_STREAM)``, so
    deterministic); ``bias`` the jackknife estimate of z's small-sample bias (:func:`z_jackknife_bias`;
    outward, about 0.2 at |z| = 10 with 100 real nulls). ``z_lo`` / ``z_hi``: ``z -+ q z_se`` with
    ``q`` the normal quantile of ``level`` (1.96 for 95 %), and ``z_half_width = q z_se``. A normal
    interval covered the true z more closely than the percentile interval at 50-100 nulls; the bias
    term keeps it at nominal coverage where the bias is a sizeable part of the error (for an error
    ``N(b, s^2)``, ``z -+ 1.96 sqrt(s^2 + b^2)`` covers 95.0 % at ``b = s / 4``; METRICS.md). Also ``z``
    (the plain estimate ``(rho - mean) / sd``) and the empirical p-values of :func:`empirical_p_values`.

    No interval (``z_se``, ``z_lo``, ``z_hi``, ``z_half_width`` NaN) below ``Z_MIN_NULL`` draws, where
    the draws cannot support one (METRICS.md), nor from degenerate draws: a null spread at float
    rounding level (below ``NULL_SD_FLOOR``), a bootstrap resample without spread, or a non-finite
    result. Nulls without any spread (z undefined) are an error.
    """
    nulls = _finite_1d("nulls", nulls)
    n = nulls.size
    if n < 2 or not np.isfinite(rho):
        raise InputError("need at least 2 finite null rhos and a finite rho")
    if n_boot < 2:
        raise InputError(f"n_boot must be at least 2, got {n_boot}")
    if np.ptp(nulls) == 0:
        raise InputError("the null rhos have no spread, so z is undefined")
    q = level_quantile(level)
    sd = float(nulls.std(ddof=1))
    z = (rho - float(nulls.mean())) / sd
    result = {"z": float(z), **_no_interval(), **empirical_p_values(rho, nulls)}
    if n < Z_MIN_NULL or not sd > NULL_SD_FLOOR:
        return result
    rng = np.random.default_rng([int(seed), BOOT_STREAM])
    # In blocks of resamples, the same draws as one (n_boot, n) array: 100,000 nulls x 1,000 resamples held 800 MB
    # at once, in one numpy call that a SIGTERM to the driver (which scores each unit's rows) waited out.
    block = max(1, BOOT_BLOCK_VALUES // n)
    means, sds = np.empty(n_boot), np.empty(n_boot)
    for start in range(0, n_boot, block):
        resampled = nulls[rng.integers(0, n, size=(min(block, n_boot - start), n))]
        means[start : start + len(resampled)] = resampled.mean(axis=1)
        sds[start : start + len(resampled)] = resampled.std(axis=1, ddof=1)
    if not (sds > NULL_SD_FLOOR).all():  # a resample of one repeated draw: too few distinct draws to bound z
        return result
    boot_z = (rho - means) / sds
    se = float(np.sqrt(boot_z.var(ddof=1) + z_jackknife_bias(rho, nulls) ** 2))
    if not (np.isfinite(se) and se > 0):
        return result
    result.update(z_se=se, z_lo=z - q * se, z_hi=z + q * se, z_half_width=q * se)
    return result


BOOT_BLOCK_VALUES = 1_000_000  # null draws resampled at once by z_uncertainty (8 MB)


def interval_note(n_null: int) -> str:
    """What the console says where a z carries no interval."""
    if n_null < Z_MIN_NULL:
        return f"no interval below {Z_MIN_NULL} nulls"
    return "no interval: degenerate null draws"


# ----------------------------------------------------------------------------- --n-null auto


def null_blocks(cap: int = NULL_CAP, block: int = NULL_BLOCK, start: int = 0) -> list[range]:
    """The fixed schedule of null indices: ``range(0, 100), range(100, 200), ...`` up to ``cap``.

    Null ``i`` is seeded by ``(seed, i)`` whichever task draws it, so any split of these blocks
    across tasks yields the same values.
    """
    if block < 1 or cap < 1:
        raise InputError(f"block and cap must be positive; got block={block}, cap={cap}")
    return [range(s, min(s + block, cap)) for s in range(start, cap, block)]


def null_target_reached(
    rho: float,
    nulls: Sequence[float],
    target_half_width: float = TARGET_HALF_WIDTH,
    cap: int = NULL_CAP,
    *,
    seed: int = 0,
    min_null: int = NULL_MIN,
    relative_target: float | None = None,
    n_boot: int = N_BOOT,
    level: float = LEVEL,
    decide_cap: int = 0,
) -> bool:
    """Whether ``--n-null auto`` may stop with these nulls: at least ``min_null`` (and ``Z_MIN_NULL``)
    of them and the 95 % half-width of z (:func:`z_uncertainty`) at most
    :func:`stop_half_width` ``(z, target_half_width, relative_target)``, or ``cap`` reached. Below
    ``decide_cap`` nulls, it also waits while z's interval holds a decision threshold
    (:func:`holds_threshold`: the sign of z or |z| > 2 still open).

    A degenerate null (no spread, z undefined; or draws too degenerate for an interval) stops at
    once: more draws cannot help.
    """
    nulls = _finite_1d("nulls", nulls)
    if nulls.size >= cap:
        return True
    if nulls.size < max(min_null, Z_MIN_NULL):
        return False
    if np.ptp(nulls) == 0:
        return True
    result = z_uncertainty(rho, nulls, seed=seed, n_boot=n_boot, level=level)
    if not np.isfinite(result["z_half_width"]):
        return True
    if not result["z_half_width"] <= stop_half_width(result["z"], target_half_width, relative_target):
        return False
    return not (nulls.size < decide_cap and holds_threshold(result["z_lo"], result["z_hi"]))


def holds_threshold(z_lo: float, z_hi: float, thresholds: Sequence[float] = DECISION_THRESHOLDS) -> bool:
    """Whether z's interval ``[z_lo, z_hi]`` holds a decision threshold (by default 0 and -2, 2: the sign
    of z and |z| > 2), so that the interval leaves that decision open."""
    return any(z_lo <= t <= z_hi for t in thresholds)


def stop_half_width(z: float, target_half_width: float = TARGET_HALF_WIDTH, relative_target: float | None = None) -> float:
    """The half-width at which ``--n-null auto`` stops a layer: ``max(target_half_width,
    relative_target * |z|)`` (``target_half_width`` alone without ``relative_target``). Absolute near
    the decision thresholds (|z| <= 5 at the defaults 0.25 and 0.05), relative far out."""
    if relative_target is None:
        return float(target_half_width)
    return float(max(target_half_width, relative_target * abs(z)))


def expected_auto_nulls(
    z,
    target_half_width: float = TARGET_HALF_WIDTH,
    relative_target: float | None = None,
    cap: int = NULL_CAP,
    block: int = NULL_BLOCK,
    min_null: int = NULL_MIN,
    level: float = LEVEL,
    inflation: float = 1.0,
    decide_cap: int = 0,
):
    """Nulls ``--n-null auto`` is expected to draw for a layer whose z is ``z`` (array or scalar): the
    delta method's need ``(q / h)^2 (1 + z^2 / 2)`` at the stop half-width ``h`` of
    :func:`stop_half_width`, times ``inflation`` (the null's measured ``(z_se / delta se)^2``; 1 for
    Gaussian nulls), rounded up to a whole block, at least ``min_null``, at most ``cap``. At the
    defaults (0.25, no relative target) the need is ``61.5 (1 + z^2 / 2)``; with 5 % of |z| it levels
    off at ``(q / 0.05)^2 / 2 = 768`` for large |z|. With ``decide_cap``, a layer whose interval at that
    count still holds a decision threshold goes on to the count whose half-width is its distance to
    the nearest one, up to ``decide_cap``."""
    z = np.abs(np.asarray(z, dtype=np.float64))
    h = (
        np.full_like(z, float(target_half_width))
        if relative_target is None
        else np.maximum(target_half_width, relative_target * z)
    )
    per_null = (level_quantile(level) ** 2) * (1.0 + z * z / 2.0) * inflation
    need = per_null / h**2
    if decide_cap:
        nearest = np.min(np.abs(z[..., None] - np.abs(np.asarray(DECISION_THRESHOLDS))), axis=-1)
        with np.errstate(divide="ignore"):
            need = np.maximum(need, np.minimum(per_null / nearest**2, decide_cap))
    blocks = np.ceil(np.maximum(need, min_null) / block) * block
    return np.minimum(blocks, cap)


def auto_null_count(
    rho: float,
    nulls: Sequence[float],
    target_half_width: float = TARGET_HALF_WIDTH,
    cap: int = NULL_CAP,
    *,
    seed: int = 0,
    block: int = NULL_BLOCK,
    min_null: int = NULL_MIN,
    relative_target: float | None = None,
    n_boot: int = N_BOOT,
    level: float = LEVEL,
    decide_cap: int = 0,
) -> int | None:
    """How many nulls ``--n-null auto`` keeps, given the first ``len(nulls)`` draws in index order.

    The rule is checked only at the ends of the fixed blocks (100, 200, ...; and ``cap``), each time
    on all draws before that point; the answer is the first end where :func:`null_target_reached`
    holds, or None when the draws given end before any does (draw more blocks). Draws beyond the
    answer (e.g. blocks computed ahead in parallel) are ignored, so the count, and z from
    ``nulls[:count]``, are bit-identical however the blocks were split across tasks.
    """
    nulls = _finite_1d("nulls", nulls)
    for part in null_blocks(cap, block):
        end = part.stop
        if end > nulls.size:
            return None
        if null_target_reached(
            rho,
            nulls[:end],
            target_half_width,
            cap,
            seed=seed,
            min_null=min_null,
            relative_target=relative_target,
            n_boot=n_boot,
            level=level,
            decide_cap=decide_cap,
        ):
            return end
    return cap


def auto_nulls(
    rho: float,
    draw: Callable[[range], Sequence[float]],
    target_half_width: float = TARGET_HALF_WIDTH,
    cap: int = NULL_CAP,
    *,
    seed: int = 0,
    block: int = NULL_BLOCK,
    min_null: int = NULL_MIN,
    relative_target: float | None = None,
    n_boot: int = N_BOOT,
    level: float = LEVEL,
    decide_cap: int = 0,
) -> np.ndarray:
    """Draw null blocks in order with ``draw(indices) -> rhos`` until :func:`auto_null_count` settles;
    returns the kept draws. A serial driver; a parallel one may draw blocks ahead and call
    :func:`auto_null_count` on what has arrived, in index order."""
    nulls = np.empty(0)
    for part in null_blocks(cap, block):
        nulls = np.concatenate([nulls, np.asarray(draw(part), dtype=np.float64)])
        count = auto_null_count(
            rho,
            nulls,
            target_half_width,
            cap,
            seed=seed,
            block=block,
            min_null=min_null,
            relative_target=relative_target,
            n_boot=n_boot,
            level=level,
            decide_cap=decide_cap,
        )
        if count is not None:
            return nulls[:count]
    return nulls


# ----------------------------------------------------------------------------- interval over texts


def text_subsamples(n: int, size: int, seed: int, count: int) -> list[np.ndarray]:
    """``count`` subsamples of the texts: each ``size`` of ``range(n)`` without replacement, sorted,
    drawn one after another from the generator seeded by ``(seed, 0x7E47)``. Drawing them costs next
    to nothing, so a task that scores subsample ``s`` alone regenerates the first ``s + 1``."""
    if not 0 < size < n:
        raise InputError(f"a subsample must hold 0 < size < N texts; got size={size}, N={n}")
    rng = np.random.default_rng([int(seed), _TEXT_TAG])
    return [np.sort(rng.choice(n, size=size, replace=False)) for _ in range(count)]


def text_subsample(n: int, size: int, seed: int, index: int) -> np.ndarray:
    """Subsample ``index`` of :func:`text_subsamples`."""
    return text_subsamples(n, size, seed, int(index) + 1)[-1]


def jackknife_se(values: Sequence[float], n: int, size: int) -> float:
    """Delete-d jackknife standard error from statistics on random subsamples of ``size`` of ``n`` units.

    ``se^2 = (size / d) * var(values)`` with ``d = n - size`` deleted units (Shao & Wu 1989; random
    subsets as in Shao & Tu 1995, sec. 2.3); the variance has divisor ``S - 1``. At ``size = n/2``
    (half-sampling) the factor is 1.
    """
    values = _finite_1d("subsample values", values)
    if not 0 < size < n:
        raise InputError(f"size must be an integer > 0 and < n = {n} (subsamples of size of n units), got {size}")
    if values.size < 2:
        return float("nan")
    return float(np.sqrt(size / (n - size) * values.var(ddof=1)))


def normal_interval(value: float, se: float, level: float = LEVEL) -> tuple[float, float]:
    """``value -+ q se``, ``q`` the normal quantile of ``level`` (1.96 for 95 %)."""
    half = level_quantile(level) * se
    return value - half, value + half


def bounded_normal_interval(value: float, se: float, low: float, high: float, level: float = LEVEL) -> tuple[float, float]:
    """A normal interval for an estimate that lives in ``[low, high]`` (a share, a mean cosine distance): ``value -+
    q se`` taken on the logit scale of ``(value - low) / (high - low)`` with the delta-method standard error
    ``se / ((value - low)(high - value) / (high - low))``, mapped back, so it stays strictly inside the bounds and
    is asymmetric near them. NaN bounds (no interval) where the value sits on a bound or ``se`` is 0 or not finite:
    a zero-width interval would claim a certainty the estimate does not have."""
    span = high - low
    if not (np.isfinite(value) and np.isfinite(se)) or se <= 0 or not low < value < high:
        return float("nan"), float("nan")
    unit = (value - low) / span
    centre = np.log(unit / (1.0 - unit))
    half = level_quantile(level) * se / (span * unit * (1.0 - unit))
    lo, hi = (low + span / (1.0 + np.exp(-(centre + sign * half))) for sign in (-1.0, 1.0))
    return float(lo), float(hi)


def wilson_interval(successes: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval (low, high) of a proportion (Wilson 1927), e.g. probe accuracy on ``n``
    test texts.

    ``(p + q^2/2n -+ q sqrt(p(1-p)/n + q^2/4n^2)) / (1 + q^2/n)``; unlike the Wald interval it stays
    inside [0, 1] and keeps close to nominal coverage for small n and p near 0 or 1. At 0 or n
    successes the bound is exactly 0 or 1 (the formula reaches it only up to rounding).
    """
    if n <= 0 or not 0 <= successes <= n:
        raise InputError(f"need 0 <= successes <= n and n > 0, got {successes} of {n}")
    q = level_quantile(level)
    p = successes / n
    denominator = 1.0 + q * q / n
    centre = (p + q * q / (2 * n)) / denominator
    half = q * np.sqrt(p * (1 - p) / n + q * q / (4 * n * n)) / denominator
    low = 0.0 if successes == 0 else float(max(0.0, centre - half))
    high = 1.0 if successes == n else float(min(1.0, centre + half))
    return low, high


def bootstrap_ci(
    data,
    statistic: Callable[..., float] = np.mean,
    seed: int = 0,
    n_boot: int = N_BOOT,
    level: float = LEVEL,
    clusters: Sequence | None = None,
) -> dict[str, float]:
    """Percentile bootstrap interval of ``statistic`` (Efron & Tibshirani 1993, ch. 13).

    ``data``: one array of ``n`` values, or a tuple of equal-length arrays that are resampled
    together (paired: e.g. per-token NLL of two layers, ``statistic=lambda a, b: np.mean(a - b)``).
    ``clusters``: optional label of each position; then whole clusters are resampled with
    replacement (e.g. tokens grouped by their text, since tokens of one text are not independent).
    Returns the estimate on the data, the percentile interval, the bootstrap standard error and
    the count of draws. Seeded, so deterministic.
    """
    arrays = tuple(np.asarray(a) for a in data) if isinstance(data, (tuple, list)) else (np.asarray(data),)
    n = arrays[0].shape[0]
    if n < 2 or any(a.shape[0] != n for a in arrays):
        raise InputError(f"bootstrap needs at least 2 values and equal-length paired arrays; got {[a.shape for a in arrays]}")
    if n_boot < 2:
        raise InputError(f"n_boot must be at least 2, got {n_boot}")
    rng = np.random.default_rng([int(seed), _BOOT_TAG])
    estimate = float(statistic(*arrays))
    if clusters is None:
        draws = (rng.integers(0, n, size=n) for _ in range(n_boot))
    else:
        labels = np.asarray(clusters)
        if labels.shape[0] != n:
            raise InputError(f"clusters has {labels.shape[0]} labels for {n} values")
        _, inverse = np.unique(labels, return_inverse=True)
        members = np.split(np.argsort(inverse, kind="stable"), np.cumsum(np.bincount(inverse))[:-1])
        n_clusters = len(members)
        if n_clusters < 2:
            raise InputError("a cluster bootstrap needs at least 2 clusters")
        draws = (np.concatenate([members[c] for c in rng.integers(0, n_clusters, size=n_clusters)]) for _ in range(n_boot))
    values = np.array([statistic(*(a[index] for a in arrays)) for index in draws], dtype=np.float64)
    return {"estimate": estimate, **_percentile_interval(values, level), "n": n, "n_boot": n_boot, "level": level}


def _percentile_interval(values: np.ndarray, level: float) -> dict[str, float]:
    """Percentile interval and standard error of bootstrap replicates (NaN replicates are dropped)."""
    values = values[np.isfinite(values)]
    if values.size < 2:
        return {"lo": float("nan"), "hi": float("nan"), "se": float("nan")}
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(values, [alpha, 1.0 - alpha])
    return {"lo": float(lo), "hi": float(hi), "se": float(values.std(ddof=1))}


def spearman_with_ci(x, y, seed: int = 0, level: float = LEVEL, method: str = "fisher", n_boot: int = N_BOOT) -> dict[str, float]:
    """Spearman correlation with an interval, or with an exact permutation p-value where no interval is honest.

    ``method="fisher"`` (default): Fisher's z = atanh(rho) with the Bonett & Wright (2000) variance
    ``(1 + rho^2 / 2) / (n - 3)``, back-transformed; deterministic, good from n of about 10, and the
    usual choice for a few dozen points (models x layers). ``method="bootstrap"``: percentile
    bootstrap over (x, y) pairs (seeded; the same draws as :func:`bootstrap_ci` would make), with
    no distributional assumption; a resample whose x or y is constant has no rho and is dropped.

    Over fewer than ``RANK_INTERVAL_MIN_N`` points, or at |rho| = 1, either interval would be degenerate (a
    bootstrap over 5 checkpoints, or Fisher's transform at the bound, gives [-1, -1]): then ``lo`` and ``hi`` are
    NaN, ``note`` says why, and ``p_perm`` is the two-sided permutation p-value (:func:`permutation_spearman_p`).
    Elsewhere ``note`` is "" and ``p_perm`` NaN.
    """
    x, y = _finite_1d("x", x), _finite_1d("y", y)
    n = x.size
    if n != y.size or n < 4:
        raise InputError(f"need equal-length x and y with at least 4 points; got {x.size} and {y.size}")
    if method not in ("fisher", "bootstrap"):
        raise InputError(f"method must be 'fisher' or 'bootstrap'; got {method!r}")
    rho = spearman(x, y)
    base = {"rho": rho, "n": n, "level": level, "method": method}
    if n < RANK_INTERVAL_MIN_N or not np.isfinite(rho) or abs(rho) >= 1.0 - 1e-12:
        permutation = permutation_spearman_p(x, y, seed=seed)
        return {
            **base,
            "lo": float("nan"),
            "hi": float("nan"),
            "note": (CONSTANT if not np.isfinite(rho) else TOO_FEW_POINTS if n < RANK_INTERVAL_MIN_N else AT_THE_BOUND),
            "p_perm": permutation["p"],
            "p_method": permutation["method"],
        }
    none = {"note": "", "p_perm": float("nan"), "p_method": ""}
    if method == "fisher":
        half = level_quantile(level) * np.sqrt((1.0 + rho * rho / 2.0) / (n - 3))
        lo, hi = float(np.tanh(np.arctanh(rho) - half)), float(np.tanh(np.arctanh(rho) + half))
        return {**base, "lo": lo, "hi": hi, **none}
    rng = np.random.default_rng([int(seed), _BOOT_TAG])
    index = np.stack([rng.integers(0, n, size=n) for _ in range(n_boot)])
    ranks_x = rank_rows(x[index]) - (n + 1) / 2.0
    ranks_y = rank_rows(y[index]) - (n + 1) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        values = (ranks_x * ranks_y).sum(axis=1) / np.sqrt((ranks_x**2).sum(axis=1) * (ranks_y**2).sum(axis=1))
    boot = _percentile_interval(values, level)
    return {**base, "lo": boot["lo"], "hi": boot["hi"], **none}


def permutation_spearman_p(x, y, seed: int = 0) -> dict:
    """Two-sided permutation p-value of Spearman's rho: the share of orderings of ``y`` against ``x`` whose |rho| is
    at least the observed one (ties keep their average ranks). Exact (every one of the n! orderings) up to
    ``EXACT_PERMUTATIONS_UP_TO`` points; above, ``2 / n!`` where |rho| = 1 without ties (only the order and its reverse
    reach it), else ``(1 + hits) / (1 + B)`` over B = ``MONTE_CARLO_PERMUTATIONS`` seeded permutations."""
    import itertools
    import math

    x, y = _finite_1d("x", x), _finite_1d("y", y)
    n = x.size
    if n != y.size or n < 2:
        raise InputError(f"need equal-length x and y with at least 2 points; got {x.size} and {y.size}")
    rx = rank_rows(x[None, :])[0] - (n + 1) / 2.0
    ry = rank_rows(y[None, :])[0] - (n + 1) / 2.0
    scale = np.sqrt((rx @ rx) * (ry @ ry))
    if scale == 0:
        return {"p": 1.0, "method": "exact (a constant variable)", "permutations": 1}
    observed = abs(float(rx @ ry)) / scale
    tolerance = 1e-9
    if n <= EXACT_PERMUTATIONS_UP_TO:
        orders = np.array(list(itertools.permutations(range(n))), dtype=np.int8)
        values = np.abs(ry[orders] @ rx) / scale
        return {"p": float(np.mean(values >= observed - tolerance)), "method": "exact", "permutations": len(orders)}
    if observed >= 1 - tolerance and np.unique(x).size == n and np.unique(y).size == n:
        return {"p": 2.0 / math.factorial(n), "method": "exact", "permutations": math.factorial(n)}
    rng = np.random.default_rng([int(seed), _PERM_TAG])
    orders = np.argsort(rng.random((MONTE_CARLO_PERMUTATIONS, n)), axis=1)
    hits = int(np.sum(np.abs(ry[orders] @ rx) / scale >= observed - tolerance))
    return {"p": (1 + hits) / (1 + MONTE_CARLO_PERMUTATIONS), "method": "Monte Carlo", "permutations": MONTE_CARLO_PERMUTATIONS}


def bounds_of(column: str) -> tuple[float, float] | None:
    """The range a reported quantity can take, from its column name (an interval's ``<name>_lo`` / ``_hi`` share the
    name): shares, accuracies and isotropy in [0, 1]; correlations in [-1, 1]; cosine dispersions in [0, 2]; the
    difference of two correlations in [-2, 2]. None: no bound (z, perplexities, gaps, dimensions)."""
    name = column.removesuffix("_texts")
    if name in ("excess", "margin") or name.endswith("_excess"):
        return (-2.0, 2.0)
    if name.startswith("rho") or name.endswith(("spearman", "pearson")) or "agreement" in name or name in ("fisher", "boot"):
        return (-1.0, 1.0)
    if name.endswith(("share", "accuracy", "chance", "isotropy", "fraction")):
        return (0.0, 1.0)
    if name.endswith("dispersion"):
        return (0.0, 2.0)
    return None


def bounded_mean_interval(
    values, within: Sequence[tuple[float, float]] = (), bounds: tuple[float, float] | None = None, level: float = LEVEL
) -> dict[str, float]:
    """The mean of replicates (training seeds, chunks) with an interval that respects the quantity's ``bounds``.

    The seed-to-seed Student-t interval (:func:`mean_t_interval`), taken on the logit scale of ``bounds`` when the
    quantity has them (so a share of two seeds, 0.2 and 0.6, is not [-0.9, +1.7]); then widened to hold the mean of
    the seeds' own ``within`` intervals, since the mean of a few runs is no surer than one run's own measurement
    (two seeds that agree give a zero-width t interval). ``how`` names what was done."""
    x = _finite_1d("values", values)
    if x.size == 0:
        raise InputError("need at least one value")
    mean = float(x.mean())
    lo = hi = float("nan")
    how = []
    if x.size > 1 and x.std(ddof=1) > 0:
        if bounds is None:
            t = mean_t_interval(x, level)
            lo, hi = float(t["lo"]), float(t["hi"])
            how.append("t over seeds")
        else:
            low, high = bounds
            eps = 1e-6 * (high - low)
            unit = np.clip((x - low) / (high - low), eps / (high - low), 1 - eps / (high - low))
            t = mean_t_interval(np.log(unit / (1 - unit)), level)
            lo, hi = (low + (high - low) / (1 + np.exp(-v)) for v in (t["lo"], t["hi"]))
            lo, hi = float(min(lo, mean)), float(max(hi, mean))
            how.append("logit-scale t over seeds")
    finite = [(a, b) for a, b in within if a is not None and b is not None and np.isfinite(a) and np.isfinite(b)]
    if finite:
        w_lo, w_hi = float(np.mean([a for a, _ in finite])), float(np.mean([b for _, b in finite]))
        lo = w_lo if not np.isfinite(lo) else min(lo, w_lo)
        hi = w_hi if not np.isfinite(hi) else max(hi, w_hi)
        how.append("at least the seeds' mean within-run interval")
    if bounds is not None and np.isfinite(lo):
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    if np.isfinite(lo) and hi <= lo:
        lo = hi = float("nan")
    return {
        "mean": mean,
        "lo": lo,
        "hi": hi,
        "n": int(x.size),
        "how": ", ".join(how)
        if np.isfinite(lo)
        else "no interval (seeds agree and carry none of their own)"
        if x.size > 1
        else "one seed",
    }


def mean_t_interval(values, level: float = LEVEL) -> dict[str, float]:
    """Mean of independent replicates (e.g. one value per training seed) with its Student-t interval,
    ``mean -+ t_{n-1} sd / sqrt(n)``: with 2 seeds t is 12.7, so the interval is honest about how little two
    runs pin down. NaN bounds with fewer than 2 values."""
    x = _finite_1d("values", values)
    if x.size == 0:
        raise InputError("need at least one value")
    mean = float(x.mean())
    if x.size < 2:
        return {"mean": mean, "lo": float("nan"), "hi": float("nan"), "sd": float("nan"), "n": 1}
    sd = float(x.std(ddof=1))
    half = t_quantile(0.5 + level / 2, x.size - 1) * sd / np.sqrt(x.size)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "sd": sd, "n": int(x.size)}


def log_linear_change(x, y, span: float, level: float = 0.90) -> dict[str, float]:
    """The relative change of a positive ``y`` over ``span`` units of ``x``, from the least-squares line through
    ``(x, log y)``: ``exp(slope * span) - 1``, with the Student-t interval of the slope (``n - 2`` degrees of freedom)
    carried through the same map, so it stays above -1. At ``level`` 0.90 the two ends are the one-sided 95% bounds
    that an equivalence test (TOST) compares with a margin. NaN bounds with 2 points; fewer, or one distinct x, is
    refused."""
    x, y = _finite_1d("x", x), _finite_1d("y", y)
    if x.size != y.size or x.size < 2 or np.any(y <= 0) or np.ptp(x) == 0:
        raise InputError(f"need paired x and positive y of equal length >= 2 with distinct x; got {x.size} and {y.size}")
    centred, log_y = x - x.mean(), np.log(y)
    slope = float(centred @ log_y / (centred @ centred))
    change = float(np.expm1(slope * span))
    if x.size < 3:
        return {"change": change, "lo": float("nan"), "hi": float("nan"), "n": int(x.size)}
    residuals = log_y - log_y.mean() - slope * centred
    se = float(np.sqrt(residuals @ residuals / (x.size - 2) / (centred @ centred)))
    half = t_quantile(0.5 + level / 2, x.size - 2) * se
    ends = sorted(float(np.expm1((slope + sign * half) * span)) for sign in (-1, 1))
    return {"change": change, "lo": ends[0], "hi": ends[1], "n": int(x.size)}


def paired_t(a, b) -> dict[str, float]:
    """Paired t-test of ``mean(a - b) = 0`` (e.g. a metric with and without push-away, per seed).

    ``t = mean(diff) / (sd(diff) / sqrt(n))``, ``df = n - 1``, two-sided ``p``; assumes the
    differences are independent and roughly normal (few seeds: read p with care).
    """
    a, b = _finite_1d("a", a), _finite_1d("b", b)
    if a.size != b.size or a.size < 2:
        raise InputError(f"need paired arrays of equal length >= 2; got {a.size} and {b.size}")
    diff = a - b
    n = diff.size
    mean, sd = float(diff.mean()), float(diff.std(ddof=1))
    se = sd / np.sqrt(n)
    if se > 0:
        t = mean / se
        p = 2.0 * t_sf(abs(t), n - 1)
    else:
        t, p = (float("nan"), float("nan")) if mean == 0 else (float(np.copysign(np.inf, mean)), 0.0)
    return {"t": float(t), "df": n - 1, "p": p, "mean_diff": mean, "se": float(se), "n": n}


def block_interval_note(n_blocks: int) -> str:
    """Why a block bootstrap over ``n_blocks`` blocks carries no interval ("" where it can carry one)."""
    return f"no interval below {BLOCK_MIN} blocks ({n_blocks})" if n_blocks < BLOCK_MIN else ""


def token_blocks(chunk, block: int) -> np.ndarray:
    """Cluster labels for a block bootstrap over tokens: consecutive runs of ``block`` tokens inside each chunk
    (``chunk`` gives each token's chunk, tokens in order). block=1: single tokens; block >= chunk length: whole chunks."""
    chunk = np.asarray(chunk, dtype=np.int64)
    if block < 1:
        raise InputError(f"bootstrap block must be at least 1 token, got {block}")
    position = np.zeros(len(chunk), dtype=np.int64)
    for c in np.unique(chunk):
        where = np.flatnonzero(chunk == c)
        position[where] = np.arange(len(where))
    return chunk * (int(position.max(initial=0)) // block + 1) + position // block
