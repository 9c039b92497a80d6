"""Densities on meshes: mass convention, validation, quadrature, samples, atoms."""

import warnings

import numpy as np
import pytest

from wflow.density import Density
from wflow.measure import Atoms
from wflow.mesh import CircleMesh, SphereMesh
from wflow.sphere import von_mises_fisher


@pytest.fixture(scope="module")
def sphere():
    return SphereMesh(6)


def test_uniform_mass_and_convention(sphere):
    for mesh in (CircleMesh(50), sphere):
        rho = Density.uniform(mesh)
        assert abs(rho.mass() - 1) < 1e-14
        assert np.allclose(rho.values, 1 / mesh.total_area)


def test_from_function_cell_averages_circle():
    m = CircleMesh(32)
    rho = Density.from_function(m, lambda x: 1 + 0.5 * x[:, 0])  # 1 + cos(theta)/2, mass 2 pi
    a, b = m.edge_angles, m.edge_angles + m.width
    exact = (1 + 0.5 * (np.sin(b) - np.sin(a)) / m.width) / (2 * np.pi)
    assert np.abs(rho.values - exact).max() < 1e-14
    assert abs(rho.mass() - 1) < 1e-14


def test_from_function_sphere_moments(sphere):
    # 1 + z: mass 4 pi, first moment int z (1 + z) dA = 4 pi / 3
    rho = Density.from_function(sphere, lambda x: 1 + x[:, 2])
    assert abs(rho.mass() - 1) < 1e-14
    assert (
        abs(rho.integrate(sphere.centers[:, 2]) - 1 / 3) < 0.05 * sphere.spacing**2
    )  # midpoint rule, O(h^2)


def test_validation():
    m = CircleMesh(8)
    u = np.full(8, 1 / (2 * np.pi))
    with pytest.raises(ValueError, match="non-negative"):
        Density(m, np.where(np.arange(8) == 3, -0.1, u))
    with pytest.raises(ValueError, match="non-finite"):
        Density(m, np.where(np.arange(8) == 3, np.nan, u))
    with pytest.raises(ValueError, match="total mass"):
        Density(m, 2 * u)
    with pytest.raises(ValueError, match="shape"):
        Density(m, u[:5])
    with pytest.raises(TypeError, match="mesh"):
        Density("mesh", u)
    assert abs(Density(m, 2 * u, normalize=True).mass() - 1) < 1e-15
    with pytest.warns(UserWarning, match="rescaled"):
        rho = Density(m, u * (1 + 1e-8))
    assert abs(rho.mass() - 1) < 1e-15
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Density(m, u * (1 + 1e-14))  # round-off: silent


def test_atoms_round_trip(sphere):
    rng = np.random.default_rng(0)
    for mesh in (CircleMesh(40), sphere):
        v = rng.uniform(0.1, 1.0, mesh.n_cells)
        rho = Density(mesh, v, normalize=True)
        mu = rho.to_atoms()
        assert isinstance(mu, Atoms) and mu.n == mesh.n_cells
        assert np.allclose(mu.weights, rho.values * mesh.areas, rtol=1e-14)
        back = Density.from_atoms(mesh, mu)
        assert np.allclose(back.values, rho.values, rtol=1e-13)


def test_histogram_counts_exact_masses():
    m = CircleMesh(10)
    theta = np.array([0.1, 0.2, 3.0, 6.2])
    x = np.stack([np.cos(theta), np.sin(theta)], axis=1)
    rho = Density.from_samples(m, x, weights=[1, 1, 1, 1])
    masses = rho.values * m.areas
    assert (
        masses[0] == pytest.approx(0.5)
        and masses[4] == pytest.approx(0.25)
        and masses[9] == pytest.approx(0.25)
    )


def test_kde_approaches_vmf(sphere):
    x = von_mises_fisher(20000, [0, 0, 1], 4.0, seed=np.random.default_rng(0))
    rho = Density.from_samples(sphere, x, method="kde", bandwidth=0.15, backend="numpy")
    exact = Density.from_function(sphere, lambda y: np.exp(4 * y[:, 2]))
    err = np.sum(np.abs(rho.values - exact.values) * sphere.areas)
    assert err < 0.1  # L1 error of a smoothed estimate (bias ~ bandwidth^2)
    assert abs(rho.mass() - 1) < 1e-14
    with pytest.raises(ValueError, match="method"):
        Density.from_samples(sphere, x, method="spline")
    with pytest.raises(ValueError, match="dimension"):
        Density.from_atoms(CircleMesh(8), Atoms(x))
