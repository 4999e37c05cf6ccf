"""Analysis parameters shared by job files, the CLI and the orchestration layer."""

from __future__ import annotations

import math
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from raygeom.errors import RaygeomError

_TYPES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}

# Upper bounds from what each quantity means, so a value a run cannot meet is refused before any work (k <= d and
# r < rank are checked again against the model at plan time).
MAX_SEED = 2**32 - 1  # numpy's legacy seeds and torch's manual_seed both take 32 bits
MAX_NULLS = 1_000_000  # random subspaces per layer: z's Monte-Carlo error is far below its bias long before this
MAX_BOOT = 100_000  # bootstrap resamples: the percentile interval is settled to the third digit well before
MAX_WIDTH = 65_536  # hidden width d (and so k, r, heads) of any model raygeom can load
MAX_BLOCKS = 65_536  # blocks (layers) of any model raygeom can load
MAX_NEIGHBOURS = 65_536  # kNN-LM neighbours of one query
MAX_TOKENS = 1_048_576  # tokens of one sequence: beyond every model's context
MAX_COUNT = 10_000_000  # texts, chunks, groups, training steps
MAX_BATCH = 65_536  # sequences in one forward batch
MAX_WORKERS = 100_000  # GPUs, replicas, threads, Ray tasks
MAX_Z = 1_000.0  # a z threshold

# The grids (temperature scale, lam) are searched on the tuning half. On SmolLM2 (bbc, the defaults: 33 candidate layers)
# the tuning optimum over scales 0.001-3 and lams 0-0.9 was a scale of 0.003 (block_00), 0.01, 0.03 (embed, early
# blocks) or 0.1 (block_06 on) and a lam of 0.02-0.05: the earlier scales {0.1, 0.3, 1} put it on their lower edge in
# 33 of 33 layers. These grids hold every one of those optima inside them with room on both sides; lam up to 0.9 and
# down to 0.001 for datastores that help more (larger, or close to the held-out text) or less. A lam of 0 or 1 is
# allowed (no edge: nothing lies beyond it) but not a default: lam = 0, the base LM, is always compared (kNN may not
# help at a layer; raygeom.analyses.knn.choose_tuning_point).
# The scales run from 1e-4 to 100 because the temperature's range has two limits the objective flattens towards: at
# 1e-4 of the median neighbour distance the weight is the nearest neighbour's alone, at 100 the k neighbours weigh
# (nearly) the same. On the every-analysis run (chunk_len 128) the optimum lay at one of them in 10 of 54 layers:
# SmolLM2 block_00/09/10 fall towards equal weights (the objective at 100 within 2e-5 of the limit), block_11/12 are
# best at 10-30, attn_last at 3e-4; Gemma-3 block_01 at 30, block_13/16/attn_last at 1e-4-3e-4. Within those limits
# every layer of both models has its optimum inside the grid, up to the tolerance TUNE_RTOL.
KNN_SCALES = "0.0001,0.0003,0.001,0.003,0.01,0.03,0.1,0.3,1,3,10,30,100"
KNN_LAMS = "0.001,0.002,0.005,0.01,0.02,0.03,0.05,0.1,0.2,0.3,0.5,0.7,0.9"


def param(
    default: Any,
    help: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    choices: tuple | None = None,
    nonempty: bool = False,
    flag: str | None = None,
    rule: tuple | None = None,
    words: tuple[str, ...] = (),
):
    """A declared parameter: its default, help text and the values allowed (``low``/``high`` bounds, closed
    unless ``*_open``; ``choices``; ``nonempty`` strings; ``rule`` = (predicate, what it allows in words) for a
    string with a grammar, e.g. a comma-separated list). ``flag`` renames the CLI option (default ``--name``).
    ``words``: values taken as text beside the declared type (e.g. 'auto'), which the class's ``normalise`` turns
    into settings; a job file and a flag take them alike."""
    return field(
        default=default,
        metadata={
            "help": help,
            "low": low,
            "high": high,
            "low_open": low_open,
            "high_open": high_open,
            "choices": choices,
            "nonempty": nonempty,
            "flag": flag,
            "rule": rule,
            "words": tuple(words),
        },
    )


