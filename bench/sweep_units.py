"""What only the sweep benchmarks use: PGA units for every landed extraction, and the full suite's estimate."""

from __future__ import annotations

from raygeom.params import PGAParams
from raygeom.sources import revisions as pythia
from raygeom.store.tree import Store


def pga_units_for(store: Store, params: PGAParams):
    """``run_sweep``'s ``units_for``: PGA on every layer of each landed extraction."""
    from raygeom.analyses import pga

    def units_for(item, info: dict) -> list:
        spec = item.request.spec
        return pga.units(store, spec.slug, spec.revision, info["layers"], params, info=info)

    return units_for


def full_suite_estimate(
    extract_rate_gpu: float,
    load_seconds_per_param: float,
    pga_unit_seconds,
    n_samples: int = 2000,
    seq_len: int = 128,
    gpus: int = 8,
    deduped: bool = False,
) -> dict:
    """Every Pythia size x 154 revisions x all layers (see docs/sweeps.md). ``extract_rate_gpu``: GPU-seconds
    per parameter-token of forward pass; ``pga_unit_seconds(d)``: CPU-seconds of one PGA unit at width d."""
    revisions = len(pythia.PYTHIA_REVISIONS) * (2 if deduped else 1)
    sizes = pythia.PYTHIA_SIZES.values()
    params = sum(s.params for s in sizes)
    forward = extract_rate_gpu * params * n_samples * seq_len * revisions
    load = load_seconds_per_param * params * revisions
    pga_cpu = sum(s.n_layers * pga_unit_seconds(s.d) for s in sizes) * revisions
    return {
        "revisions_per_model": revisions,
        "total_params": params,
        "units": sum(s.n_layers for s in sizes) * revisions,
        "forward_gpu_hours": forward / 3600,
        "load_gpu_hours": load / 3600,
        "extract_gpu_hours": (forward + load) / 3600,
        "pga_cpu_hours": pga_cpu / 3600,
        "node_wall_hours": (forward + load) / 3600 / gpus,
    }
