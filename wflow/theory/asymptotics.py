r"""The late-time laws of :math:`1-\rho` near :math:`\rho = 1`, every normalization scheme."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import check_positive
from .checks import check_rho
from .equiangular import EquiangularSystem


@dataclass(frozen=True)
class EquiangularLaw:
    r"""Predicted late-time law of :math:`1-\rho(t)` for one scheme (see :func:`equiangular_asymptotics`).

    Attributes
    ----------
    scheme : str
    law : {'exponential', 'exponential-sqrt', 'exponential-alpha', 'power'}
        :math:`Ce^{-\lambda t}`, :math:`Ce^{-\lambda\sqrt{t+1}}`,
        :math:`Ce^{-\lambda\int_0^t\alpha}`, :math:`Ct^{-\lambda}`.
    rate : float
        :math:`\lambda`.
    constant : float
        :math:`C` for the given initial condition (``inf`` if it overflows).
    formula : str
        The law in words, e.g. ``'1-rho ~ C exp(-2 t)'``.

    Examples
    --------
    >>> from wflow.theory import equiangular_asymptotics
    >>> law = equiangular_asymptotics(1.0, 8, "SA", "post-ln", rho0=0.0)
    >>> law.law, law.rate, law.formula
    ('exponential', 2.0, '1-rho ~ C exp(-2 t)')
    """

    scheme: str
    law: str
    rate: float
    constant: float
    formula: str
    clock: Any = field(repr=False, default=None)

    def gap(self, t) -> np.ndarray:
        r"""The predicted :math:`1-\rho` at times ``t`` (an asymptotic equivalent as :math:`t\to\infty`)."""
        t = np.asarray(t, dtype=float)
        if self.law == "exponential":
            return self.constant * np.exp(-self.rate * t)
        if self.law == "exponential-sqrt":
            return self.constant * np.exp(-self.rate * np.sqrt(t + 1.0))
        if self.law == "exponential-alpha":
            return self.constant * np.exp(-self.rate * self.clock(t))
        return self.constant * t ** (-self.rate)


def _log_constant_sphere(sys: EquiangularSystem, u0: float, lam: float, ngpt: bool) -> float:
    r""":math:`\log C` of :math:`u\,e^{\lambda T}\to C` for :math:`u' = -G(u)` in the clock :math:`T`.

    :math:`T = \int_u^{u_0} dv/G(v)` gives :math:`\log C = \log u_0 + \int_0^{u_0}(\lambda/G(v) - 1/v)\,dv`.
    """
    from scipy.integrate import quad

    n, beta = sys.n, sys.beta
    k = 1.0 if sys.model == "SA" else float(n)

    def integrand(v: float) -> float:
        g = v * (n - (n - 1) * v)
        e = np.expm1(beta * v)
        if not ngpt:  # lambda/G - 1/v = (k (e^{beta v} - 1) + (n-1) v) / g
            return (k * e + (n - 1) * v) / g
        # nGPT: 2/G - 1/v = (X - Y)/g, X = ||A||/b, Y = n - (n-1) v, X^2 - Y^2 written without cancellation
        rho = 1.0 - v
        x = np.sqrt(
            np.exp(2 * beta * v)
            + 2 * np.exp(beta * v) * (n - 1) * rho
            + (n - 1) * (1 + (n - 2) * rho)
        )
        y = n - (n - 1) * v
        return ((n - 1) * g + e * (e + 2 * n - 2 * (n - 1) * v)) / ((x + y) * g)

    if u0 == 0.0:
        return -np.inf
    return float(np.log(u0) + quad(integrand, 0.0, u0, limit=200, epsabs=0.0, epsrel=1e-12)[0])


def _log_constant_radial(sys: EquiangularSystem, u0: float, r0: float, slope: float) -> float:
    r""":math:`\log C` of :math:`t^2 u\to C` for Pre-/Peri-LN from :math:`(u_0, r_0)`.

    Along a trajectory :math:`d\log r/du = -(e^{\beta u} + (n-1)(1-u))/(2u(n-(n-1)u))` (the same
    for Pre- and Peri-LN, SA and USA), so :math:`r^2u\to r_0^2u_0\exp\int_0^{u_0}\frac{e^{\beta v}-1}{v(n-(n-1)v)}dv`
    and :math:`r\sim m t` with :math:`m = \lim r'`.
    """
    from scipy.integrate import quad

    n, beta = sys.n, sys.beta
    if u0 == 0.0:
        return -np.inf
    integral = quad(
        lambda v: np.expm1(beta * v) / (v * (n - (n - 1) * v)),
        0.0,
        u0,
        limit=200,
        epsabs=0.0,
        epsrel=1e-12,
    )[0]
    return float(2 * np.log(r0) + np.log(u0) + integral - 2 * np.log(slope))


def equiangular_asymptotics(
    beta: float,
    n: int,
    model: str = "SA",
    scheme: str = "post-ln",
    *,
    rho0: float = 0.0,
    r0: float = 1.0,
    tau: float | None = None,
    alpha=None,
    alpha_times=None,
    convention: str = "plain",
) -> EquiangularLaw:
    r"""Late-time law of :math:`1-\rho` for the equiangular ODE of a scheme, with its constant.

    Exponential (Post-LN :math:`Ce^{-2m_0t}`, :math:`\sqrt{}`-scaling :math:`Ce^{-4m_0\sqrt{t+1}}`,
    nGPT :math:`Ce^{-2\int_0^t\alpha}`) or power (Pre-, Peri-, Mix-LN :math:`Ct^{-2}`),
    :math:`m_0 = n\,b|_{\rho=1}`; the constant :math:`C` by an exact quadrature of the separable
    ODE.  The derivation: ``docs/theory.md``, "How fast tokens collapse".

    Parameters
    ----------
    beta, n, model, scheme, rho0, r0, tau, alpha, alpha_times, convention
        As in :func:`equiangular_scheme_solution`.

    Returns
    -------
    EquiangularLaw

    Examples
    --------
    >>> law = equiangular_asymptotics(1.0, 8, "SA", "post-ln", rho0=0.0)
    >>> law.formula, law.rate
    ('1-rho ~ C exp(-2 t)', 2.0)
    >>> law = equiangular_asymptotics(1.0, 8, "SA", "pre-ln", rho0=0.0)
    >>> law.formula, round(law.constant, 6)
    ('1-rho ~ C t^-2', 1.53315)
    """
    sys = EquiangularSystem(beta, n, model, scheme, convention, tau, alpha, alpha_times)
    rho0 = check_rho(rho0, sys.n, "rho0")
    r0 = check_positive(r0, "r0")
    if rho0 == -1.0 / (sys.n - 1):
        raise ValueError(f"rho0 = {rho0!r} = -1/(n-1) is a fixed point: 1-rho never decays")
    u0 = 1.0 - rho0
    m0 = float(sys.n * sys.self_weight(np.asarray(0.0)))  # n b at u = 0
    with np.errstate(over="ignore"):
        if sys.scheme in ("post-ln", "sqrt"):
            lam = 2.0 * m0
            log_c = _log_constant_sphere(sys, u0, lam, ngpt=False)
            if sys.scheme == "post-ln":
                return EquiangularLaw(
                    sys.scheme,
                    "exponential",
                    lam,
                    float(np.exp(log_c)),
                    f"1-rho ~ C exp(-{lam:.6g} t)",
                )
            # T(t) = 2 sqrt(t+1) - 2: u ~ C e^{-lam T} = C e^{2 lam} e^{-2 lam sqrt(t+1)}
            return EquiangularLaw(
                sys.scheme,
                "exponential-sqrt",
                2 * lam,
                float(np.exp(log_c + 2 * lam)),
                f"1-rho ~ C exp(-{2 * lam:.6g} sqrt(t+1))",
            )
        if sys.alpha is not None:  # (nGPT)
            log_c = _log_constant_sphere(sys, u0, 2.0, ngpt=True)
            return EquiangularLaw(
                sys.scheme,
                "exponential-alpha",
                2.0,
                float(np.exp(log_c)),
                "1-rho ~ C exp(-2 int_0^t alpha)",
                clock=sys.alpha.integral,
            )
        if sys.tau is not None and sys.tau > 0:  # (Mix-LN)
            u0 = float(sys.solve(u0, r0, sys.tau, rtol=1e-13, atol=1e-15)[0](sys.tau)[0])
        slope = 1.0 if sys.scheme == "peri-ln" else m0
        log_c = _log_constant_radial(sys, u0, r0, slope)
        return EquiangularLaw(sys.scheme, "power", 2.0, float(np.exp(log_c)), "1-rho ~ C t^-2")