def declared_as(cls: type, name: str, default=MISSING, **changes):
    """The declaration of ``cls.name`` again, for a class that takes the same setting (one help text and range;
    its default unless ``default`` says otherwise); ``changes``: e.g. another ``flag``."""
    spec = next(f for f in fields(cls) if f.name == name)
    return field(default=spec.default if default is MISSING else default, metadata={**spec.metadata, **changes})


def _numbers(text: str) -> list[float] | None:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        return None
    return values if values and all(math.isfinite(v) for v in values) else None


def number_list(
    low: float | None = None,
    high: float | None = None,
    positive: bool = False,
    integers: bool = False,
    words: tuple[str, ...] = (),
    one: bool = False,
) -> tuple:
    """A ``rule`` for a comma-separated list of numbers (``one``: a single number), or one of ``words``, each within
    the bounds given."""

    def allowed(text) -> bool:
        if not isinstance(text, str):
            return False
        if text.strip() in words:
            return True
        values = _numbers(text)
        return (
            values is not None
            and (not one or len(values) == 1)
            and all(
                (not integers or v == int(v))
                and (low is None or v >= low)
                and (high is None or v <= high)
                and (not positive or v > 0)
                for v in values
            )
        )

    kind = "integers" if integers else "numbers"
    bounds = [
        f">= {bound_text(low)}" if low is not None else "",
        f"<= {bound_text(high)}" if high is not None else "",
        "> 0" if positive else "",
    ]
    text = ("an integer" if integers else "a number") if one else f"comma-separated {kind}"
    text += " " + " and ".join(b for b in bounds if b) if any(bounds) else ""
    return allowed, text + "".join(f", or {word}" for word in words)


def bound_text(value: float) -> str:
    """A bound as a refusal states it: whole numbers in full (4,294,967,295, not 4.29497e+09)."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def nearest(word: str, known) -> str:
    """' (did you mean X?)' for the known word closest to a misspelt one, or ''."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def declared_type(cls: type, name: str) -> type:
    hint = typing.get_type_hints(cls)[name]
    return hint if hint in _TYPES else typing.get_args(hint)[0] if typing.get_args(hint) else hint


def allowed(cls: type, name: str) -> str:
    """The declared range of one parameter, as the refusal line states it."""
    spec = next(f for f in fields(cls) if f.name == name)
    meta, kind = spec.metadata, declared_type(cls, name)
    words = "".join(f" or '{word}'" for word in meta.get("words", ()))
    if meta.get("choices"):
        return "one of " + ", ".join(map(str, meta["choices"])) + words
    if meta.get("rule"):
        return meta["rule"][1] + words
    parts = [_TYPES.get(kind, kind.__name__)]
    if meta.get("low") is not None:
        parts.append(f"{'>' if meta['low_open'] else '>='} {bound_text(meta['low'])}")
    if meta.get("high") is not None:
        parts.append(f"{'<' if meta['high_open'] else '<='} {bound_text(meta['high'])}")
    if meta.get("nonempty"):
        parts.append("not empty")
    return " ".join(parts[:1]) + (" " + " and ".join(parts[1:]) if len(parts) > 1 else "") + words


def check_value(cls: type, name: str, value: Any, where: str = "", label: str | None = None) -> Any:
    """``value`` checked against its declaration; returns it (an int given for a float becomes a float).
    ``label``: the name the refusal gives it (a CLI flag), instead of ``where`` + ``name``."""
    spec = next(f for f in fields(cls) if f.name == name)
    meta, kind = spec.metadata, declared_type(cls, name)
    label = label or f"{where}{name}"
    shown = repr(value)
    shown = shown if "\n" not in shown else type(value).__name__  # an array from the API: the line stays one line
    refuse = RaygeomError(f"{label} must be {allowed(cls, name)}, got {shown}")
    if kind is bool:
        if not isinstance(value, bool):
            raise refuse
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise refuse
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise refuse
        value = float(value)
    elif kind is str:
        if not isinstance(value, str) or (meta.get("nonempty") and not value.strip()):
            raise refuse
    if meta.get("choices") and value not in meta["choices"]:
        raise refuse
    if meta.get("rule") and not meta["rule"][0](value):
        raise refuse
    low, high = meta.get("low"), meta.get("high")
    if low is not None and (value <= low if meta["low_open"] else value < low):
        raise refuse
    if high is not None and (value >= high if meta["high_open"] else value > high):
        raise refuse
    return value


