import numpy as np
import pytest
from scipy import special

from wflow import SA, USA, theory
from wflow.solvers.lagrangian import quadrature_measure, solve_lagrangian


def _fit(rho, basis):
    return np.linalg.lstsq(np.stack(basis, 1), rho, rcond=None)[0]


@pytest.mark.parametrize("kind", ["SA", "USA"])
@pytest.mark.parametrize("beta", [1.0, 5.0])
def test_circle_growth_rates(kind, beta):
    """Mode k of 1 + a cos(k theta) grows at DESIGN.md's rate (within 1e-4 relative at a = 1e-6)."""
    a = 1e-6
    for k in (1, 2, 3, 4):
        expected = theory.growth_rate(k, beta, 2, kind)
        t = min(0.5, 1.0 / expected)  # about one e-fold: linear regime, few steps
        f = lambda x: 1 + a * np.cos(k * np.arctan2(x[:, 1], x[:, 0]))  # noqa: E731
        model = SA(beta) if kind == "SA" else USA(beta)
        sol = solve_lagrangian(model, f, t, d=2, nodes=64, save_at=[0, t], rtol=1e-9)
        pts, rho = sol.density(-1)  # w.r.t. the surface measure: uniform 1 / (2 pi)
        th = np.arctan2(pts[:, 1], pts[:, 0])
        c = _fit(2 * np.pi * rho, [np.ones_like(th), np.cos(k * th), np.sin(k * th)])
        rate = np.log(np.hypot(c[1], c[2]) / a) / t
        assert abs(rate - expected) < 1e-4 * max(expected, 0.1), (k, rate, expected)


@pytest.mark.parametrize("kind", ["SA", "USA"])
def test_sphere_growth_rates(kind):
    """Zonal mode P_l(z) on S^2 at beta = 4 grows at l(l+1) c_l / beta (/ c_0 for SA)."""
    a, t, beta = 1e-6, 0.3, 4.0
    for ell in (1, 2, 3):
        f = lambda x: 1 + a * special.eval_legendre(ell, x[:, 2])  # noqa: E731
        model = SA(beta) if kind == "SA" else USA(beta)
        sol = solve_lagrangian(model, f, t, d=3, nodes=12, save_at=[0, t])
        pts, rho = sol.density(-1)  # uniform 1 / (4 pi)
        z = pts[:, 2]
        c = _fit(4 * np.pi * rho, [special.eval_legendre(j, z) for j in range(6)])
        rate = np.log(c[ell] / a) / t
        expected = theory.growth_rate(ell, beta, 3, kind)
        assert abs(rate - expected) < 1e-4 * expected, (ell, rate, expected)


def test_density_is_consistent_with_transported_mass():
    """rho_t(X) J_t = rho_0 and the Jacobian is 1 at t = 0; mass is carried by the atoms."""
    f = lambda x: np.exp(2 * x[:, 0])  # noqa: E731
    sol = solve_lagrangian(SA(3.0), f, 1.0, d=2, nodes=128)
    np.testing.assert_allclose(sol.jacobian[0], 1, atol=1e-8)
    np.testing.assert_allclose(sol.atoms(-1).weights.sum(), 1, rtol=1e-14)
    # mass conservation of the recovered density: integrate rho_t over the moved nodes
    pts, rho = sol.density(-1)
    th = np.mod(np.arctan2(pts[:, 1], pts[:, 0]), 2 * np.pi)
    order = np.argsort(th)
    th, r = th[order], rho[order]
    th = np.append(th, th[0] + 2 * np.pi)
    r = np.append(r, r[0])
    mass = np.sum(0.5 * (r[1:] + r[:-1]) * np.diff(th))  # w.r.t. arc length
    assert abs(mass - 1) < 1e-3  # trapezoid on the moved (non-uniform) nodes


def test_bad_input():
    with pytest.raises(ValueError, match="d=4"):
        quadrature_measure(lambda x: np.ones(len(x)), 4, 8)
    with pytest.raises(ValueError, match="non-negative"):
        quadrature_measure(lambda x: x[:, 0], 2, 8)
    with pytest.raises(TypeError, match="callable"):
        quadrature_measure(np.ones(8), 2, 8)
