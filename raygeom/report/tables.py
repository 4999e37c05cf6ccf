"""Console tables and PNG plots of any registered analysis's rows, from its declaration: its metrics with their
intervals, one table and one line per model, revision and setting (never two settings in one)."""

from __future__ import annotations

import math
import re
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def _setting_label(row: dict, columns: tuple[str, ...]) -> str:
    return ", ".join(f"{c}={row.get(c)}" for c in columns)


def _groups(rows: list[dict], series: tuple[str, ...]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["revision"], _setting_label(row, series)), []).append(row)
    return groups


def _value(row: dict, column: str, lo: str | None, hi: str | None) -> str:
    value = row.get(column)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return "-"
    text = f"{value:.4g}"
    low, high = row.get(lo) if lo else None, row.get(hi) if hi else None
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and math.isfinite(low) and math.isfinite(high):
        text += f" [{low:.3g}, {high:.3g}]"
    return text


def print_analysis(console: Console, analysis, rows: list[dict]) -> None:
    """One table per model, revision and setting: every declared metric per layer, with its interval, each column
    headed by the metric's column name (the table stays within a log line); below the tables, each metric named in
    full with its interval's level."""
    for (model, revision, setting), group in _groups(rows, analysis.series).items():
        first = group[0]
        size = f"N={first['n']}" if first.get("n") is not None else f"{first.get('n_chunks')} chunks"
        title = (
            f"{analysis.title}  {escape(model)}@{escape(revision)}  ({size}, d={first.get('d')}"
            + (f", {escape(setting)}" if setting else "")
            + ")"
        )
        head = ["layer"]
        for metric in analysis.metrics:
            head += [metric.column, *(["chance"] if metric.chance else [])]
        body = []
        for row in sorted(group, key=lambda r: r.get("layer_index", 0)):
            cells = [escape(str(row["layer"]))]
            for metric in analysis.metrics:
                cells.append(_value(row, metric.column, metric.lo, metric.hi))
                if metric.chance:
                    cells.append(_value(row, metric.chance, None, None))
            body.append(cells)
        _print_tables(console, fitted_tables(title, head, body, [False] + [True] * (len(head) - 1)))
    for metric in analysis.metrics if rows else ():
        level = f" [{metric.level_label(rows)}]" if metric.lo else ""
        console.print(f"  {metric.column}: {metric.title}{level}", markup=False, highlight=False, soft_wrap=True)


def print_ranked(console: Console, analysis, rows: list[dict], most: int = 30) -> None:
    """An analysis whose rows are not per layer (one per model and revision, e.g. the gap G): one table of its
    declared columns, in the rows' order, each value with its interval where the row carries ``<column>_lo/_hi``;
    the first ``most`` rows (the table under results/ has them all)."""
    title = analysis.title + (f" (first {most} of {len(rows)} rows)" if len(rows) > most else "")
    shown = [
        c
        for c in ("rank", "model", "revision", *analysis.columns)
        if not c.endswith(("_lo", "_hi", "_se")) and any(c in row for row in rows)
    ]
    body = [
        [
            escape(str(row.get(c))) if isinstance(row.get(c), str) or row.get(c) is None else _value(row, c, f"{c}_lo", f"{c}_hi")
            for c in shown
        ]
        for row in rows[:most]
    ]
    _print_tables(console, fitted_tables(title, shown, body, [c not in ("model", "revision", "layer") for c in shown]))


TABLE_WIDTH = 120  # columns: the widest console table, so that a log viewer of that width never wraps one
KEY_COLUMNS = 3  # at most: the leading columns that name a row, repeated in each part of a table split by columns


def fitted_tables(title: str, head: list[str], body: list[list[str]], right: list[bool], width: int = TABLE_WIDTH) -> list:
    """A console table (``right``: which columns are right-aligned) as one box Table, or, where its values and the
    longest word of each heading would not fit ``width`` columns, several, split between columns, each repeating the
    leading columns that name a row (the first, and the text columns after it). Headings wrap by word; values never
    wrap."""

    def need(i: int) -> int:
        return max([len(w) for w in head[i].split()] + [len(row[i]) for row in body if i < len(row)])

    keys = [0] + [i for i in range(1, min(KEY_COLUMNS, len(head))) if not right[i]]
    keys = keys[: next((n for n, i in enumerate(keys) if i != n), len(keys))]  # only a leading run
    base = 1 + sum(need(i) + 3 for i in keys)
    parts: list[list[int]] = [[]]
    used = base
    for i in range(len(keys), len(head)):
        if parts[-1] and used + need(i) + 3 > width:
            parts.append([])
            used = base
        parts[-1].append(i)
        used += need(i) + 3
    tables = []
    for n, part in enumerate(parts):
        columns = [*keys, *part]
        sizes = {i: need(i) for i in columns}
        spare = width - 1 - sum(size + 3 for size in sizes.values())
        for i in columns:  # what room is left unwraps headings, left to right
            grow = max(0, min(len(head[i]) - sizes[i], spare))
            sizes[i] += grow
            spare -= grow
        table = Table(title=title if n == 0 else f"{title} (continued)".strip(), title_justify="left")
        for i in columns:
            table.add_column(head[i], justify="right" if right[i] else "left", width=sizes[i])
        for row in body:
            table.add_row(*(row[i] if i < len(row) else "" for i in columns))
        tables.append(table)
    return tables


