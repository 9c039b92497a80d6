r"""Spectral fast summation of rotation-invariant kernel sums on :math:`S^1` and :math:`S^2`.

When :math:`Q = K = I` and :math:`V = vI` the kernel depends on :math:`\langle x, y\rangle`
only, and it separates in Fourier modes (circle, Jacobi--Anger) or spherical harmonics
(:math:`S^2`, Funk--Hecke):

.. math::

    e^{z\cos\psi} = \sum_{k\in\mathbb Z} I_{|k|}(z)\, e^{ik\psi}, \qquad
    e^{z t} = \sum_{\ell\ge 0} (2\ell+1)\, i_\ell(z)\, P_\ell(t)
            = \sum_{\ell\ge0} i_\ell(z) \operatorname{Re}\sum_{m=0}^{\ell}
              \epsilon_m \tilde P_\ell^m(t_x)\tilde P_\ell^m(t_y) e^{im(\varphi_x-\varphi_y)},

with :math:`i_\ell(z) = \sqrt{\pi/2z}\, I_{\ell+1/2}(z)`, :math:`\epsilon_0 = 1`,
:math:`\epsilon_{m>0} = 2` and :math:`\tilde P_\ell^m = \sqrt{(2\ell+1)(\ell-m)!/(\ell+m)!}\,P_\ell^m`
(computed by the standard three-term recurrence in :math:`\ell`, stable to any degree).
Source moments :math:`\sum_j w_j (1, y_j)\,\overline{\text{mode}(y_j)}` cost
:math:`O(M K)` (circle) or :math:`O(M L^2)` (:math:`S^2`); evaluating the truncated
series at the queries costs the same in :math:`N`.  The vector sum uses the
coordinates of :math:`y_j` as extra weight columns.

Points off the sphere
---------------------
Runge--Kutta stages leave the sphere slightly.  With :math:`r_i = |x_i|`,
:math:`\rho_j = |y_j|`, the logit is :math:`a_i \rho_j \langle\hat x_i, \hat y_j\rangle`
with :math:`a_i = |\beta| r_i`.  The query radius enters exactly through per-row
coefficients :math:`I_k(a_i)`, :math:`i_\ell(a_i)` (backward ratio recurrence), the
source radius through the multiplication theorem
:math:`I_\nu(\rho a) = \rho^\nu\sum_{p\ge0} \frac{((\rho^2-1)a/2)^p}{p!} I_{\nu+p}(a)`
(DLMF 10.44.1; the same holds for :math:`i_\ell`), truncated after :math:`P` terms
(:math:`P = 0` on the sphere).  :math:`\beta < 0` is :math:`|\beta|` with the sources
reflected, :math:`y \mapsto -y`, in the logits only.

Scaling and error bound
-----------------------
Rows are scaled by the upper bound of the logits:
:math:`c_i = a_i\bar\rho + \log W`, :math:`\bar\rho = \max(1, \max_j\rho_j)`,
:math:`W = \sum_j w_j`, so ``mass`` lies in :math:`(0, 1]` and never overflows (any
:math:`\beta`).  Write :math:`g_k` for :math:`I_{|k|}` (circle) or :math:`(2\ell+1) i_\ell`
(:math:`S^2`); since :math:`\sum_k g_k(z) = e^z`, :math:`p_k(z) = g_k(z) e^{-z}` is a
probability distribution (on the circle the Skellam law of variance :math:`z`).  Using
:math:`|e^{ik\psi}|, |P_\ell| \le 1`, that :math:`g_k` increases with its argument, that
:math:`I_{\nu+p} \le I_\nu` and that the tails :math:`T_K(z) = \sum_{|k|>K} p_k(z)` increase
with :math:`z`, the error of ``mass`` for every row is at most

.. math::

    \varepsilon = T_K(z_{\max}) + \sum_{p>P}\frac{u^p}{p!}, \qquad
    z_{\max} = |\beta|\, \bar\rho \max_i r_i, \quad u = \tfrac12 |\beta| \max_i r_i \max_j |\rho_j^2 - 1|,

and the error of each component of ``vector`` at most :math:`|v|\bar\rho\,\varepsilon`
(plus rounding, about :math:`10^{-15}`).  :math:`K` and :math:`P` are the smallest that
make :math:`\varepsilon \le` ``tol``.  The tails are Gaussian-like,
:math:`T_K(z) \approx e^{-K^2/2z}`, so :math:`K \approx \sqrt{2 z \log(1/\mathrm{tol})}`:
27 at :math:`\beta = 10` and 75 at :math:`\beta = 100` for ``tol = 1e-12``.

The bound is relative to :math:`e^{c_i}`.  Where the local mass is tiny (a query far from
every source at large :math:`\beta`), the softmax average :math:`s^1/s^0` (error at most
:math:`2|v|\bar\rho\varepsilon/(s^0_i - \varepsilon)`) degrades: rows whose bound exceeds
:math:`\sqrt{\mathrm{tol}}` are recomputed by direct summation (backend ``"numpy"``).
"""

