"""What every report must satisfy, read from its HTML as a browser gets it: no two series of one figure look alike
(colour, dash, marker) unless drawn on an ordered scale with a colour bar; tick labels at least 10 px and not turned
by hand; every "Data:" line names tidy tables (``results/<name>.parquet``); every table with a model column sorted
by model, revision (training step) and layer (depth)."""

from __future__ import annotations

import html as html_module
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pyarrow.parquet as pq

from raygeom.sources.revisions import step_of

# plotly's default colorway: the colour of a trace that names none, by its index in the figure
COLORWAY = ("#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692", "#B6E880", "#FF97FF", "#FECB52")
MIN_TICK_PX = 10


def title_of(figure: dict) -> str:
    title = figure["layout"].get("title", {})
    return title.get("text", "") if isinstance(title, dict) else str(title)


def has_colour_bar(figure: dict) -> bool:
    return any(t.get("type") == "scatter" and (t.get("marker") or {}).get("showscale") for t in figure["data"])


def looks(figure: dict) -> list[tuple[str, tuple]]:
    """(name, (colour, dash, marker)) of each series a reader tells apart in the legend: scatter traces shown in it
    (not bands, chance levels, colour-bar carriers)."""
    out = []
    for index, trace in enumerate(figure["data"]):
        if trace.get("type", "scatter") != "scatter" or trace.get("showlegend") is False or trace.get("fill") == "toself":
            continue
        line, marker = trace.get("line") or {}, trace.get("marker") or {}
        mode = str(trace.get("mode", "lines+markers"))
        colour = line.get("color") or marker.get("color") or COLORWAY[index % len(COLORWAY)]
        dash = (line.get("dash") or "solid") if "lines" in mode else None
        symbol = (marker.get("symbol") or "circle") if "markers" in mode else None
        out.append((trace.get("name", ""), (str(colour), dash, symbol)))
    return out


def alike_series(figures: list[dict]) -> list[tuple[str, list]]:
    """(figure title, repeated looks) of every figure where two series look alike without a colour bar."""
    bad = []
    for figure in figures:
        if has_colour_bar(figure):
            continue
        counts = Counter(look for _, look in looks(figure))
        repeated = [look for look, n in counts.items() if n > 1]
        if repeated:
            bad.append((title_of(figure), repeated))
    return bad


def small_or_turned_ticks(figures: list[dict]) -> list[tuple[str, str, object]]:
    """(figure title, axis, what) of every axis or colour bar whose tick labels are under MIN_TICK_PX or turned."""
    bad = []
    for figure in figures:
        layout = figure["layout"]
        base = (layout.get("font") or {}).get("size", 12)
        axes = {name: axis for name, axis in layout.items() if re.fullmatch(r"[xy]axis\d*", name)}
        bars = {
            f"colorbar {i}": (t.get("colorbar") or (t.get("marker") or {}).get("colorbar") or {})
            for i, t in enumerate(figure["data"])
        }
        for name, axis in {**axes, **bars}.items():
            size = (axis.get("tickfont") or {}).get("size", base)
            if size < MIN_TICK_PX:
                bad.append((title_of(figure), name, size))
            if axis.get("tickangle") not in (None, "auto", 0):
                bad.append((title_of(figure), name, axis.get("tickangle")))
    return bad


def data_lines(page: str) -> list[list[str]]:
    """The store paths each "Data:" line links to."""
    return [
        [html_module.unescape(path) for path in re.findall(r"<code>([^<]+)</code>", line)]
        for line in re.findall(r"<p class='note'>Data: (.*?)</p>", page)
    ]


def untidy_data_lines(page: str) -> list[list[str]]:
    return [
        paths for paths in data_lines(page) if not paths or not all(re.fullmatch(r"results/[\w.-]+\.parquet", p) for p in paths)
    ]


class _Tables(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self.tables and self.tables[-1]:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def tables_of(page: str) -> list[list[dict]]:
    """Every HTML table of the page as rows (dicts by header)."""
    parser = _Tables()
    parser.feed(page)
    return [[dict(zip(t[0], row)) for row in t[1:]] for t in parser.tables if t]


def depths(store: Path) -> dict[tuple[str, str], float]:
    """(model, layer) -> relative depth, from every table of the store's results/ that has both."""
    out = {}
    for path in sorted((store / "results").glob("*.parquet")):
        names = pq.read_schema(path).names
        if {"model", "layer", "relative_depth"} <= set(names):
            for row in pq.read_table(path, columns=["model", "layer", "relative_depth"]).to_pylist():
                if row["relative_depth"] is not None:
                    out.setdefault((row["model"], row["layer"]), row["relative_depth"])
    return out


def unsorted_tables(page: str, depth: dict) -> list[tuple[list[str], int, str]]:
    """(header, row index, why) of the first row out of order in each table with a model column (a ranking, with a
    rank column, keeps its own order): each model in one block, its revisions by step, each revision's layers by depth."""
    bad = []
    for rows in tables_of(page):
        if not rows or "model" not in rows[0] or "rank" in rows[0]:
            continue
        seen, previous = set(), None
        for i, row in enumerate(rows):
            model = row["model"]
            if previous is None or model != previous["model"]:
                if model in seen:
                    bad.append((list(rows[0]), i, f"model {model} in two blocks"))
                    break
                seen.add(model)
            elif "revision" in row:
                before, now = step_of(previous["revision"]), step_of(row["revision"])
                if before is not None and now is not None and now < before:
                    bad.append((list(rows[0]), i, f"{row['revision']} after {previous['revision']}"))
                    break
                if now == before and row["revision"] == previous["revision"] and "layer" in row:
                    a, b = depth.get((model, previous["layer"])), depth.get((model, row["layer"]))
                    if a is not None and b is not None and b < a:
                        bad.append((list(rows[0]), i, f"{row['layer']} after {previous['layer']}"))
                        break
            previous = row
    return bad


def extraction_kinds(page: str) -> set[str]:
    """The kinds the "Extractions and their settings" table lists."""
    return {row["kind"] for rows in tables_of(page) if rows and "kind" in rows[0] and "key" in rows[0] for row in rows}


def assert_no_rough_edges(store: Path) -> tuple[str, list[dict]]:
    """Every check above on the store's report.html; returns (its HTML, its figures)."""
    from tests.figures import figures_of

    page = (store / "report.html").read_text()
    figures = figures_of(page)
    assert figures
    alike, ticks = alike_series(figures), small_or_turned_ticks(figures)
    assert alike == [] and ticks == [], (alike, ticks)
    assert data_lines(page) and untidy_data_lines(page) == [], data_lines(page)
    unsorted = unsorted_tables(page, depths(store))
    assert unsorted == [], unsorted
    return page, figures


def box_table(output: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the first rich box table printed in ``output`` (of a table split between columns, its first
    part), each heading's and cell's wrapped lines joined."""

    def cells(line: str, bar: str) -> list[str]:
        return [cell.strip() for cell in line.strip().strip(bar).split(bar)]

    def joined(before: list[str], after: list[str]) -> list[str]:
        return [" ".join(filter(None, pair)) for pair in zip(before, after)]

    head: list[str] = []
    rows: list[list[str]] = []
    for line in output.splitlines():
        if line.startswith("└"):
            break
        if line.startswith("┃"):
            head = joined(head, cells(line, "┃")) if head else cells(line, "┃")
        elif line.startswith("│"):
            row = cells(line, "│")
            if rows and not row[0]:  # a wrapped cell's next line
                rows[-1] = joined(rows[-1], row)
            else:
                rows.append(row)
    return head, rows
