"""Blurring mean shift on the sphere (wflow.studies.mean_shift) against SA and against finite differences."""

import numpy as np
import pytest

from wflow.sphere import uniform
from wflow.studies.mean_shift import field_gap, mean_shift_field, random_configurations, run_gap


@pytest.mark.parametrize("beta", [0.5, 3.0, 20.0])
def test_field_is_beta_times_sa(beta):
    gap, size = field_gap(beta, random_configurations(1, 12))
    assert gap < 1e-12 and size > 0.1


def test_field_is_riemannian_gradient_of_log_kde():
    """Central differences of log sum_j w_j e^{beta<x,x_j>} along tangent directions."""
    rng = np.random.default_rng(0)
    pts = uniform(15, 4, rng)
    w = rng.uniform(0.2, 1.0, 15)
    beta, h = 2.5, 1e-5
    x = uniform(3, 4, rng)
    v = mean_shift_field(x, pts, w, beta)
    assert np.abs(np.sum(v * x, axis=-1)).max() < 1e-14  # tangent
    logf = lambda y: np.log(np.exp(beta * y @ pts.T) @ w)  # noqa: E731
    for i in range(3):
        for _ in range(3):
            u = rng.standard_normal(4)
            u -= (u @ x[i]) * x[i]
            u /= np.linalg.norm(u)
            # the geodesic through x_i with speed u: derivative of log f along it at 0
            deriv = (
                logf(np.cos(h) * x[i] + np.sin(h) * u) - logf(np.cos(-h) * x[i] + np.sin(-h) * u)
            ) / (2 * h)
            assert abs(deriv - v[i] @ u) < 1e-8


def test_large_beta_is_finite_and_zero_weights_ignored():
    x = uniform(10, 3, 0)
    w = np.r_[np.zeros(3), np.full(7, 1 / 7)]
    v = mean_shift_field(x, x, w, 1000.0)
    assert np.all(np.isfinite(v))
    v2 = mean_shift_field(x, x[3:], w[3:], 1000.0)
    assert np.abs(v - v2).max() < 1e-12


def test_bad_input_named():
    x = uniform(4, 3, 0)
    with pytest.raises(ValueError, match="beta"):
        mean_shift_field(x, x, np.full(4, 0.25), -1.0)
    with pytest.raises(ValueError, match="weights"):
        mean_shift_field(x, x, np.full(3, 0.25), 1.0)


def test_run_is_sa_at_time_beta_t():
    """The study's run check on one small batch: mean shift to t = 0.5 is SA to beta t (dopri5)."""
    r = run_gap(3.0, uniform(12, 3, 4, batch=(2,)), 0.5, n_saves=2)
    assert r["moved"] > 0.1  # it moved
    assert r["gaps"].shape == (2,) and r["gaps"].max() < 1e-8
