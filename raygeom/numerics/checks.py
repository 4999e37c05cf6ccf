"""The arguments of the public numerics (``raygeom.numerics.<name>``) checked before the work, one line each.

``raygeom.numerics`` hands out each public function wrapped by :func:`checked`: every argument is checked by the
rule its name has here (the ranges are the flags' own, from raygeom.params), once per call, so a value of the wrong
type or range is an :class:`InputError` naming it, never numpy's or torch's error from deep inside. The modules'
own functions (``raygeom.numerics.pga.null_rhos``, what the engine calls per chunk) are not wrapped: no hot path
pays for the checks."""

from __future__ import annotations

import functools
import inspect
import math
from numbers import Integral, Real

import numpy as np

from raygeom.errors import InputError, RaygeomError
from raygeom.params import MAX_BOOT, MAX_COUNT, MAX_NULLS, MAX_SEED, MAX_WIDTH, PGAParams, allowed, check_value


def shown(value) -> str:
    """A value as a refusal names it, on one line: a scalar or string by its repr, anything else by its type."""
    return repr(value)[:60] if isinstance(value, (str, Real, type(None))) else type(value).__name__


def declared(name: str, value, cls=PGAParams, field: str | None = None):
    """``value`` by the declaration of the flag that sets it (e.g. ``--k``)."""
    try:
        return check_value(cls, field or name, value, label=name)
    except RaygeomError:
        raise InputError(f"{name} must be {allowed(cls, field or name)}, got {shown(value)}") from None


def integer(low: int, high: int):
    def check(name: str, value):
        if isinstance(value, bool) or not isinstance(value, Integral) or not low <= value <= high:
            raise InputError(f"{name} must be an integer >= {low:,} and <= {high:,}, got {shown(value)}")
        return int(value)

    return check


# Beyond any statistic raygeom computes (|z| of a few hundred at most), and far from float64's overflow.
BIG = 1e12


def number(low: float | None = None, high: float | None = None, open_: bool = True):
    def check(name: str, value):
        bad = isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or abs(value) > BIG
        if not bad and low is not None:
            bad = value <= low if open_ else value < low
        if not bad and high is not None:
            bad = value >= high if open_ else value > high
        if bad:
            sides = [
                f"{'>' if open_ else '>='} {low:g}" if low is not None else "",
                f"{'<' if open_ else '<='} {high:g}" if high is not None else "",
            ]
            limits = " and ".join(side for side in sides if side)
            raise InputError(
                f"{name} must be a number{' ' + limits if limits else ''} with |{name}| <= {BIG:g}, got {shown(value)}"
            )
        return float(value)

    return check


def array(ndim: int | None):
    """A finite real array of ``ndim`` dimensions (None: any), as float64; numpy, torch or nested lists."""

    def check(name: str, value):
        from raygeom.numerics.arrays import as_array

        values = as_array(value, np.float64, name)
        if ndim is not None and values.ndim != ndim:
            raise InputError(f"{name} must be a {ndim}-D array, got shape {values.shape}")
        if not np.isfinite(values).all():
            raise InputError(f"{name} contains NaN or inf values ({int((~np.isfinite(values)).sum())} of {values.size})")
        return values

    return check


def device(name: str, value):
    """None (the default) or a device torch can use here; one line, not torch's multi-line TypeError."""
    if value is None:
        return None
    import torch

    if not isinstance(value, (str, torch.device)):
        raise InputError(f"{name} must be cpu, cuda, cuda:N or mps (a string), got {shown(value)}")
    try:
        where = torch.device(value)
    except (RuntimeError, TypeError) as error:
        first = (str(error).strip().splitlines() or [""])[0]
        raise InputError(f"{name} must be cpu, cuda, cuda:N or mps, got {value!r:.40} ({first})") from None
    if where.type == "cuda" and (not torch.cuda.is_available() or (where.index or 0) >= torch.cuda.device_count()):
        raise InputError(f"{name} {value!r} is not available: torch sees {torch.cuda.device_count()} CUDA device(s)")
    if where.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise InputError(f"{name} {value!r} is not available on this machine")
    if where.type not in ("cpu", "cuda", "mps"):
        raise InputError(f"{name} must be cpu, cuda, cuda:N or mps, got {value!r:.40}")
    return value


