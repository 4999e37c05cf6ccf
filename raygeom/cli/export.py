"""`raygeom export STORE --tensorboard DIR`: every per-layer metric a store holds, as TensorBoard event files
(registered by raygeom.cli.root).

Every unit row under ``results/<analysis>/`` that names a layer becomes scalars: one TensorBoard run per
(model, revision, settings) -- ``DIR/<analysis>/<model>@<revision>[/<the settings that vary>]``, e.g.
``pga/smollm2@main/CCR-5`` --, the settings being the extraction's and the analysis's declared parameters, never a
result column; one tag per finite float column that is not a setting (NaN and inf are left out, and counted) (``pga/z``, ``pga/z_lo``, ``diagnostics/rank``, ...), the step being the layer's index (``embed`` 0,
``block_00`` 1, ..., ``final_norm`` last). Points inside a block get their own tags (``pga/z/mlp_out``) at their
block's step. Each run also gets its settings as text. Written with tensorboardX; read with TensorBoard, or into
Weights & Biases with ``wandb sync --sync-tensorboard DIR``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from raygeom.cli.consoles import LogConsole, output_width
from raygeom.errors import RaygeomError

console = LogConsole(width=output_width())
errors = Console(stderr=True)

# Columns that say what a row is, not a measured value, and columns that are measured but not geometry.
IDENTITY = {
    "model",
    "revision",
    "layer",
    "layer_index",
    "relative_depth",
    "unit_key",
    "note",
    "fingerprint",
    "raygeom_version",
    "corpus_fingerprint",
    "cpu_seconds",
}


def _is_float(value) -> bool:
    return isinstance(value, float)


def _setting_words(settings: dict, varying: list[str]) -> str:
    """The settings that tell a run apart, as the report's legends name them (``k=6,CCR-5``), fit for a folder name."""
    from raygeom.report.html import setting_text

    words = ",".join(setting_text(c, settings.get(c)) for c in varying)
    return words.replace("/", "%2F").replace(" ", "_")


def _varying(runs: list[dict]) -> list[str]:
    """The settings that differ among the runs of one model and revision (every key of ``runs`` is a setting): the
    report's setting columns first, then any other that still leaves two runs alike."""
    from raygeom.report.html import SETTING_COLUMNS

    differ = [
        c
        for c in dict.fromkeys(c for run in runs for c in run)
        if len({json.dumps(run.get(c), sort_keys=True, default=str) for run in runs}) > 1
    ]
    named = [c for c in SETTING_COLUMNS if c in differ]
    return named if len({_setting_words(run, named) for run in runs}) == len(runs) else differ


def _settings_of(analysis: str):
    """A function giving a row's settings in ``results/<analysis>/``: the extraction's settings and the analysis's
    declared parameters (raygeom.analyses.results_table.row_settings), never a result column, for a registered
    analysis; for a directory no registered analysis writes, every column that is not a float or an identity."""
    from raygeom.analyses import registry
    from raygeom.analyses.results_table import row_settings

    spec = next((a for a in registry.analyses().values() if a.results_dir == analysis), None)
    if spec is None:
        return lambda row: {key: value for key, value in row.items() if key not in IDENTITY and not _is_float(value)}
    return lambda row: row_settings(spec, row)


def export_tensorboard(store_root: str | Path, out: str | Path) -> dict:
    """Write the event files; returns counts (runs, scalars, analyses, rows without a layer that were left out)."""
    from raygeom.extras import need

    SummaryWriter = need("tensorboardX").SummaryWriter
    from raygeom.sources import layers as layer_position
    from raygeom.store.tree import Store, encode_segment

    root = Path(store_root)
    if not root.is_dir():
        raise RaygeomError(f"store {root} is not a directory")
    results = root / "results"
    analyses = sorted(p.name for p in results.iterdir() if p.is_dir()) if results.is_dir() else []
    store = Store(root)
    runs: dict[str, dict] = {}
    skipped = non_finite = 0
    for analysis in analyses:
        rows = store.read_results(analysis).to_pylist()
        settings_of = _settings_of(analysis)
        groups: dict[tuple, list[dict]] = {}
        for row in rows:
            if not row.get("layer") or row.get("layer_index") is None:
                skipped += 1
                continue
            settings = settings_of(row)
            groups.setdefault(
                (row.get("model") or "model", row.get("revision") or "main", json.dumps(settings, sort_keys=True, default=str)),
                [],
            ).append(row)
        per_revision: dict[tuple, list[dict]] = {}
        for model, revision, settings in groups:
            per_revision.setdefault((model, revision), []).append(json.loads(settings))
        for (model, revision, settings), group in groups.items():
            varying = _varying(per_revision[(model, revision)])
            name = f"{encode_segment(analysis)}/{encode_segment(model)}@{encode_segment(revision)}" + (
                f"/{_setting_words(json.loads(settings), varying)}" if varying else ""
            )
            run = runs.setdefault(name, {"settings": settings, "scalars": []})
            named = set(json.loads(settings))  # settings are text, not scalars
            for row in group:
                _, sub = layer_position.split(row["layer"])
                for column, value in row.items():
                    if column in IDENTITY or not _is_float(value) or column in named:
                        continue
                    if not math.isfinite(value):  # TensorBoard warns on each; a missing point says the same
                        non_finite += 1
                        continue
                    tag = f"{analysis}/{column}" + (f"/{sub}" if sub else "")
                    run["scalars"].append((tag, value, int(row["layer_index"])))
    if not runs:
        raise RaygeomError(f"store {root} holds no per-layer results (results/<analysis>/*.parquet) to export")
    out = Path(out)
    scalars = 0
    for name, run in sorted(runs.items()):
        writer = SummaryWriter(logdir=str(out / name))
        try:
            writer.add_text("settings", f"```\n{json.dumps(json.loads(run['settings']), indent=1, sort_keys=True)}\n```", 0)
            for tag, value, step in sorted(run["scalars"], key=lambda item: (item[0], item[2])):
                writer.add_scalar(tag, value, step)
                scalars += 1
        finally:
            writer.close()
    written = sorted({name.split("/", 1)[0] for name in runs})
    return {"runs": len(runs), "scalars": scalars, "analyses": written, "skipped": skipped, "non_finite": non_finite}


def register(app: typer.Typer) -> None:
    """Add this module's command to the raygeom app."""

    @app.command()
    def export(
        store: Path = typer.Argument(..., help="The store (a run's --out directory)."),
        tensorboard: Optional[Path] = typer.Option(
            None, "--tensorboard", help="Write TensorBoard event files of every per-layer metric into this directory."
        ),
    ):
        """Export every per-layer metric in STORE (results/<analysis>/ unit rows) for a tracker: --tensorboard DIR
        writes TensorBoard event files, one run per (analysis, model, revision, settings), the layer index as the
        step. `tensorboard --logdir DIR` shows them; `wandb sync --sync-tensorboard DIR` takes them into W&B."""
        try:
            if tensorboard is None:
                raise RaygeomError("choose what to export: --tensorboard DIR")
            counts = export_tensorboard(store, tensorboard)
        except RaygeomError as error:
            errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        console.print(
            f"tensorboard: {escape(str(tensorboard))} ({counts['runs']} runs, {counts['scalars']} scalars from "
            f"{', '.join(counts['analyses'])}); view with: tensorboard --logdir {escape(str(tensorboard))}",
            highlight=False,
            soft_wrap=True,
        )
        if counts["non_finite"]:
            console.print(
                f"note: {counts['non_finite']} NaN or infinite values left out (e.g. an interval a setting does not compute)",
                highlight=False,
                soft_wrap=True,
            )
