"""The metastable-clusters study: its measurements against exact values, and one small run."""

import numpy as np
import pytest

from wflow.studies import metastable as M
from wflow.studies.parts import Parts
from wflow.theory import growth_rate, most_unstable_mode


@pytest.mark.parametrize("k", [1, 2, 3, 5, 7])
def test_count_peaks_of_cosine_density(k):
    th = M.grid_angles(512)
    assert M.count_peaks(1 + 0.5 * np.cos(k * (th - 0.3)) + 0.02 * np.cos(11 * th))[0] == k
    n, idx = M.count_peaks(1 + 0.5 * np.cos(k * (th - 0.3)))
    assert n == k
    # the peaks sit at 0.3 + 2 pi j / k, to the grid spacing
    assert M.angle_error(th[idx], 0.3 + 2 * np.pi * np.arange(k) / k) <= np.pi / 512 + 1e-12


def test_count_peaks_ignores_small_bumps_and_uniform():
    th = M.grid_angles(256)
    assert M.count_peaks(np.ones(256))[0] == 0
    # a ripple of amplitude 0.03 (prominence <= 0.06 * mean) is below the default 0.25
    assert M.count_peaks(1 + 0.5 * np.cos(2 * th) + 0.03 * np.cos(5 * th))[0] == 2


def test_fourier_and_predicted_angles_of_atoms():
    k, phi = 4, 0.7
    theta = phi + 2 * np.pi * np.arange(k) / k
    c = M.fourier_coefficients(theta, 8)
    # c_k = e^{-ik phi}, c_j = 0 for j not a multiple of k
    np.testing.assert_allclose(c[k - 1], np.exp(-1j * k * phi), atol=1e-14)
    np.testing.assert_allclose(c[[0, 1, 2, 4, 5, 6]], 0, atol=1e-14)
    assert M.angle_error(theta, M.predicted_angles(c[k - 1], k)) < 1e-12
    # an antiphase guess is half the spacing away
    assert M.angle_error(theta + np.pi / k, M.predicted_angles(c[k - 1], k)) == pytest.approx(
        np.pi / k
    )


def test_smoothed_density_phase_prediction():
    """Cell masses of 1 + 2 eps cos(k theta - phi): c_k = eps e^{-i phi}, peaks at phi / k + 2 pi j / k."""
    m, k, phi, eps = 400, 3, 1.1, 0.2
    th = 2 * np.pi * (np.arange(m) + 0.5) / m
    w = 1 + 2 * eps * np.cos(k * th - phi)
    c = M.fourier_coefficients(th, 6, w)
    np.testing.assert_allclose(c[k - 1], eps * np.exp(-1j * phi), atol=1e-12)
    dens = M.smoothed_density(th, m=256, weights=w)
    assert np.sum(dens) * 2 * np.pi / 256 == pytest.approx(1.0)
    n, idx = M.count_peaks(dens)
    assert n == k
    assert (
        M.angle_error(M.grid_angles(256)[idx], M.predicted_angles(c[k - 1], k)) < 0.05
    )  # histogram of 400 cells on 256 bins


def test_degree_spectrum_antipodal_pair_even_degrees_only():
    x = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, -1.0]])
    a = M.degree_spectrum(x, 8)
    np.testing.assert_allclose(a, [(1 + (-1) ** ell) / 2 for ell in range(9)], atol=1e-14)


