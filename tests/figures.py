"""Figure data out of a report's HTML: plotly's JSON with its typed arrays decoded (NOTES.md: they are base64)."""

import base64
import json
import re

import numpy as np


def decode(value):
    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
    return np.asarray(value, dtype=float) if value is not None else None


def figures_of(html: str) -> list[dict]:
    """Every figure's traces and layout, decoded from the report's Plotly.newPlot calls."""
    decoder, figures = json.JSONDecoder(), []
    for match in re.finditer(r'Plotly\.newPlot\(\s*"[^"]+",\s*', html):
        data, end = decoder.raw_decode(html, match.end())
        layout, _ = decoder.raw_decode(html, html.index("{", end))
        figures.append({"data": data, "layout": layout})
    return figures
