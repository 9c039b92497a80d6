r"""Analytic results of DESIGN.md §1 that the solvers must reproduce.

* Funk--Hecke eigenvalues of :math:`e^{\beta\langle x,y\rangle}` on :math:`S^{d-1}`:
  :math:`c_\ell(\beta) = \Gamma(d/2)(2/\beta)^{d/2-1} I_{\ell+d/2-1}(\beta)`, i.e. the
  kernel acts on a degree-:math:`\ell` spherical harmonic (normalized measure) as
  multiplication by :math:`c_\ell`.
* Linear growth rates around the uniform measure (Rigollet 2025, §5):
  USA :math:`\lambda_\ell = \ell(\ell+d-2)c_\ell/\beta`, SA
  :math:`\lambda_\ell = \ell(\ell+d-2)c_\ell/(\beta c_0)`.
* The equiangular reduction (all pairwise inner products equal :math:`\rho`).
* The Kuramoto form on the circle.
* Long context: one attention layer at :math:`\beta = \gamma\log n`.
"""
from __future__ import annotations

import numpy as np
from scipy import special

from .errors import check_int, check_nonnegative, check_positive

__all__ = [
    "funk_hecke",
    "growth_rate",
    "most_unstable_mode",
    "equiangular_rhs",
    "equiangular_solution",
    "kuramoto_velocity",
    "long_context_limit",
    "heat_decay_rate",
]


def funk_hecke(ell, beta: float, d: int) -> np.ndarray:
    r"""Funk--Hecke eigenvalue :math:`c_\ell(\beta) = \Gamma(d/2)(2/\beta)^{d/2-1} I_{\ell+d/2-1}(\beta)`.

    At :math:`\beta = 0` this is the limit (1 for :math:`\ell = 0`, else 0).  On the circle
    (:math:`d = 2`) it is :math:`I_\ell(\beta)`.
    """
    d = check_int(d, "d", minimum=2)
    beta = check_nonnegative(beta, "beta")
    ell = np.asarray(ell, dtype=float)
    nu = ell + d / 2 - 1
    if beta == 0:
        return np.where(ell == 0, 1.0, 0.0)
    # log form avoids overflow for large beta: ive(nu, b) = I_nu(b) e^{-b}
    with np.errstate(divide="ignore"):  # ive underflows to 0 for degrees far beyond beta: c = 0
        log_c = special.gammaln(d / 2) + (d / 2 - 1) * np.log(2 / beta) + np.log(special.ive(nu, beta)) + beta
    return np.exp(log_c)


def growth_rate(ell, beta: float, d: int, model: str = "USA") -> np.ndarray:
    r"""Growth rate of mode :math:`\ell` around the uniform measure on :math:`S^{d-1}` (V = I).

    USA :math:`\ell(\ell+d-2)c_\ell(\beta)/\beta`; SA :math:`\ell(\ell+d-2)c_\ell(\beta)/(\beta c_0(\beta))`.
    On the circle: USA :math:`k^2 I_k(\beta)/\beta`, SA :math:`k^2 I_k(\beta)/(\beta I_0(\beta))`.
    For V = -I the rates change sign.  At :math:`\beta = 0` the limit :math:`\ell(\ell+d-2)c'_\ell(0)`
    is used (nonzero for :math:`\ell = 1` only: rate :math:`(d-1)/d`).
    """
    if model not in ("SA", "USA"):
        raise ValueError(f"model must be 'SA' or 'USA', got {model!r}")
    ell = np.asarray(ell, dtype=float)
    beta = check_nonnegative(beta, "beta")
    lap = ell * (ell + d - 2)
    if beta == 0:
        return np.where(ell == 1, (d - 1) / d, 0.0)
    c = funk_hecke(ell, beta, d)
    rate = lap * c / beta
    if model == "SA":
        rate = rate / funk_hecke(0, beta, d)
    return rate


def most_unstable_mode(beta: float, d: int, model: str = "SA", ell_max: int = 200) -> int:
    """The degree of largest growth rate (ties to the smaller degree)."""
    ells = np.arange(1, ell_max + 1)
    return int(ells[np.argmax(growth_rate(ells, beta, d, model))])


