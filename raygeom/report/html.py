"""One self-contained, interactive HTML report of everything a store holds: the page.

``write_report(store_root)`` reads the store's Parquet tables (never its activations), builds plotly figures and
writes ``<store>/report.html``: plotly's JavaScript is inlined once, every figure is interactive (hover values, click a
legend entry to show or hide a model or revision), and the only links out of the file are relative links to the
store's own Parquet files. Sections appear only for what the store holds:

- one per registered analysis with rows, from its declaration (raygeom.report.profiles draws the generic one: each
  declared metric by depth, a (revision x layer) heatmap per setting; raygeom.report.renderers those drawn their own
  way, from raygeom.report.analysis_sections: PGA with its sweep and collapse zones, dispersion, the gap ranking, convergence, kNN-LM);
- what is not an analysis (raygeom.report.other_sections): training curves, a trained trajectory, a width ladder,
  the store's extractions and their settings.

Where the rows come from and how lines look: raygeom.report.rows and raygeom.report.styling. Big grids stay a file a
browser opens: a model's revisions beyond ``VISIBLE_REVISIONS`` start hidden (one click shows them; the data is all
there), and hover text is built by plotly templates from numeric arrays rather than stored per point as strings.
"""

from __future__ import annotations

import html
import os
import time
from contextlib import contextmanager
from pathlib import Path

from rich.markup import escape

from raygeom.analyses import registry
from raygeom.errors import RaygeomError
from raygeom.report.other_sections import (
    extraction_section,
    train_section,
    trajectory_section,
    width_section,
)
from raygeom.report.profiles import analysis_section
from raygeom.report.rows import _OVERLAY, SETTING_COLUMNS, UNREADABLE, _analysis_rows, pga_rows  # noqa: F401 - the CLI's and tests' names
from raygeom.report.styling import VISIBLE_REVISIONS, Section, _short, setting_text, settings_runs  # noqa: F401 - as above

REPORT_NAME = "report.html"

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1280px;
       padding: 0 18px 40px; color: #222; }
