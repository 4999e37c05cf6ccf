"""A driver that only names replicas imports no torch (about 2 s of every CLI process), and raygeom.numerics still
offers every name it lists."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER_MODULES = (
    "raygeom.numerics.uncertainty",
    "raygeom.analyses.pga",
    "raygeom.engine.orchestrate",
    "raygeom.jobs.run",
    "raygeom.report.html",
)


def test_the_driver_modules_import_no_torch():
    code = f"import importlib, sys\nfor m in {DRIVER_MODULES!r}: importlib.import_module(m)\nprint('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


def test_the_driver_and_the_unit_task_numerics_import_no_scipy_stats():
    """scipy.stats costs 0.8 s of import in the CLI and in every Ray worker of a job; its few functions come from
    scipy.special (raygeom.numerics.distributions). Only the probe (sklearn) and k-means slices still pull it in."""
    task_modules = (
        "raygeom.numerics.pga",
        "raygeom.numerics.dispersion",
        "raygeom.numerics.layer_geometry",
        "raygeom.numerics.spectral",
        "raygeom.numerics.twonn",
        "raygeom.numerics.knnlm",
        "raygeom.analyses.dispersion",
        "raygeom.analyses.knn",
        "raygeom.analyses.train",
    )
    code = (
        f"import importlib, sys\nfor m in {DRIVER_MODULES + task_modules!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m in ('scipy.stats', 'sklearn')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_every_listed_name_resolves_to_its_module():
    import importlib

    import raygeom.numerics as numerics

    for name in numerics.__all__:
        module = importlib.import_module(f"raygeom.numerics.{numerics._MODULE_OF[name]}")
        value = getattr(numerics, name)  # a function comes with its arguments checked (raygeom.numerics.checks)
        assert getattr(value, "__wrapped__", value) is getattr(module, name), name
    assert set(numerics.__all__) <= set(dir(numerics))
    from raygeom.numerics import null_rhos, summarize_null  # the package's names, as callers import them

    assert callable(null_rhos) and summarize_null(1.0, [0.0, 1.0])["z"] == pytest.approx((1.0 - 0.5) / 0.5**0.5)  # sd = sqrt(1/2)
    with pytest.raises(AttributeError, match="no attribute 'not_a_metric'"):
        _ = numerics.not_a_metric