from __future__ import annotations

import logging
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from scipy import special

from ..errors import available_memory
from . import threads as _threads
from .sums import BACKENDS, KernelProblem, KernelSums, register_backend

__all__ = ["SpectralBackend", "SpectralPlan", "spectral_plan", "degree_tail", "DEFAULT_TOL"]

log = logging.getLogger(__name__)

#: Default ``tol`` by dtype of the problem.
DEFAULT_TOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-6}

_EPS = np.finfo(np.float64).eps


def _order_weights(d: int, kmax: int) -> np.ndarray:
    """Multiplicity of each order in :math:`\\sum_k p_k = 1`: 1, 2, 2, ... (circle) or :math:`2\\ell+1`."""
    k = np.arange(kmax + 1, dtype=np.float64)
    return np.where(k == 0, 1.0, 2.0) if d == 2 else 2.0 * k + 1.0


def _scaled_bessel(d: int, z: float, kmax: int) -> np.ndarray:
    r""":math:`h_k(z) e^{-z}` for :math:`k = 0..k_{\max}`: :math:`I_k` (circle) or :math:`i_\ell` (:math:`S^2`)."""
    k = np.arange(kmax + 1, dtype=np.float64)
    if z == 0.0:
        return (k == 0).astype(np.float64)
    if d == 2:
        return special.ive(k, z)
    return np.sqrt(np.pi / (2.0 * z)) * special.ive(k + 0.5, z)


def degree_tail(d: int, z: float, K: int) -> float:
    r"""The truncation bound :math:`T_K(z) = \sum_{|k| > K} g_k(z) e^{-z}` (see module docstring).

    Examples
    --------
    >>> from wflow.kernels.spectral import degree_tail
    >>> f"{degree_tail(2, 10.0, 20):.3e}", degree_tail(2, 10.0, 40) < 1e-20  # circle, z = 10
    ('3.274e-09', True)
    """
    kmax = int(K + 12.0 * math.sqrt(z) + 60)
    p = _order_weights(d, kmax) * _scaled_bessel(d, z, kmax)
    return float(p[K + 1 :].sum())


def _radial_tail(u: float, P: int) -> float:
    """:math:`\\sum_{p > P} u^p / p!` (the source-radius series)."""
    if u == 0.0:
        return 0.0
    term, total = 1.0, 0.0
    for p in range(1, P + 1):
        term *= u / p
    for p in range(P + 1, P + 400):
        term *= u / p
        total += term
        if term < 1e-18 * total:
            break
    return total


def _scaled_bessel_rows(d: int, z: np.ndarray, kmax: int, extra: int) -> np.ndarray:
    r""":math:`h_k(z_i) e^{-z_i}`, shape ``(len(z), kmax + 1)``, by the backward ratio recurrence.

    :math:`q_k = h_k/h_{k-1} = z / (2(k+\nu_0) + z q_{k+1})` (:math:`\nu_0 = 0` or 1/2),
    started at :math:`q = 0` ``extra`` orders above ``kmax`` (Miller / Gauss continued
    fraction; only underflow is possible, never overflow), then multiplied from
    :math:`h_0 e^{-z}` (``ive(0, z)`` or :math:`(1 - e^{-2z})/2z`).
    """
    nu0 = 0.0 if d == 2 else 0.5
    out = np.empty((z.shape[0], kmax + 1))
    q = np.zeros_like(z)
    for k in range(kmax + extra, 0, -1):
        q = z / (2.0 * (k + nu0) + z * q)
        if k <= kmax:
            out[:, k] = q
    if d == 2:
        out[:, 0] = special.ive(0, z)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            h0 = -np.expm1(-2.0 * z) / (2.0 * z)
        out[:, 0] = np.where(z > 0, h0, 1.0)
    np.cumprod(out, axis=1, out=out)
    return out


def _miller_extra(z_max: float) -> int:
    # orders above kmax at which the backward recurrence starts (tests/test_spectral.py)
    return int(30 + 3.0 * math.sqrt(z_max))


#: beyond this |beta| the spectral series (degree ~ beta) is not attempted
MAX_BETA = 1e5


@dataclass(frozen=True)
class SpectralPlan:
    r"""Truncation chosen a priori for one problem.

    Attributes
    ----------
    d : int
        Ambient dimension (2: circle, 3: :math:`S^2`).
    degree : int
        :math:`K` (largest Fourier mode) or :math:`L` (largest harmonic degree).
    radial_terms : int
        :math:`P`, terms of the source-radius series (0 when sources lie on the sphere).
    z_max, u : float
        Arguments of the two tails (module docstring).
    bound : float
        :math:`\varepsilon`, the a-priori bound on the error of ``mass`` in units of :math:`e^{c_i}`.
    tol : float
        The tolerance asked for.

    Examples
    --------
    >>> from wflow.kernels.spectral import spectral_plan
    >>> plan = spectral_plan(2, 10.0, 0.0, 1e-8)
    >>> plan.degree, plan.radial_terms, plan.bound <= plan.tol
    (20, 0, True)
    """

    d: int
    degree: int
    radial_terms: int
    z_max: float
    u: float
    bound: float
    tol: float


