"""What a figure is drawn from, kept in its PNG: a rerun that computes nothing redraws nothing. Standard library only
at import, so any module can decorate its plot functions without loading matplotlib or pyarrow."""

from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
import pickle
from pathlib import Path

FIGURE_KEY = "raygeom-inputs"
_drawing_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("raygeom_figure_key", default=None)


@functools.lru_cache(maxsize=None)
def _code_digest(module_file: str) -> str:
    import matplotlib

    from raygeom import __version__

    # the shared drawing helpers (figures.py) as well as the plot's own module
    sources = Path(module_file).read_bytes() + (Path(__file__).parent / "figures.py").read_bytes()
    return hashlib.sha256(sources + f"{__version__} {matplotlib.__version__}".encode()).hexdigest()


def figure_key(function, inputs) -> str | None:
    """A key of what a figure is drawn from: ``inputs`` and the code that draws it (``function``'s module, raygeom's and
    matplotlib's versions). None when the inputs cannot be pickled: then the figure is always drawn."""
    try:
        payload = pickle.dumps((function.__qualname__, inputs), protocol=4)
    except Exception:
        return None
    return hashlib.sha256(payload + _code_digest(inspect.getsourcefile(function)).encode()).hexdigest()


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
    The key (:func:`figure_key`) is kept in the PNG's text."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def plot(*args, **kwargs):
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
