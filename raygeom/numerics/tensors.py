"""Tensors over numpy arrays without a copy."""

from __future__ import annotations

import warnings

import numpy as np
import torch


def shared_tensor(array) -> torch.Tensor:
    """A tensor over ``array``, without a copy. In a Ray task the arguments are the object store's read-only pages;
    the numerics only read their inputs, so torch's warning about non-writable arrays does not apply. Left on, Ray
    prints it on the driver's console from every worker, as stray lines among a command's own output."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
        return torch.from_numpy(np.asarray(array))