def print_lines(console: Console, lines: list[str]) -> None:
    """An analysis's console lines as they are, but a Markdown table among them (its documents keep those) drawn as
    the box table every other command prints."""
    block: list[str] = []
    for line in (part for entry in lines for part in entry.split("\n")):  # an entry may hold several lines
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            _print_tables(console, markdown_table(block))
            block = []
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if block:
        _print_tables(console, markdown_table(block))


def _print_tables(console: Console, tables: list) -> None:
    for table in tables:
        console.print(table)


def markdown_table(block: list[str]) -> list:
    """A Markdown table (a header row, its ``|---|`` rule, rows) as the box tables of :func:`fitted_tables`: numbers
    right-aligned."""

    def cells(line: str) -> list[str]:
        inner = line.strip().removeprefix("|").removesuffix("|")
        return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", inner)]

    head, *body = [cells(line) for line in block if not set(line.replace("|", "").strip()) <= set("-: ")]
    right = [bool(body) and all(_numeric(row[i]) for row in body if i < len(row)) for i in range(len(head))]
    # an identifier's underscores become spaces, so a heading wraps by word
    return fitted_tables("", [escape(h.replace("_", " ")) for h in head], [[escape(c) for c in row] for row in body], right)


def _numeric(text: str) -> bool:
    first = text.strip().split(" ")[0].replace("±", "")
    try:
        float(first)
    except ValueError:
        return text.strip() in ("", "-", "nan")
    return True


def plot_analysis(analysis, rows: list[dict], directory: Path) -> list[Path]:
    """One PNG per declared metric: the metric against relative depth, a line (and band) per model, revision and
    setting."""
    from raygeom.extras import has, note_missing
    from raygeom.report.figures import figure_to_draw, pyplot, save_figure

    if not has("matplotlib"):
        note_missing("matplotlib", "no plots drawn")
        return []
    plt = pyplot()

    paths = []
    groups = [
        (name, sorted(group, key=lambda r: r["relative_depth"])) for name, group in sorted(_groups(rows, analysis.series).items())
    ]
    for metric in analysis.metrics:
        path = Path(directory) / f"{analysis.name}_{metric.column}_vs_depth.png"
        # keyed on the columns this plot draws, not the whole rows: another metric's change does not redraw it
        columns = ("relative_depth", metric.column, metric.lo, metric.hi, metric.chance)
        drawn_from = [(name, [tuple(r.get(c) if c else None for c in columns) for r in group]) for name, group in groups]
        key, drawn = figure_to_draw(path, plot_analysis, (analysis.name, analysis.title, metric, drawn_from))
        if drawn:  # from these rows already (a rerun)
            paths.append(path)
            continue
        fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
        for (model, revision, setting), group in groups:
            x = [r["relative_depth"] for r in group]
            label = f"{model}@{revision}" + (f" ({setting})" if setting else "")
            (line,) = ax.plot(x, [_finite(r.get(metric.column)) for r in group], marker="o", ms=3, label=label)
            if metric.lo and metric.hi:
                ax.fill_between(
                    x,
                    [_finite(r.get(metric.lo)) for r in group],
                    [_finite(r.get(metric.hi)) for r in group],
                    color=line.get_color(),
                    alpha=0.2,
                    lw=0,
                )
            if metric.chance:
                ax.plot(x, [_finite(r.get(metric.chance)) for r in group], color=line.get_color(), ls=":", lw=0.8)
        ax.set_xlabel("relative depth (embedding = 0, final norm = 1)")
        level = metric.level_label(row for _, group in groups for row in group)
        ax.set_ylabel(metric.title + (f" (band: {level} interval)" if metric.lo else ""))
        ax.set_title(f"{analysis.title} by depth")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(save_figure(fig, path, key))
    return paths


def _finite(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else math.nan


def analysis_outputs(console: Console, analysis, rows: list[dict], root: Path) -> list[Path]:
    """What a run of ``analysis`` shows and leaves beside its table, from its declaration: its console lines (else
    the generic table of its metrics or columns), its figures (its renderer's, else each metric by depth) under plots/, its
    documents under results/. Returns the files written."""
    if not rows:
        return []
    layered = [row for row in rows if row.get("relative_depth") is not None]
    from raygeom.report.renderers import renderer
    from raygeom.store.tree import Store

    drawn = renderer(analysis.name)
    lines = [] if drawn.console else analysis.console(rows, Store(root))
    if lines:  # its title heads what it declares, as it heads the generic table
        lines = [analysis.title, *lines]
    print_lines(console, lines)
    if drawn.console:
        drawn.console(console, rows)
    elif not lines and layered and analysis.metrics:
        print_analysis(console, analysis, layered)
    elif not lines:
        print_ranked(console, analysis, rows)

    return analysis_files(analysis, rows, root)


def analysis_files(analysis, rows: list[dict], root: Path) -> list[Path]:
    """What ``analysis`` leaves beside its table of ``rows``, from its declaration: its figures (its renderer's, else
    each metric by depth) under plots/ and its documents under results/; the run's writer and the library's alike."""
    from raygeom.report.renderers import renderer
    from raygeom.store.tree import atomic_write_text

    if not rows:
        return []
    layered = [row for row in rows if row.get("relative_depth") is not None]
    written = []
    figures = renderer(analysis.name).figures
    if figures:
        written += figures(rows, Path(root) / "plots")
    elif layered and analysis.metrics:
        written += plot_analysis(analysis, layered, Path(root) / "plots")
    for name, text in analysis.documents(rows).items():
        path = Path(root) / "results" / name
        atomic_write_text(text, path)
        written.append(path)
    return written
