r"""Zonal densities on :math:`S^{d-1}`: the mean-field equation as a one-dimensional conservation law.

A measure is *zonal* about the axis :math:`e` when it is invariant under the rotations that
fix :math:`e`: :math:`\mu = f(\langle x, e\rangle)\,\sigma` with :math:`\sigma` the normalized
surface measure.  SA and USA with :math:`Q = K = I`, :math:`V = \pm I` map zonal measures to
zonal velocity fields, so the flow keeps them zonal and everything is a function of
:math:`z = \langle x, e\rangle \in [-1, 1]`, in every dimension :math:`d \ge 2`.
The full derivation is in ``docs/zonal.md``; the results used here:

**Law of z.**  Write :math:`x = z e + s u` with :math:`s = \sqrt{1-z^2}`, :math:`u \in S^{d-2}`
(the unit sphere of :math:`e^\perp`).  Then :math:`\sigma = c_d\,\omega(z)\,dz \otimes d\sigma_{d-2}(u)`,

.. math::

    \omega(z) = (1-z^2)^{(d-3)/2}, \qquad c_d = \frac{\Gamma(d/2)}{\sqrt\pi\,\Gamma((d-1)/2)},

and the law of :math:`z` under :math:`\mu` has density :math:`p(z) = c_d f(z)\omega(z)`.

**Kernel.**  With :math:`\nu = (d-3)/2` and the normalized Bessel function
:math:`\Lambda_\nu(a) = \Gamma(\nu+1)(2/a)^\nu I_\nu(a) = {}_0F_1(;\nu+1;a^2/4)`
(the average of :math:`e^{a\langle u, u'\rangle}` over :math:`u' \in S^{d-2}`),

.. math::

    k(z, z') = \int e^{\beta\langle x, y\rangle}\,d\sigma_{d-2}(u')
             = e^{\beta z z'}\,\Lambda_\nu\big(\beta s s'\big),

and, with the Bessel ratio :math:`r_\nu(a) = I_{\nu+1}(a)/I_\nu(a)` (so :math:`\Lambda_\nu' = r_\nu\Lambda_\nu`),
the :math:`e`-component of :math:`P_x\int e^{\beta\langle x,y\rangle} y\,d\sigma_{d-2}(u')` is

.. math::

    K(z, z') = (1-z^2)\,k(z, z')\,h(z, z'), \qquad
    h(z, z') = z' - \beta z (1-z'^2)\,\frac{r_\nu(\beta s s')}{\beta s s'} ,

:math:`r_\nu(a)/a \to 1/(d-1)` as :math:`a \to 0`.  Equivalently
:math:`(1-z^2)\,\partial_z k = \beta K`.  :math:`d = 2` (:math:`\Lambda = \cosh`, :math:`r = \tanh`)
and :math:`d = 3` (:math:`\Lambda = I_0`, :math:`r = I_1/I_0`) are the same formula.

**Velocity.**  The velocity is :math:`v = g(z)\,\nabla_S z` with :math:`\nabla_S z = P_x e`, so the
:math:`z`-velocity is :math:`w = \langle v, e\rangle = (1-z^2) g(z)`, and, for :math:`V = \epsilon I`,

.. math::

    \text{USA: } g(z) = \epsilon\int_{-1}^{1} p(z')\,k(z,z')\,h(z,z')\,dz', \qquad
    \text{SA: } g(z) = \epsilon\,\frac{\int p(z')\,k\,h\,dz'}{\int p(z')\,k\,dz'} .

**Equation.**  :math:`\partial_t\mu + \mathrm{div}_S(\mu v) = \kappa^{-1}\Delta_S\mu` becomes

.. math::

    \partial_t p + \partial_z\big(p\,w\big) = \kappa^{-1}\partial_z\big(c_d(1-z^2)^{(d-1)/2}\,\partial_z f\big),
    \qquad p = c_d\,\omega f,

and :math:`E_\beta(\mu) = \frac{1}{2\beta}\iint k(z,z')\,p(z)p(z')\,dz\,dz'`.

**Discretization** (:class:`ZonalFV`).  Cells :math:`[z_i, z_{i+1}]`, state = cell masses
:math:`m_i = \mu(z_i \le z \le z_{i+1})`, band volumes :math:`V_i = \sigma(\cdot)`, face weights
:math:`\ell_i = c_d(1-z_i^2)^{(d-1)/2}` (zero at the poles), weighted centroids
:math:`\bar z_i = (\ell_i - \ell_{i+1})/((d-1)V_i)` (exact).  Flux of :math:`p` through face
:math:`z_f`: :math:`F_f = \ell_f\big(g_f^+ f_L + g_f^- f_R\big) - \kappa^{-1}\ell_f(\bar f_R - \bar f_L)/(\bar z_R - \bar z_L)`,
with :math:`f_{L,R}` the limited linear reconstructions of :math:`f = m/V` (MC slopes,
face values kept in :math:`[0, 2\bar f]`) and :math:`g_f` the centroid-rule quadrature of the
integrals above against the cell masses.  :math:`dm_i/dt = F_i - F_{i+1}`.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable

import numpy as np
from scipy import special

from ._typing import ArrayLike
from .errors import SolverError, check_int, check_nonnegative, check_positive, short_repr

__all__ = [
    "log_normalized_bessel",
    "bessel_ratio",
    "zonal_kernel",
    "zonal_weight",
    "log_cap_volume",
    "ZonalFV",
]

# -- Bessel functions in log scale ---------------------------------------------------------------

#: orders at or above this use the uniform (Debye) expansion
_DEBYE_NU = 30.0
_SERIES_TERMS = 40


def _debye_polynomials(n: int = 14) -> list[np.ndarray]:
    r"""Coefficients (ascending powers of p) of Debye's :math:`u_k(p)`, DLMF 10.41.10."""
    polys = [[Fraction(1)]]
    for _ in range(n):
        u = polys[-1]
        du = [i * u[i] for i in range(1, len(u))]
        nxt = [Fraction(0)] * (len(u) + 4)
        for i, c in enumerate(du):  # p^2 (1 - p^2) u'(p) / 2
            nxt[i + 2] += c / 2
            nxt[i + 4] -= c / 2
        for i, c in enumerate(u):  # (1/8) int_0^p (1 - 5 t^2) u(t) dt
            nxt[i + 1] += c / (8 * (i + 1))
            nxt[i + 3] -= 5 * c / (8 * (i + 3))
        while nxt and nxt[-1] == 0:
            nxt.pop()
        polys.append(nxt)
    return [np.array([float(c) for c in u]) for u in polys]


