"""docs/results/ pages that carry their data (issue 40): each generated page is rebuilt from the tidy rows shipped
beside it and must equal the committed page; every interval in every shipped table lies inside its quantity's bounds
and has width; and the width page's verdicts, built from planted rows, say what the rows show (step 0 named as the
initialisation, a sign opposite to the paper's said in words, restoration outside d >= 768)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raygeom.numerics.uncertainty import bounds_of
from tools import results_pages

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def _copy_page(page: Path, to: Path) -> Path:
    """The page and what it is made from (its rows and template, no figures) into ``to``."""
    shutil.copy(page, to / page.name)
    shutil.copytree(page.parent / page.stem, to / page.stem, ignore=shutil.ignore_patterns("*.png", "*.md", "*.py"))
    return to / page.name


@pytest.mark.parametrize("name", sorted(results_pages.GENERATED))
def test_each_generated_page_is_what_its_shipped_rows_give(name, tmp_path):
    page = RESULTS / name
    copy = _copy_page(page, tmp_path)
    assert results_pages.render(copy) == page.read_text(), f"{name} drifted from its rows: run the command at its top"


def shipped_tables():
    return sorted(p for p in RESULTS.rglob("*") if p.suffix in (".parquet", ".csv"))


def test_no_shipped_interval_leaves_its_bounds_or_has_zero_width():
    problems = []
    for path in shipped_tables():
        df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        for column in df.columns:
            if not column.endswith("_lo") or column[:-3] + "_hi" not in df.columns:
                continue
            name = column[:-3]
            lo, hi = df[column].astype(float).to_numpy(), df[name + "_hi"].astype(float).to_numpy()
            both = np.isfinite(lo) & np.isfinite(hi)
            if (np.isfinite(lo) != np.isfinite(hi)).any():
                problems.append(f"{path.name}:{name}: half an interval")
            if (lo[both] >= hi[both]).any():
                problems.append(f"{path.name}:{name}: {int((lo[both] >= hi[both]).sum())} zero-width or reversed")
            bounds = bounds_of(name)
            if bounds and ((lo[both] < bounds[0] - 1e-12).any() or (hi[both] > bounds[1] + 1e-12).any()):
                problems.append(f"{path.name}:{name}: outside {bounds} ({lo[both].min():.3f} .. {hi[both].max():.3f})")
    assert problems == []
    assert any(p.name == "converge.parquet" for p in shipped_tables())  # the walk found the tables


def _planted_width_rows(tmp_path: Path) -> Path:
    """A ladder of 2 (width, depth) points x 2 seeds x checkpoints 0, 2, 4, 6, 8 (step 0: the initialisation): z high
    and positive after step 0, G largest at step 0 where perplexity is worst (the sign opposite to the paper's)."""
    rng = np.random.default_rng(0)
    data = tmp_path / "width"
    data.mkdir()
    layers = ["embed", "block_00", "block_01", "block_02", "block_03", "final_norm"]
    tables = {n: [] for n in ("pga", "spectral", "pc1", "probe", "sample_dispersion", "evaluations", "gap")}
    runs = []
    for width, depth in ((32, 4), (64, 4)):
        for seed in (0, 1):
            run = f"d{width}-l{depth}-seed{seed}"
            runs.append({"run": run, "width": width, "depth": depth, "seed": seed})
            for step in (0, 2, 4, 6, 8):
                ppl = 2000.0 / (1 + step) + seed
                tables["evaluations"].append(
                    {"run": run, "width": width, "depth": depth, "run_seed": seed, "step": step, "heldout_perplexity": ppl}
                )
                tables["gap"].append(
                    {
                        "run": run,
                        "width": width,
                        "depth": depth,
                        "run_seed": seed,
                        "revision": f"step{step}",
                        "step": step,
                        "gap": 0.1 - 0.01 * step,
                        "heldout_perplexity": ppl,
                    }
                )
                for index, layer in enumerate(layers):
                    point = {
                        "model": run,
                        "run": run,
                        "width": width,
                        "depth": depth,
                        "run_seed": seed,
                        "step": step,
                        "revision": f"step{step}",
                        "layer": layer,
                        "layer_index": index,
                        "relative_depth": index / 5,
                    }
                    for r in (0, 1, 5, 10):
                        z = (0.1 if step == 0 else 5.0 + index) + rng.normal() * 0.1
                        tables["pga"].append(
                            {
                                **point,
                                "k": width // 4,
                                "k_per_d": 0.25,
                                "r": r,
                                "n_null": 50,
                                "z": z,
                                "z_lo": z - 0.5,
                                "z_hi": z + 0.5,
                            }
                        )
                    tables["spectral"].append(
                        {
                            **point,
                            "k": width // 4,
                            "k_per_d": 0.25,
                            "rankme": 10 + rng.normal(),
                            "alpha_req": 1 + rng.normal() * 0.1,
                            "isotropy": 0.5,
                            "condition_number": 10.0,
                        }
                    )
                    share = 0.25 if step == 0 else 0.9
                    tables["pc1"].append(
                        {
                            **point,
                            "k": width // 4,
                            "k_per_d": 0.25,
                            "pc1_readout_share": share,
                            "pc1_readout_share_lo": share - 0.05,
                            "pc1_readout_share_hi": share + 0.05,
                            "pc1_readout_chance": 0.25,
                        }
                    )
                    tables["probe"].append(
                        {**point, "accuracy": 0.26, "accuracy_lo": 0.159, "accuracy_hi": 0.396, "chance": 0.22, "n_test": 50}
                    )
                    tables["sample_dispersion"].append({**point, "dispersion": 0.9, "dispersion_lo": 0.88, "dispersion_hi": 0.92})
    for name, rows in tables.items():
        pd.DataFrame(rows).to_parquet(data / f"{name}.parquet")
    meta = {
        "job": "width",
        "store": "runs/width",
        "head_dim": 16,
        "checkpoint_steps": [0, 2, 4, 6, 8],
        "runs": runs,
        "n_samples": 40,
        "n_train_sequences": 100,
        "pool": "last",
        "width": {"collapse_z": 0.0, "positive_z": 2.0, "seed": 0},
        "train": {
            "steps": 8,
            "batch_size": 4,
            "seq_len": 32,
            "lr": 0.003,
            "warmup": 1,
            "vocab_size": 300,
            "corpus": "bbc",
            "max_texts": 60,
            "heldout_fraction": 0.2,
        },
        "trajectory": {
            "gap_layer": "final_norm",
            "domain_tokens": "digits",
            "chunks_per_domain": 3,
            "chunk_len": 16,
            "late_from": 4,
            "bootstrap": 200,
            "seed": 0,
        },
        "wall": {
            "wall_s": 600.0,
            "train_wall_s": 300.0,
            "finished": "2026-12-05T00:00:00+00:00",
            "cpus": 2,
            "load_1min_at_end": 3.0,
        },
    }
    (data / "meta.json").write_text(json.dumps(meta))
    page = tmp_path / "width.md"
    page.write_text("")
    return page


def test_the_width_page_says_what_its_planted_rows_show(tmp_path):
    from tools.width_page import render_page

    text = render_page(_planted_width_rows(tmp_path))
    assert "python -m tools.results_pages docs/results/width.md" in text.splitlines()[2]
    assert "outside the paper's stated range** (the paper claims restoration for d >= 768" in text
    assert "step 0 (the initialisation)" in text
    # G is largest at step 0, the worst perplexity: over 5 checkpoints, an exact permutation p and no interval
    assert "contradicted: the sign is the opposite of the paper's (exact permutation p = 0.0167)" in text
    assert "G picks step 0 (the initialisation), perplexity rank 5 of 5 (the worst)" in text
    assert "too few points for an interval" in text
    # across the 4 runs none has the paper's sign: one-sided binomial P(X <= 0 | n = 4, 1/2) = 1/16, not below 0.05
    assert "is positive, the paper's sign, in 0 of 4 runs" in text and "binomial p = 0.062: **undecided**" in text
    # two seeds that agree exactly (probe 0.26 and 0.26) keep their own Wilson interval: no zero-width interval
    assert "+0.260 [+0.159, +0.396]" in text and "[+0.260, +0.260]" not in text
    for line in text.splitlines():  # no printed interval of a share leaves [0, 1]
        if "| 0.250 |" in line and "[" in line:
            assert "-0." not in line and "+1.0" not in line.replace("+1.000", ""), line
    # 8 steps x 4 x 32 = 1,024 tokens over 100 sequences of 32 (3,200 tokens): each seen 0.32 times
    assert "bbc, 60 of its articles, 80% of them for training (100 sequences, 3k tokens, each seen about 0.3 times)" in text


def _planted_trajectory_rows(tmp_path: Path) -> Path:
    """One run, checkpoints 0, 1, 2, 4, ..., 64, 100, 150, ..., 400: the middle block reaches half its peak at step 150,
    the checkpoint before is 100 (25%): still below half at the quarter, so 'set early' is decided (contradicted)."""
    data = tmp_path / "trajectory"
    data.mkdir()
    steps = [0, 1, 2, 4, 8, 16, 32, 64, 100, 150, 200, 250, 300, 350, 400]
    layers = ["embed", "block_00", "block_01", "block_02", "block_03", "final_norm"]
    z, pga, checkpoints, dispersion = [], [], [], []
    for step in steps:
        for index, layer in enumerate(layers):
            value = 10.0 * min(1.0, (step - 50) / 150) if step >= 100 else 0.5
            row = {
                "model": "m",
                "revision": f"step{step}",
                "step": step,
                "layer": layer,
                "layer_index": index,
                "relative_depth": index / 5,
                "k": 8,
                "r": 1,
                "n_null": 50,
                "z": value,
                "z_lo": value - 0.3,
                "z_hi": value + 0.3,
                "weights_flag": None,
            }
            z.append(row)
            pga += [{**row, "run": "run", "width": 32, "depth": 4, "run_seed": 0, "k_per_d": 0.0, "r": r} for r in (0, 1)]
            dispersion.append(
                {
                    "revision": f"step{step}",
                    "step": step,
                    "layer": layer,
                    "layer_index": index,
                    "relative_depth": index / 5,
                    "token_dispersion": 0.8,
                    "sample_dispersion": 0.4,
                    "perplexity": 100.0,
                    "n_chunks": 5,
                    "gap": 0.0,
                }
            )
        checkpoints.append(
            {
                "model": "m",
                "revision": f"step{step}",
                "step": step,
                "gap": -0.001 * step,
                "select_rank": 1,
                "heldout_perplexity": 4000.0 / (1 + step),
                "perplexity_source": "trainer",
                "perplexity_rank": len(steps) - steps.index(step),
                "weights_flag": None,
            }
        )
    for name, rows in (("z", z), ("pga", pga), ("checkpoints", checkpoints), ("dispersion", dispersion)):
        pd.DataFrame(rows).to_parquet(data / f"{name}.parquet")
    meta = {
        "job": "trajectory",
        "store": "runs/trajectory",
        "log_until": 64,
        "save_every": 50,
        "n_samples": 40,
        "train": {
            "hidden_size": 32,
            "n_layers": 4,
            "n_heads": 2,
            "vocab_size": 300,
            "seq_len": 32,
            "heldout_fraction": 0.2,
            "steps": 400,
            "batch_size": 4,
            "lr": 0.002,
            "seed": 0,
            "workers": 1,
        },
        "pga": {"k": 8, "r": 1, "n_null": 50, "seed": 0},
        "sweep": {"collapse_threshold": 0.0, "positive_z": 2.0},
        "trajectory": {
            "gap_layer": "final_norm",
            "domain_tokens": "digits",
            "chunks_per_domain": 3,
            "chunk_len": 16,
            "late_from": 250,
            "bootstrap": 200,
            "seed": 0,
        },
        "wall": None,
        "rerun_note": "planted.",
    }
    (data / "meta.json").write_text(json.dumps(meta))
    page = tmp_path / "trajectory.md"
    page.write_text("")
    return page


def test_the_trajectory_page_decides_set_early_only_where_the_checkpoints_bracket_the_quarter(tmp_path):
    from tools.trajectory_page import render_page

    text = render_page(_planted_trajectory_rows(tmp_path))
    assert "python -m tools.results_pages docs/results/trajectory.md" in text.splitlines()[2]
    assert "**Organisation is set early** (PGA paper): **contradicted**" in text
    assert "the checkpoint before is step 100" in text
    # G falls while perplexity falls: over all 15 checkpoints Spearman(G, -perplexity) = -1, at the bound: no interval
    assert "contradicted: the sign is the opposite of the paper's" in text and "|rho| = 1: no interval" in text
    assert "over the late ones (steps >= 250): **contradicted" in text.lower() or "too few points for an interval" in text
    assert "outside the paper's stated range** (it claims restoration for d >= 768; this run has d = 32)" in text
    assert "z at step 0 (initialisation)" in text


def test_a_cited_number_follows_its_row_and_a_bad_query_names_its_line(tmp_path):
    from raygeom.errors import RaygeomError
    from tools import cited_pages

    assert cited_pages.fill("z {{ a | +.1f }}, {{ b | .2f }} and {{ b | –.2f }}", {"a": -29.54, "b": (0.721, 0.8649)}) == (
        "z \u221229.5, 0.72 … 0.86 and 0.72–0.86"
    )
    with pytest.raises(RaygeomError, match=r"t\.md\.in:2: \{\{nope\(\)\}\}"):
        cited_pages.fill("a\n{{nope()}}", {}, "t.md.in")
    copy = _copy_page(RESULTS / "pga.md", tmp_path)
    rows = pd.read_parquet(tmp_path / "pga" / "diagnostics_pga.parquet")
    deepest = (rows["model"] == "gemma3-270m") & (rows["layer"] == "block_12")
    assert "z is \u22127.8, \u221229.5, \u221217.1" in results_pages.render(copy)
    rows.loc[deepest, "z"] = -31.04
    rows.to_parquet(tmp_path / "pga" / "diagnostics_pga.parquet")
    assert "z is \u22127.8, \u221231.0, \u221217.1" in results_pages.render(copy)


def test_an_undecided_correlation_of_the_opposite_sign_says_so_in_words():
    from raygeom.jobs.gap_ranking import claim_verdict

    few = {"note": "too few points for an interval", "p_perm": 0.0833, "p_method": "exact"}
    assert claim_verdict({**few, "spearman": -1.0}) == (
        "undecided (exact permutation p = 0.0833); its sign is the opposite of the paper's"
    )
    assert claim_verdict({**few, "spearman": 0.8}) == "undecided (exact permutation p = 0.0833)"
    wide = {"spearman": -0.2, "fisher_lo": -0.6, "fisher_hi": 0.3}
    assert claim_verdict(wide) == "undecided (the 95% interval holds 0); its sign is the opposite of the paper's"
