"""The width of the CLI's output consoles.

In a terminal, rich uses the terminal's width. Written to a file, a pipe or ``ray job logs`` there is no width to
fit, and rich's default of 80 columns squeezes tables (``check…``, ``block…``): there, tables keep their natural
width (they never pad to the console's). ``COLUMNS`` in the environment still sets the width, as in rich.
"""

from __future__ import annotations

import os
import sys

WIDE = 1000  # wider than any table raygeom prints, so no column is folded or cut


def output_width(stream=None) -> int | None:
    """None (rich decides: the terminal's width, or COLUMNS) for a terminal or with COLUMNS set; else WIDE."""
    stream = stream or sys.stdout
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    return None if terminal or os.environ.get("COLUMNS") else WIDE