def spectral_plan(d: int, z_max: float, u: float, tol: float) -> SpectralPlan:
    """Smallest degree and radial series meeting ``tol`` (see :class:`SpectralPlan`).

    Examples
    --------
    >>> from wflow.kernels.spectral import degree_tail, spectral_plan
    >>> plan = spectral_plan(2, 10.0, 0.0, 1e-8)  # circle, beta |x| |y| <= 10, sources on the sphere
    >>> plan.degree, plan.bound == degree_tail(2, 10.0, plan.degree)
    (20, True)
    """
    if d not in (2, 3):
        raise ValueError(f"the spectral backend works on S^1 (d=2) and S^2 (d=3), got d={d}")
    if not (np.isfinite(tol) and 0.0 < tol < 1.0):
        raise ValueError(f"tol must be in (0, 1), got {tol!r}")
    P = 0
    radial = _radial_tail(u, 0)
    if radial > tol / 4:
        while _radial_tail(u, P) > tol / 2:
            P += 1
            if P > 200:
                raise ValueError(
                    f"sources are too far off the sphere for the spectral backend (|beta| max|rho^2-1|/2 = {u:.3g}); "
                    f"project them onto the sphere or use a direct backend"
                )
        radial = _radial_tail(u, P)
    target = tol - radial
    kmax = int(z_max + 12.0 * math.sqrt(z_max) + 60)
    p = _order_weights(d, kmax) * _scaled_bessel(d, z_max, kmax)
    tails = np.cumsum(p[::-1])[::-1]  # tails[k] = sum_{j >= k} p_j
    below = np.nonzero(tails <= target)[0]
    K = int(below[0]) - 1 if below.size else kmax
    K = max(K, 0)
    bound = float(tails[K + 1]) + radial if K + 1 < tails.size else radial
    return SpectralPlan(
        d=d, degree=K, radial_terms=P, z_max=float(z_max), u=float(u), bound=bound, tol=float(tol)
    )


def _powers(c: np.ndarray, K: int) -> np.ndarray:
    """``c[:, None] ** arange(K + 1)`` by a cumulative product (complex)."""
    E = np.empty((c.shape[0], K + 1), dtype=np.complex128)
    E[:, 0] = 1.0
    E[:, 1:] = c[:, None]
    np.cumprod(E, axis=1, out=E)
    return E


def _circle_moments(ysrc: np.ndarray, Wcols: np.ndarray, K: int, block: int) -> np.ndarray:
    r""":math:`M_{k,c} = \sum_j W_{jc}\, \bar y_j^{\,k}` (solid modes: :math:`\rho_j^k e^{-ik\varphi_j}`), shape (K+1, C)."""
    M = np.zeros((K + 1, Wcols.shape[1]), dtype=np.complex128)
    for j0 in range(0, ysrc.shape[0], block):
        yb = ysrc[j0 : j0 + block]
        E = _powers(yb[:, 0] - 1j * yb[:, 1], K)
        M += E.T @ Wcols[j0 : j0 + block]
    return M


def _circle_eval(xhat: np.ndarray, G: np.ndarray) -> np.ndarray:
    """``Re(E(x) @ G)`` with :math:`E_{ik} = e^{ik\\theta_i}`."""
    E = _powers(xhat[:, 0] + 1j * xhat[:, 1], G.shape[0] - 1)
    return (E @ G).real


def _legendre_coefficients(L: int) -> list[tuple[np.ndarray, np.ndarray]]:
    r"""Recurrence coefficients :math:`a_{\ell m}, b_{\ell m}` for :math:`m \le \ell - 2`."""
    out = []
    for l in range(L + 1):
        m = np.arange(max(l - 1, 0), dtype=np.float64)
        a = np.sqrt((2 * l - 1.0) * (2 * l + 1.0) / ((l - m) * (l + m)))
        b = (
            np.sqrt(
                (2 * l + 1.0) * (l + m - 1.0) * (l - m - 1.0) / ((2 * l - 3.0) * (l - m) * (l + m))
            )
            if l >= 2
            else m
        )
        out.append((a, b))
    return out


