import numpy as np
import pytest
from scipy import integrate, special

from wflow import theory


@pytest.mark.parametrize("d", [2, 3, 5])
@pytest.mark.parametrize("beta", [0.5, 4.0, 30.0])
def test_funk_hecke_against_quadrature(d, beta):
    """c_l = E_{x ~ unif}[e^{beta x_1} P_l^{(d)}(x_1)] with the normalized Gegenbauer polynomial."""
    for ell in range(5):
        lam = d / 2 - 1
        if d == 2:
            P = lambda t: np.cos(ell * np.arccos(np.clip(t, -1, 1)))  # noqa: E731
        else:
            P = lambda t: special.eval_gegenbauer(ell, lam, t) / special.eval_gegenbauer(ell, lam, 1.0)  # noqa: E731
        # t = cos(phi): the surface measure on S^{d-1} projects to sin^{d-2}(phi) dphi
        f = lambda phi: np.exp(beta * (np.cos(phi) - 1)) * P(np.cos(phi)) * np.sin(phi) ** (d - 2)  # noqa: E731
        num = integrate.quad(f, 0, np.pi, limit=200, epsabs=1e-14)[0]
        den = integrate.quad(lambda phi: np.sin(phi) ** (d - 2), 0, np.pi)[0]
        expected = num / den * np.exp(beta)
        assert abs(theory.funk_hecke(ell, beta, d) - expected) < 1e-9 * np.exp(beta)


def test_circle_growth_rates_match_design():
    k = np.arange(1, 5)
    np.testing.assert_allclose(theory.growth_rate(k, 5.0, 2, "USA"), k**2 * special.iv(k, 5.0) / 5.0, rtol=1e-13)
    np.testing.assert_allclose(theory.growth_rate(k, 5.0, 2, "SA"),
                               k**2 * special.iv(k, 5.0) / (5.0 * special.iv(0, 5.0)), rtol=1e-13)


def test_most_unstable_mode_grows_with_beta():
    modes = [theory.most_unstable_mode(b, 2, "SA") for b in (1, 9, 40)]
    assert modes == sorted(modes) and modes[0] == 1 and modes[-1] > modes[1]


def test_equiangular_configuration():
    x = theory.equiangular_configuration(7, 0.3)
    G = x @ x.T
    np.testing.assert_allclose(np.diag(G), 1, atol=1e-15)
    np.testing.assert_allclose(G[~np.eye(7, dtype=bool)], 0.3, atol=1e-15)
    with pytest.raises(ValueError, match="rho"):
        theory.equiangular_configuration(3, -0.6)


def test_equiangular_rhs_fixed_points():
    for model in ("SA", "USA"):
        assert theory.equiangular_rhs(1.0, 3.0, 5, model) == 0.0
        assert abs(theory.equiangular_rhs(-1 / 4, 3.0, 5, model)) < 1e-15


def test_long_context_limits():
    rho = 0.5
    assert theory.long_context_limit(rho, 1.0) == 1.0
    assert theory.long_context_limit(rho, 2.0) == pytest.approx(4 * rho / (1 + 3 * rho))
    assert theory.long_context_limit(rho, 3.0) == rho
