"""A width-and-depth ladder: a [train] grid of runs that differ only in d, depth and seed (:func:`ladder`), and the
tidy rows of its analyses per run and checkpoint (:func:`job_rows`).

``[width] report`` names a page: :func:`export_rows` writes the rows it cites beside it (Parquet in ``<page>/``, and
``meta.json`` with what ran). The page itself is a write-up of this repository, not of the package:
``python -m tools.results_pages docs/results/width.md`` builds it and its figures from those files alone."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from raygeom.jobs import plan as sweep
from raygeom.jobs.train import completed_trajectory
from raygeom.report.figures import drawn_once, pyplot, save_figure, save_text
from raygeom.store.tree import read_table

POINT = ("model", "run", "width", "depth", "run_seed", "step", "revision", "layer", "layer_index", "relative_depth")


def cited_columns(analysis) -> tuple[str, ...]:
    """The columns a page cites of an analysis's rows, from its declaration: the run's identity and the point, the
    settings that tell its series apart (and those ``raygeom plan`` names), each metric with its interval and chance."""
    metrics = [c for m in analysis.metrics for c in (m.column, m.lo, m.hi, m.chance) if c]
    return tuple(dict.fromkeys((*POINT, *analysis.series, *analysis.headline, *metrics)))


def cited_tables(rows: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Analysis name -> its rows cut to :func:`cited_columns`, for every analysis with rows that declares metrics."""
    from raygeom.analyses import registry

    out = {}
    for name, table in rows.items():
        analysis = registry.get(name)
        if table and analysis.metrics:
            columns = cited_columns(analysis)
            out[name] = [{c: r.get(c) for c in columns} for r in table]
    return out


@dataclass(frozen=True)
class Run:
    name: str
    model: str  # the store's model slug of its checkpoints
    d: int
    seed: int
    heads: int
    run_dir: str
    depth: int = 0  # blocks


def ladder(job) -> list[Run]:
    from raygeom.sources.models import ModelSpec

    return [
        Run(
            run.variant or Path(run.run_dir).name,
            ModelSpec(run.plan().run_dir, "checkpoint", "step0").slug,
            run.settings.hidden_size,
            run.settings.seed,
            run.settings.n_heads,
            run.plan().run_dir,
            run.settings.n_layers,
        )
        for run in job.trains
    ]


def job_rows(job, store) -> dict[str, list[dict]]:
    """Every row of this job's planned units, per analysis, each with its run's width, depth, seed and step."""
    plan = sweep.build_plan(job, store)
    labels = sweep.planned_labels(job)
    runs = {run.model: run for run in ladder(job)}
    keys: dict[str, list[str]] = {}
    for revision in plan.revisions:
        for label, units in revision.analysis_units.items():
            done = revision.analysis_done[label]
            keys.setdefault(labels[label].analysis, []).extend(u for layer, u in units.items() if layer in done)
    out = {}
    for analysis, unit_keys in keys.items():
        rows = store.read_results(analysis, unit_keys).to_pylist() if unit_keys else []
        out[analysis] = [
            {
                **row,
                "run": runs[row["model"]].name,
                "width": runs[row["model"]].d,
                "depth": runs[row["model"]].depth,
                "run_seed": runs[row["model"]].seed,
                "step": step_of(row["revision"]),
            }
            for row in rows
            if row["model"] in runs
        ]
    return out


def step_of(revision: str) -> int:
    return int(revision[4:]) if revision.startswith("step") and revision[4:].isdigit() else -1


def _is(row: dict, **settings) -> bool:
    return all(row.get(name) == value for name, value in settings.items())


def shapes(rows: list[dict]) -> list[tuple[int, int]]:
    """The (width, depth) points of the ladder present in ``rows``, narrow and shallow first."""
    return sorted({(r["width"], r["depth"]) for r in rows})


def _at(rows: list[dict], shape: tuple[int, int]) -> list[dict]:
    return [r for r in rows if (r["width"], r["depth"]) == shape]


# ------------------------------------------------------------------------------------------- claims


def loss_rows(job) -> list[dict]:
    """One row per (run, held-out evaluation): the trainer's held-out perplexity every ``eval_every`` steps (its
    history) and at each checkpoint (step 0 included), in step order."""
    from raygeom.analyses.train import checkpoint_evaluations

    out = []
    for run, train in zip(ladder(job), job.trains):
        perplexity = {int(e["step"]): e["heldout_perplexity"] for e in checkpoint_evaluations(run.run_dir) or []}
        trained = completed_trajectory(train.plan(), train.plan().key(train.settings))
        if trained and Path(trained["history"]).is_file():
            perplexity.update({int(h["step"]): h["heldout_perplexity"] for h in read_table(trained["history"]).to_pylist()})
        out += [
            {
                "run": run.name,
                "width": run.d,
                "depth": run.depth,
                "run_seed": run.seed,
                "step": step,
                "heldout_perplexity": float(value),
            }
            for step, value in sorted(perplexity.items())
            if value is not None
        ]
    return out


