"""raygeom: how language models organise hidden-state geometry for prediction.

The public Python API is the names in ``__all__`` (``help(raygeom.<name>)`` documents each): load models and
texts the way the CLI does, extract pooled layers (block outputs and points inside blocks), score Subspace PGA
with every interval the CLI stores, write activations captured elsewhere into a store, and render a store's
report. Every array argument takes numpy or torch (any float dtype and device, ``requires_grad`` too).

The names load on first use, so ``import raygeom`` (and the CLI's every one-line refusal) does not pay for torch
up front. Numerics (pure, arrays in and out) live in :mod:`raygeom.numerics`; Ray orchestration in
:mod:`raygeom.engine`.
"""

from raygeom.errors import InputError, RaygeomError

__version__ = "0.1.0"
_LAZY = {
    **{
        name: "raygeom.api"
        for name in (
            "PGAResult",
            "as_array",
            "dispersion",
            "layer_activations",
            "layer_names",
            "load_builtin",
            "load_model",
            "load_texts",
            "pga_by_layer",
            "readout_basis",
            "select_layers",
            "subspace_pga",
            "unembedding_matrix",
            "store_pga",
            "store_analysis",
        )
    },
    "ExtractionSettings": "raygeom.replica.extract",
    "write_activations": "raygeom.store.activations",
}
__all__ = ["InputError", "RaygeomError", *sorted(_LAZY), "write_report"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'raygeom' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def write_report(store_root, out=None, overlay=()):
    """Write the interactive HTML report of everything the store at ``store_root`` holds (default
    ``<store>/report.html``, as ``raygeom report STORE`` does) and return its path. ``overlay``: more stores drawn
    in the same figures, one facet each (as ``raygeom report STORE OTHER ...``)."""
    from raygeom.report.html import write_report as write
    from raygeom.store.activations import checked_path

    checked_path(store_root, "store_root")
    if out is not None:
        checked_path(out, "out")
    if isinstance(overlay, (str, bytes)) or not isinstance(overlay, (list, tuple)):
        raise InputError(f"overlay must be a list of store paths, got {type(overlay).__name__}")
    return write(store_root, out, overlay=[checked_path(other, "overlay") for other in overlay])
