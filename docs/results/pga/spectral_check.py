"""RankMe and alpha-ReQ of the stored layers, recomputed from the authors' own formulas, against raygeom's rows.

    python docs/results/pga/spectral_check.py STORE DIAGNOSTICS_SPECTRAL.parquet [...]

Reads each layer's Parquet with pyarrow alone (no raygeom code) and recomputes:
- RankMe as Garrido et al. (2023) define it and reptrix's ``get_rank`` computes it: the singular values
  ``s`` of the embedding matrix as given (not centred; here the square roots of its Gram matrix's eigenvalues), ``p = s / ||s||_1 + 1e-7``, ``exp(-sum p log p)``;
- alpha-ReQ as reptrix's ``get_alpha`` computes it: the eigenvalues of the centred activations' covariance
  (PCA explained-variance ratios, here from numpy's eigh of the covariance instead of sklearn's SVD), and
  ``np.linalg.solve`` of the 1/rank-weighted normal equations of ``log eig`` on ``-log rank`` over
  0-based indexes 10..99 (ranks 11-100);
and prints the largest relative difference to the ``rankme`` and ``alpha_req`` columns per model.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq


def layer_matrix(path: Path) -> np.ndarray:
    table = pq.read_table(path)
    order = np.argsort(table["sample_id"].to_numpy())
    rows = table["vector"].to_pylist()
    return np.asarray(rows, dtype=np.float64)[order]


def rankme_garrido(h: np.ndarray) -> float:
    # Singular values from the eigenvalues of the smaller Gram matrix, not an SVD: a different numerical road.
    gram = h @ h.T if h.shape[0] <= h.shape[1] else h.T @ h
    s = np.sqrt(np.clip(np.linalg.eigvalsh(gram), 0.0, None))[::-1]
    p = s / np.sum(np.abs(s)) + 1e-7
    return float(np.exp(-np.sum(p * np.log(p))))


def alpha_reptrix(h: np.ndarray) -> float:
    centred = h - h.mean(axis=0)
    eig = np.linalg.eigvalsh(centred.T @ centred / (h.shape[0] - 1))[::-1]
    eig = eig[: min(h.shape)] / eig.sum()
    trange = np.arange(10, 100)
    y = np.log(np.abs(eig))[trange][:, None]
    ranks = trange + 1
    x = np.concatenate((-np.log(ranks)[:, None], np.ones((ranks.size, 1))), axis=1)
    w = 1.0 / ranks.astype(np.float64)[:, None]
    b = np.linalg.solve(x.T @ (x * w), (w * x).T @ y).flatten()
    return float(b[0])


def main() -> None:
    store, tables = Path(sys.argv[1]), sys.argv[2:]
    for table_path in tables:
        rows = pq.read_table(table_path).to_pylist()
        worst = {}
        for row in rows:
            folder = store / "activations" / f"model={row['model']}" / f"revision={row['revision']}" / f"layer={row['layer']}"
            files = sorted(folder.glob("*.parquet"))
            if not files:
                continue
            h = layer_matrix(files[0])
            for name, ours, theirs in (
                ("rankme", row["rankme"], rankme_garrido(h)),
                ("alpha_req", row["alpha_req"], alpha_reptrix(h)),
            ):
                gap = abs(ours - theirs) / abs(theirs)
                key = (row["model"], name)
                if gap >= worst.get(key, (-1.0,))[0]:
                    worst[key] = (gap, row["layer"], ours, theirs)
                worst.setdefault((row["model"], name, "n"), 0)
                worst[(row["model"], name, "n")] += 1
        for key, value in sorted(worst.items(), key=str):
            if len(key) == 2:
                gap, layer, ours, theirs = value
                n = worst[key + ("n",)]
                verdict = "ok" if gap <= 1e-6 else "ABOVE 1e-6"
                print(
                    f"{key[0]:<16}{key[1]:<10} {n:>3} layers  max relative difference {gap:.2e} at {layer} "
                    f"(raygeom {ours:.9g}, authors' formula {theirs:.9g})  {verdict}"
                )


if __name__ == "__main__":
    main()