def gap_rows(gaps: list[dict]) -> list[dict]:
    keep = ("run", "width", "depth", "run_seed", "revision", "step", "gap", "heldout_perplexity")
    return [{k: r.get(k) for k in keep} for run in gaps for r in run["rows"]]


# ------------------------------------------------------------------------------------------- figures


@drawn_once
def plot_heatmaps(pga: list[dict], config: dict, path: Path, title: str) -> Path | None:
    """z over step x layer, one panel per run: (width, depth) points side by side (columns), seeds as rows."""
    rows = [r for r in pga if _is(r, **config)]
    if not rows:
        return None
    points = shapes(rows)
    seeds = sorted({r["run_seed"] for r in rows})
    plt = pyplot()
    fig, axes = plt.subplots(len(seeds), len(points), figsize=(2.6 * len(points), 2.8 * len(seeds)), dpi=110, squeeze=False)
    limit = max(2.0, float(np.nanmax(np.abs([r["z"] for r in rows]))))
    image = None
    for i, seed in enumerate(seeds):
        for j, shape in enumerate(points):
            ax = axes[i][j]
            cell = [r for r in _at(rows, shape) if r["run_seed"] == seed]
            steps = sorted({r["step"] for r in cell})
            layers = sorted({(r["layer_index"], r["layer"]) for r in cell})
            grid = np.full((len(layers), len(steps)), np.nan)
            for r in cell:
                grid[layers.index((r["layer_index"], r["layer"])), steps.index(r["step"])] = r["z"]
            image = ax.imshow(grid, aspect="auto", origin="lower", cmap="RdBu_r", vmin=-limit, vmax=limit)
            ax.set_xticks(range(len(steps)), [str(s) for s in steps], fontsize=5, rotation=90)
            ax.set_yticks(range(len(layers)), [name for _, name in layers], fontsize=4)
            ax.set_title(f"d={shape[0]}, {shape[1]} blocks, seed {seed}", fontsize=7)
            if i == len(seeds) - 1:
                ax.set_xlabel("step (0: initialisation)", fontsize=6)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="z")
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)


# ------------------------------------------------------------------------------------------- page


def write_rows(rows: list[dict], path: Path) -> Path:
    """A shipped table: Parquet under a temporary name renamed into place, with no store checksum beside it (a page's
    rows are for readers, as the page is)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    temporary = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.Table.from_pylist(rows), temporary)
    temporary.replace(path)
    return path


def export_rows(job, store, data_dir: Path, wall: dict | None = None, gaps: list[dict] | None = None) -> Path:
    """Write the tidy rows the page cites into ``data_dir`` (one Parquet per analysis, the loss curves, G per
    checkpoint) and ``meta.json`` (what ran): everything the page (tools/width_page.py) reads."""
    import pyarrow as pa

    from raygeom.store.tree import atomic_write_table

    data_dir.mkdir(parents=True, exist_ok=True)
    rows = job_rows(job, store)
    if rows.get("pga"):  # the HTML report's width facet reads it; every row keeps the settings that made it
        atomic_write_table(pa.Table.from_pylist(rows["pga"]), store.root / "results" / "width_pga.parquet")
    for name, kept in cited_tables(rows).items():
        write_rows(kept, data_dir / f"{name}.parquet")
    write_rows(loss_rows(job), data_dir / "evaluations.parquet")
    if gaps:
        write_rows(gap_rows(gaps), data_dir / "gap.parquet")
    first = job.trains[0]
    train = {k: v for k, v in asdict(first.settings).items() if k not in ("hidden_size", "n_layers", "seed", "n_heads")}
    trained = completed_trajectory(first.plan(), first.plan().key(first.settings)) or {}
    meta = {
        "job": job.name,
        "store": f"runs/{Path(job.out).name}",
        "train": train,
        "head_dim": first.settings.hidden_size // first.settings.n_heads,
        "checkpoint_steps": list(first.plan().steps),
        "runs": [{"run": r.name, "width": r.d, "depth": r.depth, "seed": r.seed} for r in ladder(job)],
        "n_samples": job.n_samples,
        "n_train_sequences": trained.get("n_train_sequences"),  # one article split and tokenizer for every run
        "pool": job.extraction.pool,
        "width": {"collapse_z": job.width.collapse_z, "positive_z": job.width.positive_z, "seed": job.width.seed},
        "trajectory": (
            {
                k: getattr(job.trajectory, k)
                for k in ("gap_layer", "domain_tokens", "chunks_per_domain", "chunk_len", "late_from", "bootstrap", "seed")
            }
            if job.trajectory is not None and gaps
            else None
        ),
        "wall": wall,
        "note": job.width.note,
    }
    save_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", data_dir / "meta.json")
    return data_dir


def export_page_rows(job, store, console, wall: dict | None = None, gaps: list[dict] | None = None) -> Path:
    """``[width] report``: export this job's rows beside the page (``<page>/``), what the page is built from; the
    repository's ``python -m tools.results_pages <page>`` builds the page."""
    page = Path(job.width.report)
    data = export_rows(job, store, page.parent / page.stem, wall, gaps)
    console.print(
        f"width rows: {data} (the page: python -m tools.results_pages {page})", markup=False, highlight=False, soft_wrap=True
    )
    return page
