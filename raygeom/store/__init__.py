"""The Arrow/Parquet store (layout in :mod:`raygeom.store.tree`) and :func:`write_activations`, which writes vectors
captured elsewhere into it as an extraction."""

from raygeom.store.activations import write_activations

__all__ = ["write_activations"]
