"""kNN-LM layer selection (Representation dispersion; raygeom.analyses.knn does the work): per layer, a datastore of
that layer's representations of the training text, the held-out perplexity of the kNN-LM interpolated with the
base LM (temperature and weight chosen on a tuning half of the held-out chunks), and its difference from the base
LM with a paired block-bootstrap interval; beside it the dispersion of the layer's keys. Its extraction is its own
("knn": datastore features per layer), one per (model, revision)."""

from __future__ import annotations

from dataclasses import dataclass

from raygeom.analyses.registry import Analysis, Reads, param, register
from raygeom.params import (
    KNN_LAMS,
    KNN_SCALES,
    MAX_BOOT,
    MAX_COUNT,
    MAX_NEIGHBOURS,
    MAX_SEED,
    MAX_TOKENS,
    ChunkShape,
    number_list,
)


@dataclass(frozen=True)
class KnnParams(ChunkShape):
    train_chunks: int = param(40, "Chunks of datastore text.", low=1, high=MAX_COUNT)
    test_chunks: int = param(
        8, "Chunks of held-out text (other articles): a tuning half and an evaluation half.", low=2, high=MAX_COUNT
    )
    k: int = param(64, "Neighbours.", low=1, high=MAX_NEIGHBOURS)
    temperature: str = param(
        "auto",
        "A number, or auto: per layer, the median nearest squared distance.",
        nonempty=True,
        rule=number_list(positive=True, high=1e12, words=("auto",), one=True),
    )
    temperature_scales: str = param(
        KNN_SCALES, "Multipliers of the temperature tried.", nonempty=True, rule=number_list(positive=True, high=1e6)
    )
    lams: str = param(
        KNN_LAMS,
        "Interpolation weights tried; (T, lam) chosen on a tuning half, against lam 0 (the base LM).",
        nonempty=True,
        flag="--lam",
        rule=number_list(low=0.0, high=1.0),
    )
    heldout_fraction: float = param(
        0.2, "Share of the articles held out for tuning and evaluation.", low=0.0, high=1.0, low_open=True, high_open=True
    )
    bootstrap_block: int = param(
        64,
        "Held-out tokens per resampled block of the bootstrap interval (consecutive, "
        "within a chunk); 1 = single tokens, >= chunk-len = whole chunks.",
        low=1,
        high=MAX_TOKENS,
    )
    n_boot: int = param(2000, "Bootstrap resamples.", low=100, high=MAX_BOOT)
    seed: int = param(0, "Seed of the split, the chunks and the bootstrap.", low=0, high=MAX_SEED)
    gpus_per_task: float = param(0.0, "GPUs each kNN-LM task asks Ray for (0: CPU).", low=0.0, high=64.0)


def settings_of(params: KnnParams, layers: str):
    from raygeom.analyses.knn import KnnSettings

    return KnnSettings(
        chunk_len=params.chunk_len,
        train_chunks=params.train_chunks,
        test_chunks=params.test_chunks,
        layers=layers,
        k=params.k,
        temperature=params.temperature,
        temperature_scales=params.temperature_scales,
        lams=params.lams,
        batch_size=params.batch_size,
        seed=params.seed,
        heldout_fraction=params.heldout_fraction,
        gpus_per_task=params.gpus_per_task,
        bootstrap_block=params.bootstrap_block,
        n_boot=params.n_boot,
    )