def prepared_layer(name: str, value):
    from raygeom.numerics.pga import PreparedLayer

    if not isinstance(value, PreparedLayer):
        raise InputError(f"{name} must be a PreparedLayer (from raygeom.numerics.prepare_layer), got {shown(value)}")
    return value


def function(name: str, value):
    if not callable(value):
        raise InputError(f"{name} must be a function, got {shown(value)}")
    return value


def indices(name: str, value):
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise InputError(f"{name} must be a list of null indices (integers >= 0), got {shown(value)}")
    values = list(value)
    check = integer(0, MAX_SEED)
    return [check(f"{name}[{i}]", v) for i, v in enumerate(values)]


def numbers(name: str, value):
    """A short list of finite numbers (thresholds)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise InputError(f"{name} must be a list of finite numbers, got {shown(value)}")
    check = number()
    return tuple(check(f"{name}[{i}]", v) for i, v in enumerate(value))


def samples(name: str, value):
    """bootstrap_ci's ``data``: one array of samples, or a tuple of arrays resampled together; checked, kept as given."""
    parts = value if isinstance(value, tuple) else (value,)
    for i, part in enumerate(parts):
        values = array(None)(f"{name}[{i}]" if isinstance(value, tuple) else name, part)
        if values.ndim == 0 or values.shape[0] == 0:
            raise InputError(f"{name} must be an array of at least 1 sample (or a tuple of them), got shape {values.shape}")
    return value


def labels(name: str, value):
    """bootstrap_ci's ``clusters``: one label per sample (a list or 1-D array); kept as given."""
    shape = np.shape(value) if isinstance(value, (list, tuple, np.ndarray)) else None
    if shape is None or len(shape) != 1:
        raise InputError(f"{name} must be a list of one label per sample, or None, got {shown(value)} of shape {shape}")
    return value


def optional(rule):
    return lambda name, value: None if value is None else rule(name, value)


COUNT = integer(0, MAX_COUNT)
LEVEL = number(0.0, 1.0)
# By argument name: the same name means the same thing in every public function of raygeom.numerics.
RULES = {
    "k": lambda name, value: declared(name, value),
    "r": lambda name, value: declared(name, value),
    "seed": lambda name, value: declared(name, value),
    "index": integer(0, MAX_SEED),
    "d": integer(1, MAX_WIDTH),
    "n_null": integer(0, MAX_NULLS),
    "n_boot": integer(1, MAX_BOOT),
    "n_half": integer(0, MAX_COUNT),
    "n_subsamples": integer(1, MAX_COUNT),
    "n": integer(1, MAX_COUNT),
    "size": COUNT,
    "count": COUNT,
    "successes": COUNT,
    "cap": integer(1, MAX_NULLS),
    "block": integer(1, MAX_COUNT),
    "start": integer(0, MAX_NULLS),
    "min_null": integer(0, MAX_NULLS),
    "decide_cap": integer(0, MAX_NULLS),
    "level": LEVEL,
    "fraction": LEVEL,
    "target_half_width": number(0.0),
    "relative_target": number(0.0),
    "rho": number(),
    "rho_readout": number(),
    "z": number(),
    "z_lo": number(),
    "z_hi": number(),
    "value": number(),
    "se": number(0.0, open_=False),
    "null_std": number(0.0, open_=False),
    "thresholds": numbers,
    "device": device,
    "layer": prepared_layer,
    "statistic": function,
    "draw": function,
    "indices": indices,
    "h": array(2),
    "w_u": optional(array(2)),
    "readout": optional(array(2)),
    "basis": array(2),
    "gram": array(2),
    "x": array(None),
    "y": array(None),
    "a": array(None),
    "b": array(None),
    "values": array(None),
    "weights": optional(array(1)),
    "nulls": array(1),
    "rhos": array(1),
    "chunk": array(1),
    "data": samples,
    "clusters": labels,
}


def checked(fn):
    """``fn`` with each argument checked by its name's rule before it runs (arguments with no rule pass as given)."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise InputError(f"{fn.__name__}: {error}") from None
        for name, value in bound.arguments.items():
            rule = RULES.get(name)
            if rule is not None and not (value is None and signature.parameters[name].default is None):
                checked_value = rule(name, value)
                if not (isinstance(value, np.ndarray) and value.dtype.kind == "f"):  # a float array stays as given
                    bound.arguments[name] = checked_value
        return fn(*bound.args, **bound.kwargs)

    return call
