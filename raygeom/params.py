"""Analysis parameters shared by job files, the CLI and the orchestration layer."""

from __future__ import annotations

from dataclasses import dataclass, fields

from raygeom.errors import RaygeomError


def check_types(settings) -> None:
    """Job files are user input: a wrong type gets a one-line error naming the field."""
    for field in fields(settings):
        value = getattr(settings, field.name)
        expected = {"int": int, "float": (int, float), "bool": bool, "str": str}.get(str(field.type))
        if expected is None:
            continue
        if isinstance(value, bool) and expected is not bool or not isinstance(value, expected):
            raise RaygeomError(f"{field.name} must be {field.type}, got {value!r}")


@dataclass(frozen=True)
class PGAParams:
    k: int = 100
    r: int = 1
    n_null: int = 100
    seed: int = 0
    null_chunks: int = 10
    gpus_per_task: float = 0.0
    # --n-null auto: nulls are added in blocks of AUTO_NULL_BLOCK until the 95 % half-width of z is at most
    # z_half_width, or n_null_cap nulls; n_null is then the first block.
    n_null_auto: bool = False
    z_half_width: float = 0.25
    n_null_cap: int = 1000
    # Interval over texts: this many seeded half-samples of the texts (0: none), each with 10 nulls.
    text_halves: int = 10

    def __post_init__(self):
        check_types(self)
        if self.text_halves == 1 or self.text_halves < 0:
            raise RaygeomError(f"text-halves must be 0 (no interval over texts) or at least 2, got {self.text_halves}")
        if self.n_null_auto and not (self.z_half_width > 0 and self.n_null_cap >= self.n_null):
            raise RaygeomError(f"--n-null auto needs a positive half-width target and a cap of at least {self.n_null} nulls")
        if self.k <= 0:
            raise RaygeomError(f"k must be positive, got {self.k}")
        if self.r < 0:
            raise RaygeomError(f"ccr must be >= 0, got {self.r}")
        if self.n_null < 2:
            raise RaygeomError(f"n-null must be at least 2, got {self.n_null}")
        if self.null_chunks < 1:
            raise RaygeomError(f"null-chunks must be at least 1, got {self.null_chunks}")

    def check_against(self, n: int, d: int | None = None, readout_components: int | None = None, what: str = "") -> None:
        """Refuse, before any extraction, sizes that can only give NaN: CCR removing every direction the
        N samples span, or a readout subspace the store cannot hold."""
        of = f" for {what}" if what else ""
        if n < 3:
            raise RaygeomError(f"n-samples must be at least 3 (pairwise geometry needs 3 points), got {n}")
        span = n - 1 if d is None else min(n - 1, d)
        if self.r >= span:
            raise RaygeomError(f"--ccr {self.r} removes every direction that N={n} samples" + (f" in d={d}" if d else "")
                               + f" span{of} (at most {span}); use a smaller --ccr or more --n-samples")
        if d is not None and self.k >= d:
            raise RaygeomError(f"k must satisfy 0 < k < d; got k={self.k}, d={d}{of}")
        stored = None if readout_components is None else (readout_components if d is None else min(d - 1, readout_components))
        if stored is not None and self.k > stored:
            raise RaygeomError(f"k={self.k} exceeds the {stored} readout components stored{of}; use --k {stored} or less")


# The one rule of every --layers option (raygeom.layers.select_layers implements it).
LAYERS_HELP = ("all, or comma-separated names, block numbers and ranges. Integers count blocks: 5 = block_05, -1 = the last "
               "block, 2:5 = block_02..block_04 (end excluded); embed (the first block's input) and final_norm are named, "
               "e.g. embed,5,-1,final_norm. Inside a block: 5.attn_out, 5.resid_mid, 5.mlp_out (block_05.mlp_out; "
               "resid_mid + mlp_out = the block's output).")


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