def default_of(cls: type, name: str) -> Any:
    spec = next(f for f in fields(cls) if f.name == name)
    return spec.default if spec.default is not MISSING else spec.default_factory()


def parse_text(cls: type, name: str, text: str, label: str | None = None) -> Any:
    """A command-line value of a declared parameter: parsed to its declared type, then checked (``label``: the flag)."""
    kind, shown = declared_type(cls, name), label or name
    words = next(f for f in fields(cls) if f.name == name).metadata.get("words", ())
    if isinstance(text, str) and text.strip().lower() in words:
        return text.strip().lower()
    try:
        value = int(text.strip()) if kind is int else float(text.strip()) if kind is float else text
        return check_value(cls, name, value)
    except (ValueError, RaygeomError):
        raise RaygeomError(f"{shown} must be {allowed(cls, name)}, got {text!r}") from None


# One canonical form per setting, applied once where settings enter (Params) and where rows are tabled
# (canonical_rows), before unit keys, labels and tables are made from them:
# - a setting absent from a row, or None there, that has a value meaning "as before it existed": k_per_d absent is
#   a fixed k, the same as k_per_d = 0 (unit keys leave a 0 out, so stores from before it keep their keys);
ABSENT_MEANS = {"k_per_d": 0.0}
# - a list of one value where one value belongs is that value (r = [1] in a job file is r = 1).


def canonical_value(name: str, value: Any) -> Any:
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    return ABSENT_MEANS[name] if value is None and name in ABSENT_MEANS else value


def canonical_rows(rows: list[dict]) -> list[dict]:
    """``rows`` (of one table) with every setting in its canonical form: a setting of :data:`ABSENT_MEANS` that some
    row holds is filled in the rows without it, so rows from before it existed and rows after it are one series."""
    present = {name for row in rows for name in ABSENT_MEANS if name in row}
    return [{**row, **{name: canonical_value(name, row.get(name)) for name in present}} for row in rows]