def _legendre_rows(t: np.ndarray, s: np.ndarray, L: int, coef):
    r"""Yield :math:`\tilde P_\ell^{0..\ell}(t)`, shape ``(B, ℓ+1)``, for ℓ = 0..L (sin θ = s).

    Sectoral start :math:`\tilde P_m^m = \sqrt{(2m+1)/2m}\, s\,\tilde P_{m-1}^{m-1}`, then
    :math:`\tilde P_{m+1}^m = \sqrt{2m+3}\, t\,\tilde P_m^m` and
    :math:`\tilde P_\ell^m = a_{\ell m} t \tilde P_{\ell-1}^m - b_{\ell m}\tilde P_{\ell-2}^m`
    (Holmes & Featherstone 2002, without the :math:`\sqrt 2` of geodesy).
    """
    B = t.shape[0]
    tt = t[:, None]
    prev1 = np.ones((B, 1))
    prev2 = prev1  # (read from l = 2 on, after the loop has moved it)
    yield prev1
    for l in range(1, L + 1):
        cur = np.empty((B, l + 1))
        a, b = coef[l]
        if l >= 2:
            np.multiply(prev1[:, : l - 1], tt, out=cur[:, : l - 1])
            cur[:, : l - 1] *= a
            cur[:, : l - 1] -= b * prev2[:, : l - 1]
        cur[:, l - 1] = math.sqrt(2 * l + 1.0) * t * prev1[:, l - 1]
        cur[:, l] = math.sqrt((2 * l + 1.0) / (2 * l)) * s * prev1[:, l - 1]
        prev2, prev1 = prev1, cur
        yield cur


