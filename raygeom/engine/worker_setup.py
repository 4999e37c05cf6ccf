"""Run by every Ray worker of a raygeom job when it starts (``worker_process_setup_hook``).

A task can be interrupted (``ray.cancel`` or Ctrl-C raise KeyboardInterrupt in it), and a task's first
step is to import the module its function lives in. An interrupt that lands inside the first
``import scipy.stats`` leaves scipy half-imported in that worker: ``scipy.ndimage._ndimage_api`` stays in
``sys.modules`` while ``scipy.ndimage`` is dropped, and every later task the worker runs fails with
``NameError: name '_ndimage_api' is not defined``. Importing the numerics here, before the worker takes any
task, leaves nothing for a cancel to interrupt.

Importing them this early also starts numpy's BLAS and torch's thread pools before Ray sets
OMP_NUM_THREADS for the first task, so they would size themselves to every core of the node: a unit task
asks Ray for one CPU, and with N tasks of N threads each on N cores every task ran at half speed (measured
here: one task alone used 1.64 cores, and 2 Ray workers gave 1.05x over 1). So every pool starts at one
thread; a replica actor and a Ray Train worker then set torch's to the CPUs they asked for.
"""

from __future__ import annotations

import importlib
import pkgutil

HOOK = f"{__name__}.import_numerics"


def import_numerics() -> None:
    import raygeom.numerics as numerics

    for module in pkgutil.iter_modules(numerics.__path__):
        importlib.import_module(f"{numerics.__name__}.{module.name}")
    one_thread()


def one_thread() -> None:
    """Every BLAS/OpenMP pool of this process, and torch's, at one thread (a unit task's one CPU)."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1)  # kept: applied at once, restored only on request
