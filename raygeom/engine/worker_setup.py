"""Run by every Ray worker of a raygeom job when it starts (``worker_process_setup_hook``).

The engine cancels tasks (``ray.cancel`` raises KeyboardInterrupt in the running task), and a task's first
step is to import the module its function lives in. An interrupt that lands inside the first
``import scipy.stats`` leaves scipy half-imported in that worker: ``scipy.ndimage._ndimage_api`` stays in
``sys.modules`` while ``scipy.ndimage`` is dropped, and every later task the worker runs fails with
``NameError: name '_ndimage_api' is not defined``. Importing the numerics here, before the worker takes any
task, leaves nothing for a cancel to interrupt.
"""

from __future__ import annotations

import importlib
import pkgutil

HOOK = f"{__name__}.import_numerics"


def import_numerics() -> None:
    import raygeom.numerics as numerics

    for module in pkgutil.iter_modules(numerics.__path__):
        importlib.import_module(f"{numerics.__name__}.{module.name}")