@register
class KnnLM(Analysis):
    """kNN-LM layer selection: per layer a datastore, interpolated held-out perplexity; is the max-dispersion layer best?"""

    name = "knn_lm"
    # 3: a note column (no interval below 10 blocks), lam_edge/scale_edge declared, k never clamped; 4: lam = 0 (the
    # base LM) always compared, ties within TUNE_RTOL go to an interior point, an edge flagged only when the optimum
    # lies beyond the grid, a selection column saying what was chosen and why; the scale grid 1e-4-100
    version = 4
    Params = KnnParams
    title = "kNN-LM layer selection"
    command = "knn"
    extraction = "knn"
    results = "knn"
    columns = (
        "layer",
        "dispersion",
        "knn_perplexity",
        "base_perplexity",
        "delta",
        "delta_se",
        "delta_lo",
        "delta_hi",
        "bootstrap_units",
        "note",
        "temperature",
        "temperature_scale",
        "scale_edge",
        "lam",
        "lam_edge",
        "selection",
        "target_in_neighbours",
        "nearest_is_target",
        "n_keys",
        "n_test",
        "chunk_len",
        "train_chunks",
        "test_chunks",
        "k",
    )
    series = ("chunk_len", "train_chunks", "test_chunks", "k")
    measured = ("temperature",)  # the temperature chosen per layer (a result), not the `temperature` setting

    def check_job(self, params: KnnParams, job) -> None:
        """Refuse, before Ray starts, settings that can only give a k larger than the datastore or an evaluation half
        of fewer than BLOCK_MIN bootstrap blocks (no interval), both known from the settings alone."""
        from raygeom.errors import RaygeomError

        try:
            settings_of(params, job.layers).check_blocks()
        except RaygeomError as error:
            raise RaygeomError(f"[analyses.{self.name}] {error}") from None

    def chunk_counts(self, params: KnnParams, corpus):
        from raygeom.analyses.knn import split_corpus

        train, test = split_corpus(corpus, params.heldout_fraction, params.seed)
        return [
            ("train_chunks", params.train_chunks, params.chunk_len, params.seed, train.texts, None, "the datastore half of "),
            ("test_chunks", params.test_chunks, params.chunk_len, params.seed, test.texts, None, "the held-out half of "),
        ]

    def console(self, rows, store=None):
        from raygeom.analyses.knn import summary_lines

        return summary_lines(store, rows) if rows else []

    def reads(self, params: KnnParams, job) -> Reads:
        return Reads(
            "knn",
            settings=tuple(sorted(settings_of(params, job.layers).extraction().items())),
            why=f"token states with next-token targets of {params.train_chunks} datastore and {params.test_chunks} "
            "held-out chunks, the articles split apart",
        )

    def extracted(self, store, job, spec, params: KnnParams) -> bool:
        from raygeom.analyses import knn
        from raygeom.sources.corpus import load_corpus

        return knn.features_stored(store, spec, load_corpus(job.corpus), settings_of(params, job.layers))

    def run(self, store, job, specs, params: KnnParams, progress):
        from raygeom.analyses import knn
        from raygeom.analyses.dispersion import handover
        from raygeom.sources.corpus import load_corpus

        corpus, settings, rows = load_corpus(job.corpus), settings_of(params, job.layers), []
        # Every (model, revision)'s features first, on one replica process handed from each to the next (a new one
        # each imports torch and transformers again, about 7 s of a CPU); it is stopped before the units run.
        with handover() as replicas:
            for spec in specs:
                label = f"{spec.name}@{spec.revision}"
                knn.extract_features(
                    store,
                    spec,
                    corpus,
                    settings,
                    features_progress=lambda total, label=label: progress(f"knn pass, {label}", total),
                    replicas=replicas,
                )
        for spec in specs:
            label = f"{spec.name}@{spec.revision}"
            rows += knn.run_knn(
                store,
                spec,
                corpus,
                settings,
                progress=progress(f"{self.name} units, {label}", None),
                features_progress=lambda total, label=label: progress(f"knn pass, {label}", total),
            )["layers"]
        return rows

    def planned_units(self, store, job, specs, params: KnnParams):
        from raygeom.analyses import knn
        from raygeom.sources.corpus import load_corpus

        corpus, settings = load_corpus(job.corpus), settings_of(params, job.layers)
        counts = [knn.planned_units(store, spec, corpus, settings) for spec in specs]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)
