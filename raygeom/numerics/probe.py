"""Linear probe of one layer: multinomial logistic regression on ``H`` with labels."""

from __future__ import annotations

import math
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from raygeom.errors import InputError
from raygeom.numerics.pga import _check_matrix


def _check_labels(labels, n: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.shape[0] != n:
        raise InputError(f"labels must be a 1-D array with one label per row of H (N={n}); got shape {labels.shape}")
    classes, counts = np.unique(labels, return_counts=True)
    if classes.size < 2:
        raise InputError(f"a probe needs at least 2 classes; got {classes.size}")
    # A stratified split puts at least one member of every class on each side.
    rare = classes[counts < 2]
    if rare.size:
        raise InputError(f"every class needs at least 2 samples for a stratified split; too few: {rare.tolist()}")
    return labels


def linear_probe_accuracy(
    h: np.ndarray,
    labels,
    test_fraction: float = 0.25,
    seed: int = 0,
    max_iter: int = 1000,
    c: float = 1.0,
) -> dict:
    """Test accuracy of a multinomial logistic regression (L2, inverse strength ``c``, lbfgs)
    on standardised features, with a stratified train/test split fixed by ``seed``.

    ``chance`` is the test accuracy of always predicting the most frequent
    training class. ``converged`` is False when lbfgs stopped at ``max_iter``.
    """
    h = _check_matrix("H", h)
    labels = _check_labels(labels, h.shape[0])
    if not 0.0 < test_fraction < 1.0:
        raise InputError(f"test_fraction must lie in (0, 1); got {test_fraction}")
    n = h.shape[0]
    n_classes = np.unique(labels).size
    # train_test_split's own sizes: ceil for the test side, the rest for training.
    n_test = math.ceil(test_fraction * n)
    n_train = n - n_test
    if min(n_test, n_train) < n_classes:
        raise InputError(
            f"with N={n} and test_fraction={test_fraction} the split has {n_train} train and {n_test} test "
            f"samples, but both sides need at least one per class ({n_classes} classes)"
        )
    h_train, h_test, y_train, y_test = train_test_split(
        h.astype(np.float64), labels, test_size=n_test, random_state=seed, stratify=labels
    )
    model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=max_iter))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model.fit(h_train, y_train)
    converged = True
    for warning in caught:
        if issubclass(warning.category, ConvergenceWarning):
            converged = False
        else:
            warnings.warn(warning.message, warning.category, stacklevel=2)
    train_classes, train_counts = np.unique(y_train, return_counts=True)
    majority = train_classes[train_counts.argmax()]
    return {
        "accuracy": float(np.mean(model.predict(h_test) == y_test)),
        "chance": float(np.mean(y_test == majority)),
        "n_train": int(len(y_train)),
        "n_test": int(len(y_test)),
        "n_classes": int(n_classes),
        "converged": bool(converged),
    }
