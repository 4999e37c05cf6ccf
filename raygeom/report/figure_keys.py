"""What a figure is drawn from, kept in its PNG: a rerun that computes nothing redraws nothing. Standard library only
at import, so any module can decorate its plot functions without loading matplotlib or pyarrow."""

from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
import pickle
from pathlib import Path

from raygeom.extras import has, note_missing

FIGURE_KEY = "raygeom-inputs"
_drawing_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("raygeom_figure_key", default=None)


def _raygeom_sources(function) -> list[str]:
    """The source files of the code that draws: ``function``'s module, figures.py, and every raygeom module that
    module takes a name from (a helper imported from elsewhere changes the figure as much as the plot's own code)."""
    import sys

    function = inspect.unwrap(function)
    names = {function.__module__, "raygeom.report.figures"}
    for value in function.__globals__.values():
        name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
        if isinstance(name, str) and (name == "raygeom" or name.startswith("raygeom.")):
            names.add(name)
    files = {getattr(sys.modules.get(name), "__file__", None) for name in names}
    return sorted(f for f in files if f and f.endswith(".py"))


@functools.lru_cache(maxsize=None)
def _code_digest(files: tuple[str, ...]) -> str:
    import matplotlib

    from raygeom import __version__

    digest = hashlib.sha256(f"{__version__} {matplotlib.__version__}".encode())
    for file in files:
        digest.update(file.encode() + b"\0" + Path(file).read_bytes())
    return digest.hexdigest()


def figure_key(function, inputs) -> str | None:
    """A key of what a figure is drawn from: ``inputs`` and the code that draws it (the source of ``function``'s
    module and of the raygeom modules it imports from, raygeom's and matplotlib's versions). None when the inputs
    cannot be pickled: then the figure is always drawn."""
    try:
        payload = pickle.dumps((function.__qualname__, inputs), protocol=4)
    except Exception:
        return None
    return hashlib.sha256(payload + _code_digest(tuple(_raygeom_sources(function))).encode()).hexdigest()


def drawn_key(path: Path) -> str | None:
    """The key a raygeom PNG at ``path`` was drawn from; None for no file, another PNG or a damaged one."""
    try:
        from PIL import Image

        with Image.open(path) as image:
            return image.text.get(FIGURE_KEY)
    except Exception:
        return None


def figure_to_draw(path: Path, function, inputs) -> tuple[str | None, bool]:
    """``(key, drawn)``: the :func:`figure_key` of a figure ``function`` draws from ``inputs``, and whether ``path``
    already holds the PNG drawn from them (then there is nothing to draw)."""
    key = figure_key(function, inputs)
    return key, key is not None and drawn_key(path) == key


def drawing_key() -> str | None:
    """The key of the :func:`drawn_once` call drawing now, for ``save_figure``."""
    return _drawing_key.get()


def drawn_once(function):
    """A plot function ``f(..., path, ...) -> path`` that draws nothing when ``path`` holds the PNG it drew from the
    same arguments with the same code, so a rerun that computes nothing redraws nothing (a plot is 0.3-0.5 s here).
    The key (:func:`figure_key`) is kept in the PNG's text. Without matplotlib (the [report] extra) it draws
    nothing, returns None and says so once."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def plot(*args, **kwargs):
        if not has("matplotlib"):
            note_missing("matplotlib", "no plots drawn")
            return None
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        path = Path(bound.arguments["path"])
        key, drawn = figure_to_draw(path, function, {name: value for name, value in bound.arguments.items() if name != "path"})
        if drawn:
            return path
        token = _drawing_key.set(key)
        try:
            return function(*args, **kwargs)
        finally:
            _drawing_key.reset(token)

    return plot
