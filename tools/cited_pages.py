"""Results pages written by hand whose cited numbers come from the rows shipped beside them (issue 40).

The page's text is a template, ``<page stem>/page.md.in``: every number it cites is a placeholder
``{{ query | format }}``, a call of one of the page's queries over its shipped tables (``pga_queries``), written with
a Python format spec (``+.1f``, ``.3f``, ``,``); a pair of numbers (an interval) prints as ``lo … hi``, or ``lo–hi``
under a spec that starts with ``–``. Negative
numbers print with the typographic minus the pages use. ``python -m tools.results_pages docs/results`` fills
the placeholders and writes the page; the regeneration test fails when a page and its rows disagree."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from raygeom.errors import RaygeomError

TEMPLATE = "page.md.in"
PLACEHOLDER = re.compile(r"\{\{(.+?)\}\}", re.DOTALL)
MINUS = "\u2212"
SAFE_BUILTINS = {"min": min, "max": max, "sum": sum, "range": range, "len": len, "abs": abs}


def _format(value, spec: str) -> str:
    if isinstance(value, tuple):  # an interval: "lo … hi", or "lo–hi" under a spec that starts with "–"
        joiner, spec = ("–", spec[1:]) if spec.startswith("–") else (" … ", spec)
        return joiner.join(_format(v, spec) for v in value)
    if isinstance(value, str):
        return value
    if isinstance(value, (int, np.integer)) and not spec.endswith(("f", "e", "g", "%")):
        return format(int(value), spec).replace("-", MINUS)
    return format(float(value), spec).replace("-", MINUS)


def fill(template: str, queries: dict, source: str = TEMPLATE) -> str:
    """``template`` with every ``{{ query | format }}`` replaced by its value; a query that fails names its line."""

    def one(match: re.Match) -> str:
        expression, _, spec = match.group(1).rpartition("|") if "|" in match.group(1) else (match.group(1), "", "")
        try:
            # the repository's own templates; the queries are globals so that a generator expression sees them
            value = eval(expression.strip(), {"__builtins__": {}, **SAFE_BUILTINS, **queries})  # noqa: S307
        except Exception as error:  # any query error is the template's: say where
            line = template.count("\n", 0, match.start()) + 1
            raise RaygeomError(f"{source}:{line}: {{{{{match.group(1).strip()}}}}}: {error}") from None
        return _format(value, spec.strip())

    return PLACEHOLDER.sub(one, template)


def _layer(layer) -> str:
    return f"block_{layer:02d}" if isinstance(layer, (int, np.integer)) else layer


def pga_queries(folder: Path) -> dict:
    """The queries of docs/results/pga.md over pga/ (the `--n-null auto` diagnose run at CCR-1, converge) and
    pga/restoration/ (all four CCR ranks at 100 nulls). Models by their store slug; ``S`` and ``G`` name the two."""
    auto = pd.read_parquet(folder / "diagnostics_pga.parquet")
    fixed = pd.read_parquet(folder / "restoration" / "diagnostics_pga.parquet")
    spectral = pd.read_parquet(folder / "diagnostics_spectral.parquet")
    probe = pd.read_parquet(folder / "diagnostics_probe.parquet")
    geometry = pd.read_parquet(folder / "diagnostics_sample_geometry.parquet")

    def one(table: pd.DataFrame, model: str, layer, r: int | None = None) -> pd.Series:
        rows = table[(table["model"] == model) & (table["layer"] == _layer(layer))]
        if r is not None:
            rows = rows[rows["r"] == r]
        if len(rows) != 1:
            raise RaygeomError(f"{len(rows)} rows for {model} {_layer(layer)}" + (f" CCR-{r}" if r is not None else ""))
        return rows.iloc[0]

    def pga_rows(nulls: str) -> pd.DataFrame:
        return auto if nulls == "auto" else fixed

    def z(model, layer, r=1, nulls="auto"):
        return float(one(pga_rows(nulls), model, layer, r)["z"])

    def hw(model, layer, r=1, nulls="auto"):
        return float(one(pga_rows(nulls), model, layer, r)["z_half_width"])

    def n_null(model, layer, r=1, nulls="auto"):
        return int(one(pga_rows(nulls), model, layer, r)["n_null"])

    def margin(model, layer, r=1, nulls="auto"):
        row = one(pga_rows(nulls), model, layer, r)
        return (float(row["margin_texts_lo"]), float(row["margin_texts_hi"]))

    def total_nulls(model):
        return int(auto[auto["model"] == model]["n_null"].sum())

    def n_layers(model):
        return int((auto["model"] == model).sum())

    def count(model, r, above=None, below=None, whole=False, nulls="restoration"):
        """Layers of ``model`` at CCR-``r`` with z above / below a value (``whole``: the interval entirely)."""
        rows = pga_rows(nulls)
        rows = rows[(rows["model"] == model) & (rows["r"] == r)]
        z_lo, z_hi = rows["z"] - rows["z_half_width"], rows["z"] + rows["z_half_width"]
        if above is not None:
            return int(((z_lo if whole else rows["z"]) > above).sum())
        return int(((z_hi if whole else rows["z"]) < below).sum())

    def margin_count(model, r, sign, nulls="restoration"):
        """Layers whose margin's interval over texts lies wholly above (sign +1) or below (-1) 0."""
        rows = pga_rows(nulls)
        rows = rows[(rows["model"] == model) & (rows["r"] == r)]
        return int((rows["margin_texts_lo"] > 0).sum() if sign > 0 else (rows["margin_texts_hi"] < 0).sum())

    def median_z(model, r, nulls="restoration"):
        rows = pga_rows(nulls)
        return float(rows[(rows["model"] == model) & (rows["r"] == r)]["z"].median())

    def spec(model, layer, column):
        return float(one(spectral, model, layer)[column])

    def accuracy(model, layer):
        return float(one(probe, model, layer)["accuracy"])

    def accuracy_ci(model, layer):
        row = one(probe, model, layer)
        return (float(row["accuracy_lo"]), float(row["accuracy_hi"]))

    def spec_range(model, first: int, last: int, column):
        """(min, max) of a spectral column over blocks ``first``..``last``."""
        rows = spectral[spectral["model"] == model].set_index("layer").loc[[_layer(i) for i in range(first, last + 1)]]
        return (float(rows[column].min()), float(rows[column].max()))

    def rank_corr(model, column, p=False):
        """Spearman of a spectral column with z (CCR-1, `--n-null auto`) over every layer of ``model``; ``p``: its p."""
        rows = auto[auto["model"] == model][["layer", "z"]].merge(spectral[spectral["model"] == model], on="layer")
        result = stats.spearmanr(rows["z"], rows[column])
        return float(result.pvalue if p else result.statistic)

    def loss_share(model, layer):
        return float(one(geometry, model, layer)["loss_share_spearman"])

    layer_order = auto.sort_values("layer_index").groupby("model", sort=False)["layer"]
    return {
        "LAYERS": {model: list(layers) for model, layers in layer_order},
        "S": "smollm2-135m",
        "G": "gemma3-270m",
        "z": z,
        "hw": hw,
        "n_null": n_null,
        "margin": margin,
        "total_nulls": total_nulls,
        "n_layers": n_layers,
        "count": count,
        "margin_count": margin_count,
        "median_z": median_z,
        "spec": spec,
        "accuracy": accuracy,
        "accuracy_ci": accuracy_ci,
        "loss_share": loss_share,
        "spec_range": spec_range,
        "rank_corr": rank_corr,
    }


