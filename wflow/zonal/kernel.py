r"""The zonal kernel on :math:`S^{d-1}` in log scale, stable for :math:`\beta \le 10^3`, :math:`d \le 10^4`
(``docs/zonal.md`` §2, §5)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from scipy import special

from .._typing import ArrayLike
from ..errors import SolverError, check_int, check_nonnegative, short_repr

__all__ = [
    "log_normalized_bessel",
    "bessel_ratio",
    "zonal_kernel",
    "zonal_weight",
    "log_cap_volume",
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
_DEBYE_MAX = [
    float(np.max(np.abs(np.polynomial.polynomial.polyval(np.linspace(0, 1, 1001), u))))
    for u in _DEBYE
]
# Stirling: lgamma(nu + 1) - (nu log nu - nu + log(2 pi nu)/2) = sum_k B_2k / (2k (2k-1) nu^(2k-1))
# fmt: off
_STIRLING = [1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156, -3617 / 122400]
# fmt: on


def _debye_terms(nu: float) -> int:
    """Number of Debye terms for an absolute error below ~1e-17 at order ``nu``."""
    for k in range(1, len(_DEBYE)):
        if _DEBYE_MAX[k] / nu**k < 1e-17:
            return k
    raise ValueError(f"order nu={nu} is too small for the Debye expansion")  # pragma: no cover


def _bessel_parts(nu: float, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""``(log Lambda_nu(a), r_nu(a)/a)`` for ``a >= 0``: power series, ``ive`` or Debye's expansion
    (``docs/zonal.md`` §5), no overflow or cancellation.

    For :math:`\nu \ge 30`, :math:`r_\nu(\nu t) = t/(1+q) - t p^2/(2\nu) - t p^3 S'(p)/(\nu S(p))`,
    :math:`q = \sqrt{1+t^2}`, :math:`p = 1/q`, :math:`S` the Debye sum.
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

    The average of :math:`e^{a\langle u, u'\rangle}` over :math:`u' \in S^{2\nu+1}`; accurate to a few
    :math:`10^{-16}\max(1, a)` absolute for every :math:`\nu \ge -1/2`, :math:`a \ge 0`, no overflow.

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


def check_d(d) -> int:
    """The ambient dimension ``d`` as an int ``>= 2`` (``ValueError`` naming ``d`` otherwise)."""
    return check_int(d, "d", minimum=2)


def _check_z(z: ArrayLike, name: str) -> np.ndarray:
    arr = np.asarray(z, dtype=float)
    if not np.all(np.isfinite(arr)) or np.any(np.abs(arr) > 1):
        raise ValueError(f"{name} must lie in [-1, 1], got {short_repr(z)}")
    return arr


def zonal_kernel(z: ArrayLike, zp: ArrayLike, beta: float, d: int) -> tuple[np.ndarray, np.ndarray]:
    r"""The zonal interaction kernel on :math:`S^{d-1}` in log scale.

    Returns :math:`\log k(z, z')` and :math:`h(z, z')` with

    .. math::

        k(z,z') = e^{\beta z z'}\Lambda_{(d-3)/2}\big(\beta\sqrt{1-z^2}\sqrt{1-z'^2}\big), \qquad
        h(z,z') = z' - \beta z(1-z'^2)\,\frac{r_{(d-3)/2}(a)}{a}\Big|_{a = \beta s s'} ,

    so that the potential is :math:`\int e^{\beta\langle x,y\rangle}d\mu(y) = \int k\,p\,dz'` and the
    :math:`e`-component of :math:`P_x\int e^{\beta\langle x,y\rangle}y\,d\mu(y)` is
    :math:`(1-z^2)\int k\,h\,p\,dz'`; :math:`\log k \le \beta` never overflows.

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
    d = check_d(d)
    beta = check_nonnegative(beta, "beta")
    z = _check_z(z, "z")
    zp = _check_z(zp, "zp")
    return zonal_kernel_unchecked(z, zp, beta, d)


def zonal_kernel_unchecked(
    z: np.ndarray, zp: np.ndarray, beta: float, d: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`zonal_kernel` without its argument checks, for callers that checked them once."""
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
    d = check_d(d)
    z = _check_z(z, "z")
    if d == 3:
        return np.full(np.shape(z), 0.5)
    with np.errstate(divide="ignore", over="ignore"):  # d = 2: an integrable +inf at the poles
        return np.exp(log_zonal_constant(d) + 0.5 * (d - 3) * np.log((1.0 - z) * (1.0 + z)))


def log_zonal_constant(d: int) -> float:
    r""":math:`\log c_d`, the normaliser of :func:`zonal_weight`."""
    return float(special.gammaln(d / 2) - special.gammaln((d - 1) / 2) - 0.5 * math.log(math.pi))


def log_cap_volume(z: ArrayLike, d: int) -> np.ndarray:
    r"""Logarithm of :math:`\sigma(\{x : \langle x, e\rangle \ge z\})` (normalized measure).

    The regularized incomplete beta function :math:`I_{(1-z)/2}(a, a)`, :math:`a = (d-1)/2`; below
    :math:`10^{-280}` in log form by Lentz's continued fraction (no underflow).

    Examples
    --------
    >>> import numpy as np
    >>> bool(np.isclose(np.exp(log_cap_volume(0.5, 3)), 0.25))   # Archimedes
    True
    >>> float(log_cap_volume(0.9, 10_000)) < -4000
    True
    """
    d = check_d(d)
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

    def lentz(aa, dd, c):  # one term of the fraction: the new D and C (never zero)
        dd = 1.0 + aa * dd
        c = 1.0 + aa / c
        return 1.0 / np.where(np.abs(dd) < tiny, tiny, dd), np.where(np.abs(c) < tiny, tiny, c)

    for m in range(1, 10000):
        m2 = 2 * m
        dd, c = lentz(m * (b - m) * x / ((qam + m2) * (a + m2)), dd, c)
        h *= dd * c
        dd, c = lentz(-(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)), dd, c)
        delta = dd * c
        h *= delta
        if np.all(np.abs(delta - 1.0) < 1e-15):
            return h
    msg = f"incomplete beta continued fraction did not converge (a={a}, b={b})"
    raise SolverError(msg)  # pragma: no cover