def equiangular_rhs(rho, beta: float, n: int, model: str = "SA") -> np.ndarray:
    r"""Right side of the equiangular reduction :math:`\rho' = F(\rho)` (DESIGN.md §1).

    SA :math:`2(1-\rho)((n-1)\rho+1)/(e^{\beta(1-\rho)} + n - 1)`; USA
    :math:`(2/n)e^{\beta\rho}(1-\rho)((n-1)\rho+1)`.
    """
    rho = np.asarray(rho, dtype=float)
    if model == "SA":
        return 2 * (1 - rho) * ((n - 1) * rho + 1) / (np.exp(beta * (1 - rho)) + n - 1)
    if model == "USA":
        return (2.0 / n) * np.exp(beta * rho) * (1 - rho) * ((n - 1) * rho + 1)
    raise ValueError(f"model must be 'SA' or 'USA', got {model!r}")


def equiangular_solution(rho0: float, t, beta: float, n: int, model: str = "SA", *, rtol: float = 1e-13,
                         atol: float = 1e-15) -> np.ndarray:
    """Solve the equiangular ODE from ``rho0`` at times ``t`` (scipy DOP853, tight tolerances)."""
    from scipy.integrate import solve_ivp  # imported here: scipy.integrate is slow to import

    t = np.atleast_1d(np.asarray(t, dtype=float))
    sol = solve_ivp(lambda _t, r: equiangular_rhs(r, beta, n, model), (0.0, float(t[-1])), [rho0],
                    method="DOP853", t_eval=t, rtol=rtol, atol=atol)
    return sol.y[0]


def equiangular_configuration(n: int, rho: float) -> np.ndarray:
    r"""``n`` unit vectors in :math:`\mathbb{R}^n` with all pairwise inner products ``rho``.

    :math:`x_i = a e_i + b\mathbf{1}` with :math:`a^2 + 2ab + nb^2 = 1`, :math:`2ab + nb^2 = \rho`;
    needs :math:`-1/(n-1) < \rho < 1`.
    """
    n = check_int(n, "n", minimum=2)
    if not -1.0 / (n - 1) < rho < 1:
        raise ValueError(f"rho must lie in (-1/(n-1), 1) = ({-1/(n-1):.4g}, 1), got {rho}")
    a = np.sqrt(1 - rho)
    # n b^2 + 2 a b - rho = 0, positive root
    b = (-a + np.sqrt(a * a + n * rho)) / n
    return a * np.eye(n) + b * np.ones((n, n))


def kuramoto_velocity(theta, beta: float) -> np.ndarray:
    r"""USA on the circle in angles: :math:`\theta_i' = -\frac1n\sum_j e^{\beta\cos(\theta_i-\theta_j)}\sin(\theta_i-\theta_j)`."""
    theta = np.asarray(theta, dtype=float)
    diff = theta[:, None] - theta[None, :]
    return -np.mean(np.exp(beta * np.cos(diff)) * np.sin(diff), axis=1)


def long_context_limit(rho: float, gamma: float) -> float:
    r"""Limit of the output cosine of one SA layer with :math:`\beta = \gamma\log n`, equiangular input :math:`\rho`.

    1 for :math:`\gamma < 1/(1-\rho)`, :math:`4\rho/(1+3\rho)` at equality, :math:`\rho` above.
    """
    gamma = check_positive(gamma, "gamma")
    crit = 1.0 / (1.0 - rho)
    if np.isclose(gamma, crit, rtol=1e-12, atol=0):
        return 4 * rho / (1 + 3 * rho)
    return 1.0 if gamma < crit else float(rho)


def heat_decay_rate(ell, d: int, kappa: float) -> np.ndarray:
    r"""Decay rate of degree-:math:`\ell` harmonics under :math:`\kappa^{-1}\Delta_S`: :math:`\ell(\ell+d-2)/\kappa`."""
    ell = np.asarray(ell, dtype=float)
    return ell * (ell + d - 2) / check_positive(kappa, "kappa")
