"""Pure numerics: arrays in, arrays out. No Ray, no files, no models.

The names below load their module on first use (PEP 562), each function with its arguments checked
(:mod:`raygeom.numerics.checks`; the modules' own functions are not), so importing one torch-free module of this package (say
``raygeom.numerics.uncertainty``) does not import torch, which ``raygeom.numerics.pga``'s fast path needs."""

from importlib import import_module

_FROM = {
    "pga": (
        "PGAResult",
        "PreparedLayer",
        "average_ranks",
        "ccr",
        "null_rhos",
        "pairwise_cosine_distances",
        "prepare_layer",
        "random_subspace",
        "readout_basis",
        "readout_basis_from_gram",
        "subspace_pga",
        "subspace_rho",
    ),
    "pga_texts": ("half_sample_spread", "pga_text_interval"),
    "uncertainty": (
        "auto_null_count",
        "auto_nulls",
        "bootstrap_ci",
        "empirical_p_values",
        "holds_threshold",
        "jackknife_se",
        "normal_interval",
        "null_blocks",
        "null_target_reached",
        "paired_t",
        "spearman_with_ci",
        "summarize_null",
        "text_subsample",
        "text_subsamples",
        "token_blocks",
        "wilson_interval",
        "z_delta_se",
        "z_uncertainty",
    ),
}
_MODULE_OF = {name: module for module, names in _FROM.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name in _MODULE_OF:
        value = getattr(import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
        if not isinstance(value, type):  # a function: its arguments checked first (raygeom.numerics.checks)
            from raygeom.numerics.checks import checked

            value = checked(value)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
