"""The report's screenshots in docs/, taken with headless Chromium (Debian's package, `make browser`) from synthetic
stores (tests/synthetic.py; the values are made up, the drawing is the report's):

- docs/report-two-models-ccr.png: two models x two revisions x CCR 0/1/5, the top of the page;
- docs/report-sweep-three-checkpoints.png: one model at three checkpoints, the PGA panel and heatmap;
- docs/report-sweep-heatmap.png: the full Pythia grid's z over training x layer of pythia-410m.

Run from the repository root: ``python -m tools.report_screenshots [OUT_DIR]`` (default docs/)."""

from __future__ import annotations

import io
import json
import sys
import tempfile
from pathlib import Path

WIDTH = 1280


def _figure_box(title_part: str) -> str:
    """A probe: scroll the first figure whose title holds ``title_part`` to the top; its box in the viewport."""
    return (
        "(() => { const d = [...document.querySelectorAll('.plotly-graph-div')].find(d => "
        f"(d.layout.title.text || '').includes({json.dumps(title_part)}));"
        " d.scrollIntoView(); const r = d.parentElement.getBoundingClientRect();"
        " return [r.x, r.y, r.width, r.height]; })()"
    )


def _shot(page: Path, out: Path, probe: str = "null", height: int = 1500, crop_to_probe: bool = False) -> None:
    from PIL import Image

    from tests.browser import visit

    seen = visit(page, probe=probe, width=WIDTH, height=height, settle=2.0)
    if seen.errors:
        raise RuntimeError(f"{page}: {seen.errors}")
    image = Image.open(io.BytesIO(seen.screenshot))
    if crop_to_probe:
        x, y, w, h = seen.probe
        image = image.crop((int(x), int(y), int(x + w), int(min(y + h, height))))
    image.save(out, optimize=True)
    print(f"{out}: {image.size[0]}x{image.size[1]}")


def main(out: Path) -> None:
    from raygeom.report.html import write_report
    from tests.synthetic import write_job_store, write_pythia_grid_store

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        two = write_report(write_job_store(root / "jobstore"))
        _shot(two, out / "report-two-models-ccr.png", height=1500)
        three = write_report(
            write_job_store(root / "sweep", models=("EleutherAI--pythia-14m",), revisions=("step0", "step1000", "step143000"))
        )
        _shot(three, out / "report-sweep-three-checkpoints.png", height=1200)
        grid = write_report(write_pythia_grid_store(root / "grid"))
        _shot(grid, out / "report-sweep-heatmap.png", _figure_box("pythia-410m: Subspace PGA z over training"), 900, True)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs"))
