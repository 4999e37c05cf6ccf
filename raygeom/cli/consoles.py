"""The width of the CLI's output consoles.

In a terminal, rich uses the terminal's width. Written to a file, a pipe or ``ray job logs`` there is no width to
fit, and rich's default of 80 columns squeezes tables (``check…``, ``block…``): there, tables keep their natural
width (they never pad to the console's). ``COLUMNS`` in the environment still sets the width, as in rich. Tables are drawn at most ``TABLE_WIDTH`` columns wide
on a :class:`LogConsole` (their cells wrap inside), so a log read in a 120-column window never wraps one.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.table import Table

from raygeom.report.tables import TABLE_WIDTH

WIDE = 1000  # wider than any line raygeom prints, so none is folded or cut


class LogConsole(Console):
    """A console whose tables are at most TABLE_WIDTH columns wide (narrower where the console is)."""

    def print(self, *objects, **kwargs):
        if "width" not in kwargs and self.width > TABLE_WIDTH and any(isinstance(o, Table) for o in objects):
            kwargs["width"] = TABLE_WIDTH
        super().print(*objects, **kwargs)


def output_width(stream=None) -> int | None:
    """None (rich decides: the terminal's width, or COLUMNS) for a terminal or with COLUMNS set; else WIDE."""
    stream = stream or sys.stdout
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    return None if terminal or os.environ.get("COLUMNS") else WIDE
