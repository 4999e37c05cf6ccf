"""raygeom: how language models organise hidden-state geometry for prediction.

Numerics (pure, arrays in and out) live in :mod:`raygeom.numerics`; the
notebook API in :mod:`raygeom.api`; Ray orchestration in :mod:`raygeom.engine`.
The names below load on first use, so the CLI (and every one-line refusal) does not pay for torch up front.
"""

from raygeom.errors import InputError, RaygeomError

__version__ = "0.1.0"
_LAZY = {
    **{name: "raygeom.api" for name in ("layer_activations", "load_builtin", "load_model", "load_texts", "pga_by_layer",
                                         "unembedding_matrix")},
    **{name: "raygeom.numerics.pga" for name in ("PGAResult", "readout_basis", "subspace_pga")},
}
__all__ = ["InputError", "RaygeomError", *sorted(_LAZY), "write_report"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'raygeom' has no attribute {name!r}")


def write_report(store_root, out=None):
    """The interactive HTML report of a store (see raygeom.report.html); returns its path."""
    from raygeom.report.html import write_report as write

    return write(store_root, out)
