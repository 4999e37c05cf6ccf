"""A training trajectory end to end: train (checkpoints), sweep PGA over step x layer, dispersion over steps,
and the dispersion gap's checkpoint ranking set against the ranking by held-out perplexity."""

from __future__ import annotations

from pathlib import Path

from raygeom.errors import RaygeomError
from raygeom.jobs.gap_ranking import agreement  # noqa: F401 - the trajectory's G ranking, re-exported
from raygeom.jobs.trajectory_report import organisation_summary, pick_layers  # noqa: F401 - re-exported
from raygeom.jobspec import TrajectorySettings
from raygeom.report.figures import save_text

# ------------------------------------------------------------------------------------------- tables


def _settings_columns(job, settings: TrajectorySettings) -> dict:
    return {
        "corpus": job.corpus,
        "chunk_len": settings.chunk_len,
        "chunks_per_domain": settings.chunks_per_domain,
        "domain_tokens": settings.domain_tokens,
        "gap_layer": settings.gap_layer,
    }


def checkpoint_table(
    ranking: list[dict], evaluations: list[dict], steps: dict[str, int | None], flags: dict[str, str | None], extra: dict
) -> list[dict]:
    """One row per checkpoint: its step, G and select's rank, the held-out perplexity (the trainer's evaluation
    where the run was trained here, else the perplexity of the chunks G was measured on) and its rank."""
    trainer = {e["revision"]: e for e in evaluations}
    rows = []
    for r in ranking:
        evaluation = trainer.get(r["revision"], {})
        rows.append(
            {
                "model": r["model"],
                "revision": r["revision"],
                "step": steps.get(r["revision"]),
                "gap": r["gap"],
                "select_rank": r["rank"],
                "domain_dispersion": r["domain_dispersion"],
                "generic_dispersion": r["generic_dispersion"],
                "n_domain": r["n_domain"],
                "chunk_perplexity": r["perplexity"],
                "trainer_heldout_perplexity": evaluation.get("heldout_perplexity"),
                "weights_flag": flags.get(r["revision"]),
                **extra,
            }
        )
    source = "trainer" if rows and all(r["trainer_heldout_perplexity"] is not None for r in rows) else "chunks"
    for r in rows:
        r["heldout_perplexity"] = r["trainer_heldout_perplexity"] if source == "trainer" else r["chunk_perplexity"]
        r["perplexity_source"] = source
    for rank, r in enumerate(sorted(rows, key=lambda r: (r["heldout_perplexity"], r["revision"])), 1):
        r["perplexity_rank"] = rank
    return sorted(rows, key=lambda r: (r["step"] if r["step"] is not None else -1, r["revision"]))


def gap_by_run(job, ranking: list[dict], extra: dict) -> list[dict]:
    """Per run of the ladder: G at each checkpoint against the trainer's held-out perplexity there, and
    Spearman(G, -perplexity) over its checkpoints with Fisher and bootstrap intervals (the trajectory job's reading,
    one run at a time, so checkpoints of different widths are never ranked together)."""
    from raygeom.analyses.train import checkpoint_evaluations
    from raygeom.jobs.width import ladder, step_of

    out = []
    settings = job.trajectory
    for run in ladder(job):
        mine = [r for r in ranking if r["model"] == run.model]
        if not mine:
            continue
        steps = {r["revision"]: step_of(r["revision"]) for r in mine}
        columns = {**extra, "run": run.name, "width": run.d, "depth": run.depth, "run_seed": run.seed}
        rows = checkpoint_table(mine, checkpoint_evaluations(run.run_dir), steps, {}, columns)
        summary = agreement(rows, settings.late_from, settings.bootstrap, settings.seed)
        out.append(
            {
                "run": run.name,
                "width": run.d,
                "depth": run.depth,
                "seed": run.seed,
                "rows": rows,
                "summary": [{**row, **columns} for row in summary],
            }
        )
    return out