h1 { font-size: 22px; margin: 18px 0 4px; }
h2 { font-size: 18px; margin-top: 34px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h4 { margin: 14px 0 6px; font-size: 14px; } p, li { font-size: 14px; line-height: 1.45; } .note { color: #666; font-size: 12px; }
nav a { margin-right: 14px; font-size: 14px; } .figure { margin: 10px 0 18px; border: 1px solid #eee; }
.scroll { overflow-x: auto; max-height: 420px; overflow-y: auto; border: 1px solid #eee; }
table { border-collapse: collapse; font-size: 12px; }
th, td { padding: 3px 7px; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
th { background: #f6f6f6; position: sticky; top: 0; } td:first-child, th:first-child { text-align: left; }
code { font-size: 12px; } .warning { background: #fff4e5; border: 1px solid #f0b429; padding: 6px 12px; font-size: 13px; }
"""


@contextmanager
def _white_template():
    """Figures made inside start from plotly_white, as plotly's default template. plotly applies its default unvalidated,
    where ``template="plotly_white"`` on each figure deep-copies and validates the template: a third of a report's time.
    The ``default`` setter validates too, each way: plotly's own template names are set past it where the attribute is
    there (a tiny store's sections here: 1.0-1.2 s -> 0.8-1.0 s)."""
    import plotly.io as pio

    templates = pio.templates
    before = templates.default
    _set_default_template(templates, "plotly_white")
    try:
        yield
    finally:
        _set_default_template(templates, before)


def _set_default_template(templates, name) -> None:
    if hasattr(templates, "_default") and (name is None or name in templates):
        templates._default = name
    else:
        templates.default = name


def build_sections(root: Path) -> list[Section]:
    with _white_template():
        return _build_sections(Path(root))


def _build_sections(root: Path) -> list[Section]:
    UNREADABLE.clear()
    sections = [
        *analysis_sections(root),
        train_section(root),
        trajectory_section(root),
        width_section(root),
        extraction_section(root),
    ]
    return [s for s in sections if s is not None]


def analysis_sections(root: Path) -> list[Section]:
    """One section per registered analysis the store holds rows of (pga first, then by name), each from its
    declaration: its renderer's section (renderers.py), else the generic section of its metrics (profiles.py); headed by
    the analysis's title, anchored by its name. A section without a figure (a settings table alone) is left out, and
    so is an analysis whose rows share a results directory with another's (slices, token dispersion) where the store
    records the analyses asked for and this one is not among them."""
    from raygeom.analyses.results_table import asked

    sections = []
    analyses = registry.analyses()
    wanted = asked(root)
    for name, analysis in sorted(analyses.items(), key=lambda item: (item[0] != "pga", item[0])):
        shared = any(other != name and a.results_dir == analysis.results_dir for other, a in analyses.items())
        if shared and wanted is not None and name not in wanted:  # its rows are another analysis's, not asked for
            continue
        section = section_of(root, analysis)
        if section is not None and section.figures:
            sections.append(section)
    return sections


def section_of(root: Path, analysis) -> Section | None:
    """The section of one registered analysis: its renderer's ``section`` of the store root (raygeom.report.renderers),
    else the generic section of its rows; None where the store holds none."""
    from raygeom.report.renderers import renderer

    drawn = renderer(analysis.name).section
    if drawn:
        section = drawn(root)
    else:
        section = analysis_section(analysis, *_analysis_rows(root, analysis))
    if section is not None:
        section.anchor, section.title = analysis.name, analysis.title
    return section


def _relative(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path.resolve(), start.resolve())).as_posix()


def _file_link(path: Path, root: Path, out: Path) -> str:
    """A relative link from the report to one of the store's files, labelled with its path in the store."""
    return f"<a href='{html.escape(_relative(path, out.parent))}'><code>{html.escape(_relative(path, root))}</code></a>"


def render(sections: list[Section], root: Path, out: Path) -> str:
    import plotly
    import plotly.offline

    from raygeom import __version__

    config = {"displaylogo": False, "responsive": True, "toImageButtonOptions": {"format": "png", "scale": 2}}
    counter = 0
    body = []
    for section in sections:
        parts = [f"<section id='{section.anchor}'><h2>{html.escape(section.title)}</h2>"]
        if section.intro:
            parts.append(f"<p>{html.escape(section.intro)}</p>")
        if section.files:
            links = " ".join(_file_link(f, root, out) for f in dict.fromkeys(section.files) if f.is_file())
            if links:
                parts.append(f"<p class='note'>Data: {links}</p>")
        for fig in section.figures:
            counter += 1
            parts.append(
                "<div class='figure'>"
                + fig.to_html(
                    full_html=False,
                    include_plotlyjs=False,
                    config=config,
                    div_id=f"fig-{counter}",
                    default_width="100%",
                    default_height=f"{fig.layout.height or 420}px",
                )
                + "</div>"
            )
        parts += [t for t in section.tables if t]
        parts.append("</section>")
        body.append("".join(parts))
    results = sorted((root / "results").rglob("*.parquet")) if (root / "results").is_dir() else []
    tables = [p for p in results if p.parent == root / "results"]
    unit_dirs = sorted({p.parent for p in results if p.parent != root / "results"})
    files = "".join(f"<li>{_file_link(p, root, out)}</li>" for p in tables)
    files += "".join(
        f"<li><code>{html.escape(_relative(d, root))}/</code>: {len(list(d.glob('*.parquet'))):,} unit files</li>"
        for d in unit_dirs
    )
    warning = ""
    if UNREADABLE:
        items = "".join(
            f"<li><code>{html.escape(_relative(p, root))}</code>: {html.escape(reason)}</li>" for p, reason in UNREADABLE[:50]
        )
        warning = (
            f"<div class='warning'><b>{len(UNREADABLE)} file(s) in this store could not be read and are not in this "
            f"report:</b><ul>{items}</ul></div>"
        )
    nav = " ".join(f"<a href='#{s.anchor}'>{html.escape(s.title.split(':')[0])}</a>" for s in sections)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>raygeom report: {html.escape(root.name)}</title><style>{STYLE}</style>"
        f"<script type='text/javascript'>{plotly.offline.get_plotlyjs()}</script></head><body>"
        f"<h1>raygeom report: <code>{html.escape(str(root))}</code></h1>"
        f"<p class='note'>Written {stamp} by raygeom {__version__} with plotly {plotly.__version__}; "
        f"{counter} figure{'' if counter == 1 else 's'}. Works offline: everything is in this file.</p>{warning}"
        f"<nav>{nav} <a href='#files'>Files</a></nav>"
        + "".join(body)
        + "<section id='files'><h2>Files</h2><p>The store's Parquet tables, which this report was built from:</p>"
        f"<ul>{files}</ul></section>"
        "</body></html>"
    )


def write_report(store_root: str | Path, out: str | Path | None = None, overlay: list[str | Path] = ()) -> Path:
    """Write the report of everything under ``store_root`` (default ``<store>/report.html``); return its path. With
    ``overlay`` stores, their rows are drawn beside the first store's, each store one more setting of the series.
    Without plotly (the [report] extra), :class:`raygeom.extras.MissingExtra`."""
    from raygeom.extras import need

    need("plotly")
    root = Path(store_root)
    for store in (root, *map(Path, overlay)):
        if not store.is_dir():
            raise RaygeomError(f"store {store} is not a directory")
    out = Path(out) if out is not None else root / REPORT_NAME
    from raygeom.store.tree import atomic_write_text

    labels = _store_labels([root, *map(Path, overlay)])
    if overlay:
        _OVERLAY.update(
            primary=root.absolute(),
            label=labels[0],
            others=[(Path(other).absolute(), label) for other, label in zip(overlay, labels[1:])],
        )
    try:
        sections = build_sections(root.absolute())
    finally:
        _OVERLAY.clear()
    if not sections:
        unreadable = f"; {len(UNREADABLE)} file(s) could not be read, e.g. {UNREADABLE[0][1]}" if UNREADABLE else ""
        raise RaygeomError(
            f"nothing to report in {root}: no readable result tables under {root / 'results'} and no extractions{unreadable}"
        )
    page = render(sections, root, out)
    try:
        atomic_write_text(page, out)
    except OSError as error:
        raise RaygeomError(f"cannot write the report to {out}: {error.strerror or error}") from None
    return out


STORE_LABEL_MAX = 16  # characters: a store's name in a legend, beside the revision and setting


def _store_labels(stores: list[Path]) -> list[str]:
    """Short distinct names of the stores, for legends: their folder names (with the parent's where two share one);
    where one is long, less the words all of them share (``sweep-2024-01-run-a``, ``...-run-b``: ``a``, ``b``), cut to
    STORE_LABEL_MAX characters; ``store 1``, ``store 2``... where that still leaves two alike."""
    import re

    stores = [Path(store).absolute() for store in stores]
    names = [store.name or str(store) for store in stores]
    if len(set(names)) < len(names):
        names = [f"{store.parent.name}/{store.name}" for store in stores]
    if len(names) > 1 and max(map(len, names)) > STORE_LABEL_MAX:
        words = [re.split(r"(?<=[-_./ ])", name) for name in names]  # words keep their separator
        head = 0
        while all(len(w) > head + 1 for w in words) and len({w[head] for w in words}) == 1:
            head += 1
        tail = 0
        while all(len(w) > head + tail + 1 for w in words) and len({w[-1 - tail] for w in words}) == 1:
            tail += 1
        names = ["".join(w[head : len(w) - tail]).strip("-_./ ") or name for w, name in zip(words, names)]
    names = [_short(name, STORE_LABEL_MAX) for name in names]
    return names if len(set(names)) == len(names) else [f"store {i + 1}" for i in range(len(names))]


def _os_text(error: OSError) -> str:
    import errno

    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk is full ({error.filename or ''})"
    return f"{error.strerror or error} ({error.filename or ''})"


def announce_report(store_root: str | Path, console) -> Path | None:
    """For the end of a run command: write the report and print its path. The run's results are already
    written by then, so a report that cannot be written is said, not raised."""
    from raygeom.extras import MissingExtra

    try:
        path = write_report(store_root)
    except MissingExtra as error:
        console.print(f"report:  not written: {error}", markup=False, highlight=False)
        return None
    except (OSError, RaygeomError) as error:  # a write that failed (a full disk): the run did not complete its outputs
        raise RaygeomError(
            f"report not written: {error if isinstance(error, RaygeomError) else _os_text(error)}; the "
            f"results are stored, `raygeom report {store_root}` writes it"
        ) from None
    except Exception as error:  # noqa: BLE001 - a report that cannot be drawn must not turn a finished run into a failed one
        console.print(f"[yellow]report: not written ({escape(type(error).__name__)}: {escape(str(error))})[/]", highlight=False)
        return None
    console.print(f"report:  {path}", markup=False, highlight=False)
    if UNREADABLE:
        console.print(
            f"[yellow]report: {len(UNREADABLE)} unreadable file(s) left out, listed at the top of the report[/]", highlight=False
        )
    return path