def test_degree_spectrum_low_degrees_exact():
    """A_1 = |mean x|^2 and A_2 = (3 |mean x x^T|_F^2 - 1) / 2 (P_1 = t, P_2 = (3t^2 - 1)/2); chunks agree."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((301, 3)) + [0.5, 0, 0]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    a = M.degree_spectrum(x, 6, chunk=64)
    np.testing.assert_allclose(a[0], 1.0)
    np.testing.assert_allclose(a[1], np.sum(x.mean(0) ** 2), rtol=1e-12)
    S = x.T @ x / len(x)
    np.testing.assert_allclose(a[2], (3 * np.sum(S * S) - 1) / 2, rtol=1e-12)
    np.testing.assert_allclose(a, M.degree_spectrum(x, 6, chunk=1000), rtol=1e-12)


def test_selection_probability():
    # two modes: P(X_1 > X_2) = w_1 / (w_1 + w_2) for exponentials of means w
    lam, t = np.array([0.5, 0.3]), 2.0
    w = np.exp(2 * lam * t)
    assert M.selection_probability(lam, t) == pytest.approx(w[0] / w.sum(), rel=1e-8)
    # K equal modes at t = 0: 1/K; far in time the fastest always wins
    assert M.selection_probability(np.zeros(5), 0.0) == pytest.approx(0.2, rel=1e-8)
    assert M.selection_probability(
        growth_rate(np.arange(1, 13), 5.0, 2, "SA"), 200.0
    ) == pytest.approx(1.0)


def test_selection_probability_monte_carlo():
    rng = np.random.default_rng(1)
    lam = growth_rate(np.arange(1, 9), 10.0, 2, "SA")
    t = 5.0
    x = rng.exponential(size=(200_000, 8)) * np.exp(2 * lam * t)
    mc = np.mean(np.argmax(x, axis=1) == np.argmax(lam))
    assert M.selection_probability(lam, t) == pytest.approx(mc, abs=0.005)


def test_resolved_modes():
    lam = growth_rate(np.arange(1, 13), 10.0, 2, "SA")  # modes 4 (0.697) and 5 (0.690) nearly tie
    assert M.resolved_modes(lam, 8.0) == [4, 5]
    assert M.resolved_modes(lam, 500.0) == [4]
    assert M.resolved_modes(growth_rate(np.arange(1, 13), 2.0, 2, "SA"), 8.0) == [2]


def test_finite_volume_selects_k_star_and_parts_reuse(tmp_path):
    """beta = 2 on 128 cells: mode k* = 2 wins, two peaks; the second get is read from disk."""
    parts = Parts(tmp_path, "metastable", quick=True)
    key = {"solver": "fv", "beta": 2.0, "cells": 128}
    a = parts.get(key, lambda: M.run_fv(2.0, 128, 0))
    b = parts.get(key, lambda: pytest.fail("recomputed a stored part"))
    assert (parts.computed, parts.reused) == (1, 1)
    assert a["k_dom"] == b["k_dom"] == most_unstable_mode(2.0, 2, "SA") == 2
    assert a["n_peaks"] == 2
    np.testing.assert_array_equal(a["c0"], b["c0"])
    # the linear phase: |c_2| grew from eps by about exp(lambda_2 t) (nonlinear saturation starts near 0.25)
    growth = np.log(a["c_lin"][1] / a["c0"][1]).real / a["t_lin"]
    assert growth == pytest.approx(growth_rate(2, 2.0, 2, "SA"), rel=0.1)
    assert a["angle_error"] < 0.1


def test_selection_probability_gamma_shapes():
    """shape = 1 is the exponential case; shapes (2l+1)/2 (chi^2_{2l+1} powers on S^2) against Monte Carlo."""
    lam = growth_rate(np.arange(1, 9), 5.0, 3, "SA")
    assert M.selection_probability(lam, 3.0, shape=1.0) == pytest.approx(
        M.selection_probability(lam, 3.0), rel=1e-7
    )
    ells = np.arange(1, 9)
    a = (2 * ells + 1) / 2
    rng = np.random.default_rng(2)
    x = rng.gamma(a, 1 / a, size=(200_000, 8)) * np.exp(2 * lam * 4.0)
    for winner in (1, 2):  # l = 2 and l* = 3
        mc = np.mean(np.argmax(x, axis=1) == winner)
        assert M.selection_probability(lam, 4.0, winner=winner, shape=a) == pytest.approx(
            mc, abs=0.005
        )


def test_competitor_ratio():
    c = np.array([0.1, -0.5j, 0.2, 0.3 + 0.4j])
    assert M.competitor_ratio(c, 2) == pytest.approx(1.0)
    assert M.competitor_ratio(c, 4) == pytest.approx(1.0)
    assert M.competitor_ratio(c[:3], 2) == pytest.approx(0.4)


def test_linear_prediction_and_fit_growth_exact_exponentials():
    """A_l(t) = A_l(0) e^{2 lambda_l t}: the fit returns 2 lambda_l over the saves with max A <= FIT_MAX."""
    lam = growth_rate(np.arange(1, 7), 10.0, 3, "SA")
    a0 = np.r_[1.0, np.linspace(1, 2, 6) * 1e-4]
    t = np.arange(0, 8.0, 0.2)
    series = np.array([np.r_[1.0, M.linear_prediction(a0, lam, s)] for s in t])
    np.testing.assert_allclose(series[:, 1:] / a0[1:], np.exp(2 * np.outer(t, lam)), rtol=1e-12)
    np.testing.assert_allclose(M.fit_growth(series, t)[1:], 2 * lam, rtol=1e-9)
    assert M.fit_growth(series, t)[0] == pytest.approx(0.0, abs=1e-12)
    assert np.all(np.isnan(M.fit_growth(series[:2], t[:2])))


@pytest.mark.parametrize("beta, l_star", [(2.0, 2), (5.0, 3), (10.0, 4)])
def test_sphere_rates_against_spherical_bessel(beta, l_star):
    """On S^2, K * Y_l = i_l(beta) Y_l (Funk-Hecke, modified spherical Bessel), Laplacian -l(l+1): SA rate l(l+1) i_l / (beta i_0)."""
    from scipy.special import spherical_in

    ells = np.arange(1, 11)
    np.testing.assert_allclose(
        growth_rate(ells, beta, 3, "SA"),
        ells * (ells + 1) * spherical_in(ells, beta) / (beta * spherical_in(0, beta)),
        rtol=1e-12,
    )
    assert most_unstable_mode(beta, 3, "SA") == l_star