def _sphere_angles(p: np.ndarray, conj: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``t = cos θ``, ``s = sin θ`` and :math:`e^{\\mp i\\varphi}` of unit vectors ``p``."""
    s = np.hypot(p[:, 0], p[:, 1])
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(s > 0, (p[:, 0] + (-1j if conj else 1j) * p[:, 1]) / s, 1.0)
    return p[:, 2], s, e


def _sphere_moments(
    yhat: np.ndarray, rho: np.ndarray, Wcols: np.ndarray, L: int, block: int, coef
) -> list[np.ndarray]:
    r""":math:`M_{\ell m c} = \sum_j W_{jc}\,\rho_j^\ell \tilde P_\ell^m(\hat y_j) e^{-im\varphi_j}`, one (ℓ+1, C) array per ℓ."""
    M = [np.zeros((l + 1, Wcols.shape[1]), dtype=np.complex128) for l in range(L + 1)]
    for j0 in range(0, yhat.shape[0], block):
        t, s, e = _sphere_angles(yhat[j0 : j0 + block], conj=True)
        E = _powers(e, L)
        W = Wcols[j0 : j0 + block].copy()
        rb = rho[j0 : j0 + block, None]
        for l, Pl in enumerate(_legendre_rows(t, s, L, coef)):
            M[l] += (Pl * E[:, : l + 1]).T @ W
            W *= rb
    return M


class _Radii(NamedTuple):
    """Of the rows of one system's points: the largest norm, the largest ``| |p| - 1 |`` and
    ``| |p|^2 - 1 |``."""

    r_max: float
    dev: float
    dev2: float


def _radii(p: np.ndarray, block: int) -> _Radii:
    """:class:`_Radii` of the rows of ``p``, shape (n, d), read ``block`` rows at a time."""
    r_max = dev = dev2 = 0.0
    for i0 in range(0, p.shape[0], block):
        r = np.linalg.norm(p[i0 : i0 + block].astype(np.float64, copy=False), axis=1)
        r_max = max(r_max, float(r.max(initial=0.0)))
        dev = max(dev, float(np.abs(r - 1.0).max(initial=0.0)))
        dev2 = max(dev2, float(np.abs(r * r - 1.0).max(initial=0.0)))
    return _Radii(r_max, dev, dev2)


def _same_view(p: np.ndarray, q: np.ndarray) -> bool:
    """Whether ``p`` and ``q`` are the same numbers (one memory, shape, strides and dtype)."""
    return (
        p.__array_interface__["data"][0] == q.__array_interface__["data"][0]
        and p.shape == q.shape
        and p.strides == q.strides
        and p.dtype == q.dtype
    )


@dataclass(frozen=True)
class _System:
    """What both passes over one system need: truncation, scales and the shared coefficients."""

    d: int
    K: int
    P: int
    C: int  # weight columns: 1 (mass) + d (vector)
    beta: float  # |beta|
    reflect: bool  # beta < 0: sources reflected in the logits
    W: float  # total weight
    rho_bar: float
    shared: bool  # every query on the sphere
    h: np.ndarray  # h_k(|beta|) e^{|beta|(1 - rho_bar)}, k = 0..K+P
    fp: np.ndarray  # (|beta|/2)^p / p!
    extra: int  # Miller start above the degree


def _weight_columns(sys: _System, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    r"""Weight columns of the sources ``y`` (float64, not reflected), shape ``(m, (P+1) C)``:
    :math:`(w_j/W)(1, y_j)(\rho_j^2 - 1)^p` for p = 0..P."""
    wn = w.astype(np.float64) / sys.W
    W0 = np.concatenate([wn[:, None]] + ([wn[:, None] * y] if sys.C > 1 else []), axis=1)
    if sys.P == 0:
        return W0
    rho = np.linalg.norm(y, axis=1)
    return np.concatenate(
        [W0 * ((rho * rho - 1.0) ** p)[:, None] for p in range(sys.P + 1)], axis=1
    )


def _unit_rows(sys: _System, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Directions :math:`\hat x_i` (the pole where :math:`x_i = 0`) and :math:`a_i = |\beta| |x_i|`."""
    x = x.astype(np.float64, copy=False)
    r = np.linalg.norm(x, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        xhat = np.where(r[:, None] > 0, x / r[:, None], np.eye(sys.d)[-1])
    return xhat, sys.beta * r


def _query_rows(sys: _System, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_unit_rows` and the per-row :math:`h_0(a_i) e^{-a_i}` (empty when every query is on the sphere)."""
    xhat, a = _unit_rows(sys, x)
    if sys.shared:
        h0 = np.ones(0)
    elif sys.d == 2:
        h0 = special.ive(0, a)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            h0 = np.where(a > 0, -np.expm1(-2.0 * a) / (2.0 * a), 1.0)
    return xhat, a, h0


def _fold(sys: _System, M: np.ndarray) -> np.ndarray:
    """Moments to the series' coefficients: the factor 2 of the orders > 0 and, when every query is
    on the sphere, the one coefficient vector folded in (the p axis then has length 1)."""
    K, P, C = sys.K, sys.P, sys.C
    H = np.stack([sys.h[p : p + K + 1] for p in range(P + 1)], 1)  # (k or l, p)
    if sys.d == 2:
        M = M.reshape(K + 1, P + 1, C, 2)
        M[1:] *= 2.0  # e^{ik psi} + e^{-ik psi}, k >= 1
        G = np.einsum("p,kp,kpcz->kcz", sys.fp, H, M)[:, None] if sys.shared else M
    else:
        M = M.reshape(K + 1, K + 1, P + 1, C, 2)  # (m, l, p, c, re/im)
        M[1:] *= 2.0  # epsilon_m
        G = np.einsum("p,lp,mlpcz->mlcz", sys.fp, H, M)[:, :, None] if sys.shared else M
    return np.ascontiguousarray(G)


def _write_rows(
    sys: _System, out, i0: int, c: np.ndarray, s: np.ndarray, v: float, plan
) -> np.ndarray:
    r"""Rows ``i0 ...`` of ``out = (log_scale, mass, vector)`` from the shifts ``c`` and the sums ``s``
    (mass, vector); returns those of them whose softmax bound exceeds :math:`\sqrt{tol}`."""
    log_scale, mass, vector = out
    i1 = i0 + c.shape[0]
    log_scale[i0:i1] = c
    mass[i0:i1] = s[:, 0]
    if vector is not None:
        vector[i0:i1] = v * s[:, 1:]
    bound = plan.bound
    bad = np.nonzero(2.0 * sys.rho_bar * bound > math.sqrt(plan.tol) * (s[:, 0] - bound))[0]
    return bad + i0 if np.isfinite(c).all() else bad[:0]


def _legendre_tables(L: int) -> tuple[np.ndarray, np.ndarray]:
    """Dense ``A[m, l]``, ``B[m, l]`` (recurrence coefficients, zero where unused)."""
    A = np.zeros((L + 1, L + 1))
    Bc = np.zeros((L + 1, L + 1))
    for l, (a, b) in enumerate(_legendre_coefficients(L)):
        A[: a.size, l] = a
        Bc[: b.size, l] = b
    return A, Bc


class SpectralBackend:
    """Spectral kernel sums (module docstring); ``tol`` bounds the error relative to :math:`e^{c_i}`.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.kernels import kernel_sums
    >>> x = wflow.sphere.uniform(6, 2, seed=0)  # 6 points on the circle
    >>> s = kernel_sums(x, x, np.full(6, 1 / 6), 3.0, backend="spectral", tol=1e-10)
    >>> s.backend, bool(np.allclose(np.exp(s.log_scale) * s.mass, np.exp(3.0 * x @ x.T).mean(axis=1)))
    ('spectral', True)
    """

    name = "spectral"
    reason = ""

    def __init__(self, engine: str = "numba") -> None:
        if engine not in ("numba", "numpy"):
            raise ValueError(f"engine must be 'numba' or 'numpy', got {engine!r}")
        #: "numba" (fused loops) or "numpy" (blocked arrays)
        self.engine = engine

    #: rows per block of the numpy engine (temporaries stay near ``block * K`` complex numbers)
    block = 4096
    #: points per block of the numba engine's passes (work space ``(4d + 8) * stream_block``
    #: float64 numbers per worker thread)
    stream_block = 1 << 16
    #: worker threads over query blocks (NumPy releases the GIL in its loops)
    threads = max(1, min(2, os.cpu_count() or 1))
    #: recompute rows with tiny local mass by direct summation (module docstring)
    direct_fallback = True
    #: direct sums of the fastest CPU backend run at about this many pairs per second
    direct_pairs_per_s = 3e8

    def available(self) -> bool:
        return True

    def why_not(self, problem: KernelProblem) -> str:
        d = problem.x.shape[-1]
        if d not in (2, 3):
            return f"it works on S^1 (d=2) and S^2 (d=3) only, got points of dimension d={d}"
        if abs(problem.beta) > MAX_BETA:
            return (
                f"|beta| = {abs(problem.beta):g} is beyond its range (the series needs a degree ~beta; at most "
                f"{MAX_BETA:g}): use the numba or numpy backend"
            )
        if not problem.is_rotation_invariant():
            return "it needs a rotation-invariant kernel: Q = K = identity and V a multiple of the identity (or None)"
        if problem.tol is not None and not (np.isfinite(problem.tol) and 0.0 < problem.tol < 1.0):
            return f"tol must be in (0, 1), got {problem.tol!r}"
        return ""

    def accepts(self, problem: KernelProblem) -> bool:
        return self.why_not(problem) == ""

    def estimated_seconds(self, problem: KernelProblem) -> float:
        """Rough run time of this backend on a 2-core CPU (used by ``accepts_auto``)."""
        d = problem.x.shape[-1]
        tol = self._tol(problem)
        K = spectral_plan(d, abs(problem.beta), 0.0, tol).degree
        B, n, _ = problem.x.shape
        m = problem.y.shape[1]
        per_point = 8e-9 * (K + 1) if d == 2 else 4e-9 * (K + 1) * (K + 2) / 2
        return B * (n + m) * per_point + 1e-3 * B

    def accepts_auto(self, problem: KernelProblem) -> bool:
        """Only when it takes the problem and is estimated at least 2x faster than a direct sum."""
        if not self.accepts(problem):
            return False
        return 2.0 * self.estimated_seconds(problem) < problem.pairs / self.direct_pairs_per_s

    @staticmethod
    def _tol(problem: KernelProblem) -> float:
        return (
            float(problem.tol) if problem.tol is not None else DEFAULT_TOL.get(problem.dtype, 1e-12)
        )

    def plan(self, problem: KernelProblem) -> SpectralPlan:
        """The truncation (and a-priori bound) this backend uses for ``problem``."""
        return self._plan(problem)[0]

    def _plan(self, problem: KernelProblem) -> tuple[SpectralPlan, list[tuple[_Radii, _Radii]]]:
        """The plan and the radii of each system's queries and sources (read in blocks)."""
        why = self.why_not(problem)
        if why:
            raise ValueError(f"backend 'spectral' cannot compute this kernel sum: {why}")
        radii = []
        for b in range(problem.x.shape[0]):
            rx = _radii(problem.x[b], self.stream_block)
            same = problem.y[b] is problem.x[b] or _same_view(problem.y[b], problem.x[b])
            radii.append((rx, rx if same else _radii(problem.y[b], self.stream_block)))
        r_max = max((rx.r_max for rx, _ in radii), default=0.0)
        rho_bar = max([1.0] + [ry.r_max for _, ry in radii])
        a_max = abs(problem.beta) * r_max
        u = 0.5 * a_max * max((ry.dev2 for _, ry in radii), default=0.0)
        return spectral_plan(problem.x.shape[-1], a_max * rho_bar, u, self._tol(problem)), radii

    def memory_bytes(self, problem: KernelProblem) -> int:
        """Bytes this backend allocates for ``problem`` beyond its input (output and work space).

        Examples
        --------
        >>> import numpy as np
        >>> from wflow.kernels import BACKENDS, KernelProblem
        >>> x = np.broadcast_to([0.0, 0.0, 1.0], (1, 10**8, 3))  # 10^8 points on S^2 (one in memory)
        >>> p = KernelProblem(x=x, y=x, weights=np.ones((1, 10**8)), beta=10.0, Q=None, K=None, V=None,
        ...                   values=True)
        >>> round(BACKENDS["spectral"].memory_bytes(p) / 1e9, 2)  # 4 GB of output: log_scale, mass, vector
        4.02
        """
        B, n, d = problem.x.shape
        out = B * n * (2 + (d if problem.values else 0)) * problem.dtype.itemsize
        if self.engine == "numpy":  # whole-array temporaries: about 12 numbers a point (+ columns)
            return out + 8 * (12 + 2 * d) * (n + problem.y.shape[1])
        rows = min(self.stream_block, max(n, problem.y.shape[1]))
        return out + _threads.num_threads() * rows * 8 * (4 * d + 8)

    def _check_memory(self, problem: KernelProblem) -> None:
        need = self.memory_bytes(problem)
        if need < 2**28:  # a quarter GB: not worth reading /proc/meminfo
            return
        avail = available_memory()
        if need > 0.9 * avail:
            raise ValueError(
                f"x: {problem.x.shape[0] * problem.x.shape[1]} query points need about {need / 2**30:.3g} GiB "
                f"for the spectral sums' output and work space; {avail / 2**30:.3g} GiB is available"
            )

    def __call__(self, problem: KernelProblem) -> KernelSums:
        self._check_memory(problem)  # before anything is read or allocated
        plan, radii = self._plan(problem)
        dtype = problem.dtype
        B, n, d = problem.x.shape
        v = 1.0 if problem.V is None else float(problem.V[0, 0])
        # outputs in the problem's dtype, written block by block
        log_scale = np.empty((B, n), dtype)
        mass = np.empty((B, n), dtype)
        vector = np.empty((B, n, d), dtype) if problem.values else None
        for b in range(B):
            out = (log_scale[b], mass[b], None if vector is None else vector[b])
            bad = self._one(problem, b, plan, radii[b], out, v)
            if self.direct_fallback and bad.size:
                log.debug(
                    "spectral: %d of %d rows recomputed directly (tiny local mass)", bad.size, n
                )
                sub = KernelProblem(
                    x=problem.x[b : b + 1, bad],
                    y=problem.y[b : b + 1],
                    weights=problem.weights[b : b + 1],
                    beta=problem.beta,
                    Q=None,
                    K=None,
                    V=problem.V,
                    values=problem.values,
                    tol=problem.tol,
                )
                direct = BACKENDS["numpy"](sub)
                log_scale[b, bad], mass[b, bad] = direct.log_scale[0], direct.mass[0]
                if vector is not None and direct.vector is not None:  # (both: problem.values)
                    vector[b, bad] = direct.vector[0]
        return KernelSums(log_scale, mass, vector, self.name)

    def _one(self, problem: KernelProblem, b: int, plan: SpectralPlan, radii, out, v: float):
        """System ``b`` into ``out = (log_scale, mass, vector)``; returns the rows whose softmax bound
        :math:`2|v|\\bar\\rho\\varepsilon/(s^0_i - \\varepsilon)` exceeds :math:`\\sqrt{tol}` (module docstring)."""
        d, K, P = plan.d, plan.degree, plan.radial_terms
        rx, ry = radii
        w = problem.weights[b]
        W = float(np.sum(w, dtype=np.float64))
        if W <= 0.0:
            for o in out:
                if o is not None:
                    o[...] = 0.0
            return np.arange(problem.x.shape[1])
        beta = abs(problem.beta)
        rho_bar = max(1.0, ry.r_max)
        shared = rx.dev <= 8 * _EPS  # every query on the sphere: one coefficient vector
        h = _scaled_bessel(d, beta, K + P) * math.exp(beta * (1.0 - rho_bar))
        fact = np.array([1.0 / math.factorial(p) for p in range(P + 1)])
        fp = fact * (0.5 * beta) ** np.arange(P + 1)
        C = 1 + d if problem.values else 1
        sys = _System(
            d, K, P, C, beta, problem.beta < 0, W, rho_bar, shared, h, fp, _miller_extra(plan.z_max)
        )
        if self.engine == "numba":
            moments = self._numba_moments(sys, problem.y[b], w)
            G = _fold(sys, moments)
            return self._numba_eval(sys, G, problem.x[b], out, v, plan)
        c, s = self._numpy_one(sys, problem.x[b], problem.y[b], w)
        return _write_rows(sys, out, 0, c, s, v, plan)

    def _numba_moments(self, sys: _System, y: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Source moments, ``(K+1, [K+1,] (P+1) C, 2)``: one pass over the sources in blocks, one
        accumulator per worker thread."""
        from . import _spectral_numba as kern  # (imported when first used)

        K, S = sys.K, self.stream_block
        parts = _threads.shares(y.shape[0], _threads.num_threads())
        shape = (K + 1,) if sys.d == 2 else (K + 1, K + 1)
        acc = np.zeros((len(parts), *shape, sys.C * (sys.P + 1), 2))
        if sys.d == 3:
            A, Bc = _legendre_tables(K)

        def work(t: int) -> None:
            lo, hi = parts[t]
            for j0 in range(lo, hi, S):
                yb = y[j0 : min(hi, j0 + S)].astype(np.float64)  # (a copy: negated for beta < 0)
                cols = _weight_columns(sys, yb, w[j0 : j0 + yb.shape[0]])
                if sys.reflect:
                    np.negative(yb, out=yb)
                if sys.d == 2:
                    kern.circle_moments(yb, cols, K, 1, 0, 1, acc[t : t + 1])
                else:
                    kern.sphere_moments(yb, cols, K, A, Bc, 1, 0, 1, acc[t : t + 1])

        _threads.parallel(work, len(parts))
        return acc.sum(axis=0)

    def _numba_eval(self, sys: _System, G: np.ndarray, x: np.ndarray, out, v: float, plan):
        """Evaluate the series at the queries in blocks, each worker thread a contiguous share, writing
        into ``out``; returns the rows for the direct fallback."""
        from . import _spectral_numba as kern

        S = self.stream_block
        parts = _threads.shares(x.shape[0], _threads.num_threads())
        found: list[list[np.ndarray]] = [[] for _ in parts]
        if sys.d == 3:
            A, Bc = _legendre_tables(sys.K)
        scale_exp = 1.0 - sys.rho_bar

        def work(t: int) -> None:
            lo, hi = parts[t]
            for i0 in range(lo, hi, S):
                xhat, a, h0 = _query_rows(sys, x[i0 : min(hi, i0 + S)])
                nb = xhat.shape[0]
                s = np.zeros((nb, G.shape[-2]))
                if sys.d == 2:
                    kern.circle_eval(xhat, G, a, h0, not sys.shared, sys.extra, scale_exp, 0, nb, s)
                else:
                    blocks = -(-nb // kern.BLOCK)
                    args = (xhat, G, a, h0, not sys.shared, sys.extra, scale_exp, A, Bc)
                    kern.sphere_eval(*args, 0, blocks, s)
                c = a * sys.rho_bar + math.log(sys.W)
                found[t].append(_write_rows(sys, out, i0, c, s, v, plan))

        _threads.parallel(work, len(parts))
        return np.concatenate([r for rows in found for r in rows] or [np.zeros(0, np.intp)])

    def _numpy_one(self, sys: _System, x: np.ndarray, y: np.ndarray, w: np.ndarray):
        """The reference engine (blocked NumPy arrays over whole systems): ``(log_scale, sums)``."""
        d, K, P, C, rho_bar, shared = sys.d, sys.K, sys.P, sys.C, sys.rho_bar, sys.shared
        h, fp, extra = sys.h, sys.fp, sys.extra
        fact = np.array([1.0 / math.factorial(p) for p in range(P + 1)])
        y = y.astype(np.float64)
        rho = np.linalg.norm(y, axis=1)
        Wcols = _weight_columns(sys, y, w)
        ybasis = -y if sys.reflect else y  # e^{beta<x,y>} = e^{|beta|<x,-y>} for beta < 0
        xhat, a = _unit_rows(sys, x)
        n = xhat.shape[0]
        moments: Any  # (K+1, C) on S^1, one (l+1, C) array per l on S^2
        if d == 2:
            moments = _circle_moments(ybasis, Wcols, K, self.block)
            moments[1:] *= 2.0  # e^{ik psi} + e^{-ik psi} for k >= 1
            coef = None
        else:
            coef = _legendre_coefficients(K)
            with np.errstate(divide="ignore", invalid="ignore"):
                yhat = np.where(rho[:, None] > 0, ybasis / rho[:, None], np.array([0.0, 0.0, 1.0]))
            moments = _sphere_moments(yhat, rho, Wcols, K, self.block, coef)
            for M in moments:
                M[1:] *= 2.0  # epsilon_m
        if shared:  # one coefficient vector for all rows: fold it into the moments
            if d == 2:
                G = sum(
                    fp[p] * h[p : p + K + 1, None] * moments[:, p * C : (p + 1) * C]
                    for p in range(P + 1)
                )
            else:
                G = [
                    sum(fp[p] * h[l + p] * M[:, p * C : (p + 1) * C] for p in range(P + 1))
                    for l, M in enumerate(moments)
                ]

        def rows(i0: int) -> np.ndarray:
            xb = xhat[i0 : i0 + self.block]
            if not shared:
                ab = a[i0 : i0 + self.block]
                H = _scaled_bessel_rows(d, ab, K + P, extra) * np.exp(ab * (1.0 - rho_bar))[:, None]
                fpr = fact[None, :] * (0.5 * ab[:, None]) ** np.arange(P + 1)[None, :]
            if d == 2:
                if shared:
                    return _circle_eval(xb, G)
                E = _powers(xb[:, 0] + 1j * xb[:, 1], K)
                out = np.zeros((xb.shape[0], C))
                for p in range(P + 1):
                    out += (
                        fpr[:, p : p + 1]
                        * ((E * H[:, p : p + K + 1]) @ moments[:, p * C : (p + 1) * C]).real
                    )
                return out
            t, s, e = _sphere_angles(xb, conj=False)
            E = _powers(e, K)
            out = np.zeros((xb.shape[0], C))
            for l, Pl in enumerate(_legendre_rows(t, s, K, coef)):
                A = Pl * E[:, : l + 1]
                if shared:
                    out += (A @ G[l]).real
                else:
                    Hl = (A @ moments[l]).real.reshape(-1, P + 1, C)
                    out += np.einsum("bp,bpc->bc", fpr * H[:, l : l + P + 1], Hl)
            return out

        starts = range(0, n, self.block)
        if self.threads > 1 and n > self.block:
            with ThreadPoolExecutor(self.threads) as pool:
                parts = list(pool.map(rows, starts))
        else:
            parts = [rows(i0) for i0 in starts]
        sums = np.concatenate(parts, axis=0) if parts else np.zeros((0, C))
        return a * rho_bar + math.log(sys.W), sums


register_backend(SpectralBackend(), auto_priority=1)
