"""Synchronization and hemisphere collapse (wflow.studies.dichotomy): the linearization against theory."""

import numpy as np
import pytest

from wflow import SA, USA, simulate
from wflow.studies.dichotomy import (
    deviation_from_mean,
    diameter,
    hemisphere_start,
    jacobian_spectrum,
    late_rate,
    linearized_rate,
    synchronized,
)
from wflow.theory import equiangular_configuration, equiangular_solution


@pytest.mark.parametrize(
    "name,beta,n,d", [("SA", 0.5, 4, 3), ("SA", 3.0, 5, 4), ("USA", 0.5, 4, 3), ("USA", 2.0, 3, 5)]
)
def test_jacobian_at_synchronized_state(name, beta, n, d):
    """Eigenvalues -lambda ((n-1)(d-1) times) and 0 (d-1 times), lambda = 1 (SA) or e^beta (USA)."""
    model = {"SA": SA, "USA": USA}[name](beta)
    ev = jacobian_spectrum(model, n, d)
    lam = linearized_rate(name, beta)
    k = (n - 1) * (d - 1)
    assert np.allclose(ev[:k], -lam, rtol=1e-7)
    assert np.abs(ev[k:]).max() < 1e-7 * lam


def test_linearization_agrees_with_equiangular_reduction():
    """DESIGN §1: SA rho' = 2(1-rho)((n-1)rho+1)/(e^{beta(1-rho)}+n-1) -> 2(1-rho) as rho -> 1, USA -> 2 e^beta (1-rho)."""
    n, beta = 7, 1.5
    for name in ("SA", "USA"):
        lam = linearized_rate(name, beta)
        t = np.array([0.0, 8.0 / lam, 10.0 / lam])
        rho = equiangular_solution(0.2, t, beta, n, model=name)
        slope = np.log((1 - rho[2]) / (1 - rho[1])) / (t[2] - t[1])
        assert abs(slope / (-2 * lam) - 1) < 1e-4


def test_simulated_late_rate():
    x0 = np.stack(
        [
            equiangular_configuration(5, 0.3)
            @ np.linalg.qr(np.random.default_rng(s).standard_normal((5, 5)))[0]
            for s in range(2)
        ]
    )
    for name, beta in (("SA", 1.0), ("USA", 0.5)):
        lam = linearized_rate(name, beta)
        T = 16.0 / lam
        tr = simulate(
            {"SA": SA, "USA": USA}[name](beta),
            x0,
            T,
            save_at=np.linspace(0, T, 81),
            dt=0.02 / lam,
            diagnostics=(),
        )
        dev = deviation_from_mean(tr.points)
        for s in range(2):
            rate, half, k = late_rate(tr.times, dev[:, s], (1e-9, 1e-4))
            assert k >= 10 and abs(rate / lam - 1) < 1e-5
        assert synchronized(tr.points[-1]).all()


def test_geometry_helpers():
    x = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [-1.0, 0.0, 0.0]])
    assert diameter(x) == pytest.approx(np.pi)
    assert deviation_from_mean(x) == pytest.approx(np.pi / 2)  # mean direction (0, 1, 0)
    assert not synchronized(x)
    t = np.linspace(0, 10, 41)
    rate, half, k = late_rate(t, 3.0 * np.exp(-2.5 * t), (1e-9, 1.0))
    assert rate == pytest.approx(2.5, rel=1e-12) and half < 1e-10
    assert np.isnan(late_rate(t, np.ones_like(t))[0])


def test_hemisphere_start_and_cone_invariance():
    x0 = hemisphere_start(10, 4, 3, np.random.default_rng(0))
    assert x0.shape == (3, 10, 4) and x0[..., -1].min() > 0.1
    assert np.allclose(np.linalg.norm(x0, axis=-1), 1.0)
    tr = simulate(SA(4.0), x0, 5.0, save_at=np.linspace(0, 5, 21), dt=0.05, diagnostics=())
    margin = tr.points[..., -1].min(axis=-1)
    assert np.all(np.diff(margin, axis=0) >= -1e-12)  # min_i <x_i, e> never decreases