@dataclass(frozen=True)
class Params:
    """Base of every analysis's parameters: each field declared with :func:`param`, put in its canonical form
    (:func:`canonical_value`) and checked on creation."""

    def __post_init__(self):
        for spec in fields(self):
            if "help" in spec.metadata:
                value = canonical_value(spec.name, getattr(self, spec.name))
                object.__setattr__(self, spec.name, check_value(type(self), spec.name, value))

    @classmethod
    def declared(cls) -> list:
        return [f for f in fields(cls) if "help" in f.metadata]

    @classmethod
    def from_mapping(cls, values: dict, where: str = "") -> "Params":
        """From a job-file table or CLI options (None = not given); unknown keys and bad values get one line."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            hint = nearest(unknown[0], names)
            raise RaygeomError(f"{where}unknown key(s): {', '.join(unknown)}" + (hint or f" (known: {', '.join(sorted(names))})"))
        if values.get("k") is not None and values.get("k_per_d") and "k_per_d" in names:
            raise RaygeomError(
                f"{where}k and k_per_d conflict: k_per_d > 0 sets k = round(k_per_d * d) for each model; give one of them"
            )
        values = {name: canonical_value(name, value) for name, value in cls.normalise(values).items()}
        checked = {
            name: check_value(cls, name, value, where)
            for name, value in values.items()
            if value is not None and "help" in next(f for f in fields(cls) if f.name == name).metadata
        }
        checked.update({name: value for name, value in values.items() if value is not None and name not in checked})
        try:
            return cls(**checked)
        except RaygeomError as error:
            raise RaygeomError(f"{where}{error}") from None

    @classmethod
    def normalise(cls, values: dict) -> dict:
        """``values`` with a declared word (see :func:`param`) turned into the settings it stands for."""
        return values

    @classmethod
    def grid(cls, values: dict, where: str = "") -> list["Params"]:
        """A job-file table where a list means 'each of these': ``r = [0, 1, 5]`` gives three Params."""
        import itertools

        keys = list(values)
        axes = [v if isinstance(v, list) else [v] for v in values.values()]
        for key, axis in zip(keys, axes):
            if not axis:
                raise RaygeomError(f"{where}{key} is an empty list; give a value or a list of values")
        return [cls.from_mapping(dict(zip(keys, combo)), where) for combo in itertools.product(*axes)]

    def settings(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def given_over(self, values: dict) -> "Params":
        """These parameters with ``values`` (given, e.g. on the command line) over them."""
        return type(self).from_mapping({**self.settings(), **type(self).normalise(values)})


def k_per_d_param():
    """The k/d declaration shared by every analysis with a readout subspace of dimension k."""
    return param(
        0.0,
        "When > 0: k = round(k_per_d * d) for each model, the same k/d at every width (k is then ignored); 0: the fixed k.",
        low=0.0,
        high=1.0,
        high_open=True,
    )


def for_width(params, d: int | None):
    """``params`` on a model of width ``d``: k resolved from k_per_d when the analysis has one and it is set."""
    if not getattr(params, "k_per_d", 0.0) or d is None:
        return params
    from dataclasses import replace

    return replace(params, k=max(1, round(params.k_per_d * d)))


def key_settings(params) -> list:
    """The values a unit key is made of: every setting, except a k_per_d of 0 (a fixed k), so the units stored
    before k_per_d existed keep their keys."""
    return [v for n, v in params.settings().items() if not (n == "k_per_d" and not v)]


@dataclass(frozen=True)
class PGAParams(Params):
    k: int = param(100, "Readout subspace dimension (k < d).", low=1, high=MAX_WIDTH)
    k_per_d: float = k_per_d_param()
    r: int = param(1, "Top principal components removed after centring (CCR-r).", low=0, flag="--ccr", high=MAX_WIDTH)
    n_null: int = param(
        100,
        "Random subspaces in the null, or 'auto': blocks of 100 until z's 95% half-width is <= max(z_half_width, "
        "z_rel_width x |z|) and, below n_null_decide, its interval holds none of 0, -2, 2; at most n_null_cap.",
        low=2,
        high=MAX_NULLS,
        words=("auto",),
    )
    seed: int = param(0, "Seed of the nulls (and of the text sample).", low=0, high=MAX_SEED)
    null_chunks: int = param(10, "Ray tasks the nulls of one layer are split into.", low=1, high=10_000)
    gpus_per_task: float = param(0.0, "GPUs each PGA task asks Ray for (0: CPU).", low=0.0, high=64.0)
    # --n-null auto: nulls are added in blocks of AUTO_NULL_BLOCK until the 95 % half-width of z is at most
    # max(z_half_width, z_rel_width * |z|), or n_null_cap nulls; n_null is then the first block;
    n_null_auto: bool = False
    z_half_width: float = param(0.25, "Target 95% half-width of z for --n-null auto.", low=0.0, low_open=True, high=MAX_Z)
    z_rel_width: float = param(
        0.05,
        "--n-null auto also stops at this fraction of |z| (half-width <= max(z_half_width, z_rel_width * |z|)).",
        low=0.0,
        high=1.0,
        high_open=True,
    )
    n_null_cap: int = param(1000, "Most nulls --n-null auto draws for one layer.", low=2, high=MAX_NULLS)
    # and, below n_null_decide nulls, while z's interval holds 0, -2 or 2 (a decision still open; 0: off).
    n_null_decide: int = param(
        500,
        "--n-null auto keeps drawing while z's 95% interval holds 0, -2 or 2 (its sign or "
        "|z| > 2 still open), up to this many nulls (0: off; --n-null-cap still caps).",
        low=0,
        high=MAX_NULLS,
    )
    # Interval over texts: this many seeded half-samples of the texts (0: none), each with 10 nulls.
    text_halves: int = param(10, "Half-samples of the texts for the interval over texts (0: none, else >= 2).", low=0, high=1000)

    @classmethod
    def normalise(cls, values: dict) -> dict:
        # a count or 'auto' sets n_null_auto with it, so a count given over an auto job is a count
        value = values.get("n_null")
        known = (isinstance(value, str) and value.strip().lower() == "auto") or (
            isinstance(value, int) and not isinstance(value, bool)
        )
        return {**values, **n_null_settings(value)} if known and values.get("n_null_auto") is None else values

    def __post_init__(self):
        super().__post_init__()
        if self.text_halves == 1:
            raise RaygeomError(f"text-halves must be 0 (no interval over texts) or at least 2, got {self.text_halves}")
        if self.n_null_auto and not self.n_null_cap >= self.n_null:
            raise RaygeomError(f"--n-null auto needs a cap of at least {self.n_null} nulls")

    def check_against(
        self, n: int, d: int | None = None, readout_components: int | None = None, what: str = "", words: dict | None = None
    ) -> None:
        """Refuse, before any extraction, sizes that can only give NaN: CCR removing every direction the
        N samples span, or a readout subspace the store cannot hold. ``words``: how the line names r, k and
        n_samples (default their flags, --ccr, --k and --n-samples; a job file's own words, e.g. ``[analyses.pga] r``)."""
        named = {"r": "--ccr", "k": "--k", "n_samples": "--n-samples", **(words or {})}

        def said(name: str, value) -> str:
            return f"{named[name]} = {value}" if named[name].startswith("[") else f"{named[name]} {value}"

        of = f" for {what}" if what else ""
        if n < 3:
            raise RaygeomError(f"n-samples must be at least 3 (pairwise geometry needs 3 points), got {n}")
        span = n - 1 if d is None else min(n - 1, d)
        if self.r >= span:
            raise RaygeomError(
                f"{said('r', self.r)} removes every direction that N={n} samples"
                + (f" in d={d}" if d else "")
                + f" span{of} (at most {span}); use a smaller {named['r']} or more {named['n_samples']}"
            )
        if d is not None and self.k >= d:
            raise RaygeomError(f"k must satisfy 0 < k < d; got k={self.k}, d={d}{of}")
        stored = None if readout_components is None else (readout_components if d is None else min(d - 1, readout_components))
        if stored is not None and self.k > stored:
            raise RaygeomError(f"k={self.k} exceeds the {stored} readout components stored{of}; use {said('k', stored)} or less")


@dataclass(frozen=True)
class ChunkShape(Params):
    """Text read in chunks of tokens: declared once for every analysis that does (token_dispersion, slices, gap,
    knn_lm) and for a trajectory job's dispersion side, so each setting has one help text and one default."""

    chunk_len: int = param(512, "Tokens per chunk (at most the model's context).", low=2, high=MAX_TOKENS)
    batch_size: int = param(4, "Chunks per forward batch.", low=1, high=MAX_BATCH)


@dataclass(frozen=True)
class ChunkSettings(ChunkShape):
    """Chunks drawn per domain (label) of the corpus, and the token set of the dispersion gap's domain side."""

    chunks_per_domain: int = param(40, "Chunks drawn from each domain (label) of the corpus.", low=1, high=MAX_COUNT)
    domain_tokens: str = param(
        "digits", "Token set of the gap's domain side: digits, or comma-separated token texts.", nonempty=True
    )


# The one rule of every --layers option (raygeom.sources.layers.select_layers implements it).
LAYERS_HELP = (
    "all, or comma-separated names, block numbers and ranges. Integers count blocks: 5 = block_05, -1 = the last "
    "block, 2:5 = block_02..block_04 (end excluded); embed (the first block's input) and final_norm are named, "
    "e.g. embed,5,-1,final_norm. Inside a block: 5.attn_out, 5.resid_mid, 5.mlp_out (block_05.mlp_out; "
    "resid_mid + mlp_out = the block's output)."
)


AUTO_NULL_BLOCK = 100


def n_null_settings(value: str | int | None) -> dict:
    """``--n-null`` as given on the command line or in a job file: a count, or ``auto``."""
    if value is None:
        return {}
    if isinstance(value, str) and value.strip().lower() == "auto":
        return {"n_null": AUTO_NULL_BLOCK, "n_null_auto": True}
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise RaygeomError(f"n-null must be a whole number or 'auto', got {value!r}") from None
    if isinstance(value, float) and value != count or isinstance(value, bool):
        raise RaygeomError(f"n-null must be a whole number or 'auto', got {value!r}")
    return {"n_null": count, "n_null_auto": False}