def _estimate(value: float, low: float, high: float, spec: str) -> str:
    """``value [low, high]`` in one format, with the typographic minus."""
    return f"{_format(value, spec)} [{_format(low, spec)}, {_format(high, spec)}]"


def dispersion_queries(folder: Path) -> dict:
    """The queries of docs/results/dispersion.md over dispersion/layers.csv (one row per model x layer: token and
    sample dispersion, their correlations with perplexity and slice agreements with bootstrap intervals, the gap G)."""
    layers = pd.read_csv(folder / "layers.csv")

    def one(model, layer) -> pd.Series:
        rows = layers[(layers["model"] == model) & (layers["layer"] == _layer(layer))]
        if len(rows) != 1:
            raise RaygeomError(f"{len(rows)} rows for {model} {_layer(layer)} in layers.csv")
        return rows.iloc[0]

    def value(model, layer, column):
        return one(model, layer)[column].item()

    def est(model, layer, name, spec="+.2f"):
        row = one(model, layer)
        return _estimate(float(row[name]), float(row[f"{name}_lo"]), float(row[f"{name}_hi"]), spec)

    def layer_row(model, layer):
        """The cells of section 1's table after the model's: layer, depth, token D, sample D, three correlations."""
        row = one(model, layer)
        depth = "(last block)" if row["layer"] == "attn_last" else f"{row['relative_depth']:.2f}"
        cells = [row["layer"], depth, f"{row['token_dispersion']:.3f}", f"{row['sample_dispersion']:.3f}"]
        cells += [est(model, layer, name) for name in ("group_spearman", "group_pearson", "chunk_spearman")]
        return " | ".join(cells)

    return {
        "S": "smollm2-135m",
        "G": "gemma3-270m",
        "value": value,
        "est": est,
        "layer_row": layer_row,
    }


QUERIES = {"pga.md": pga_queries, "dispersion.md": dispersion_queries}


def render_page(page: Path) -> str:
    folder = page.parent / page.stem
    template = folder / TEMPLATE
    return fill(template.read_text(), QUERIES[page.name](folder), str(template))
