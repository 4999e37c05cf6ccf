"""CLI commands for the dispersion analyses (registered by raygeom.cli.root): dispersion, select, knn, train."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from raygeom.cli.consoles import output_width
from raygeom.errors import RaygeomError
from raygeom.params import LAYERS_HELP, PGAParams, check_value
from raygeom.report.figures import format_interval
from raygeom.report.html import announce_report

# Wide tables stay readable when the output goes to a log file.
console = Console(width=output_width())
errors = Console(stderr=True)

AddressOption = typer.Option(None, "--address", help="Attach to this Ray cluster instead of starting a local one.")
NumCpusOption = typer.Option(None, "--num-cpus", help="CPUs for a local Ray (default: all).")


def _fail(message: str) -> None:
    errors.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


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


def _specs(models: list[str], revisions: list[str]):
    from raygeom.sources.models import resolve_model

    return [resolve_model(m, r) for m in models for r in revisions]


def _progress():
    from raygeom.jobs.pipeline import progress_bar

    return progress_bar(console)


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


ReportOption = typer.Option(None, "--report", help="Also write the CSV copies of the tables and the plots into this "
                            "directory (e.g. docs/results/dispersion).")


def _check_report(report: Optional[Path]) -> None:
    """A --report directory that cannot be made fails before any work, with one line."""
    if report is None:
        return
    try:
        report.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RaygeomError(f"report directory {report} cannot be created: {error.strerror or error}") from None
    if not os.access(report, os.W_OK):
        raise RaygeomError(f"report directory {report} is not writable")


NBootOption = typer.Option(1000, "--n-boot", help="Bootstrap draws behind every interval (seeded by --seed).")


def dispersion(
    model: list[str] = typer.Option(["smollm2"], "--model", "-m", help="Built-in name, hub id, model dir or .gguf. Repeatable."),
    revision: list[str] = typer.Option(["main"], "--revision", "-r", help="Hub revision(s). Repeatable."),
    corpus: str = typer.Option("bbc", "--corpus", "-c", help="Built-in name or file; its labels are the domains."),
    chunk_len: int = typer.Option(512, "--chunk-len", help="Tokens per chunk."),
    chunks_per_domain: int = typer.Option(40, "--chunks-per-domain"),
    batch_size: int = typer.Option(4, "--batch-size", help="Chunks per forward pass."),
    layers: str = typer.Option("all", "--layers", help=LAYERS_HELP + " attn_last is always added."),
    domain_tokens: str = typer.Option("digits", "--domain-tokens", help="Gap token set: digits, or comma-separated token texts."),
    group_size: int = typer.Option(20, "--group-size", help="Chunks per perplexity group (authors: 100, over far more chunks)."),
    n_groups: int = typer.Option(100, "--n-groups", help="Groups kept, evenly spaced in mean perplexity."),
    n_slices: int = typer.Option(8, "--n-slices", help="k-means slices for the difficulty analysis."),
    model_layer: str = typer.Option("final_norm", "--model-layer", help="Layer of the cross-model and gap summaries."),
    n_boot: int = NBootOption,
    seed: int = typer.Option(0, "--seed"),
    out: Path = typer.Option(Path("runs/dispersion"), "--out", "-o", help="Store directory."),
    plots: Optional[Path] = typer.Option(None, "--plots", help="Where PNGs go (default: <out>/plots)."),
    report: Optional[Path] = ReportOption,
    address: Optional[str] = AddressOption,
    num_cpus: Optional[int] = NumCpusOption,
):
    """Dispersion vs perplexity per model, layer and domain: token and sample level, group protocol, slices, gap,
    each correlation with a 95 % bootstrap interval; bits per byte beside perplexity."""
    from raygeom.sources.corpus import load_corpus
    from raygeom.store.tree import Store, check_writable

    try:
        _prepare(address)
        from raygeom.analyses.dispersion import AnalysisSettings, DispersionSettings

        settings = DispersionSettings(chunk_len, chunks_per_domain, batch_size, layers, domain_tokens, seed)
        analysis = AnalysisSettings(group_size, n_groups, n_slices, model_layer, n_boot)
        specs = _specs(model, revision)
        _check_report(report)
        store = Store(out)
        check_writable(store.root)
        text = load_corpus(corpus)
        analysis.check_against(len(set(text.labels or ["all"])) * chunks_per_domain)
        _start(address, num_cpus)
        from raygeom.analyses import dispersion as dp

        with _progress() as bar:
            def factory(label, _):
                task = bar.add_task(f"chunks {label}", total=len(set(text.labels or ["all"])) * chunks_per_domain)
                return lambda n: bar.advance(task, n)

            analysed = bar.add_task("analysis (layers x models)", total=None)
            result = dp.run_dispersion(store, specs, text, settings, analysis, factory, lambda n: bar.advance(analysed, n))
        plot_dir = plots or store.root / "plots"
        written = []
        for name in dict.fromkeys(r["model"] for r in result["layers"]):
            for revision_name in dict.fromkeys(r["revision"] for r in result["layers"] if r["model"] == name):
                rows = [dict(r) for r in result["layers"] if r["model"] == name and r["revision"] == revision_name]
                for row in rows:
                    for label, column in (("group Spearman", "group_spearman"), ("group Pearson", "group_pearson"),
                                          ("chunk Spearman", "chunk_spearman")):
                        row[label] = format_interval(row, column, separator=",")
                    row["G"] = format_interval(row, "gap", 3, ",")
                    for kind in ("domain", "kmeans"):
                        for level in ("token", "sample"):
                            row[f"{kind} {level}"] = format_interval(row, f"{kind}_agreement_{level}", separator=",")
                title = (f"{name}@{revision_name}  (perplexity {rows[0]['perplexity']:.2f}, {rows[0]['bits_per_byte']:.4f} bits "
                         f"per byte, {rows[0]['n_chunks']} chunks; [95 % bootstrap interval])")
                console.print(_table(rows, ["layer", "token_dispersion", "sample_dispersion", "group Spearman", "group Pearson",
                                            "chunk Spearman", "G", "gap_n_domain"], f"dispersion against perplexity  {title}"))
                console.print(_table(rows, ["layer", "domain token", "domain sample", "kmeans token", "kmeans sample"],
                                     f"slice rank agreement, Spearman(-slice dispersion, slice perplexity), token- and "
                                     f"sample-level dispersion  {name}@{revision_name}"))
                warning = next((r["gap_warning"] for r in rows if r["layer"] == model_layer and r.get("gap_warning")), "")
                if warning:
                    console.print(f"[yellow]warning:[/] {name}@{revision_name} at {model_layer}: {warning}", highlight=False)
            depth = sorted((r for r in result["layers"] if r["model"] == name), key=lambda r: r["relative_depth"])
            ordered = list(dict.fromkeys(r["layer"] for r in depth if r["layer"] != "attn_last"))
            picks = list(dict.fromkeys([ordered[len(ordered) // 4], ordered[len(ordered) // 2], ordered[-2], ordered[-1], "attn_last"]))
            written.append(dp.plot_groups(result["groups"], result["layers"], name, picks,
                                          plot_dir / f"groups_{name.replace('/', '--')}.png"))
        written.append(dp.plot_layer_profile(result["layers"], plot_dir / "layer_profile.png"))
        written.append(dp.plot_models(result["domains"], plot_dir / "models_dispersion_vs_perplexity.png"))
        console.print(_table(result["domains"], ["model", "revision", "domain", "token_dispersion", "perplexity", "bits_per_byte",
                                                 "n_chunks"],
                             f"per domain at {model_layer} (bits per byte compare across tokenizers; perplexity does not)"))
        _write_report({name: result[name] for name in ("layers", "slices", "groups", "domains")}, written, report)
        console.print(f"tables: {store.root / 'results'} (dispersion_layers/slices/groups/domains.parquet)\nplots:  {plot_dir}"
                      + (f"\nreport: {report}" if report else ""))
        announce_report(store.root, console)
    except RaygeomError as error:
        _fail(str(error))


def select(
    job: Optional[Path] = typer.Option(None, "--job", help="A sweep job file: its models, revisions and corpus are ranked."),
    model: list[str] = typer.Option([], "--model", "-m", help="Model(s) to rank when no job file is given. Repeatable."),
    revision: list[str] = typer.Option(["main"], "--revision", "-r", help="Revisions (checkpoints). Repeatable."),
    corpus: str = typer.Option("bbc", "--corpus", "-c"),
    domain_tokens: str = typer.Option("digits", "--domain-tokens", help="digits, or comma-separated token texts."),
    layer: str = typer.Option("final_norm", "--layer", help="Layer whose gap ranks the candidates."),
    chunk_len: int = typer.Option(512, "--chunk-len"),
    chunks_per_domain: int = typer.Option(10, "--chunks-per-domain"),
    batch_size: int = typer.Option(4, "--batch-size"),
    n_boot: int = NBootOption,
    seed: int = typer.Option(0, "--seed"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Store (default: the job's out, or runs/select)."),
    plots: Optional[Path] = typer.Option(None, "--plots", help="Where the PNG goes (default: <out>/plots)."),
    report: Optional[Path] = ReportOption,
    address: Optional[str] = AddressOption,
    num_cpus: Optional[int] = NumCpusOption,
):
    """Rank checkpoints or models by the dispersion gap G (domain-token minus generic positions), label-free;
    G with its 95 % bootstrap interval over chunks and the positions behind it."""
    from raygeom.sources.corpus import load_corpus
    from raygeom.store.tree import Store, check_writable

    try:
        _prepare(address)
        from raygeom.analyses.dispersion import DispersionSettings

        if n_boot < 10:
            raise RaygeomError(f"--n-boot must be at least 10, got {n_boot}")
        if job is not None:
            from raygeom.jobspec import load_job
            from raygeom.jobs.pipeline import job_models

            spec_job = load_job(job)
            specs, corpus, root = job_models(spec_job), spec_job.corpus, out or Path(spec_job.out)
        else:
            if not model:
                raise RaygeomError("give --job or at least one --model")
            specs, root = _specs(model, revision), out or Path("runs/select")
        settings = DispersionSettings(chunk_len, chunks_per_domain, batch_size, "all", domain_tokens, seed)
        _check_report(report)
        store = Store(root)
        check_writable(store.root)
        text = load_corpus(corpus)
        _start(address, num_cpus)
        from raygeom.analyses.dispersion import plot_select, rank_by_gap
        rows = rank_by_gap(store, specs, text, settings, layer, n_boot)
        shown = [{**r, "G [95%]": format_interval(r, "gap", 3, ",")} for r in rows]
        console.print(_table(shown, ["rank", "model", "revision", "G [95%]", "gap_se", "domain_dispersion", "generic_dispersion",
                                     "n_domain", "n_generic", "perplexity", "bits_per_byte"],
                             f"dispersion gap at {layer}, domain tokens: {domain_tokens} (interval: bootstrap over chunks, "
                             f"{n_boot} draws; bits per byte compare across tokenizers)"))
        for row in rows:
            if row.get("gap_warning"):
                console.print(f"[yellow]warning:[/] {row['model']}@{row['revision']}: {row['gap_warning']}", highlight=False)
        plot = plot_select(rows, (plots or store.root / "plots") / "select_gap.png")
        _write_report({"select": rows}, [plot], report)
        console.print(f"table: {store.root / 'results' / 'dispersion_select.parquet'}\nplot:  {plot}"
                      + (f"\nreport: {report}" if report else ""))
        announce_report(store.root, console)
    except RaygeomError as error:
        _fail(str(error))


def knn(
    model: str = typer.Option("smollm2", "--model", "-m"),
    revision: str = typer.Option("main", "--revision", "-r"),
    corpus: str = typer.Option("bbc", "--corpus", "-c"),
    layers: str = typer.Option("all", "--layers", help="Candidate layers: " + LAYERS_HELP + " attn_last is always added."),
    chunk_len: int = typer.Option(512, "--chunk-len"),
    train_chunks: int = typer.Option(40, "--train-chunks", help="Chunks of datastore text."),
    test_chunks: int = typer.Option(8, "--test-chunks", help="Chunks of held-out text (other articles)."),
    k: int = typer.Option(64, "--k", help="Neighbours."),
    temperature: str = typer.Option("auto", "--temperature", help="A number, or auto: per layer, the median nearest squared distance."),
    temperature_scales: str = typer.Option("0.1,0.3,1", "--temperature-scales", help="Multipliers of the temperature tried."),
    lam: str = typer.Option("0.01,0.02,0.05,0.1,0.2,0.3,0.5", "--lam", help="Interpolation weights tried; (T, lam) chosen on a tuning half."),
    bootstrap_block: int = typer.Option(64, "--bootstrap-block", help="Held-out tokens per resampled block of the "
                                        "bootstrap interval (consecutive, within a chunk); 1 = single tokens, "
                                        ">= chunk-len = whole chunks."),
    n_boot: int = typer.Option(2000, "--n-boot", help="Bootstrap resamples."),
    batch_size: int = typer.Option(4, "--batch-size"),
    seed: int = typer.Option(0, "--seed"),
    out: Path = typer.Option(Path("runs/knn"), "--out", "-o"),
    plots: Optional[Path] = typer.Option(None, "--plots"),
    report: Optional[Path] = ReportOption,
    gpus_per_task: float = typer.Option(0.0, "--gpus-per-task"),
    address: Optional[str] = AddressOption,
    num_cpus: Optional[int] = NumCpusOption,
):
    """kNN-LM layer selection: per layer a datastore, interpolated held-out perplexity; is the max-dispersion layer best?"""
    from raygeom.sources.corpus import load_corpus
    from raygeom.store.tree import Store, check_writable

    try:
        check_value(PGAParams, "gpus_per_task", gpus_per_task, label="--gpus-per-task")  # the same declaration as pga's
        _prepare(address)
        from raygeom.analyses.knn import KnnSettings

        settings = KnnSettings(chunk_len=chunk_len, train_chunks=train_chunks, test_chunks=test_chunks, layers=layers, k=k,
                               temperature=temperature, temperature_scales=temperature_scales, lams=lam, batch_size=batch_size,
                               seed=seed, gpus_per_task=gpus_per_task, bootstrap_block=bootstrap_block, n_boot=n_boot)
        spec = _specs([model], [revision])[0]
        _check_report(report)
        store = Store(out)
        check_writable(store.root)
        text = load_corpus(corpus)
        _start(address, num_cpus)
        from raygeom.analyses import knn as knn_module

        with _progress() as bar:
            task = bar.add_task(f"kNN-LM {spec.name}", total=None)
            result = knn_module.run_knn(store, spec, text, settings, progress=lambda n: bar.advance(task, n))
        rows = result["layers"]
        shown = [{**r, "ppl difference [95% CI]": format_interval(r, "delta", separator=",")} for r in rows]
        console.print(_table(shown, ["layer", "dispersion", "temperature", "lam", "knn_perplexity", "ppl difference [95% CI]",
                                     "target_in_neighbours", "nearest_is_target"],
                             f"kNN-LM  {spec.name}  ({result['n_keys']} keys, {result['n_test']} held-out tokens, k={k}, "
                             f"base perplexity {rows[0]['base_perplexity']:.2f}; interval: bootstrap over blocks of "
                             f"{bootstrap_block} held-out tokens, {rows[0]['bootstrap_units']} blocks)"))
        versus = result["best_vs_runner_up"]
        if versus["runner_up"] is not None:
            verdict = {True: "separated", False: "NOT separated (the interval contains 0)",
                       None: "not compared"}[versus["separated"]]
            console.print(f"best kNN-LM layer: {versus['best_layer']}   runner-up: {versus['runner_up']}   perplexity difference "
                          f"{format_interval({'d': versus['difference'], 'd_lo': versus['lo'], 'd_hi': versus['hi']}, 'd', separator=',')} "
                          f"(paired bootstrap): {verdict}",
                          highlight=False)
        console.print(f"max-dispersion layer: {result['max_dispersion_layer']}   "
                      f"agrees with the best layer: {result['best_layer'] == result['max_dispersion_layer']}   "
                      f"Spearman over layers: dispersion vs -perplexity {result['spearman']:+.3f}, "
                      f"dispersion vs target-among-neighbours {result['spearman_retrieval']:+.3f}", highlight=False)
        for line in result["warnings"]:
            errors.print(f"[bold yellow]warning:[/] {line}", highlight=False, soft_wrap=True)
        plot = knn_module.plot_layers(rows, (plots or store.root / "plots") / f"knn_{spec.slug}.png", spec.name)
        console.print(f"table: {result['table']}\nplot:  {plot}")
        if report is not None:
            _write_report({"knn": rows}, [plot], report)
            console.print(f"report: {report / 'knn.csv'}")
        announce_report(store.root, console)
    except RaygeomError as error:
        _fail(str(error))


def train(
    corpus: str = typer.Option("bbc", "--corpus", "-c"),
    lam: list[float] = typer.Option([0.0], "--lam", help="Push-away weight lambda in L = L_LM - lambda * D_batch. Repeatable."),
    seeds: str = typer.Option("0", "--seeds", help="Comma-separated seeds; each lambda runs with each seed."),
    steps: int = typer.Option(600, "--steps"),
    batch_size: int = typer.Option(16, "--batch-size", help="Global batch (split over workers)."),
    seq_len: int = typer.Option(128, "--seq-len"),
    lr: float = typer.Option(2e-3, "--lr"),
    hidden_size: int = typer.Option(128, "--hidden-size"),
    n_layers: int = typer.Option(4, "--n-layers"),
    vocab_size: int = typer.Option(4096, "--vocab-size", help="BPE vocabulary trained on the training split."),
    push_layer: str = typer.Option("final_norm", "--push-layer", help="Layer whose dispersion is pushed (e.g. final_norm, block_03)."),
    over: str = typer.Option("tokens", "--over", help="tokens | last | mean: which vectors D_batch is over."),
    eval_every: int = typer.Option(100, "--eval-every"),
    workers: int = typer.Option(1, "--workers", help="Data-parallel Ray Train workers."),
    use_gpu: bool = typer.Option(False, "--gpu/--cpu", help="One GPU per worker."),
    cpus_per_worker: float = typer.Option(1.0, "--cpus-per-worker"),
    save_every: int = typer.Option(0, "--save-every", help="Save HF checkpoints (model + tokenizer): step 0, 1, 2, 4, ... "
                                   "--log-until, then every N steps. 0: no checkpoints."),
    log_until: int = typer.Option(512, "--log-until", help="Last log-spaced checkpoint step."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Where checkpoints go (one run only); default "
                                           "<out>/checkpoints/lam<lambda>-seed<seed>. A sweep source: [[models]] run_dir = ..."),
    out: Path = typer.Option(Path("runs/train"), "--out", "-o"),
    plots: Optional[Path] = typer.Option(None, "--plots", help="Where the PNG goes (default: <out>/plots)."),
    report: Optional[Path] = ReportOption,
    address: Optional[str] = AddressOption,
    num_cpus: Optional[int] = NumCpusOption,
):
    """Push-away training with Ray Train: a small GPT-NeoX from scratch, L = L_LM - lambda * D_batch."""
    from raygeom.store.tree import Store, check_writable

    try:
        _prepare(address)
        from raygeom.analyses.train import TrainSettings

        try:
            seed_list = [int(s) for s in seeds.split(",") if s.strip()]
        except ValueError:
            raise RaygeomError(f"--seeds must be comma-separated integers, got '{seeds}'") from None
        base = TrainSettings(corpus=corpus, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, hidden_size=hidden_size,
                             n_layers=n_layers, vocab_size=vocab_size, push_layer=push_layer, over=over, eval_every=eval_every,
                             workers=workers, use_gpu=use_gpu, cpus_per_worker=cpus_per_worker)
        grid = [base.with_run(lam=l, seed=s) for l in lam for s in seed_list]
        if not grid:
            raise RaygeomError("no runs: give at least one --lam and one seed")
        if save_every < 0:
            raise RaygeomError(f"--save-every must be 0 (no checkpoints) or positive, got {save_every}")
        if run_dir is not None and (len(grid) > 1 or not save_every):
            raise RaygeomError("--run-dir needs --save-every and a single run (one --lam, one seed)")
        from raygeom.analyses.train import CheckpointPlan, checkpoint_steps

        def plan_of(settings):
            if not save_every:
                return None
            directory = run_dir or out / "checkpoints" / f"lam{settings.lam:g}-seed{settings.seed}"
            return CheckpointPlan(str(directory.expanduser().resolve()), checkpoint_steps(settings.steps, save_every, log_until))

        plan_of(grid[0])  # a bad schedule fails before Ray starts
        _check_report(report)
        store = Store(out)
        check_writable(store.root)
        _start(address, num_cpus)
        from raygeom.analyses import train as train_module
        from raygeom.jobs import train as train_job

        rows = []
        for settings in grid:
            with console.status(f"training lambda={settings.lam} seed={settings.seed} ({settings.steps} steps)"):
                row = train_job.run_training(store, settings, plan_of(settings))
            rows.append(row)
            if row.get("run_dir"):
                console.print(f"checkpoints: {row['n_checkpoints']} in {row['run_dir']}", highlight=False)
            console.print(f"lambda={row['lam']:<6g} seed={row['seed']}  held-out perplexity {row['heldout_perplexity']:.3f}  "
                          f"held-out dispersion {row['heldout_dispersion']:.4f}  ({row['wall_s']:.0f}s{', cached' if row.get('cached') else ''})")
        summary = train_module.summarise(rows)
        shown = [{**s, "lam": f"{s['lam']:g}", "held-out perplexity by seed": s["heldout_perplexities"],
                  "mean ± std": f"{s['heldout_perplexity_mean']:.2f}" + (f" ± {s['heldout_perplexity_std']:.2f}"
                                                                        if math.isfinite(s["heldout_perplexity_std"]) else ""),
                  "paired delta vs lambda=0 [95% CI]": "—" if s["lam"] == 0.0 or not math.isfinite(s["paired_delta_mean"]) else
                  f"{s['paired_delta_mean']:+.2f} ± {s['paired_delta_std']:.2f} "
                  f"[{s['paired_delta_lo']:+.2f}, {s['paired_delta_hi']:+.2f}]",
                  "t": "" if not math.isfinite(s["paired_t"]) else f"{s['paired_t']:+.2f}",
                  "p": "" if not math.isfinite(s["paired_p"]) else f"{s['paired_p']:.3g}",
                  "seeds lower/higher": "" if s["lam"] == 0.0 else f"{s['n_lower']}/{s['n_higher']}"} for s in summary]
        console.print(_table(shown, ["lam", "n_seeds", "held-out perplexity by seed", "mean ± std",
                                     "paired delta vs lambda=0 [95% CI]", "t", "p", "seeds lower/higher",
                                     "heldout_dispersion_mean"], "push-away vs plain (held-out; paired t-test over seeds)"))
        paths = train_module.write_report(store, rows, summary, plots)
        console.print(f"tables: {paths['runs']}, {paths['table']}\nplots:  {paths['plot']}")
        if report is not None:
            columns = list(train_module.RUN_COLUMNS) + [c for c in train_module.PROVENANCE + ("revision", "settings", "unit_key")
                                                        if any(c in r for r in rows)]
            _write_report({"train_runs": [{c: r.get(c) for c in columns} for r in rows], "train_summary": summary},
                          [paths["plot"]], report)
            console.print(f"report: {report}")
        announce_report(store.root, console)
    except RaygeomError as error:
        _fail(str(error))


def register(app: typer.Typer) -> None:
    """Add this module's commands to the raygeom app."""
    app.command("dispersion")(dispersion)
    app.command("select")(select)
    app.command("knn")(knn)
    app.command("train")(train)
