"""raygeom: how language models organise hidden-state geometry for prediction.

Numerics (pure, arrays in and out) live in :mod:`raygeom.numerics`; the
notebook API in :mod:`raygeom.api`; Ray orchestration in :mod:`raygeom.engine.orchestrate`.
"""

from raygeom.api import layer_activations, load_builtin, load_model, load_texts, pga_by_layer, unembedding_matrix
from raygeom.errors import InputError, RaygeomError
from raygeom.numerics.pga import PGAResult, readout_basis, subspace_pga

__version__ = "0.1.0"
__all__ = ["InputError", "PGAResult", "RaygeomError", "layer_activations", "load_builtin", "load_model", "load_texts",
           "pga_by_layer", "readout_basis", "subspace_pga", "unembedding_matrix", "write_report"]


def write_report(store_root, out=None):
    """The interactive HTML report of a store (see raygeom.report.html); returns its path."""
    from raygeom.report.html import write_report as write

    return write(store_root, out)