_DEBYE = _debye_polynomials()
_DEBYE_MAX = [float(np.max(np.abs(np.polynomial.polynomial.polyval(np.linspace(0, 1, 1001), u)))) for u in _DEBYE]
# Stirling: lgamma(nu + 1) - (nu log nu - nu + log(2 pi nu)/2) = sum_k B_2k / (2k (2k-1) nu^(2k-1))
_STIRLING = [1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156, -3617 / 122400]


def _debye_terms(nu: float) -> int:
    """Number of Debye terms for an absolute error below ~1e-17 at order ``nu``."""
    for k in range(1, len(_DEBYE)):
        if _DEBYE_MAX[k] / nu**k < 1e-17:
            return k
    raise ValueError(f"order nu={nu} is too small for the Debye expansion")  # pragma: no cover


def _bessel_parts(nu: float, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""``(log Lambda_nu(a), r_nu(a)/a)`` for ``a >= 0`` (module docstring), no overflow or cancellation.

    Three regimes: the power series of :math:`{}_0F_1` for :math:`a^2/4 \le \max(1, \nu+1)`;
    scaled Bessel functions (``ive``) for larger ``a`` when :math:`\nu < 30`; Debye's uniform
    expansion for :math:`\nu \ge 30`, rewritten without the large cancelling terms:

    .. math::

        \log\Lambda_\nu(\nu t) = \nu\big(q - 1 - \log\tfrac{1+q}{2}\big) - \tfrac12\log q
        + \gamma(\nu) + \log\sum_k u_k(1/q)\nu^{-k}, \qquad q = \sqrt{1+t^2},

    :math:`\gamma` the Stirling remainder of :math:`\log\Gamma(\nu+1)`, and its derivative
    :math:`r_\nu(a) = t/(1+q) - t p^2/(2\nu) - t p^3 S'(p)/(\nu S(p))`, :math:`p = 1/q`.
    """
    a = np.asarray(a, dtype=float)
    log_lam = np.empty_like(a)
    rho = np.empty_like(a)
    if nu >= _DEBYE_NU:
        K = _debye_terms(nu)
        # S(p) = sum_k u_k(p) nu^-k as one polynomial in p
        deg = max(len(_DEBYE[k]) for k in range(K + 1))
        coef = np.zeros(deg)
        for k in range(K + 1):
            coef[: len(_DEBYE[k])] += _DEBYE[k] / nu**k
        dcoef = np.polynomial.polynomial.polyder(coef)
        t = a / nu
        q = np.sqrt(1.0 + t * t)
        qm1 = t * t / (1.0 + q)
        p = 1.0 / q
        S = np.polynomial.polynomial.polyval(p, coef)
        dS = np.polynomial.polynomial.polyval(p, dcoef)
        gam = sum(c / nu ** (2 * j + 1) for j, c in enumerate(_STIRLING))
        log_lam[...] = nu * (qm1 - np.log1p(0.5 * qm1)) - 0.5 * np.log(q) + gam + np.log(S)
        rho[...] = (1.0 / (1.0 + q) - p * p / (2 * nu) - p**3 * dS / (nu * S)) / nu
        return log_lam, rho
    x = 0.25 * a * a
    series = x <= max(1.0, nu + 1.0)
    if np.any(series):
        xs = x[series]
        s1 = np.zeros_like(xs)  # sum_{k>=1} x^k / (k! (nu+1)_k)
        s2 = np.zeros_like(xs)  # same with nu + 1 -> nu + 2
        t1 = np.ones_like(xs)
        t2 = np.ones_like(xs)
        for k in range(1, _SERIES_TERMS):
            t1 = t1 * xs / (k * (nu + k))
            t2 = t2 * xs / (k * (nu + 1 + k))
            s1 += t1
            s2 += t2
        log_lam[series] = np.log1p(s1)
        rho[series] = (1.0 + s2) / ((1.0 + s1) * (2.0 * (nu + 1.0)))
    big = ~series
    if np.any(big):
        ab = a[big]
        i0 = special.ive(nu, ab)
        i1 = special.ive(nu + 1.0, ab)
        log_lam[big] = special.gammaln(nu + 1.0) - nu * np.log(0.5 * ab) + np.log(i0) + ab
        rho[big] = i1 / (i0 * ab)
    return log_lam, rho


def _check_order(nu: ArrayLike) -> float:
    v = np.asarray(nu, dtype=float)
    if v.ndim != 0 or not np.isfinite(v) or v < -0.5:
        raise ValueError(f"nu must be a finite number >= -1/2, got {short_repr(nu)}")
    return float(v)


def _check_argument(a: ArrayLike) -> np.ndarray:
    arr = np.asarray(a, dtype=float)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"a must be finite and >= 0, got {short_repr(a)}")
    return arr


def log_normalized_bessel(nu: float, a: ArrayLike) -> np.ndarray:
    r"""Logarithm of :math:`\Lambda_\nu(a) = \Gamma(\nu+1)(2/a)^\nu I_\nu(a) = {}_0F_1(;\nu+1;a^2/4)`.

    :math:`\Lambda_\nu(a)` is the average of :math:`e^{a\langle u, u'\rangle}` over :math:`u'` on the
    sphere :math:`S^{2\nu+1}`; :math:`\Lambda_\nu(0) = 1`.  Accurate to a few units of
    :math:`10^{-16}\max(1, a)` in absolute terms for every :math:`\nu \ge -1/2` and
    :math:`a \ge 0`, without overflow (:math:`\log\Lambda_\nu(a) \le a`).

    Parameters
    ----------
    nu : float
        Order, ``>= -1/2``.
    a : array_like
        Arguments, ``>= 0``.

    Returns
    -------
    ndarray, shape of ``a``

    Examples
    --------
    >>> import numpy as np
    >>> bool(np.isclose(log_normalized_bessel(-0.5, 2.0), np.log(np.cosh(2.0))))
    True
    >>> round(float(log_normalized_bessel(4998.5, 1000.0)), 6)   # S^{9999}: no overflow, no underflow
    49.758247
    """
    return _bessel_parts(_check_order(nu), _check_argument(a))[0]


def bessel_ratio(nu: float, a: ArrayLike) -> np.ndarray:
    r"""The ratio :math:`r_\nu(a) = I_{\nu+1}(a)/I_\nu(a) = \frac{d}{da}\log\Lambda_\nu(a)`, stably.

    Examples
    --------
    >>> import numpy as np
    >>> bool(np.isclose(bessel_ratio(-0.5, 3.0), np.tanh(3.0)))
    True
    """
    a = _check_argument(a)
    return a * _bessel_parts(_check_order(nu), a)[1]


# -- the zonal kernel ------------------------------------------------------------------------------

def _sqrt1m(z: np.ndarray) -> np.ndarray:
    r""":math:`\sqrt{1-z^2}`, accurate near the poles."""
    return np.sqrt(np.maximum((1.0 - z) * (1.0 + z), 0.0))


def _check_d(d) -> int:
    return check_int(d, "d", minimum=2)


def _check_z(z: ArrayLike, name: str) -> np.ndarray:
    arr = np.asarray(z, dtype=float)
    if not np.all(np.isfinite(arr)) or np.any(np.abs(arr) > 1):
        raise ValueError(f"{name} must lie in [-1, 1], got {short_repr(z)}")
    return arr


def zonal_kernel(z: ArrayLike, zp: ArrayLike, beta: float, d: int) -> tuple[np.ndarray, np.ndarray]:
    r"""The zonal interaction kernel on :math:`S^{d-1}` in log scale (module docstring).

    Returns :math:`\log k(z, z')` and :math:`h(z, z')` with

    .. math::

        k(z,z') = e^{\beta z z'}\Lambda_{(d-3)/2}\big(\beta\sqrt{1-z^2}\sqrt{1-z'^2}\big), \qquad
        h(z,z') = z' - \beta z(1-z'^2)\,\frac{r_{(d-3)/2}(a)}{a}\Big|_{a = \beta s s'} ,

    so that the potential is :math:`\int e^{\beta\langle x,y\rangle}d\mu(y) = \int k\,p\,dz'` and the
    :math:`e`-component of :math:`P_x\int e^{\beta\langle x,y\rangle}y\,d\mu(y)` is
    :math:`(1-z^2)\int k\,h\,p\,dz'`.  Stable for :math:`\beta \le 10^3`, :math:`d \le 10^4`
    (and beyond): :math:`\log k \le \beta` never overflows.

    Parameters
    ----------
    z, zp : array_like
        Coordinates :math:`\langle x, e\rangle`, :math:`\langle y, e\rangle` in ``[-1, 1]``; broadcast.
    beta : float
        Inverse temperature, ``>= 0``.
    d : int
        Ambient dimension, ``>= 2``.

    Returns
    -------
    log_k, h : ndarray, the broadcast shape

    Examples
    --------
    On :math:`S^2` (:math:`d = 3`) the kernel is :math:`e^{\beta z z'}I_0(\beta s s')`:

    >>> import numpy as np
    >>> from scipy.special import i0
    >>> log_k, h = zonal_kernel(0.3, -0.5, 2.0, 3)
    >>> bool(np.isclose(np.exp(log_k), np.exp(2.0 * 0.3 * -0.5) * i0(2.0 * np.sqrt(0.91 * 0.75))))
    True
    """
    d = _check_d(d)
    beta = check_nonnegative(beta, "beta")
    z = _check_z(z, "z")
    zp = _check_z(zp, "zp")
    return _kernel(z, zp, beta, d)


def _kernel(z: np.ndarray, zp: np.ndarray, beta: float, d: int) -> tuple[np.ndarray, np.ndarray]:
    z, zp = np.broadcast_arrays(np.asarray(z, dtype=float), np.asarray(zp, dtype=float))
    a = beta * _sqrt1m(z) * _sqrt1m(zp)
    log_lam, rho = _bessel_parts(0.5 * (d - 3), a)
    log_k = beta * z * zp + log_lam
    h = zp - beta * z * ((1.0 - zp) * (1.0 + zp)) * rho
    return log_k, h


def zonal_weight(z: ArrayLike, d: int) -> np.ndarray:
    r"""Density :math:`c_d(1-z^2)^{(d-3)/2}` of :math:`z = \langle x, e\rangle` under the normalized :math:`\sigma`.

    Examples
    --------
    >>> import numpy as np
    >>> float(zonal_weight(0.0, 3))   # uniform on [-1, 1] on S^2
    0.5
    """
    d = _check_d(d)
    z = _check_z(z, "z")
    if d == 3:
        return np.full(np.shape(z), 0.5)
    with np.errstate(divide="ignore", over="ignore"):  # d = 2: an integrable +inf at the poles
        return np.exp(_log_cd(d) + 0.5 * (d - 3) * np.log((1.0 - z) * (1.0 + z)))


def _log_cd(d: int) -> float:
    return float(special.gammaln(d / 2) - special.gammaln((d - 1) / 2) - 0.5 * math.log(math.pi))


def log_cap_volume(z: ArrayLike, d: int) -> np.ndarray:
    r"""Logarithm of :math:`\sigma(\{x : \langle x, e\rangle \ge z\})` (normalized measure).

    The cap is the regularized incomplete beta function :math:`I_{(1-z)/2}(a, a)`,
    :math:`a = (d-1)/2`; where it is below :math:`10^{-280}` its logarithm comes from the
    prefactor :math:`x^a(1-x)^a/(aB(a,a))` and Lentz's continued fraction (no underflow, so
    caps of any size in any dimension).

    Examples
    --------
    >>> import numpy as np
    >>> bool(np.isclose(np.exp(log_cap_volume(0.5, 3)), 0.25))   # Archimedes
    True
    >>> float(log_cap_volume(0.9, 10_000)) < -4000
    True
    """
    d = _check_d(d)
    z = _check_z(z, "z")
    A = 0.5 * (d - 1)
    x = np.atleast_1d(0.5 * (1.0 - z)).astype(float)
    out = np.empty_like(x)
    direct = special.betainc(A, A, x)
    ok = direct > 1e-280
    with np.errstate(divide="ignore"):
        out[ok] = np.log(direct[ok])
    small = ~ok
    if np.any(small):
        xs = x[small]
        with np.errstate(divide="ignore"):
            pre = A * np.log(xs) + A * np.log1p(-xs) - math.log(A) - special.betaln(A, A)
        out[small] = pre + np.log(_betacf(A, A, xs))
    return out.reshape(np.shape(z))


def _betacf(a: float, b: float, x: np.ndarray) -> np.ndarray:
    """Continued fraction of the incomplete beta function (modified Lentz, Numerical Recipes 6.4)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = np.ones_like(x)
    dd = 1.0 - qab * x / qap
    dd = np.where(np.abs(dd) < tiny, tiny, dd)
    dd = 1.0 / dd
    h = dd.copy()
    for m in range(1, 10000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        dd = 1.0 + aa * dd
        dd = np.where(np.abs(dd) < tiny, tiny, dd)
        c = 1.0 + aa / c
        c = np.where(np.abs(c) < tiny, tiny, c)
        dd = 1.0 / dd
        h *= dd * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        dd = 1.0 + aa * dd
        dd = np.where(np.abs(dd) < tiny, tiny, dd)
        c = 1.0 + aa / c
        c = np.where(np.abs(c) < tiny, tiny, c)
        dd = 1.0 / dd
        delta = dd * c
        h *= delta
        if np.all(np.abs(delta - 1.0) < 1e-15):
            return h
    raise SolverError(f"incomplete beta continued fraction did not converge (a={a}, b={b})")  # pragma: no cover


# -- finite volumes --------------------------------------------------------------------------------

#: relative mass defects rescaled silently / with a warning (as in wflow.density); beyond, rejected
_MASS_SILENT = 1e-12
_MASS_WARN = 1e-6
#: rows whose shifted normalizer falls below this are recomputed in log scale
_UNDERFLOW = 1e-200
#: kernel rows built per block (memory of the temporaries: block * n_cells * 8 bytes * ~10)
_BLOCK_ELEMENTS = 1 << 19


class ZonalFV:
    r"""Finite-volume right-hand side of the zonal mean-field equation on :math:`S^{d-1}` (module docstring).

    The state is the vector of band masses :math:`m_i = \mu(\{z_i \le \langle x, e\rangle \le z_{i+1}\})`,
    a probability vector.  :meth:`rhs` returns :math:`dm/dt` and the positivity limit of one
    forward-Euler step, exactly like :class:`wflow.solvers.eulerian.FiniteVolume`:

    .. math::

        \frac{dm_i}{dt} = F_i - F_{i+1}, \qquad
        F_f = \ell_f\big(g_f^+ f_{f-1}^{R} + g_f^- f_f^{L}\big)
              - \kappa^{-1}\ell_f\,\frac{\bar f_f - \bar f_{f-1}}{\bar z_f - \bar z_{f-1}}, \qquad F_0 = F_M = 0,

    :math:`\ell_f = c_d(1-z_f^2)^{(d-1)/2}` (it vanishes at the poles for every :math:`d \ge 2`, and so
    does the :math:`z`-velocity :math:`w = (1-z^2)g`), :math:`\bar f_i = m_i/V_i` the cell average of
    the density w.r.t. :math:`\sigma`, :math:`f^{L,R}` its MC-limited linear reconstruction at the
    two faces (slopes between weighted centroids :math:`\bar z_i`, face values kept in
    :math:`[0, 2\bar f_i]`).  Each flux is added to one cell and subtracted from the other, so
    :math:`\sum_i m_i` is conserved to round-off.  Positivity: a forward-Euler step of size
    :math:`\Delta t \le \Delta t_{\max} = 1/\max_i\big(2\sum_{f\in\partial i}(\ell_f/V_i)(g_f)_{\rm out}
    + \kappa^{-1}\sum_f \ell_f/(V_i\,\Delta\bar z_f)\big)` keeps every :math:`m_i \ge 0`.

    Why :math:`z` and not the polar angle: a smooth zonal function is a smooth function of
    :math:`z` up to the poles (no parity condition, no ghost cells), the exact band volumes,
    centroids and face weights are closed forms in :math:`z`, and :math:`\ell_{\pm1} = 0` makes
    the pole flux exactly zero.  The cells may still be uniform in angle (``grid="angle"``, the
    default: resolves clusters at the poles) or in :math:`z` (``grid="z"``).  Every volume ratio
    is formed in log scale, so cells whose :math:`\sigma`-volume underflows (polar cells for
    large :math:`d`) still carry mass correctly.

    Velocity :math:`g_f` at the interior faces: the centroid rule
    :math:`\sum_j m_j k(z_f,\bar z_j)h(z_f,\bar z_j)` (and the SA normalizer
    :math:`\sum_j m_j k(z_f,\bar z_j)`), with the two dense :math:`(M-1)\times M` matrices built once
    (:func:`zonal_kernel`, row-shifted in log scale); memory :math:`16M^2` bytes
    (270 MB at :math:`M = 4096`).

    Parameters
    ----------
    d : int
        Ambient dimension, ``>= 2`` (:math:`d = 2`: even densities on the circle).
    n_cells : int
        Number of bands ``M >= 4``.
    attention : {"SA", "USA"}
    beta : float
        Inverse temperature, ``>= 0``.
    sign : {1, -1}
        :math:`V = \mathrm{sign}\cdot I` (1: attraction, -1: repulsion).
    kappa : float, optional
        Inverse diffusivity; ``None`` or ``inf``: no noise.
    kernel : {"plain", "rescaled"}
        :math:`e^{\beta\langle x,y\rangle}` (the package's convention) or :math:`e^{\beta(\langle x,y\rangle-1)}`
        (a time change of USA, nothing for SA).  USA in the plain kernel needs :math:`\beta \lesssim 700`.
    grid : {"angle", "z"} or array_like
        Cells uniform in the polar angle, uniform in :math:`z`, or the increasing edges
        :math:`-1 = z_0 < \dots < z_M = 1` themselves.

    Attributes
    ----------
    edges : ndarray, shape (M+1,)
    centers : ndarray, shape (M,)
        Weighted centroids :math:`\bar z_i = \int_{\rm cell} z\,d\sigma / V_i`.
    volumes : ndarray, shape (M,)
        :math:`V_i = \sigma(\text{band } i)`, sum 1 (may underflow to 0 near the poles for large
        ``d``; ``log_volumes`` does not).
    face_weights : ndarray, shape (M+1,)
        :math:`\ell_f`.

    Examples
    --------
    >>> import numpy as np
    >>> fv = ZonalFV(128, 256, attention="SA", beta=4.0)
    >>> m0 = fv.masses_from_function(lambda z: 1 + 0.1 * z)
    >>> dm, dt_max = fv.rhs(m0)
    >>> bool(abs(dm.sum()) < 1e-15), bool(dt_max > 0)
    (True, True)
    >>> bool(dm[-1] > 0)   # attraction: the upper cap gains mass
    True
    """

    name = "zonal-fv-muscl"
    order = 2

    def __init__(self, d: int, n_cells: int, *, attention: str = "SA", beta: float = 1.0, sign: int = 1,
                 kappa: float | None = None, kernel: str = "plain", grid: str | ArrayLike = "angle"):
        self.d = _check_d(d)
        M = check_int(n_cells, "n_cells", minimum=4)
        if attention not in ("SA", "USA"):
            raise ValueError(f"attention must be 'SA' or 'USA', got {attention!r}")
        self.attention = attention
        self.beta = check_nonnegative(beta, "beta")
        if isinstance(sign, bool) or sign not in (1, -1):
            raise ValueError(f"sign must be 1 (V = I) or -1 (V = -I), got {sign!r}")
        self.sign = int(sign)
        if kappa is not None:
            kappa = check_positive(kappa, "kappa", allow_inf=True)
        self.kappa = kappa
        self.inv_kappa = 0.0 if kappa is None or np.isinf(kappa) else 1.0 / kappa
        if kernel not in ("plain", "rescaled"):
            raise ValueError(f"kernel must be 'plain' or 'rescaled', got {kernel!r}")
        self.kernel = kernel
        self._shift = self.beta if kernel == "rescaled" else 0.0
        self.edges = _edges(grid, M)
        self.n_cells = M = self.edges.size - 1
        self.evaluations = 0
        self._geometry()
        self._build_kernel()
        self._energy_logk: np.ndarray | None = None

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_model(cls, model, d: int, n_cells: int, **kwargs) -> "ZonalFV":
        """The scheme for a wflow :class:`~wflow.models.SA` or :class:`~wflow.models.USA` model.

        The model must be zonal: :math:`Q = K = I` and :math:`V = \\pm I` (``None`` counts as I).
        """
        from .models import SA, USA

        if not isinstance(model, (SA, USA)):
            raise ValueError(f"model must be a wflow SA or USA attention block to be solved by ZonalFV, got {short_repr(model)}")
        sign = 1
        for name in ("Q", "K", "V"):
            A = getattr(model, name)
            if A is None:
                continue
            if A.shape != (d, d):
                raise ValueError(f"model.{name} has shape {A.shape}, not ({d}, {d}): the model does not act on S^{d - 1}")
            if np.array_equal(A, np.eye(d)):
                continue
            if name == "V" and np.array_equal(A, -np.eye(d)):
                sign = -1
                continue
            raise ValueError(f"model is not zonal: {name} must be the identity (or V = -I) for the flow to keep "
                             f"zonal densities zonal, got {name} = {short_repr(A)}")
        return cls(d, n_cells, attention=type(model).__name__, beta=model.beta, sign=sign, **kwargs)

    def _geometry(self) -> None:
        d, z, M = self.d, self.edges, self.n_cells
        self.log_volumes = _log_band_volumes(z, d)
        with np.errstate(divide="ignore"):
            self.log_face_weights = _log_cd(d) + 0.5 * (d - 1) * np.log((1.0 - z) * (1.0 + z))
        self.log_face_weights[[0, -1]] = -np.inf
        with np.errstate(under="ignore"):
            self.volumes = np.exp(self.log_volumes)
            self.face_weights = np.exp(self.log_face_weights)
            # lam_left[f] = ell_f / V_{f-1}, lam_right[f] = ell_f / V_f at the interior faces f = 1..M-1
            self._lam_left = np.exp(self.log_face_weights[1:-1] - self.log_volumes[:-1])
            self._lam_right = np.exp(self.log_face_weights[1:-1] - self.log_volumes[1:])
            # centroid: (ell_i - ell_{i+1}) / ((d-1) V_i), both ratios finite
            up = np.concatenate([[0.0], self._lam_right])       # ell_i / V_i
            down = np.concatenate([self._lam_left, [0.0]])      # ell_{i+1} / V_i
        self.centers = np.clip((up - down) / (d - 1), z[:-1], z[1:])
        self._dz_centers = np.diff(self.centers)                 # (M-1,) distance of centroids across each face
        self._off_right = z[1:] - self.centers                   # face offsets from the centroid
        self._off_left = z[:-1] - self.centers
        reach = np.maximum(self._off_right, -self._off_left)
        reach[0], reach[-1] = self._off_right[0], -self._off_left[-1]  # the pole faces carry no flux
        self._reach = reach
        self.spread = self._cell_spread()

    def _cell_spread(self, nodes: int = 8) -> np.ndarray:
        r"""Standard deviation :math:`\varsigma_i` of :math:`z` under :math:`\sigma` restricted to cell ``i``.

        Gauss--Legendre in the polar angle (log-scale weights); no cancellation near the poles.
        """
        x, w = np.polynomial.legendre.leggauss(nodes)
        phi_lo, phi_hi = np.arccos(self.edges[1:]), np.arccos(self.edges[:-1])
        phi = 0.5 * (phi_lo + phi_hi)[:, None] + 0.5 * (phi_hi - phi_lo)[:, None] * x[None, :]
        with np.errstate(divide="ignore"):
            logw = np.log(w)[None, :] + (self.d - 2) * np.log(np.sin(phi))
        logw -= logw.max(axis=1, keepdims=True)
        with np.errstate(under="ignore"):
            wt = np.exp(logw)
        wt /= wt.sum(axis=1, keepdims=True)
        zq = np.cos(phi)
        mean = np.sum(wt * zq, axis=1)
        return np.sqrt(np.sum(wt * (zq - mean[:, None]) ** 2, axis=1))

    def _build_kernel(self) -> None:
        r"""Rows :math:`f` of :math:`k` and :math:`kh` at the two nodes :math:`\bar z_j \pm \varsigma_j` of every cell.

        Stored as half-sums ``A`` and half-differences over :math:`\varsigma_j` ``B`` (so the
        quadrature is :math:`\sum_j m_j(A_{fj} + \hat s_j\varsigma_j^2 B_{fj})`), shifted by the row
        maximum of :math:`\log k` (kept in ``_row_log``).
        """
        zf = self.edges[1:-1]
        M = self.n_cells
        rows = max(1, _BLOCK_ELEMENTS // (2 * M))
        lo = np.maximum(self.centers - self.spread, self.edges[:-1])
        hi = np.minimum(self.centers + self.spread, self.edges[1:])
        half = 0.5 * (hi - lo)
        inv = np.where(half > 0, 1.0 / np.where(half > 0, half, 1.0), 0.0)
        self._E = np.empty((2, M - 1, M))
        self._EH = np.empty((2, M - 1, M))
        self._row_log = np.empty(M - 1)
        for i in range(0, M - 1, rows):
            z = zf[i:i + rows, None]
            lk_lo, h_lo = _kernel(z, lo[None, :], self.beta, self.d)
            lk_hi, h_hi = _kernel(z, hi[None, :], self.beta, self.d)
            top = np.maximum(lk_lo.max(axis=1), lk_hi.max(axis=1))
            with np.errstate(under="ignore"):
                e_lo = np.exp(lk_lo - top[:, None])
                e_hi = np.exp(lk_hi - top[:, None])
            self._E[0, i:i + rows] = 0.5 * (e_hi + e_lo)
            self._E[1, i:i + rows] = 0.5 * (e_hi - e_lo) * inv
            self._EH[0, i:i + rows] = 0.5 * (e_hi * h_hi + e_lo * h_lo)
            self._EH[1, i:i + rows] = 0.5 * (e_hi * h_hi - e_lo * h_lo) * inv
            self._row_log[i:i + rows] = top
        self._nodes = (lo, hi, half)
        if self.attention == "USA":
            excess = float(np.max(self._row_log)) - self._shift
            if excess > 700:
                raise ValueError(f"USA with the plain kernel at beta={self.beta:g} has velocities ~ e^{excess:.0f}, beyond "
                                 f"double precision; use kernel='rescaled' (a time change)")
            with np.errstate(under="ignore"):
                self._row_scale = np.exp(self._row_log - self._shift)

    # -- densities ---------------------------------------------------------------------------------
    def uniform(self) -> np.ndarray:
        """Masses of the uniform measure :math:`\\sigma`: the band volumes, summing to 1."""
        with np.errstate(under="ignore"):
            v = np.exp(self.log_volumes - np.logaddexp.reduce(self.log_volumes))
        return v

    def masses_from_function(self, f: Callable[[np.ndarray], ArrayLike], *, normalize: bool = True,
                             nodes: int = 8) -> np.ndarray:
        r"""Band masses :math:`m_i = \int_{\rm band} f\,d\sigma` of the zonal density :math:`\mu = f(z)\sigma`.

        Gauss--Legendre with ``nodes`` points per cell in the polar angle, where
        :math:`d\sigma = c_d\sin^{d-2}\varphi\,d\varphi` is smooth for every :math:`d \ge 2`, applied to the
        weighted average of ``f``; the band volume itself is exact.

        Parameters
        ----------
        f : callable
            ``f(z)`` for an array ``z`` in ``(-1, 1)``, values ``>= 0``.
        normalize : bool
            Rescale to mass 1 (default).  With ``False`` the mass must already be 1.
        """
        if not callable(f):
            raise TypeError(f"f must be a callable of z in [-1, 1], got {short_repr(f)}")
        x, w = np.polynomial.legendre.leggauss(check_int(nodes, "nodes", minimum=1))
        phi_lo, phi_hi = np.arccos(self.edges[1:]), np.arccos(self.edges[:-1])
        phi = 0.5 * (phi_lo + phi_hi)[:, None] + 0.5 * (phi_hi - phi_lo)[:, None] * x[None, :]
        with np.errstate(divide="ignore"):
            logw = np.log(w)[None, :] + (self.d - 2) * np.log(np.sin(phi))
        logw -= logw.max(axis=1, keepdims=True)
        with np.errstate(under="ignore"):
            wt = np.exp(logw)
        wt /= wt.sum(axis=1, keepdims=True)
        vals = np.asarray(f(np.cos(phi)), dtype=float)
        if vals.shape != phi.shape:
            raise ValueError(f"f must return one value per point (shape {phi.shape}), got shape {vals.shape}")
        if not np.all(np.isfinite(vals)):
            raise ValueError(f"f returned non-finite values, e.g. at z={float(np.cos(phi)[~np.isfinite(vals)][0]):.6g}")
        if np.any(vals < 0):
            i = np.unravel_index(int(np.argmin(vals)), vals.shape)
            raise ValueError(f"f must be a non-negative density, got f({np.cos(phi)[i]:.6g}) = {vals[i]:.6g}")
        with np.errstate(under="ignore"):
            m = self.volumes * np.sum(wt * vals, axis=1)
        if normalize:
            total = m.sum()
            if not total > 0:
                raise ValueError("f has zero mass on the sphere; a density must have mass 1")
            m = m / total
        return self.check_masses(m)

    def check_masses(self, masses: ArrayLike, name: str = "masses") -> np.ndarray:
        """Validate band masses: shape ``(M,)``, finite, ``>= 0``, total 1 (as :class:`wflow.density.Density`).

        A relative mass defect below 1e-12 is rescaled silently, below 1e-6 with a warning;
        beyond, ``ValueError``.
        """
        m = np.asarray(masses)
        if m.dtype == object or not np.issubdtype(m.dtype, np.number) or np.iscomplexobj(m):
            raise TypeError(f"{name} must be a real array, got {short_repr(masses)}")
        m = m.astype(float)
        if m.shape != (self.n_cells,):
            raise ValueError(f"{name} must have shape ({self.n_cells},) (one per band), got {m.shape}")
        if not np.all(np.isfinite(m)):
            raise ValueError(f"{name} contain non-finite entries at bands {np.flatnonzero(~np.isfinite(m))[:5].tolist()}")
        if np.any(m < 0):
            i = int(np.argmin(m))
            raise ValueError(f"{name} must be non-negative, got {m[i]:.6g} in band {i}")
        total = float(m.sum())
        defect = abs(total - 1.0)
        if defect > _MASS_WARN:
            raise ValueError(f"{name} must sum to 1 (a probability measure), got total mass {total:.12g}")
        if defect > _MASS_SILENT:
            import warnings

            warnings.warn(f"{name} total {total:.15g} differs from 1 by {defect:.2g}; rescaled to 1", UserWarning,
                          stacklevel=2)
        return m / total

    def density(self, masses: np.ndarray) -> np.ndarray:
        r"""Cell averages :math:`\bar f_i = m_i/V_i` of the density w.r.t. :math:`\sigma` (uniform: 1)."""
        with np.errstate(divide="ignore", over="ignore", under="ignore"):
            return np.exp(np.log(np.asarray(masses, dtype=float)) - self.log_volumes)

    # -- the right-hand side -----------------------------------------------------------------------
    def face_velocity(self, masses: np.ndarray, slope: np.ndarray | None = None) -> np.ndarray:
        r""":math:`g_f` at the interior faces, shape ``(M-1,)``; the :math:`z`-velocity is :math:`w = (1-z_f^2)g_f`.

        Quadrature of :math:`\int p(z')k\,h\,dz'` (and of :math:`\int p\,k\,dz'` for SA) cell by cell,
        with the density linear in each cell (relative slope ``slope``, default the limited
        reconstruction) and a two-node rule at :math:`\bar z_j\pm\varsigma_j`, :math:`\varsigma_j^2` the
        :math:`\sigma`-variance of :math:`z` in the cell: exact for :math:`(1, z', z'^2)` against
        :math:`\sigma` and for :math:`(1, z')` against :math:`\mu`, so second order (and accurate where
        :math:`\omega` varies on the scale :math:`d^{-1/2}`).
        """
        m = np.asarray(masses, dtype=float)
        if slope is None:
            slope = self._slopes(m)
        self.evaluations += 1
        lo, hi, half = self._nodes
        tilt = self._tilt(slope)
        v = m * tilt * half  # node weights (m/2)(1 -+ tilt): first moment m * slope * spread^2
        num = self._EH[0] @ m + self._EH[1] @ v
        den = self._E[0] @ m + self._E[1] @ v
        bad = den < _UNDERFLOW
        if self.attention == "SA":
            with np.errstate(divide="ignore", invalid="ignore"):
                g = num / den
        else:
            g = self._row_scale * num
        if np.any(bad):
            g[bad] = self._rows_in_log_scale(np.flatnonzero(bad), m, tilt)
        return self.sign * g

    def _tilt(self, slope: np.ndarray) -> np.ndarray:
        lo, hi, half = self._nodes
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(half > 0, slope * self.spread**2 / np.where(half > 0, half, 1.0), 0.0)
        return np.clip(t, -1.0, 1.0)

    def _rows_in_log_scale(self, rows: np.ndarray, m: np.ndarray, tilt: np.ndarray) -> np.ndarray:
        """Velocity rows whose shifted normalizer underflowed, recomputed with the masses in the shift."""
        lo, hi, half = self._nodes
        z = self.edges[1:-1][rows, None]
        nodes = np.concatenate([lo, hi])
        weights = np.concatenate([0.5 * m * (1 - tilt), 0.5 * m * (1 + tilt)])
        log_k, h = _kernel(z, nodes[None, :], self.beta, self.d)
        with np.errstate(divide="ignore"):
            log_km = log_k + np.log(np.maximum(weights, 0.0))[None, :]
        top = log_km.max(axis=1)
        if not np.all(np.isfinite(top)):
            raise ValueError("masses are all zero: a density must have mass 1")
        with np.errstate(under="ignore"):
            E = np.exp(log_km - top[:, None])
        s0, s1 = E.sum(axis=1), (E * h).sum(axis=1)
        if self.attention == "SA":
            return s1 / s0
        with np.errstate(under="ignore"):
            return np.exp(np.minimum(top - self._shift, 700.0)) * s1

    def rhs(self, masses: ArrayLike) -> tuple[np.ndarray, float]:
        """``(dm/dt, dt_max)``: the semi-discrete right-hand side and the positivity step limit.

        Parameters
        ----------
        masses : ndarray, shape (M,)
            Band masses, ``>= 0`` (round-off below zero is treated as zero).

        Returns
        -------
        dm : ndarray, shape (M,)
            Sums to zero up to round-off.
        dt_max : float
            Largest forward-Euler step that keeps every mass non-negative (``inf`` if nothing moves).
        """
        m = np.asarray(masses, dtype=float)
        if m.shape != (self.n_cells,):
            raise ValueError(f"masses must have shape ({self.n_cells},), got {m.shape}")
        if not np.all(np.isfinite(m)):
            raise SolverError(f"non-finite masses at bands {np.flatnonzero(~np.isfinite(m))[:5].tolist()}")
        m = np.maximum(m, 0.0)
        if not m.sum() > 0:
            raise ValueError("masses are all zero: a density must have mass 1")
        M = self.n_cells
        slope = self._slopes(m)
        g = self.face_velocity(m, slope)
        theta_l = np.clip(1.0 + slope * self._off_left, 0.0, 2.0)
        theta_r = np.clip(1.0 + slope * self._off_right, 0.0, 2.0)
        a_left = self._lam_left * m[:-1]    # ell_f fbar_{f-1}
        a_right = self._lam_right * m[1:]   # ell_f fbar_f
        flux = np.maximum(g, 0.0) * a_left * theta_r[:-1] + np.minimum(g, 0.0) * a_right * theta_l[1:]
        rate = np.zeros(M)
        rate[:-1] += 2.0 * self._lam_left * np.maximum(g, 0.0)
        rate[1:] += 2.0 * self._lam_right * np.maximum(-g, 0.0)
        if self.inv_kappa:
            flux -= self.inv_kappa * (a_right - a_left) / self._dz_centers
            rate[:-1] += self.inv_kappa * self._lam_left / self._dz_centers
            rate[1:] += self.inv_kappa * self._lam_right / self._dz_centers
        dm = np.zeros(M)
        dm[:-1] -= flux
        dm[1:] += flux
        if not np.all(np.isfinite(dm)):
            raise SolverError(f"non-finite right-hand side (USA velocity overflow at beta={self.beta:g}?); "
                              f"try kernel='rescaled'")
        top = float(rate.max())
        return dm, (1.0 / top if top > 0 else np.inf)

    #: the name ``wflow.solvers.eulerian.FiniteVolume`` gives the same ``(dm/dt, dt_max)`` under the solver contract
    positivity_rhs = rhs

    def _slopes(self, m: np.ndarray) -> np.ndarray:
        r"""Limited slopes of :math:`f` relative to the cell average, shape ``(M,)``.

        Face values :math:`f^{L,R}_i = \bar f_i(1 + \hat s_i(z_{i,i+1} - \bar z_i))` stay in :math:`[0, 2\bar f_i]`; the neighbour ratios :math:`\bar f_{i\pm1}/\bar f_i` are
        formed in log scale (volumes may underflow), the slope is the MC limiter of the
        one-sided and central differences between centroids, one-sided in the polar cells.
        """
        with np.errstate(divide="ignore"):
            logf = np.log(m) - self.log_volumes
        full = m > 0
        with np.errstate(invalid="ignore", over="ignore", under="ignore"):
            # (ratios beyond e^300 are capped: the limiter bounds the face values by 2 fbar anyway)
            up = np.exp(np.minimum(logf[1:] - logf[:-1], 300.0))       # fbar_{i+1}/fbar_i, i = 0..M-2
            down = np.exp(np.minimum(logf[:-1] - logf[1:], 300.0))     # fbar_{i-1}/fbar_i, i = 1..M-1
        up = np.where(full[:-1], up, 1.0)
        down = np.where(full[1:], down, 1.0)
        dzc = self._dz_centers
        dplus = np.zeros(self.n_cells)
        dminus = np.zeros(self.n_cells)
        dplus[:-1] = (up - 1.0) / dzc
        dminus[1:] = (1.0 - down) / dzc
        slope = np.empty(self.n_cells)
        central = (up[1:] - down[:-1]) / (dzc[1:] + dzc[:-1])
        a, b = 2.0 * dminus[1:-1], 2.0 * dplus[1:-1]
        same = (a > 0) & (b > 0) & (central > 0) | (a < 0) & (b < 0) & (central < 0)
        mag = np.minimum(np.minimum(np.abs(a), np.abs(b)), np.abs(central))
        slope[1:-1] = np.where(same, np.sign(central) * mag, 0.0)
        slope[0], slope[-1] = dplus[0], dminus[-1]
        return np.clip(slope, -1.0 / self._reach, 1.0 / self._reach)

    # -- energy ------------------------------------------------------------------------------------
    def energy(self, masses: ArrayLike) -> float:
        r"""The functional the flow ascends: :math:`\mathrm{sign}\cdot E_\beta` (``wflow.models`` convention).

        .. math::

            E_\beta = \frac{1}{2\beta}\iint k(z, z')\,p(z)p(z')\,dz\,dz'
                    \approx \frac{1}{2\beta}\sum_{i,j} m_i m_j\,k(\bar z_i, \bar z_j),

        times :math:`e^{-\beta}` in the rescaled kernel; at :math:`\beta = 0` the limit
        :math:`\tfrac12(\sum_i m_i\bar z_i)^2`.  Both SA and USA ascend it.  The
        :math:`M\times M` matrix of :math:`\log k` at the centroids is built on the first call.
        """
        m = np.maximum(np.asarray(masses, dtype=float), 0.0)
        if m.shape != (self.n_cells,):
            raise ValueError(f"masses must have shape ({self.n_cells},), got {m.shape}")
        if self.beta == 0:
            return self.sign * 0.5 * float(m @ self.centers) ** 2
        if self._energy_logk is None:
            c = self.centers
            self._energy_logk = _kernel(c[:, None], c[None, :], self.beta, self.d)[0]
        with np.errstate(divide="ignore"):
            lm = np.log(m)
        x = self._energy_logk + lm[:, None] + lm[None, :]
        top = float(x.max())
        with np.errstate(under="ignore"):
            log_e = top + math.log(float(np.exp(x - top).sum()))
        log_e += -math.log(2.0 * self.beta) - self._shift
        if log_e > 709:
            raise SolverError(f"E_beta = e^{log_e:.0f} overflows at beta={self.beta:g}; use kernel='rescaled'")
        return self.sign * math.exp(log_e)

    def __repr__(self) -> str:
        noise = "" if not self.inv_kappa else f", kappa={self.kappa:g}"
        return (f"ZonalFV(d={self.d}, n_cells={self.n_cells}, attention={self.attention!r}, beta={self.beta:g}, "
                f"sign={self.sign}{noise}, kernel={self.kernel!r})")


def _edges(grid, M: int) -> np.ndarray:
    if isinstance(grid, str):
        if grid == "angle":
            z = -np.cos(np.pi * np.arange(M + 1) / M)
        elif grid == "z":
            z = np.linspace(-1.0, 1.0, M + 1)
        else:
            raise ValueError(f"grid must be 'angle', 'z' or an array of edges, got {grid!r}")
        z[0], z[-1] = -1.0, 1.0
        if M % 2 == 0:
            z[M // 2] = 0.0
        return z
    z = np.asarray(grid, dtype=float)
    if z.ndim != 1 or z.size < 5 or not np.all(np.isfinite(z)) or z[0] != -1 or z[-1] != 1 or np.any(np.diff(z) <= 0):
        raise ValueError(f"grid edges must be increasing from -1 to 1 with at least 4 cells, got {short_repr(grid)}")
    return z


def _log_band_volumes(z: np.ndarray, d: int) -> np.ndarray:
    """log sigma(z_i <= <x,e> <= z_{i+1}) from the log caps, without cancellation or underflow."""
    up = log_cap_volume(np.maximum(z, 0.0), d)    # log sigma(<x,e> >= z), z >= 0
    low = log_cap_volume(np.maximum(-z, 0.0), d)  # log sigma(<x,e> <= z), z <= 0
    lo, hi = z[:-1], z[1:]
    out = np.empty(z.size - 1)
    with np.errstate(divide="ignore", invalid="ignore", under="ignore"):
        upper = lo >= 0
        out[upper] = up[:-1][upper] + np.log(-np.expm1(up[1:][upper] - up[:-1][upper]))
        lower = hi <= 0
        out[lower] = low[1:][lower] + np.log(-np.expm1(low[:-1][lower] - low[1:][lower]))
    mid = ~upper & ~lower
    out[mid] = np.log1p(-(np.exp(up[1:][mid]) + np.exp(low[:-1][mid])))
    return out
