"""Samplers of densities on S^2 and of zonal densities on S^{d-1}, and the fine quadrature of a
density on a SphereMesh: moments against exact values, goodness of fit with fixed seeds."""

import numpy as np
import pytest
from scipy import integrate, spatial, special, stats

from wflow import CircleMesh, Density, SphereMesh
from wflow.sphere import (
    density_quadrature,
    gauss_sphere_nodes,
    sample_sphere_density,
    sample_zonal_density,
    uniform,
)


def _close(sample, exact, k=4.0):
    """|sample mean - exact| <= k standard errors, for each column."""
    se = sample.std(axis=0) / np.sqrt(sample.shape[0])
    return np.all(np.abs(sample.mean(axis=0) - exact) <= k * se), sample.mean(axis=0) - exact, se


# ------------------------------------------------------------------------------ callables on S^2
def test_vmf_mean_resultant_length():
    kappa, e = 5.0, np.array([1.0, -2.0, 0.5]) / np.sqrt(5.25)
    x = sample_sphere_density(lambda p: np.exp(kappa * p @ e), 200_000, seed=0)
    assert x.shape == (200_000, 3) and np.allclose(np.linalg.norm(x, axis=1), 1.0)
    ok, err, se = _close(x, (1 / np.tanh(kappa) - 1 / kappa) * e)  # A_3(kappa) e
    assert ok, (err, se)


def test_callable_moments_against_quadrature():
    def f(p):
        return np.exp(2 * p[:, 0] + p[:, 1] * p[:, 2])

    nodes, q = gauss_sphere_nodes(40)
    w = q * f(nodes) / (q @ f(nodes))
    x = sample_sphere_density(f, 200_000, seed=1)
    second = np.einsum("ni,nj->nij", x, x).reshape(-1, 9)
    exact2 = np.einsum("n,ni,nj->ij", w, nodes, nodes).reshape(9)
    for sample, exact in ((x, w @ nodes), (second, exact2)):
        ok, err, se = _close(sample, exact)
        assert ok, (err, se)


# ------------------------------------------------------------------------------ zonal on S^{d-1}
@pytest.mark.parametrize("d", [2, 3, 5, 10])
def test_zonal_vmf_mean_resultant_length(d):
    kappa, rng = 2.0, np.random.default_rng(d)
    e = rng.standard_normal(d)
    e /= np.linalg.norm(e)
    x = sample_zonal_density(lambda t: np.exp(kappa * t), 200_000, axis=e, seed=d)
    assert x.shape == (200_000, d) and np.allclose(np.linalg.norm(x, axis=1), 1.0)
    a_d = special.iv(d / 2, kappa) / special.iv(d / 2 - 1, kappa)
    ok, err, se = _close(x, a_d * e)  # the orthogonal part has mean 0
    assert ok, (d, err, se)


def _law_of_t(f, d):
    """Normalizing constant and CDF of t = <x, e>: density f(t) (1 - t^2)^((d-3)/2)."""

    def g(t):
        return f(t) * (1 - t * t) ** ((d - 3) / 2)

    z = integrate.quad(g, -1, 1)[0]
    return g, z, np.vectorize(lambda s: integrate.quad(g, -1, s)[0] / z)


def test_zonal_moments_and_ks_catch_a_wrong_jacobian():
    d = 4

    def f(t):
        return 2 + np.sin(3 * t)

    g, z, cdf = _law_of_t(f, d)
    e = np.eye(d)[0]
    x = sample_zonal_density(f, 50_000, axis=e, seed=3)
    t = x[:, 0]
    m1 = integrate.quad(lambda s: s * g(s), -1, 1)[0] / z
    m2 = integrate.quad(lambda s: s * s * g(s), -1, 1)[0] / z
    ok, err, se = _close(np.stack([t, t * t, x[:, 1] ** 2], axis=1), [m1, m2, (1 - m2) / (d - 1)])
    assert ok, (err, se)
    grid = np.linspace(-1, 1, 401)
    table = cdf(grid)
    assert stats.kstest(t, lambda s: np.interp(s, grid, table)).pvalue > 0.01
    # the same test rejects the law without the Jacobian (1 - t^2)^((d-3)/2): it has the power
    _, _, wrong = _law_of_t(lambda s: f(s) * (1 - s * s) ** (-(d - 3) / 2), d)
    assert stats.kstest(t, lambda s: np.interp(s, grid, wrong(grid))).pvalue < 1e-6


# ------------------------------------------------------------------------------ Density on a mesh
def test_mesh_density_cells_and_mean():
    mesh = SphereMesh(2)
    rho = Density.from_function(mesh, lambda p: np.exp(3 * p[:, 2] + p[:, 0]))
    x = sample_sphere_density(rho, 100_000, seed=4)
    counts = np.bincount(mesh.locate(x), minlength=mesh.n_cells)
    assert stats.chisquare(counts, 100_000 * rho.masses()).pvalue > 0.01
    xq, wq, cell = mesh.quadrature()  # the mean of the piecewise-constant density
    ok, err, se = _close(x, (rho.values[cell] * wq) @ xq)
    assert ok, (err, se)


