import math

import numpy as np
import pytest

from raygeom.errors import InputError
from raygeom.numerics.probe import linear_probe_accuracy


def gaussian_classes(seed, n_per_class, n_classes, d, separation):
    rng = np.random.default_rng(seed)
    centres = separation * rng.standard_normal((n_classes, d)) / np.sqrt(d)
    labels = np.repeat(np.arange(n_classes), n_per_class)
    return centres[labels] + rng.standard_normal((len(labels), d)), labels


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n_classes, d", [(2, 10), (4, 20), (6, 50)])
def test_separated_gaussian_classes_are_probed_almost_perfectly(seed, n_classes, d):
    # Centres ~8 apart against unit noise: Bayes error is far below 1%.
    h, labels = gaussian_classes(seed, 100, n_classes, d, separation=8.0)
    result = linear_probe_accuracy(h, labels, seed=seed)
    assert result["accuracy"] > 0.95
    n = 100 * n_classes
    assert result["n_test"] == math.ceil(0.25 * n)
    assert result["n_train"] + result["n_test"] == n
    assert result["n_classes"] == n_classes
    # Balanced classes split with stratification: every class keeps the same share of the test set.
    assert result["chance"] == pytest.approx(1 / n_classes)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n_classes", [2, 4])
def test_random_labels_give_chance_accuracy(seed, n_classes):
    rng = np.random.default_rng(100 + seed)
    n = 400 * n_classes
    h = rng.standard_normal((n, 20))
    labels = rng.permutation(np.repeat(np.arange(n_classes), 400))
    result = linear_probe_accuracy(h, labels, seed=seed)
    chance = result["chance"]
    binomial_sd = np.sqrt(chance * (1 - chance) / result["n_test"])
    assert abs(result["accuracy"] - chance) < 4 * binomial_sd


def test_string_labels_and_repeatable_split():
    h, labels = gaussian_classes(7, 30, 3, 8, separation=3.0)
    # Sorted like 0 < 1 < 2: the stratified split depends on the classes' sort order, not their names.
    names = np.array(["business", "sports", "world"])[labels]
    first = linear_probe_accuracy(h, names, test_fraction=0.3, seed=4)
    assert first == linear_probe_accuracy(h, names, test_fraction=0.3, seed=4)
    assert first == linear_probe_accuracy(h, labels, test_fraction=0.3, seed=4)
    assert first["converged"]


def test_non_converged_fit_is_reported():
    h, labels = gaussian_classes(0, 50, 3, 30, separation=1.0)
    assert not linear_probe_accuracy(h, labels, max_iter=1)["converged"]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: linear_probe_accuracy(np.ones((10, 3)), [0] * 9 + [1]), r"too few: \[1\]"),
        (lambda: linear_probe_accuracy(np.ones((10, 3)), [0] * 10), "at least 2 classes"),
        (lambda: linear_probe_accuracy(np.ones((10, 3)), [0] * 5 + [1] * 4), "one label per row"),
        (lambda: linear_probe_accuracy(np.ones((12, 3)), np.arange(12) % 6, test_fraction=0.2), "at least one per class"),
        (lambda: linear_probe_accuracy(np.ones((10, 3)), [0, 1] * 5, test_fraction=1.0), r"\(0, 1\)"),
        (lambda: linear_probe_accuracy(np.full((10, 3), np.nan), [0, 1] * 5), "NaN"),
    ],
)
def test_bad_input_raises_input_error(make, message):
    with pytest.raises(InputError, match=message):
        make()
