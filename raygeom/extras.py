"""The optional dependencies (pyproject's extras) and the one line that names the extra a missing one belongs to.
Standard library only: every layer may ask."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys

from raygeom.errors import RaygeomError

# The module a feature imports: the extra that installs it, and what needs it (for the message).
EXTRAS = {
    "matplotlib": ("report", "the plots need"),
    "plotly": ("report", "the report needs"),
    "tensorboardX": ("tensorboard", "raygeom export --tensorboard needs"),
}
_NOTED: set[str] = set()


class MissingExtra(RaygeomError):
    """An optional dependency is not installed; the message names the extra and the pip command."""


def missing_message(module: str) -> str:
    extra, what = EXTRAS[module]
    return f"{what} the [{extra}] extra: pip install 'raygeom[{extra}]'"


@functools.lru_cache(maxsize=None)
def has(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    return importlib.util.find_spec(module) is not None


def note_missing(module: str, skipped: str) -> None:
    """Say once per process, on stderr, that ``skipped`` was left out for want of ``module`` (a run's results are
    stored by then: a missing plotting package must not fail it)."""
    if module not in _NOTED:
        _NOTED.add(module)
        print(f"note: {skipped}: {missing_message(module)}", file=sys.stderr)


def need(module: str):
    """``module`` imported, or :class:`MissingExtra` naming the extra that installs it."""
    if not has(module):
        raise MissingExtra(missing_message(module))
    return importlib.import_module(module)
