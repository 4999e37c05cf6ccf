"""Array arguments as numpy arrays, whatever they came as (numpy, torch, nested lists): what every public entry
point that takes vectors calls first. Torch-free unless given a tensor."""

from __future__ import annotations

import numpy as np

from raygeom.errors import InputError


def as_array(x, dtype=np.float64, name: str = "array") -> np.ndarray:
    """``x`` (numpy array, torch tensor of any dtype on any device, with or without ``requires_grad``, or a nested
    list) as a numpy array of ``dtype``. bf16 and fp16 tensors are widened on their device, then copied to the CPU."""
    try:
        dtype = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError):  # numpy parses a string as a dtype spec: ',' is a SyntaxError
        dtype = None
    if dtype is None or dtype.kind not in "fiu":
        raise InputError(f"dtype must be a real numpy dtype (float or integer), got {dtype!r}")
    if not isinstance(name, str):
        raise InputError(f"name must be a string, got {type(name).__name__}")
    if x is None:
        raise InputError(f"{name} must be a numeric array or tensor, got None")
    if type(x).__module__.startswith("torch"):
        import torch

        if isinstance(x, torch.Tensor):
            if x.is_complex() or x.dtype == torch.bool:
                raise InputError(f"{name} must hold real numbers, got {x.dtype}")
            x = x.detach()
            if x.is_floating_point() and x.dtype not in (torch.float32, torch.float64):
                x = x.float()
            return x.cpu().numpy().astype(dtype, copy=False)
    try:
        array = np.asarray(x)
        if array.dtype.kind in "bcUSmM":
            raise InputError(f"{name} must hold real numbers, got {array.dtype}")
        if array.dtype.kind == "O":  # e.g. [1, None]: numpy would make the None a NaN
            raise InputError(f"{name} must be a numeric array or tensor, got {type(x).__name__} holding non-numbers")
        if array.dtype.kind not in "fiu":  # e.g. ml_dtypes' bfloat16 reads as kind 'V'
            array = array.astype(np.float32)
        return array.astype(dtype, copy=False)
    except InputError:
        raise
    except (TypeError, ValueError) as error:
        raise InputError(f"{name} must be a numeric array or tensor, got {type(x).__name__}: {error}") from None
