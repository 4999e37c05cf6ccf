import numpy as np
import pytest
from scipy.stats import ortho_group

from raygeom.errors import InputError
from raygeom.numerics import convergence_grid
from raygeom.numerics.convergence import convergence
from raygeom.numerics.convergence_grid import null_grids, observed_grid, prepare_layer, summarize_grid


def layers_of(seed, n, d, count):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n, d)) @ rng.standard_normal((d, d))
    return [base + s * rng.standard_normal((n, d)) for s in np.linspace(0.2, 3.0, count)]


def basis(seed, d, k):
    return np.linalg.qr(np.random.default_rng(seed).standard_normal((d, k)))[0]


@pytest.mark.parametrize("r", [0, 1, 3])
def test_every_grid_cell_equals_the_pairwise_convergence(r):
    raw_a, raw_b = layers_of(0, 40, 20, 3), layers_of(1, 40, 28, 2)
    basis_a, basis_b = basis(2, 20, 5), basis(3, 28, 5)
    layers_a = [prepare_layer(h, r) for h in raw_a]
    layers_b = [prepare_layer(h, r) for h in raw_b]
    observed = observed_grid(layers_a, layers_b, basis_a, basis_b, 5)
    nulls = null_grids(layers_a, layers_b, 5, seed=7, indices=range(6))
    grid = summarize_grid(observed["rho_full"], observed["rho_readout"], nulls)
    assert nulls.shape == (6, 3, 2)
    for i, h_a in enumerate(raw_a):
        for j, h_b in enumerate(raw_b):
            expected = convergence(h_a, h_b, basis_a, basis_b, 5, r=r, n_null=6, seed=7)
            for name in ("rho_full", "rho_readout", "null_mean", "null_std", "z"):
                assert grid[name][i, j] == pytest.approx(expected[name], rel=1e-9, abs=1e-12), name


def test_null_draws_do_not_depend_on_how_they_are_split():
    layers_a = [prepare_layer(h) for h in layers_of(4, 30, 16, 2)]
    layers_b = [prepare_layer(h) for h in layers_of(5, 30, 12, 3)]
    whole = null_grids(layers_a, layers_b, 4, seed=1, indices=range(9))
    parts = np.concatenate([null_grids(layers_a, layers_b, 4, seed=1, indices=c) for c in ([0, 1], [2], [3, 4, 5, 6, 7, 8])])
    np.testing.assert_array_equal(whole, parts)


def test_rotated_model_converges_perfectly_in_full_space_at_every_matching_layer():
    raw = layers_of(6, 50, 18, 3)
    rotation = ortho_group.rvs(18, random_state=0)
    layers_a = [prepare_layer(h) for h in raw]
    layers_b = [prepare_layer(h @ rotation) for h in raw]
    b = basis(7, 18, 4)
    observed = observed_grid(layers_a, layers_b, b, rotation.T @ b, 4)
    np.testing.assert_allclose(np.diag(observed["rho_full"]), 1.0, atol=1e-6)
    np.testing.assert_allclose(np.diag(observed["rho_readout"]), 1.0, atol=1e-6)
    off_diagonal = observed["rho_full"][~np.eye(3, dtype=bool)]
    assert (off_diagonal < 0.999).all()


def test_mismatched_inputs_are_rejected():
    a = [prepare_layer(h) for h in layers_of(0, 30, 10, 1)]
    b = [prepare_layer(h) for h in layers_of(0, 20, 10, 1)]
    with pytest.raises(InputError, match="same N"):
        observed_grid(a, b, basis(0, 10, 3), basis(0, 10, 3), 3)
    with pytest.raises(InputError, match="k"):
        null_grids(a, a, 10, 0, [0])
    with pytest.raises(InputError, match="at least 2 null"):
        summarize_grid(np.zeros((1, 1)), np.zeros((1, 1)), np.zeros((1, 1, 1)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grid_uncertainty_gives_each_cell_its_p_values_and_a_monte_carlo_interval(seed):
    rng = np.random.default_rng(seed)
    n = 400
    nulls = rng.normal(0.2, 0.02, size=(n, 2, 3))
    observed = np.array([[0.2, 0.25, 0.1], [0.21, 0.3, 0.19]])
    out = convergence_grid.grid_uncertainty(observed, nulls, seed)
    for i in range(2):
        for j in range(3):
            cell = nulls[:, i, j]
            # The empirical p-values by their definition, (1 + #{null >= rho}) / (1 + n) and its lower twin.
            assert out["p_upper"][i, j] == pytest.approx((1 + np.sum(cell >= observed[i, j])) / (1 + n))
            assert out["p_lower"][i, j] == pytest.approx((1 + np.sum(cell <= observed[i, j])) / (1 + n))
            z = (observed[i, j] - cell.mean()) / cell.std(ddof=1)
            assert out["z_lo"][i, j] < z < out["z_hi"][i, j]
            # Gaussian nulls: the standard error of z is sqrt((1 + z^2 / 2) / n) (delta method).
            assert out["z_se"][i, j] == pytest.approx(np.sqrt((1 + z**2 / 2) / n), rel=0.25)
            assert out["z_half_width"][i, j] == pytest.approx(1.96 * out["z_se"][i, j], rel=1e-3)


def test_grid_uncertainty_leaves_cells_without_null_spread_undefined():
    nulls = np.zeros((50, 1, 2))
    nulls[:, 0, 1] = np.linspace(0, 1, 50)
    out = convergence_grid.grid_uncertainty(np.array([[0.5, 0.5]]), nulls)
    assert np.isnan(out["z_se"][0, 0]) and np.isfinite(out["z_se"][0, 1])


@pytest.mark.parametrize("seed", [0, 3])
def test_grid_text_spread_is_the_half_sample_jackknife_of_the_scipy_reference(seed):
    from raygeom.numerics.uncertainty import text_subsamples
    from tests.reference import convergence

    raw_a, raw_b = layers_of(seed, 40, 12, 2), layers_of(seed + 1, 40, 16, 2)
    basis_a, basis_b = basis(2, 12, 4), basis(3, 16, 4)
    out = convergence_grid.grid_text_spread(raw_a, raw_b, basis_a, basis_b, k=4, r=1, seed=seed, n_half=4, n_null=3)
    halves = text_subsamples(40, 20, seed, 4)
    for i, h_a in enumerate(raw_a):
        for j, h_b in enumerate(raw_b):
            per_half = [convergence(h_a[rows], h_b[rows], basis_a, basis_b, 4, r=1, n_null=3, seed=seed) for rows in halves]
            full = np.array([c["rho_full"] for c in per_half])
            readout = np.array([c["rho_readout"] for c in per_half])
            margin = readout - np.array([c["null_mean"] for c in per_half])
            # Half of 40 texts deleted: the delete-d jackknife factor size / (n - size) is 1.
            for name, values in (("rho_full", full), ("rho_readout", readout), ("excess", readout - full), ("margin", margin)):
                # The nulls rank float32 projections, where two of 190 distances may swap places against float64.
                tolerance = 1e-3 if name == "margin" else 1e-6
                assert out[f"{name}_texts_se"][i, j] == pytest.approx(np.std(values, ddof=1), rel=tolerance, abs=1e-9), name