def dispersion_by_step(layer_rows: list[dict], steps: dict[str, int | None]) -> list[dict]:
    """The dispersion analysis' per-layer rows, with each checkpoint's step."""
    keep = (
        "model",
        "revision",
        "layer",
        "layer_index",
        "relative_depth",
        "token_dispersion",
        "sample_dispersion",
        "perplexity",
        "n_chunks",
        "gap",
    )
    rows = [{**{k: r.get(k) for k in keep}, "step": steps.get(r["revision"])} for r in layer_rows]
    return sorted(rows, key=lambda r: (r["step"] if r["step"] is not None else -1, r["layer_index"]))


# -------------------------------------------------------------------------------------------- plots


# --------------------------------------------------------------------------------------------- run


def runs_at_once(runs, cluster: dict) -> int:
    """How many of ``runs`` (TrainSettings) the cluster holds at once: its CPUs (GPUs, when they train on GPUs) over
    the most one run asks for; at least 1."""
    need_cpu = max(run.workers * run.cpus_per_worker for run in runs)
    fits = int(float(cluster.get("CPU", 0)) // need_cpu) if need_cpu else len(runs)
    if any(run.use_gpu for run in runs):
        fits = min(fits, int(float(cluster.get("GPU", 0)) // max(run.workers for run in runs)))
    return max(1, min(len(runs), fits))


def train_stage(job, store, console, address=None, num_cpus=None) -> list[dict]:
    """[train]: every run of it, each skipped when its checkpoints exist and match its settings and schedule. The runs
    of a grid are independent: as many train at once as the cluster holds (each run is seeded and has its own
    workers, so its checkpoints are the same whatever trains beside it). Rows come back in the job's order."""
    from concurrent.futures import ThreadPoolExecutor

    from raygeom.jobs import train as train_module

    rows: dict[int, dict] = {}
    todo = []
    for index, run in enumerate(job.trains):
        plan, settings = run.plan(), run.settings
        name = f"train {run.variant}" if run.variant else "train"
        if train_module.completed_trajectory(plan, plan.key(settings)) is not None:
            row = train_module.run_training(store, settings, plan)  # reads it back, no Ray needed
            console.print(
                f"{name}: the {len(plan.steps)} checkpoints in {plan.run_dir} exist and match; not retrained "
                f"(trained in {row['wall_s'] / 60:.1f} min)",
                markup=False,
            )
            rows[index] = row
        else:
            todo.append((index, name, settings, plan))
    if todo:
        import ray

        from raygeom.engine import orchestrate

        with console.status("starting Ray" + (f" at {address}" if address else " locally")):
            orchestrate.start_ray(address, num_cpus)
        at_once = runs_at_once([settings for _, _, settings, _ in todo], ray.cluster_resources())
        _, name, settings, plan = todo[0]
        what = (
            f"{name}: d={settings.hidden_size}, {settings.n_layers} layers, {settings.steps} steps; {len(plan.steps)} "
            f"checkpoints into {plan.run_dir}"
            if len(todo) == 1
            else f"train: {len(todo)} runs, {at_once} at once"
        )
        # The data (article split, tokenizer, sequences) is made here, once per data setting: the runs of a grid share
        # it, and transformers' lazy imports are not safe from several threads at once.
        data = {}
        for _, _, settings, _ in todo:
            if settings.data_fields() not in data:
                data[settings.data_fields()] = train_module.training.prepare_data(settings.data_fields())
        # Not `with ThreadPoolExecutor`: its exit waits for every running run, so a SIGTERM or Ctrl-C would train the
        # rest of the grid before the run could stop. On any exception the queued runs are dropped and the process
        # ends (finished checkpoints are kept); Ray's teardown stops the runs under way.
        with console.status(what):
            pool = ThreadPoolExecutor(at_once)
            try:
                futures = [
                    (
                        index,
                        name,
                        settings,
                        plan,
                        pool.submit(train_module.run_training, store, settings, plan, data[settings.data_fields()]),
                    )
                    for index, name, settings, plan in todo
                ]
                failed = None
                for index, name, settings, plan, future in futures:
                    try:
                        row = future.result()
                    except RaygeomError as error:  # the other runs still finish and keep their checkpoints
                        failed = failed or error
                        continue
                    console.print(
                        f"{name}: {settings.steps} steps in {row['wall_s'] / 60:.1f} min, held-out perplexity "
                        f"{row['heldout_perplexity']:.2f}; {len(plan.steps)} checkpoints in {plan.run_dir}",
                        markup=False,
                    )
                    rows[index] = row
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            pool.shutdown()
        if failed is not None:
            raise failed
    return [rows[index] for index in sorted(rows)]


def run_trajectory_job(job, console, address: str | None = None, num_cpus: int | None = None) -> dict:
    """Train (when the job has [train]), sweep PGA over every checkpoint, then the [trajectory] analyses and report."""
    import time
    from dataclasses import replace

    import pyarrow as pa

    from raygeom.jobs.progress import progress_bar
    from raygeom.jobs.run import run
    from raygeom.jobspec import SweepSettings
    from raygeom.report.html import announce_report
    from raygeom.store.tree import Store, atomic_write_table, check_writable, read_table

    started = time.perf_counter()
    store = Store(job.out)
    check_writable(store.root)
    trained_runs = train_stage(job, store, console, address, num_cpus)
    trained = trained_runs[0] if trained_runs else None
    if job.sweep is None:
        job = replace(job, sweep=SweepSettings())
    swept = run(job, console, address=address, num_cpus=num_cpus, write_html=False)  # written once, at the end
    outputs = {"trained": trained, "trained_runs": trained_runs, "swept": swept, "computed_dispersion_units": 0}
    settings = job.trajectory
    if settings is not None:
        from raygeom.analyses import dispersion as dp
        from raygeom.sources.corpus import load_corpus

        specs = job.model_specs()
        corpus = load_corpus(job.corpus)
        dsettings = dp.DispersionSettings(
            settings.chunk_len, settings.chunks_per_domain, settings.batch_size, "all", settings.domain_tokens, settings.seed
        )
        analysis = dp.AnalysisSettings(settings.group_size, settings.n_groups, 8, settings.gap_layer)
        missing = [s for s in specs if not dp.is_extracted(store, s, corpus, dsettings)]
        with progress_bar(console) as progress:

            def factory(label, _):
                task = progress.add_task(
                    f"dispersion {label}", total=len(set(corpus.labels or ["all"])) * settings.chunks_per_domain
                )
                return lambda n: progress.advance(task, n)

            result = dp.run_dispersion(store, specs, corpus, dsettings, analysis, factory)
        ranking = dp.rank_by_gap(store, specs, corpus, dsettings, settings.gap_layer, by_model=True)  # per run
        outputs["computed_dispersion_units"] = len(missing)
    if job.width is not None:
        from raygeom.jobs.width import export_page_rows

        together = {"wall_s": sum(r["wall_s"] for r in trained_runs), "cached": all(r.get("cached") for r in trained_runs)}
        record = full_run_record(
            store, together, time.perf_counter() - started, swept.computed_units, outputs["computed_dispersion_units"]
        )
        gaps = gap_by_run(job, ranking, _settings_columns(job, settings)) if settings is not None else []
        if gaps:
            atomic_write_table(
                pa.Table.from_pylist([r for run in gaps for r in run["rows"]]), store.root / "results" / "width_gap.parquet"
            )
        if job.width.report:
            outputs["width_report"] = export_page_rows(job, store, console, record, gaps)
        announce_report(store.root, console)
        return outputs
    if settings is None:
        announce_report(store.root, console)
        return outputs

    steps = {s.revision: s.step for s in specs}
    pga = swept.over_revisions.get("pga")  # PGA over the sweep's revisions (raygeom.report.pga_sweep)
    table = pga.rows if pga is not None else []  # the sweep's [pga] units, each with its revision's step and weights flag
    flags = {r["revision"]: r["weights_flag"] for r in read_table(swept.revisions).to_pylist()}
    evaluations = []
    if job.train is not None:
        from raygeom.analyses.train import checkpoint_evaluations

        evaluations = checkpoint_evaluations(job.train.plan().run_dir)
    extra = _settings_columns(job, settings)
    rows = checkpoint_table(ranking, evaluations, steps, flags, extra)
    summary = [
        {**row, **extra, "perplexity_source": rows[0]["perplexity_source"] if rows else None}
        for row in agreement(rows, settings.late_from, settings.bootstrap, settings.seed)
    ]
    by_step = [{**r, **extra} for r in dispersion_by_step(result["layers"], steps)]
    results = store.root / "results"
    atomic_write_table(pa.Table.from_pylist(rows), results / "trajectory_checkpoints.parquet")
    atomic_write_table(pa.Table.from_pylist(summary), results / "trajectory_agreement.parquet")
    atomic_write_table(pa.Table.from_pylist(by_step), results / "trajectory_dispersion.parquet")

    organisation = organisation_summary(table, pick_layers(_layer_names(table)), job.sweep.positive_z)
    _print(console, rows, summary, organisation)
    wall = time.perf_counter() - started
    outputs.update(
        rows=rows,
        summary=summary,
        organisation=organisation,
        wall_s=wall,
        full_run=full_run_record(store, trained, wall, swept.computed_units, len(missing)),
    )
    if settings.report:
        page = Path(settings.report)
        export_rows(job, store, page.parent / page.stem, rows, by_step, table, outputs["full_run"])
        console.print(
            f"trajectory rows: {page.parent / page.stem} (the page: python -m tools.results_pages {page})",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    console.print(
        f"trajectory: {swept.computed_units} PGA units and {len(missing)} dispersion units computed in this run; "
        f"{wall / 60:.1f} min\ntables: {results / 'trajectory_checkpoints.parquet'}, trajectory_agreement.parquet, "
        f"trajectory_dispersion.parquet",
        markup=False,
    )
    announce_report(store.root, console)
    return outputs


def _layer_names(rows: list[dict]) -> list[str]:
    return [name for _, name in sorted({(r["layer_index"], r["layer"]) for r in rows})]


# The rows the trajectory page cites, per table (raygeom.jobs.width.cited_tables for every analysis with metrics).
Z_COLUMNS = (
    "model",
    "revision",
    "step",
    "layer",
    "layer_index",
    "relative_depth",
    "k",
    "r",
    "n_null",
    "z",
    "z_lo",
    "z_hi",
    "weights_flag",
)
CHECKPOINT_COLUMNS = (
    "model",
    "revision",
    "step",
    "gap",
    "select_rank",
    "domain_dispersion",
    "generic_dispersion",
    "n_domain",
    "heldout_perplexity",
    "perplexity_source",
    "perplexity_rank",
    "weights_flag",
)
DISPERSION_COLUMNS = (
    "revision",
    "step",
    "layer",
    "layer_index",
    "relative_depth",
    "token_dispersion",
    "sample_dispersion",
    "perplexity",
    "n_chunks",
    "gap",
)


def export_rows(
    job, store, data_dir: Path, rows: list[dict], by_step: list[dict], z_rows: list[dict], full_run: dict | None
) -> Path:
    """Write the tidy rows the trajectory page cites into ``data_dir`` and ``meta.json`` (what ran)."""
    import json
    from dataclasses import asdict

    from raygeom.jobs.width import cited_tables, job_rows, write_rows

    data_dir.mkdir(parents=True, exist_ok=True)

    def write(name, table, columns):
        write_rows([{c: r.get(c) for c in columns} for r in table], data_dir / f"{name}.parquet")

    write("z", z_rows, Z_COLUMNS)
    write("checkpoints", rows, CHECKPOINT_COLUMNS)
    write("dispersion", by_step, DISPERSION_COLUMNS)
    if job.train is not None and job.planned():
        for name, kept in cited_tables(job_rows(job, store)).items():
            write_rows(kept, data_dir / f"{name}.parquet")
    settings = job.trajectory
    meta = {
        "job": job.name,
        "store": f"runs/{Path(job.out).name}",
        "train": asdict(job.train.settings) if job.train is not None else None,
        "log_until": job.train.log_until if job.train is not None else None,
        "save_every": job.train.save_every if job.train is not None else None,
        "n_samples": job.n_samples,
        "pga": {"k": job.pga.k, "r": job.pga.r, "n_null": job.pga.n_null, "seed": job.pga.seed},
        "sweep": {"collapse_threshold": job.sweep.collapse_threshold, "positive_z": job.sweep.positive_z},
        "trajectory": {
            k: getattr(settings, k)
            for k in ("gap_layer", "domain_tokens", "chunks_per_domain", "chunk_len", "late_from", "bootstrap", "seed")
        },
        "wall": full_run,
        "rerun_note": RERUN_NOTE,
    }
    save_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", data_dir / "meta.json")
    return data_dir


# Said on the page: the 800-step run the page once showed was not kept, so the rows are from a smaller rerun.
RERUN_NOTE = (
    "a smaller rerun (5 Dec 2026) of the job the page once showed (800 steps of 16 x 128 tokens, N = 400): its "
    "store was not kept, so the job was sized down to 400 steps of 8 x 128 tokens and N = 200 held-out articles, "
    "with a checkpoint at 25% of training, to rerun in about 15 minutes of 2 shared cores."
)


FULL_RUN = "results/trajectory_full_run.json"


def full_run_record(store, trained: dict | None, wall: float, pga_units: int, dispersion_units: int) -> dict | None:
    """The wall time of the last invocation that trained (the whole job, end to end), kept for the report and
    the README: a rerun that reuses everything must not overwrite it with its own few minutes."""
    import json
    import os
    from datetime import datetime, timezone

    from raygeom.store.tree import atomic_write_text

    path = store.root / FULL_RUN
    if trained is not None and not trained.get("cached"):
        record = {
            "wall_s": wall,
            "train_wall_s": trained["wall_s"],
            "pga_units": pga_units,
            "dispersion_units": dispersion_units,
            "load_1min_at_end": os.getloadavg()[0],
            "cpus": os.cpu_count(),
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        atomic_write_text(json.dumps(record, indent=2), path)
        return record
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _print(console, rows: list[dict], summary: list[dict], organisation: list[dict]) -> None:
    from rich.table import Table

    table = Table(title="checkpoints: dispersion gap G (select's rank) against held-out perplexity", title_justify="left")
    for name in ("revision", "step", "G", "select rank", "held-out ppl", "ppl rank", "weights"):
        table.add_column(name, justify="left" if name in ("revision", "weights") else "right")
    for r in rows:
        table.add_row(
            r["revision"],
            str(r["step"]),
            f"{r['gap']:+.4f}",
            str(r["select_rank"]),
            f"{r['heldout_perplexity']:.2f}",
            str(r["perplexity_rank"]),
            r["weights_flag"] or "",
        )
    console.print(table)
    for s in summary:
        console.print(
            f"Spearman(G, -perplexity) over {s['subset']} (n={s['n']}): {s['spearman']:+.3f}  "
            f"95% Fisher [{s['fisher_lo']:+.3f}, {s['fisher_hi']:+.3f}]  bootstrap [{s['boot_lo']:+.3f}, {s['boot_hi']:+.3f}]"
            + (
                f"; select picks {s['select_pick']} (perplexity rank {s['pick_perplexity_rank']}), "
                f"lowest perplexity: {s['best_by_perplexity']}"
                if s.get("select_pick")
                else ""
            ),
            highlight=False,
        )
    for o in organisation:
        console.print(
            f"z {o['role']:>6} {o['layer']}: first {o['z_first']:+.2f}, peak {o['z_peak']:+.2f} at step {o['peak_step']}, "
            f"half-peak by step {o['half_peak_step']}, last {o['z_last']:+.2f}",
            highlight=False,
        )
