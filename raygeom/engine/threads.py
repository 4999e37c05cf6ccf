"""Thread pools of a Ray worker that runs raygeom's unit tasks.

A unit task asks Ray for one CPU. numpy's BLAS and torch's pools size themselves to every core of the node when
they start, so with N tasks of N threads each on N cores every task ran at half speed (measured here: one task
alone used 1.64 cores, and 2 Ray workers gave 1.05x over 1). So a unit task first puts every pool of its process
at one thread (:func:`one_thread`, once per process); a replica actor and a Ray Train worker set torch's to the
CPUs they asked for.

This is done in the task, not in a ``worker_process_setup_hook``: a hook is a runtime environment, and Ray starts
every worker of a job that has one through ``setup_worker.py``, a second Python that imports Ray before the worker
does (about 1 CPU-s per worker here). The hook also imported every numerics module in every worker, replicas
included, so that a ``ray.cancel`` could not interrupt a first ``import scipy.stats`` (which leaves scipy
half-imported for every later task); raygeom no longer cancels tasks (``UnitRunner._drop``).
"""

from __future__ import annotations

_done = False


def one_thread() -> None:
    """Every BLAS/OpenMP pool of this process, and torch's, at one thread (a unit task's one CPU); once per process."""
    global _done
    if _done:
        return
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1)  # kept: applied at once, restored only on request
    _done = True