def test_uniform_in_a_large_spherical_triangle():
    """All the mass in one cell of the octahedral mesh: four fan triangles of 0.52 sr each.

    E[z] over the cell {|x|, |y| < z} is its projected area on the xy-plane over its area
    2 pi / 3.  The law of z is compared with that of uniform points of S^2 that fall in the
    cell: radially projected flat-uniform points (no rejection) have the same E[z] but fail
    this test (p = 1e-23).
    """
    mesh = SphereMesh.from_generators(np.vstack([np.eye(3), -np.eye(3)]))
    top = int(mesh.locate([[0.0, 0.0, 1.0]])[0])
    values = np.zeros(mesh.n_cells)
    values[top] = 1 / mesh.areas[top]
    x = sample_sphere_density(Density(mesh, values), 100_000, seed=5)
    assert np.all(mesh.locate(x) == top)
    # {2x^2 + y^2 < 1, x^2 + 2y^2 < 1}: 8 copies of {0 <= y <= x, 2x^2 + y^2 < 1}
    a = integrate.quad(lambda s: min(s, np.sqrt(max(1 - 2 * s * s, 0.0))), 0, 1 / np.sqrt(2))[0]
    ok, err, se = _close(x, [0.0, 0.0, 8 * a / (2 * np.pi / 3)])
    assert ok, (err, se)
    u = uniform(600_000, 3, seed=9)
    u = u[mesh.locate(u) == top]
    assert stats.ks_2samp(x[:, 2], u[:, 2]).pvalue > 0.01


def test_circle_mesh_density():
    mesh = CircleMesh(16)
    rho = Density(mesh, 1 + np.arange(16.0), normalize=True)
    x = sample_sphere_density(rho, 50_000, seed=6)
    assert x.shape == (50_000, 2)
    counts = np.bincount(mesh.locate(x), minlength=16)
    assert stats.chisquare(counts, 50_000 * rho.masses()).pvalue > 0.01


# ------------------------------------------------------------------------------ fine quadrature
def test_density_quadrature_masses_moments_radius():
    mesh = SphereMesh(4)
    rho = Density.from_function(mesh, lambda p: np.exp(2 * p[:, 2] - p[:, 1]))
    xq, wq, cell = mesh.quadrature()
    exact = (rho.values[cell] * wq) @ xq
    errors, radii = [], []
    for k in (2, 4):
        y, w, r = density_quadrature(rho, refine=k)
        assert y.shape == (len(w), 3) and abs(w.sum() - 1) < 1e-14
        # each cell's mass exactly, at points inside the cell
        np.testing.assert_allclose(
            np.bincount(mesh.locate(y), weights=w, minlength=mesh.n_cells), rho.masses(), atol=1e-13
        )
        errors.append(np.abs(w @ y - exact).max())
        radii.append(r)
    assert errors[1] < 1e-4 and 3.5 < errors[0] / errors[1] < 4.5  # second order in 1/refine
    assert 1.9 < radii[0] / radii[1] < 2.1
    # r^2 is the mean squared distance of the density to its own triangle's atom: the nearest
    # atom is a little closer on average (measured: 2 % at refine = 4)
    x = sample_sphere_density(rho, 200_000, seed=7)
    d2 = spatial.cKDTree(y).query(x)[0] ** 2
    assert 0.95 * r**2 < d2.mean() < r**2


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("f", "match"),
    [
        (lambda p: p[:, 2], r"finite and non-negative, got -"),
        (lambda p: np.where(p[:, 2] > 0.5, np.nan, 1.0), r"finite and non-negative, got nan"),
        (lambda p: np.ones(3), r"shape \(\d+,\) at \d+ points of S\^2, got shape \(3,\)"),
        (lambda p: np.zeros(len(p)), r"must not vanish"),
    ],
)
def test_bad_callable(f, match):
    with pytest.raises(ValueError, match=match):
        sample_sphere_density(f, 10, seed=0, resolution=8)


def test_bad_arguments():
    with pytest.raises(TypeError, match=r"n must be an integer, got 2.5"):
        sample_sphere_density(lambda p: p[:, 0] ** 2, 2.5)
    with pytest.raises(ValueError, match=r"n must be"):
        sample_zonal_density(np.exp, 0, axis=[0, 0, 1])
    with pytest.raises(TypeError, match=r"density must be a callable .* got 3.0"):
        sample_sphere_density(3.0, 10)
    with pytest.raises(TypeError, match=r"profile must be a callable"):
        sample_zonal_density([1.0, 2.0], 10, axis=[0, 0, 1])
    with pytest.raises(
        ValueError, match=r"axis must be a vector of length d >= 2, got shape \(1,\)"
    ):
        sample_zonal_density(np.exp, 10, axis=[1.0])
    with pytest.raises(ValueError, match=r"profile must be finite and non-negative, got -"):
        sample_zonal_density(lambda t: t, 10, axis=[0, 0, 1])
    with pytest.raises(ValueError, match=r"must not vanish on \(-1, 1\) in dimension d = 3"):
        sample_zonal_density(lambda t: (np.abs(t) == 1).astype(float), 10, axis=[0, 0, 1])
    with pytest.raises(ValueError, match=r"density must live on a SphereMesh, got one on"):
        density_quadrature(Density.uniform(CircleMesh(8)))
    with pytest.raises(ValueError, match=r"refine must be"):
        density_quadrature(Density.uniform(SphereMesh(2)), refine=0)
