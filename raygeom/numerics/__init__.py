"""Pure numerics: arrays in, arrays out. No Ray, no files, no models."""

from raygeom.numerics.pga import (
    PGAResult,
    PreparedLayer,
    average_ranks,
    ccr,
    null_rhos,
    pairwise_cosine_distances,
    prepare_layer,
    random_subspace,
    readout_basis,
    readout_basis_from_gram,
    subspace_pga,
    subspace_rho,
    summarize_null,
)

__all__ = [
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
    "summarize_null",
]
