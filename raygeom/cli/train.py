"""CLI command of push-away training (registered by raygeom.cli.root): train (dispersion, select and knn are the
token_dispersion/slices, gap and knn_lm analyses' generated commands)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from raygeom.analyses.train import TrainSettings
from raygeom.cli.analyses import check_report
from raygeom.cli.consoles import output_width
from raygeom.cli.flags import (
    AddressOption,
    GridSettings,
    NumCpusOption,
    TrainFlags,
    checked,
    fail,
    option,
)
from raygeom.errors import RaygeomError
from raygeom.report import dispersion_plots
from raygeom.report.html import announce_report

# Wide tables stay readable when the output goes to a log file.
console = Console(width=output_width())
errors = Console(stderr=True)

_fail = fail


def _prepare(address: Optional[str]) -> None:
    """Must run before anything imports ray (see raygeom.engine.ray_env)."""
    from raygeom.engine.ray_env import prepare_ray_environment

    prepare_ray_environment(address)


def _start(address: Optional[str], num_cpus: Optional[int]) -> None:
    from raygeom.engine.orchestrate import start_ray

    with console.status("starting Ray" + (f" at {address}" if address else " locally")):
        start_ray(address, num_cpus)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if 1e-2 <= abs(value) < 1e4 or value == 0 else f"{value:.4g}"
    return str(value)


def _table(rows: list[dict], columns: list[str], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for name in columns:
        table.add_column(name, justify="left" if name in ("layer", "model", "revision", "slice", "slicing") else "right")
    for row in rows:
        table.add_row(*[_fmt(row.get(c, "")) for c in columns])
    return table


def _write_report(rows_by_name: dict[str, list[dict]], plots: list[Path], report: Optional[Path]) -> list[Path]:
    """CSV copies of the tables (names as docs/results cite them) and the plots, into ``report``."""
    if report is None:
        return []
    import shutil

    from raygeom.report.figures import write_csv

    written = [write_csv(rows, report / f"{name}.csv") for name, rows in rows_by_name.items()]
    for path in plots:
        if path.parent.resolve() != report.resolve():
            temporary = report / f".{path.name}.tmp"
            shutil.copyfile(path, temporary)
            temporary.replace(report / path.name)
        written.append(report / path.name)
    return written


ReportOption = option(
    GridSettings,
    "report",
    path=True,
    help="Also write the CSV copies of the tables and the plots into this directory (e.g. docs/results/dispersion).",
)


_check_report = check_report  # a --report directory that cannot be made fails before any work


# Every command's default store is the one store (raygeom.cli.flags.DEFAULT_STORE, GridSettings.out).
StoreOption = option(GridSettings, "out", "-o", path=True, help="The store, shared by every command (with --job: the job's out).")


TRAIN_FLAGS = (
    "corpus",
    "steps",
    "batch_size",
    "seq_len",
    "lr",
    "hidden_size",
    "n_layers",
    "vocab_size",
    "push_layer",
    "over",
    "eval_every",
    "workers",
    "use_gpu",
    "cpus_per_worker",
)


def _train_option(name: str, *aliases: str, **kwargs):
    return option(TrainSettings, name, *aliases, **kwargs)


@checked
def train(
    job: Optional[Path] = typer.Option(
        None,
        "--job",
        help="Train the runs of this job file's train section, into its "
        "run_dir, with the job's out as the store; the settings flags "
        "given override every run's.",
    ),
    corpus: Optional[str] = _train_option("corpus", "-c"),
    lam: Optional[list[str]] = _train_option(
        "lam", many=True, help="Push-away weight lambda in L = L_LM - lambda * D_batch. Repeatable."
    ),
    seeds: Optional[str] = option(TrainFlags, "seeds"),
    steps: Optional[str] = _train_option("steps"),
    batch_size: Optional[str] = _train_option("batch_size", help="Global batch (split over workers)."),
    seq_len: Optional[str] = _train_option("seq_len"),
    lr: Optional[str] = _train_option("lr"),
    hidden_size: Optional[str] = _train_option("hidden_size"),
    n_layers: Optional[str] = _train_option("n_layers"),
    vocab_size: Optional[str] = _train_option("vocab_size", help="BPE vocabulary trained on the training split."),
    push_layer: Optional[str] = _train_option("push_layer", help="Layer whose dispersion is pushed (e.g. final_norm, block_03)."),
    over: Optional[str] = _train_option("over", help="tokens | last | mean: which vectors D_batch is over."),
    eval_every: Optional[str] = _train_option("eval_every"),
    workers: Optional[str] = _train_option("workers"),
    use_gpu: Optional[bool] = _train_option("use_gpu", names="--gpu/--cpu"),
    cpus_per_worker: Optional[str] = _train_option("cpus_per_worker"),
    save_every: Optional[str] = option(TrainFlags, "save_every"),
    log_until: Optional[str] = option(TrainFlags, "log_until"),
    run_dir: Optional[str] = option(TrainFlags, "run_dir", path=True),
    out: Optional[str] = StoreOption,
    plots: Optional[str] = option(GridSettings, "plots", path=True, help="Where the PNG goes (default: <out>/plots)."),
    report: Optional[str] = ReportOption,
    address: Optional[str] = AddressOption,
    num_cpus: Optional[str] = NumCpusOption,
    given: frozenset = frozenset(),
):
    """Push-away training with Ray Train: a small GPT-NeoX from scratch, L = L_LM - lambda * D_batch."""
    values = dict(locals())
    from raygeom.store.tree import Store, check_writable

    try:
        runs, out = _job_runs(job, values) if job is not None else _flag_runs(values)
        _prepare(address)
        _check_report(report)
        store = Store(out)
        check_writable(store.root)
        _start(address, num_cpus)
        from raygeom.analyses import train as train_module
        from raygeom.jobs import train as train_job

        rows = []
        for settings, plan in runs:
            with console.status(f"training lambda={settings.lam} seed={settings.seed} ({settings.steps} steps)"):
                row = train_job.run_training(store, settings, plan)
            rows.append(row)
            if row.get("run_dir"):
                console.print(f"checkpoints: {row['n_checkpoints']} in {row['run_dir']}", markup=False, highlight=False)
            console.print(
                f"lambda={row['lam']:<6g} seed={row['seed']}  held-out perplexity {row['heldout_perplexity']:.3f}  "
                f"held-out dispersion {row['heldout_dispersion']:.4f}  ({row['wall_s']:.0f}s{', cached' if row.get('cached') else ''})"
            )
        summary = train_module.summarise(rows)
        shown = [
            {
                **s,
                "lam": f"{s['lam']:g}",
                "held-out perplexity by seed": s["heldout_perplexities"],
                "mean ± std": f"{s['heldout_perplexity_mean']:.2f}"
                + (f" ± {s['heldout_perplexity_std']:.2f}" if math.isfinite(s["heldout_perplexity_std"]) else ""),
                "paired delta vs lambda=0 [95% CI]": "—"
                if s["lam"] == 0.0 or not math.isfinite(s["paired_delta_mean"])
                else f"{s['paired_delta_mean']:+.2f} ± {s['paired_delta_std']:.2f} "
                f"[{s['paired_delta_lo']:+.2f}, {s['paired_delta_hi']:+.2f}]",
                "t": "" if not math.isfinite(s["paired_t"]) else f"{s['paired_t']:+.2f}",
                "p": "" if not math.isfinite(s["paired_p"]) else f"{s['paired_p']:.3g}",
                "seeds lower/higher": "" if s["lam"] == 0.0 else f"{s['n_lower']}/{s['n_higher']}",
            }
            for s in summary
        ]
        console.print(
            _table(
                shown,
                [
                    "lam",
                    "n_seeds",
                    "held-out perplexity by seed",
                    "mean ± std",
                    "paired delta vs lambda=0 [95% CI]",
                    "t",
                    "p",
                    "seeds lower/higher",
                    "heldout_dispersion_mean",
                ],
                "push-away vs plain (held-out; paired t-test over seeds)",
            )
        )
        paths = train_module.write_tables(store, rows, summary)
        paths["plot"] = dispersion_plots.plot_training(rows, summary, (plots or store.root / "plots") / "push_away_training.png")
        console.print(f"tables: {paths['runs']}, {paths['table']}\nplots:  {paths['plot']}", markup=False)
        if report is not None:
            columns = list(train_module.RUN_COLUMNS) + [
                c for c in train_module.PROVENANCE + ("revision", "settings", "unit_key") if any(c in r for r in rows)
            ]
            _write_report(
                {"train_runs": [{c: r.get(c) for c in columns} for r in rows], "train_summary": summary},
                [p for p in [paths["plot"]] if p],
                report,
            )
            console.print(f"report: {report}", markup=False)
        announce_report(store.root, console)
    except RaygeomError as error:
        _fail(str(error))


def _flag_runs(values: dict) -> tuple[list, Path]:
    """train's runs from its flags: each --lam with each seed, checkpoints as --save-every says."""
    from raygeom.analyses.train import CheckpointPlan, checkpoint_steps

    seeds, save_every, run_dir, out = values["seeds"], values["save_every"], values["run_dir"], values["out"]
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise RaygeomError(f"--seeds must be comma-separated integers, got '{seeds}'") from None
    base = TrainSettings(**{name: values[name] for name in TRAIN_FLAGS})
    grid = [base.with_run(lam=lam, seed=seed) for lam in values["lam"] for seed in seed_list]
    if not grid:
        raise RaygeomError("no runs: give at least one --lam and one seed")
    if run_dir is not None and (len(grid) > 1 or not save_every):
        raise RaygeomError("--run-dir needs --save-every and a single run (one --lam, one seed)")

    def plan_of(settings):
        if not save_every:
            return None
        directory = run_dir or out / "checkpoints" / f"lam{settings.lam:g}-seed{settings.seed}"
        return CheckpointPlan(
            str(directory.expanduser().resolve()), checkpoint_steps(settings.steps, save_every, values["log_until"])
        )

    return [(settings, plan_of(settings)) for settings in grid], out  # a bad schedule fails here, before Ray starts


def _job_runs(job_file: Path, values: dict) -> tuple[list, Path]:
    """train's runs from a job file's [train] section (one run, or its grid), the settings flags given over each."""
    from dataclasses import replace

    from raygeom.jobspec import load_job

    given = values["given"]
    job = load_job(job_file)
    if not job.trains:
        raise RaygeomError(f"{job_file}: no [train] section, so there is nothing to train")
    fixed = sorted(name for name in ("lam", "seeds", "save_every", "log_until", "run_dir") if name in given)
    if fixed:
        raise RaygeomError(
            f"--{fixed[0].replace('_', '-')} with --job: the job's [train] section names its runs and "
            "their checkpoints; change it there"
        )
    overrides = {name: values[name] for name in TRAIN_FLAGS if name in given}
    runs = [(replace(run.settings, **overrides), run) for run in job.trains]
    return [(settings, replace(run, settings=settings).plan()) for settings, run in runs], (
        values["out"] if "out" in given else Path(job.out)
    )


def register(app: typer.Typer) -> None:
    """Add this module's commands to the raygeom app."""
    app.command("train")(train)
