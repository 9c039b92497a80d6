r"""Analytic results that the solvers must reproduce (the conventions page of the documentation).

* Funk--Hecke eigenvalues of :math:`e^{\beta\langle x,y\rangle}` on :math:`S^{d-1}`:
  :math:`c_\ell(\beta) = \Gamma(d/2)(2/\beta)^{d/2-1} I_{\ell+d/2-1}(\beta)`, i.e. the
  kernel acts on a degree-:math:`\ell` spherical harmonic (normalized measure) as
  multiplication by :math:`c_\ell`.
* Linear growth rates around the uniform measure (Rigollet 2025, §5):
  USA :math:`\lambda_\ell = \ell(\ell+d-2)c_\ell/\beta`, SA
  :math:`\lambda_\ell = \ell(\ell+d-2)c_\ell/(\beta c_0)`.
* The equiangular reduction (all pairwise inner products equal :math:`\rho`, all radii
  equal :math:`r`) for every normalization scheme (Post-LN, Pre-LN, Peri-LN, Mix-LN, nGPT,
  :math:`\sqrt{}`-scaling; Rigollet §5, Karagodin--Geshkovski--Polyanskiy--Rigollet 2025):
  :func:`equiangular_scheme_rhs`, :func:`equiangular_scheme_solution`, the late-time laws
  :func:`equiangular_asymptotics` and the time to a cosine :func:`equiangular_time`.
* The Kuramoto form on the circle.
* Long context: one attention layer at :math:`\beta = \gamma\log n`, its limit and its
  finite-:math:`n` value (:func:`long_context_limit`, :func:`long_context_cosine`).
* Kernel conventions :math:`e^{\beta\langle x,y\rangle}` and :math:`e^{\beta(\langle x,y\rangle-1)}`:
  :func:`rescaled_time`, :func:`plain_time`, :func:`rescaled_energy`, :func:`plain_energy`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special

from .errors import SolverError, check_int, check_nonnegative, check_positive, short_repr

__all__ = [
    "funk_hecke",
    "growth_rate",
    "most_unstable_mode",
    "SCHEMES",
    "equiangular_rhs",
    "equiangular_solution",
    "equiangular_scheme_rhs",
    "equiangular_scheme_solution",
    "EquiangularSolution",
    "equiangular_asymptotics",
    "EquiangularLaw",
    "equiangular_time",
    "equiangular_configuration",
    "kuramoto_velocity",
    "long_context_limit",
    "long_context_gap",
    "long_context_cosine",
    "rescaled_time",
    "plain_time",
    "rescaled_energy",
    "plain_energy",
    "heat_decay_rate",
]


def funk_hecke(ell, beta: float, d: int) -> np.ndarray:
    r"""Funk--Hecke eigenvalue :math:`c_\ell(\beta) = \Gamma(d/2)(2/\beta)^{d/2-1} I_{\ell+d/2-1}(\beta)`.

    At :math:`\beta = 0` this is the limit (1 for :math:`\ell = 0`, else 0).  On the circle
    (:math:`d = 2`) it is :math:`I_\ell(\beta)`.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.special import iv
    >>> from wflow.theory import funk_hecke
    >>> bool(np.allclose(funk_hecke([0, 1, 2], 2.0, 2), iv([0, 1, 2], 2.0)))  # circle: I_l(beta)
    True
    >>> funk_hecke([0, 1], 0.0, 3).tolist()  # the beta = 0 limit
    [1.0, 0.0]
    """
    d = check_int(d, "d", minimum=2)
    beta = check_nonnegative(beta, "beta")
    ell = np.asarray(ell, dtype=float)
    nu = ell + d / 2 - 1
    if beta == 0:
        return np.where(ell == 0, 1.0, 0.0)
    # log form avoids overflow for large beta: ive(nu, b) = I_nu(b) e^{-b}
    with np.errstate(divide="ignore"):  # ive underflows to 0 for degrees far beyond beta: c = 0
        log_c = (
            special.gammaln(d / 2)
            + (d / 2 - 1) * np.log(2 / beta)
            + np.log(special.ive(nu, beta))
            + beta
        )
    return np.exp(log_c)


def growth_rate(ell, beta: float, d: int, model: str = "USA") -> np.ndarray:
    r"""Growth rate of mode :math:`\ell` around the uniform measure on :math:`S^{d-1}` (V = I).

    USA :math:`\ell(\ell+d-2)c_\ell(\beta)/\beta`; SA :math:`\ell(\ell+d-2)c_\ell(\beta)/(\beta c_0(\beta))`.
    On the circle: USA :math:`k^2 I_k(\beta)/\beta`, SA :math:`k^2 I_k(\beta)/(\beta I_0(\beta))`.
    For V = -I the rates change sign.  At :math:`\beta = 0` the limit :math:`\ell(\ell+d-2)c'_\ell(0)`
    is used (nonzero for :math:`\ell = 1` only: rate :math:`(d-1)/d`).

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.special import iv
    >>> from wflow.theory import growth_rate
    >>> bool(np.isclose(growth_rate(2, 4.0, 2, "USA"), 2**2 * iv(2, 4.0) / 4.0))  # k^2 I_k(beta) / beta
    True
    >>> round(float(growth_rate(1, 0.0, 3)), 6)  # beta = 0: (d - 1) / d
    0.666667
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
    """The degree of largest growth rate (ties to the smaller degree).

    Examples
    --------
    >>> from wflow.theory import most_unstable_mode
    >>> most_unstable_mode(1.0, 3), most_unstable_mode(9.0, 3)
    (1, 4)
    """
    ells = np.arange(1, ell_max + 1)
    return int(ells[np.argmax(growth_rate(ells, beta, d, model))])


# --------------------------------------------------------------------------------------
# Equiangular reduction, every normalization scheme
# --------------------------------------------------------------------------------------

#: Normalization schemes (conventions page), by the names every function here accepts.
SCHEMES = ("post-ln", "pre-ln", "peri-ln", "mix-ln", "ngpt", "sqrt")
_SCHEME_ALIASES = {
    "sqrt-scaling": "sqrt",
    "post": "post-ln",
    "pre": "pre-ln",
    "peri": "peri-ln",
    "mix": "mix-ln",
}
_MODELS = ("SA", "USA")
_CONVENTIONS = ("plain", "rescaled")
#: largest beta for which e^{beta} is a finite float64 (USA in the plain convention)
_BETA_PLAIN_MAX = 700.0


def _check_model(model: Any) -> str:
    if model not in _MODELS:
        raise ValueError(f"model must be 'SA' or 'USA', got {short_repr(model)}")
    return model


def _check_scheme(scheme: Any) -> str:
    if not isinstance(scheme, str):
        raise TypeError(f"scheme must be a string, one of {SCHEMES}, got {short_repr(scheme)}")
    name = _SCHEME_ALIASES.get(scheme.lower(), scheme.lower())
    if name not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {short_repr(scheme)}")
    return name


def _check_real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{name} must be a real number, got {short_repr(value)}")
    v = float(value)
    if not np.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


def _check_rho(rho: Any, n: int, name: str, *, closed: bool = True) -> float:
    rho = _check_real(rho, name)
    lo = -1.0 / (n - 1)
    ok = (lo <= rho <= 1) if closed else (lo < rho < 1)
    if not ok:
        brackets = "[{:.6g}, 1]" if closed else "({:.6g}, 1)"
        raise ValueError(
            f"{name} must lie in {brackets.format(lo)} (-1/(n-1) with n = {n}), got {rho!r}"
        )
    return rho


class _Alpha:
    r"""nGPT step :math:`\alpha(t)`: a constant, a callable, or values on a time grid.

    Values on a grid ``alpha_times`` are interpolated linearly (constant beyond the ends),
    so :math:`\int_0^t\alpha` is exact and the grid times are the only kinks.
    """

    def __init__(self, alpha: Any, alpha_times: Any = None):
        self.breaks: tuple[float, ...] = ()
        if alpha is None:
            raise ValueError(
                "scheme 'ngpt' needs the step alpha (a number > 0, a callable alpha(t) or an array "
                "with alpha_times), got None"
            )
        if callable(alpha):
            if alpha_times is not None:
                raise ValueError(
                    f"alpha_times goes with an array alpha, not a callable; got {short_repr(alpha_times)}"
                )
            self._fn = alpha
            self.kind = "callable"
            return
        if isinstance(alpha, (str, bytes)):
            raise TypeError(
                f"alpha must be a number, a callable or an array, got {short_repr(alpha)}"
            )
        arr = np.asarray(alpha)
        if arr.dtype == object or not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
            raise TypeError(
                f"alpha must be a number, a callable or a real array, got {short_repr(alpha)}"
            )
        arr = arr.astype(float)
        if arr.ndim == 0:
            if alpha_times is not None:
                raise ValueError(
                    f"alpha_times goes with an array alpha, not a number; got {short_repr(alpha_times)}"
                )
            self.const = check_positive(float(arr), "alpha")
            self.kind = "constant"
            return
        if arr.ndim != 1 or arr.size < 1:
            raise ValueError(f"alpha as an array must be 1-d and non-empty, got shape {arr.shape}")
        if not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise ValueError(f"alpha values must be finite and >= 0, got {short_repr(arr)}")
        if alpha_times is None:
            raise ValueError(
                "alpha given as an array needs alpha_times (the times of its values), got None"
            )
        times = np.asarray(alpha_times, dtype=float)
        if times.shape != arr.shape:
            raise ValueError(
                f"alpha_times must have the shape of alpha {arr.shape}, got {times.shape}"
            )
        if not np.all(np.isfinite(times)) or np.any(np.diff(times) <= 0):
            raise ValueError(
                f"alpha_times must be finite and strictly increasing, got {short_repr(times)}"
            )
        self.kind = "grid"
        self.times, self.values = times, arr
        grid = np.unique(np.concatenate([[0.0], times[times > 0]]))
        vals = np.interp(grid, times, arr)
        self._grid, self._vals = grid, vals
        self._cum = np.concatenate([[0.0], np.cumsum(np.diff(grid) * (vals[1:] + vals[:-1]) / 2)])
        self.breaks = tuple(float(s) for s in grid[1:])

    def __call__(self, t: float) -> float:
        if self.kind == "constant":
            return self.const
        if self.kind == "grid":
            return float(np.interp(t, self.times, self.values))
        v = self._fn(t)
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise TypeError(
                f"alpha(t) must return a real number, got alpha({t!r}) = {short_repr(v)}"
            ) from None
        if not np.isfinite(v) or v < 0:
            raise ValueError(f"alpha(t) must be finite and >= 0, got alpha({t!r}) = {v!r}")
        return v

    def integral(self, t: Any) -> np.ndarray:
        r""":math:`\int_0^t \alpha(s)\,ds` (exact for constants and grids, ``quad`` for callables)."""
        t = np.asarray(t, dtype=float)
        if self.kind == "constant":
            return self.const * t
        if self.kind == "grid":
            i = np.clip(np.searchsorted(self._grid, t, side="right") - 1, 0, len(self._grid) - 1)
            end = np.interp(t, self.times, self.values)
            return self._cum[i] + (t - self._grid[i]) * (self._vals[i] + end) / 2
        from scipy.integrate import quad

        flat = [
            quad(self, 0.0, float(s), limit=200, epsabs=0.0, epsrel=1e-12)[0] for s in t.ravel()
        ]
        return np.asarray(flat).reshape(t.shape)


class _Equiangular:
    """Validated parameters of one equiangular system and its right-hand side in ``(u, r)``, ``u = 1 - rho``."""

    def __init__(
        self,
        beta: Any,
        n: Any,
        model: Any,
        scheme: Any,
        convention: Any = "plain",
        tau: Any = None,
        alpha: Any = None,
        alpha_times: Any = None,
    ):
        self.beta = check_nonnegative(beta, "beta")
        self.n = check_int(n, "n", minimum=2)
        self.model = _check_model(model)
        self.scheme = _check_scheme(scheme)
        if convention not in _CONVENTIONS:
            raise ValueError(
                f"convention must be 'plain' (e^(beta<x,y>)) or 'rescaled' (e^(beta(<x,y>-1))), "
                f"got {short_repr(convention)}"
            )
        self.convention = convention
        if self.model == "USA" and convention == "plain" and self.beta > _BETA_PLAIN_MAX:
            raise ValueError(
                f"beta = {self.beta!r} overflows e^beta in the plain USA kernel e^(beta<x,y>) "
                f"(beta <= {_BETA_PLAIN_MAX:g}); use convention='rescaled'"
            )
        self.tau: float | None = None
        if self.scheme == "mix-ln":
            if tau is None:
                raise ValueError(
                    "scheme 'mix-ln' needs the switch time tau (a number >= 0), got None"
                )
            self.tau = check_nonnegative(tau, "tau")
        elif tau is not None:
            raise ValueError(
                f"tau is only used by scheme 'mix-ln', got tau = {short_repr(tau)} with "
                f"scheme {self.scheme!r}"
            )
        self.alpha: _Alpha | None = None
        if self.scheme == "ngpt":
            self.alpha = _Alpha(alpha, alpha_times)
        elif alpha is not None or alpha_times is not None:
            raise ValueError(
                f"alpha is only used by scheme 'ngpt', got alpha = {short_repr(alpha)} with "
                f"scheme {self.scheme!r}"
            )
        self.breaks = (
            (self.tau,) if self.tau is not None else (self.alpha.breaks if self.alpha else ())
        )

    # self weight a at u; USA's is a constant (1/n carried, e^beta in the plain kernel)
    def self_weight(self, u: np.ndarray, exp: Callable = np.exp) -> np.ndarray:
        n = self.n
        if self.model == "SA":
            return 1.0 / (1.0 + (n - 1) * exp(-self.beta * u))
        scale = math.exp(self.beta) if self.convention == "plain" else 1.0
        return scale / n + 0.0 * u

    def phase(self, t: float) -> str:
        """The scheme in force at time ``t`` (Mix-LN: Post-LN for t <= tau, then Pre-LN)."""
        if self.tau is not None:  # (set for mix-ln alone)
            return "post-ln" if t <= self.tau else "pre-ln"
        return self.scheme

    def rates(self, t: float, u: Any, r: Any, phase: str | None = None) -> tuple[Any, Any]:
        """``(u', r')`` with ``u = 1 - rho`` (the schemes' table, written in u to keep 1-rho accurate)."""
        phase = phase or self.phase(t)
        n = self.n
        # plain floats (the ODE solver's scalar state) go through math: 10x less overhead than numpy scalars
        scalar = isinstance(u, float)
        exp, sqrt = (math.exp, math.sqrt) if scalar else (np.exp, np.sqrt)
        q = exp(-self.beta * u)  # b / a = e^{-beta(1-rho)}
        a = self.self_weight(u, exp)
        b = a * q
        rho = 1.0 - u
        g = u * (n - (n - 1) * u)  # (1 - rho)(1 + (n-1) rho)
        push = 2.0 * b * g  # 2 b (1-rho)(1+(n-1)rho): rho' for speed divisor 1
        zero = 0.0 * push
        if phase == "post-ln":
            return -push, zero
        if phase == "sqrt":
            return -push / sqrt(t + 1.0), zero
        inner = 1.0 + (n - 1) * q * rho  # <theta, A> / a
        if phase == "pre-ln":
            return -push / r, a * inner
        norm = sqrt(
            1.0 + 2 * (n - 1) * q * rho + q * q * (n - 1) * (1 + (n - 2) * rho)
        )  # ||A|| / a
        if phase == "peri-ln":
            return -push / (r * a * norm), inner / norm
        # ngpt: speed divisor ||A|| / alpha(t)
        alpha = self.alpha
        assert alpha is not None  # (set for ngpt alone)
        return -alpha(t) * push / (a * norm), zero

    def solve(
        self,
        u0: float,
        r0: float,
        t_end: float,
        *,
        u_event: float | None = None,
        rtol: float,
        atol: float,
    ) -> tuple[Any, float | None, int]:
        """Integrate to ``t_end`` piece by piece between the kinks (tau, alpha grid); dense output."""
        from scipy.integrate import OdeSolution, solve_ivp

        edges = [0.0, *sorted(s for s in self.breaks if 0.0 < s < t_end), t_end]
        ts, interpolants, nfev, t_hit = [0.0], [], 0, None
        y = np.array([u0, r0], dtype=float)
        # 1-rho is controlled relatively (it decays to 0), r absolutely and relatively
        tol = np.array([1e-300, atol])
        for lo, hi in zip(edges[:-1], edges[1:]):
            if hi <= lo:
                continue
            phase = self.phase(0.5 * (lo + hi))
            events = None
            if u_event is not None:

                def events(_t, yy, _target=u_event):
                    return yy[0] - _target

                events.terminal, events.direction = True, -1  # type: ignore[attr-defined]
            sol = solve_ivp(
                lambda t, yy: np.array(self.rates(t, float(yy[0]), float(yy[1]), phase)),
                (lo, hi),
                y,
                method="DOP853",
                rtol=rtol,
                atol=tol,
                dense_output=True,
                events=events,
            )
            nfev += sol.nfev
            if sol.status == -1:
                raise SolverError(
                    f"equiangular ODE ({self.scheme}, beta = {self.beta}, n = {self.n}) failed at "
                    f"t = {sol.t[-1]:.6g}: {sol.message}; loosen rtol"
                )
            ts.extend(sol.sol.ts[1:])
            interpolants.extend(sol.sol.interpolants)
            y = sol.y[:, -1]
            if u_event is not None and len(sol.t_events[0]):
                t_hit = float(sol.t_events[0][0])
                break
        return OdeSolution(np.asarray(ts), interpolants), t_hit, nfev


def equiangular_scheme_rhs(
    rho,
    r,
    beta: float,
    n: int,
    model: str = "SA",
    scheme: str = "post-ln",
    *,
    t: float = 0.0,
    tau: float | None = None,
    alpha=None,
    alpha_times=None,
    convention: str = "plain",
) -> tuple[np.ndarray, np.ndarray]:
    r"""Right side :math:`(\rho', r')` of the equiangular reduction for a normalization scheme.

    All pairwise cosines of the directions equal :math:`\rho` and all radii equal
    :math:`r`.  The attention average of token :math:`i` is
    :math:`A_i = a\theta_i + b\sum_{j\ne i}\theta_j` with, for SA,

    .. math::

        a = \frac{e^{\beta}}{Z},\quad b = \frac{e^{\beta\rho}}{Z},\quad Z = e^{\beta} + (n-1)e^{\beta\rho},

    and for USA :math:`a = e^{\beta}/n`, :math:`b = e^{\beta\rho}/n` (rescaled convention:
    :math:`a = 1/n`, :math:`b = e^{-\beta(1-\rho)}/n`).  With the scheme's speed divisor
    :math:`s` and radius law,

    .. math::

        \rho' = \frac{2}{s}\,b\,(1-\rho)\,(1+(n-1)\rho),\qquad
        \langle\theta_i, A_i\rangle = a + (n-1)b\rho,\qquad
        \|A_i\|^2 = a^2 + 2ab(n-1)\rho + b^2(n-1)(1+(n-2)\rho),

    ============  =======================================  =====================================
    scheme        :math:`s`                                 :math:`r'`
    ============  =======================================  =====================================
    ``post-ln``   1                                         0
    ``pre-ln``    :math:`r`                                 :math:`\langle\theta, A\rangle`
    ``mix-ln``    1 for :math:`t\le\tau`, then :math:`r`    0, then :math:`\langle\theta, A\rangle`
    ``peri-ln``   :math:`r\|A\|`                            :math:`\langle\theta, A\rangle/\|A\|`
    ``ngpt``      :math:`\|A\|/\alpha(t)`                   0
    ``sqrt``      :math:`\sqrt{t+1}`                        0
    ============  =======================================  =====================================

    Parameters
    ----------
    rho, r : array_like
        Common cosine (in :math:`[-1/(n-1), 1]`) and common radius (> 0); broadcast.
    beta : float
        Inverse temperature, >= 0.
    n : int
        Number of tokens, >= 2.
    model : {'SA', 'USA'}
    scheme : str
        One of :data:`SCHEMES` (``'sqrt-scaling'`` is accepted for ``'sqrt'``).
    t : float
        Time (used by ``sqrt``, ``mix-ln``, ``ngpt``).
    tau : float, optional
        Mix-LN switch time (required for ``mix-ln``).
    alpha : float, callable or array, optional
        nGPT step (required for ``ngpt``): a number > 0, :math:`\alpha(t)`, or values at
        ``alpha_times`` (interpolated linearly, constant beyond the ends).
    convention : {'plain', 'rescaled'}
        Kernel :math:`e^{\beta\langle x,y\rangle}` or :math:`e^{\beta(\langle x,y\rangle-1)}`
        (changes USA only).

    Returns
    -------
    drho, dr : ndarray

    Examples
    --------
    >>> drho, dr = equiangular_scheme_rhs(0.5, 2.0, 1.0, 4, "SA", "pre-ln")
    >>> bool(np.isclose(drho, equiangular_rhs(0.5, 1.0, 4, "SA") / 2.0))
    True
    """
    sys = _Equiangular(beta, n, model, scheme, convention, tau, alpha, alpha_times)
    rho = np.asarray(rho, dtype=float)
    r = np.asarray(r, dtype=float)
    if np.any(~np.isfinite(rho)) or np.any(rho < -1.0 / (sys.n - 1) - 1e-15) or np.any(rho > 1):
        raise ValueError(
            f"rho must lie in [-1/(n-1), 1] = [{-1 / (sys.n - 1):.6g}, 1], got {short_repr(rho)}"
        )
    if np.any(~np.isfinite(r)) or np.any(r <= 0):
        raise ValueError(f"r must be finite and > 0, got {short_repr(r)}")
    du, dr = sys.rates(_check_real(t, "t"), 1.0 - rho, r)
    return -du, dr + np.zeros_like(du)


@dataclass(frozen=True)
class EquiangularSolution:
    """Solution of an equiangular ODE: values at the requested times and dense output.

    Attributes
    ----------
    t : ndarray, shape (m,)
        Requested times.
    rho, r : ndarray, shape (m,)
        Common cosine and radius at ``t``.
    gap : ndarray, shape (m,)
        :math:`1-\\rho` (integrated as the state, so it keeps its relative accuracy when
        :math:`\\rho` rounds to 1).
    scheme, model : str
    nfev : int
        Right-hand-side evaluations.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.theory import equiangular_scheme_solution
    >>> sol = equiangular_scheme_solution([0.0, 5.0], 1.0, 4, "SA", "pre-ln", rho0=0.2)
    >>> sol.t.tolist(), sol.gap.round(6).tolist(), bool(np.allclose(sol.gap, 1 - sol.rho))
    ([0.0, 5.0], [0.8, 0.042381], True)
    """

    t: np.ndarray
    rho: np.ndarray
    r: np.ndarray
    gap: np.ndarray
    scheme: str
    model: str
    nfev: int
    dense: Any = field(repr=False)

    def gap_at(self, t) -> np.ndarray:
        """:math:`1-\\rho` at any times in ``[0, t.max()]`` (dense output)."""
        return self.dense(np.asarray(t, dtype=float))[0]

    def rho_at(self, t) -> np.ndarray:
        """:math:`\\rho` at any times in ``[0, t.max()]``."""
        return 1.0 - self.gap_at(t)

    def r_at(self, t) -> np.ndarray:
        """The radius at any times in ``[0, t.max()]``."""
        return self.dense(np.asarray(t, dtype=float))[1]


def _check_times(t: Any) -> np.ndarray:
    t = np.atleast_1d(np.asarray(t, dtype=float))
    if t.ndim != 1 or t.size == 0 or not np.all(np.isfinite(t)) or np.any(t < 0):
        raise ValueError(
            f"t must be a non-empty 1-d array of finite times >= 0, got {short_repr(t)}"
        )
    return t


def equiangular_scheme_solution(
    t,
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
    rtol: float = 1e-13,
    atol: float = 1e-14,
) -> EquiangularSolution:
    r"""Solve the equiangular ODE of a normalization scheme (see :func:`equiangular_scheme_rhs`).

    The state is :math:`(1-\rho, r)`, integrated by scipy's DOP853 with dense output,
    piece by piece between the kinks of the right side (the Mix-LN switch :math:`\tau`,
    the grid of an array :math:`\alpha`).  :math:`1-\rho` is controlled relatively
    (``rtol``), the radius with ``rtol`` and ``atol``.

    Parameters
    ----------
    t : array_like, shape (m,)
        Output times, >= 0.
    beta, n, model, scheme, tau, alpha, alpha_times, convention
        As in :func:`equiangular_scheme_rhs`.
    rho0 : float
        Initial cosine in :math:`[-1/(n-1), 1]`.
    r0 : float
        Initial radius (> 0).

    Returns
    -------
    EquiangularSolution

    Examples
    --------
    >>> sol = equiangular_scheme_solution([0.0, 5.0], 1.0, 4, "SA", "pre-ln", rho0=0.2)
    >>> sol.rho.round(6).tolist(), sol.r.round(6).tolist()
    ([0.2, 0.957619], [1.0, 5.255717])
    """
    sys = _Equiangular(beta, n, model, scheme, convention, tau, alpha, alpha_times)
    t = _check_times(t)
    rho0 = _check_rho(rho0, sys.n, "rho0")
    r0 = check_positive(r0, "r0")
    rtol = check_positive(rtol, "rtol")
    atol = check_positive(atol, "atol")
    t_end = float(t.max())
    if t_end == 0.0:  # nothing to integrate
        const = np.array([[1.0 - rho0], [r0]])
        dense = lambda s: np.broadcast_to(const, (2, *np.shape(s)))  # noqa: E731
        nfev = 0
    else:
        dense, _, nfev = sys.solve(1.0 - rho0, r0, t_end, rtol=rtol, atol=atol)
    u, r = dense(t)
    return EquiangularSolution(
        t=t,
        rho=1.0 - u,
        r=np.array(r),
        gap=np.array(u),
        scheme=sys.scheme,
        model=sys.model,
        nfev=nfev,
        dense=dense,
    )


def equiangular_rhs(rho, beta: float, n: int, model: str = "SA") -> np.ndarray:
    r"""Right side of the equiangular reduction :math:`\rho' = F(\rho)` (Post-LN).

    .. math::

        \text{SA: } \rho' = \frac{2(1-\rho)((n-1)\rho+1)}{e^{\beta(1-\rho)} + n - 1},\qquad
        \text{USA: } \rho' = \frac{2}{n}e^{\beta\rho}(1-\rho)((n-1)\rho+1).

    The Post-LN case of :func:`equiangular_scheme_rhs`.

    Examples
    --------
    >>> float(equiangular_rhs(0.0, 0.0, 2, "SA"))
    1.0
    """
    rho = np.asarray(rho, dtype=float)
    if model == "SA":
        return 2 * (1 - rho) * ((n - 1) * rho + 1) / (np.exp(beta * (1 - rho)) + n - 1)
    if model == "USA":
        return (2.0 / n) * np.exp(beta * rho) * (1 - rho) * ((n - 1) * rho + 1)
    raise ValueError(f"model must be 'SA' or 'USA', got {model!r}")


def equiangular_solution(
    rho0: float,
    t,
    beta: float,
    n: int,
    model: str = "SA",
    *,
    rtol: float = 1e-13,
    atol: float = 1e-15,
) -> np.ndarray:
    """Solve the Post-LN equiangular ODE from ``rho0``; returns :math:`\\rho` at times ``t``.

    Shorthand for ``equiangular_scheme_solution(t, beta, n, model, "post-ln", rho0=rho0).rho``
    (DOP853, tight tolerances).

    Examples
    --------
    >>> equiangular_solution(0.0, [0.0, 1.0], 0.0, 2).round(6).tolist()  # rho' = 1 - rho^2
    [0.0, 0.761594]
    """
    return equiangular_scheme_solution(
        t, beta, n, model, "post-ln", rho0=rho0, rtol=rtol, atol=atol
    ).rho


def equiangular_configuration(n: int, rho: float) -> np.ndarray:
    r"""``n`` unit vectors in :math:`\mathbb{R}^n` with all pairwise inner products ``rho``.

    :math:`x_i = a e_i + b\mathbf{1}` with :math:`a^2 + 2ab + nb^2 = 1`, :math:`2ab + nb^2 = \rho`;
    needs :math:`-1/(n-1) < \rho < 1`.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.theory import equiangular_configuration
    >>> x = equiangular_configuration(4, 0.3)
    >>> x.shape, bool(np.allclose(x @ x.T, 0.7 * np.eye(4) + 0.3))  # unit norms, cosines 0.3
    ((4, 4), True)
    """
    n = check_int(n, "n", minimum=2)
    if not -1.0 / (n - 1) < rho < 1:
        raise ValueError(f"rho must lie in (-1/(n-1), 1) = ({-1 / (n - 1):.4g}, 1), got {rho}")
    a = np.sqrt(1 - rho)
    # n b^2 + 2 a b - rho = 0, positive root
    b = (-a + np.sqrt(a * a + n * rho)) / n
    return a * np.eye(n) + b * np.ones((n, n))


def kuramoto_velocity(theta, beta: float) -> np.ndarray:
    r"""USA on the circle in angles: :math:`\theta_i' = -\frac1n\sum_j e^{\beta\cos(\theta_i-\theta_j)}\sin(\theta_i-\theta_j)`.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.theory import kuramoto_velocity
    >>> v = kuramoto_velocity(np.array([0.0, 0.5, 2.0]), 1.0)
    >>> v.round(6).tolist(), round(float(v.sum()), 12)  # odd coupling: the mean angle is at rest
    ([0.584271, -0.027482, -0.556789], 0.0)
    """
    theta = np.asarray(theta, dtype=float)
    diff = theta[:, None] - theta[None, :]
    return -np.mean(np.exp(beta * np.cos(diff)) * np.sin(diff), axis=1)


# --------------------------------------------------------------------------------------
# Asymptotic speeds near rho = 1
# --------------------------------------------------------------------------------------


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


def _log_constant_sphere(sys: _Equiangular, u0: float, lam: float, ngpt: bool) -> float:
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


def _log_constant_radial(sys: _Equiangular, u0: float, r0: float, slope: float) -> float:
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

    Derivation near :math:`\rho = 1`.  Write :math:`u = 1-\rho` and :math:`m_0 = n\,b|_{u=0}`
    (SA: :math:`m_0 = 1`; USA: :math:`m_0 = e^{\beta}`, or 1 in the rescaled convention).
    Then :math:`(1-\rho)(1+(n-1)\rho) = u(n-(n-1)u)` and :math:`\|A\| \to m_0`,
    :math:`\langle\theta,A\rangle\to m_0`, so to first order

    .. math::

        u' \simeq -\frac{2m_0}{s}\,u, \qquad
        s = 1,\ \sqrt{t+1},\ m_0/\alpha(t),\ r,\ r\,m_0

    for Post-LN, :math:`\sqrt{}`-scaling, nGPT, Pre-LN, Peri-LN, which gives

    * Post-LN: :math:`1-\rho \sim C e^{-2m_0 t}` (SA :math:`e^{-2t}`, plain USA :math:`e^{-2e^{\beta}t}`);
    * :math:`\sqrt{}`-scaling (a time change :math:`T = 2\sqrt{t+1}-2` of Post-LN):
      :math:`1-\rho\sim C e^{-4m_0\sqrt{t+1}}`;
    * nGPT: :math:`1-\rho \sim C e^{-2\int_0^t\alpha}` for SA and USA alike (the field
      :math:`\alpha P_\theta A/\|A\|` does not see the scale of :math:`A`);
    * Pre-LN: :math:`r' \to m_0` so :math:`r\sim m_0 t` and :math:`u'\simeq -2u/t`:
      :math:`1-\rho\sim C t^{-2}`; Peri-LN: :math:`r'\to 1`, the same :math:`t^{-2}`;
      Mix-LN is Pre-LN after :math:`\tau`.

    The constants are exact integrals of the separable ODE (``scipy.integrate.quad``):
    for the schemes on the sphere :math:`\log C = \log u_0 + \int_0^{u_0}(\lambda/G(v) - 1/v)\,dv`
    with :math:`u' = -\dot T\,G(u)`; for Pre-/Peri-LN
    :math:`C = r_0^2u_0\exp\big(\int_0^{u_0}\frac{e^{\beta v}-1}{v(n-(n-1)v)}dv\big)/m^2`
    with :math:`m = m_0` (Pre-LN) or 1 (Peri-LN); Mix-LN uses :math:`u(\tau)` from the ODE.

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
    sys = _Equiangular(beta, n, model, scheme, convention, tau, alpha, alpha_times)
    rho0 = _check_rho(rho0, sys.n, "rho0")
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


# --------------------------------------------------------------------------------------
# Time to reach a cosine (phase diagram overlay)
# --------------------------------------------------------------------------------------


def equiangular_time(
    beta,
    n: int,
    rho_target=0.999,
    rho0=0.0,
    model: str = "SA",
    scheme: str = "post-ln",
    *,
    r0: float = 1.0,
    tau: float | None = None,
    alpha=None,
    alpha_times=None,
    convention: str = "plain",
    t_max: float = 1e9,
    rtol: float = 1e-12,
    atol: float = 1e-14,
):
    r"""Time :math:`t^*` at which the equiangular ODE first reaches :math:`\rho = \rho_{\rm target}`.

    :math:`t^* = \inf\{t\ge 0 : \rho(t)\ge\rho_{\rm target}\}`, found as a terminal event of
    the DOP853 integration of :func:`equiangular_scheme_solution` (the crossing located on
    the dense output to round-off; the ODE error is about ``rtol`` relative, so
    :math:`t^*` is accurate to far better than :math:`10^{-6}`).  For Post-LN SA
    it equals :math:`\int_{\rho_0}^{\rho_{\rm target}} d\rho / F(\rho)` with :math:`F` of
    :func:`equiangular_rhs`.  0 when :math:`\rho_0\ge\rho_{\rm target}`, ``inf`` when the target
    is not reached by ``t_max`` (e.g. from the fixed point :math:`\rho_0 = -1/(n-1)`).

    Parameters
    ----------
    beta : float or array_like
        Inverse temperature(s); broadcast against ``rho_target`` and ``rho0``.
    n : int
        Number of tokens.
    rho_target, rho0 : float or array_like
        Target and initial cosines.
    model, scheme, r0, tau, alpha, alpha_times, convention
        As in :func:`equiangular_scheme_solution`.
    t_max : float
        Give up (``inf``) beyond this time.

    Returns
    -------
    float or ndarray
        :math:`t^*`, with the broadcast shape of the inputs.

    Examples
    --------
    >>> round(equiangular_time(1.0, 32), 4)  # GLPR phase diagram, n = 32
    5.2703
    >>> equiangular_time([0.0, 4.0, 8.0], 32).round(3).tolist()
    [5.186, 6.954, 73.446]
    """
    n = check_int(n, "n", minimum=2)
    t_max = check_positive(t_max, "t_max")
    b_arr, tgt_arr, rho0_arr = np.broadcast_arrays(
        *(np.asarray(v, dtype=float) for v in (beta, rho_target, rho0))
    )
    out = np.empty(b_arr.shape)
    for idx in np.ndindex(b_arr.shape):
        sys = _Equiangular(float(b_arr[idx]), n, model, scheme, convention, tau, alpha, alpha_times)
        target = _check_rho(float(tgt_arr[idx]), n, "rho_target", closed=False)
        start = _check_rho(float(rho0_arr[idx]), n, "rho0")
        if start >= target:
            out[idx] = 0.0
            continue
        _, t_hit, _ = sys.solve(
            1.0 - start,
            check_positive(r0, "r0"),
            t_max,
            u_event=1.0 - target,
            rtol=check_positive(rtol, "rtol"),
            atol=check_positive(atol, "atol"),
        )
        out[idx] = np.inf if t_hit is None else t_hit
    return float(out) if out.ndim == 0 else out


# --------------------------------------------------------------------------------------
# Long context: one layer at beta = gamma log n
# --------------------------------------------------------------------------------------

_LAYERS = ("pre-ln", "post-ln")


def _check_layer(scheme: Any) -> str:
    name = _SCHEME_ALIASES.get(scheme, scheme) if isinstance(scheme, str) else scheme
    if name not in _LAYERS:
        raise ValueError(
            f"scheme must be 'pre-ln' or 'post-ln' for one long-context layer, got {short_repr(scheme)}"
        )
    return name


def long_context_limit(
    rho: float, gamma: float, *, scheme: str = "pre-ln", eta: float = 1.0
) -> float:
    r"""Limit :math:`n\to\infty` of the output cosine of one SA layer with :math:`\beta = \gamma\log n`.

    Input: :math:`n` equiangular unit tokens of cosine :math:`\rho\in(0,1)`.  The self weight
    :math:`a = e^{\beta}/Z` against the others' total :math:`(n-1)b` compares
    :math:`n^{\gamma(1-\rho)}` with :math:`n`, so :math:`a\to 0,\ \tfrac12,\ 1` as
    :math:`\gamma` is below, at or above :math:`\gamma_c = 1/(1-\rho)`, and the mean
    :math:`m` of the other tokens has :math:`\langle\theta_i,m\rangle\to\rho`,
    :math:`\|m\|^2\to\rho`.  An output :math:`y_i = p\,\theta_i + q'\,m` then has cosine
    :math:`\rho(p+q')^2/(p^2 + (2pq'+q'^2)\rho)`.

    * ``'pre-ln'``: the block's output :math:`y_i = A_i` (:math:`p = a`, :math:`q' = 1-a`):
      1, :math:`4\rho/(1+3\rho)`, :math:`\rho`;
    * ``'post-ln'``: the layer :math:`y_i = \theta_i + \eta A_i` (normalized afterwards):
      :math:`\rho(1+\eta)^2/(1+(2\eta+\eta^2)\rho)`, the same at :math:`p = 1+\eta/2,\ q' = \eta/2`
      (:math:`16\rho/(9+7\rho)` for :math:`\eta = 1`), and :math:`\rho`.

    For :math:`\rho\le 0` the mean of the tokens vanishes with :math:`n` and the transition
    sits elsewhere, so :math:`\rho` must lie in (0, 1).

    Examples
    --------
    >>> long_context_limit(0.5, 2.0)  # at gamma_c = 1/(1 - rho): 4 rho / (1 + 3 rho)
    0.8
    >>> long_context_limit(0.5, 2.0, scheme="post-ln")  # theta + A at gamma_c: 16 rho / (9 + 7 rho)
    0.64
    """
    rho = _check_real(rho, "rho")
    if not 0.0 < rho < 1.0:
        raise ValueError(f"rho must lie in (0, 1), got {rho!r}")
    gamma = check_positive(gamma, "gamma")
    scheme = _check_layer(scheme)
    eta = check_positive(eta, "eta")
    crit = 1.0 / (1.0 - rho)
    if np.isclose(gamma, crit, rtol=1e-12, atol=0):
        a = 0.5
    else:
        a = 0.0 if gamma < crit else 1.0
    if scheme == "pre-ln" and a == 0.0:
        return 1.0
    p, q = (a, 1.0 - a) if scheme == "pre-ln" else (1.0 + eta * a, eta * (1.0 - a))
    return float(rho * (p + q) ** 2 / (p * p + (2 * p * q + q * q) * rho))


def long_context_gap(
    rho, gamma, n, *, scheme: str = "pre-ln", eta: float = 1.0
) -> np.ndarray | float:
    r""":math:`1-\cos` of the outputs of one SA layer on :math:`n` equiangular tokens, :math:`\beta = \gamma\log n`.

    With :math:`a = e^{\beta}/Z`, :math:`b = e^{\beta\rho}/Z`, :math:`Z = e^{\beta}+(n-1)e^{\beta\rho}`,
    the output of token :math:`i` is :math:`y_i = p\,\theta_i + q\sum_{j\ne i}\theta_j` with
    :math:`(p, q) = (a, b)` for Pre-LN (the block's output :math:`A_i`) and
    :math:`(1+\eta a, \eta b)` for Post-LN (:math:`\theta_i+\eta A_i`).  Since
    :math:`y_i - y_k = (p-q)(\theta_i-\theta_k)` and
    :math:`y_i = (p-q)\theta_i + q\sum_j\theta_j`,

    .. math::

        1 - \cos(y_i, y_k) = \frac{(1-\rho)(p-q)^2}
        {(p-q)^2 + 2(p-q)q(1+(n-1)\rho) + q^2 n(1+(n-1)\rho)},

    every term nonnegative.  Only the ratio :math:`q/p` enters; it is formed in log scale
    (:math:`b/a = n^{-\gamma(1-\rho)}`), so :math:`n` up to :math:`10^{12}` and beyond and
    :math:`\gamma` up to 100 and beyond neither overflow nor cancel.

    Parameters
    ----------
    rho : float or array_like
        Input cosine in :math:`(-1/(n-1), 1)`.
    gamma : float or array_like
        :math:`\beta/\log n`, >= 0.
    n : float or array_like
        Number of tokens, >= 2 (a float is accepted: ``1e12``).
    scheme : {'pre-ln', 'post-ln'}
    eta : float
        Post-LN step (the layer is :math:`\theta + \eta A`).

    Returns
    -------
    ndarray
        Broadcast shape of ``rho``, ``gamma``, ``n``.

    Examples
    --------
    >>> round(float(long_context_gap(0.5, 2.0, 1e12)), 9)  # -> 1 - 4 rho/(1+3 rho) = 0.2
    0.2
    """
    scheme = _check_layer(scheme)
    eta = check_positive(eta, "eta")
    rho, gamma, n = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (rho, gamma, n)))
    if not np.all(np.isfinite(n)) or np.any(n < 2):
        raise ValueError(f"n must be finite and >= 2, got {short_repr(n)}")
    if not np.all(np.isfinite(gamma)) or np.any(gamma < 0):
        raise ValueError(f"gamma must be finite and >= 0, got {short_repr(gamma)}")
    if not np.all(np.isfinite(rho)) or np.any(rho <= -1.0 / (n - 1)) or np.any(rho >= 1):
        raise ValueError(f"rho must lie in (-1/(n-1), 1), got {short_repr(rho)}")
    log_n = np.log(n)
    log_ratio = -gamma * log_n * (1.0 - rho)  # log(b / a)
    total = 1.0 + (n - 1) * rho  # <theta_i, sum_j theta_j>
    if scheme == "pre-ln":
        p, q = np.ones_like(rho), np.exp(log_ratio)  # divided by a
    else:
        log_a = -np.logaddexp(0.0, np.log(n - 1) + log_ratio)  # a = 1 / (1 + (n-1) b/a)
        p, q = 1.0 + eta * np.exp(log_a), eta * np.exp(log_a + log_ratio)
    d = p - q
    gap = (1.0 - rho) * d * d / (d * d + 2 * d * q * total + q * q * n * total)
    return gap if gap.ndim else float(gap)


def long_context_cosine(
    rho, gamma, n, *, scheme: str = "pre-ln", eta: float = 1.0
) -> np.ndarray | float:
    r"""Output cosine :math:`1 -` :func:`long_context_gap` of one layer at :math:`\beta = \gamma\log n`.

    Tends to :func:`long_context_limit` as :math:`n\to\infty` (for :math:`\rho\in(0,1)`), with
    :math:`c = \gamma(1-\rho)`: Pre-LN below :math:`\gamma_c` as
    :math:`1-\cos\simeq\frac{1-\rho}{\rho}n^{-2(1-c)}`, above as
    :math:`\cos-\rho\simeq 2\rho(1-\rho)n^{-(c-1)}`, at :math:`\gamma_c` as :math:`O(1/n)`;
    Post-LN as :math:`n^{-(1-c)}`, :math:`n^{-(c-1)}`, :math:`O(1/n)`.

    Examples
    --------
    >>> [round(float(long_context_cosine(0.5, g, 1e12)), 4) for g in (1.0, 2.0, 3.0)]
    [1.0, 0.8, 0.5]
    """
    return 1.0 - long_context_gap(rho, gamma, n, scheme=scheme, eta=eta)


# --------------------------------------------------------------------------------------
# Kernel conventions e^{beta<x,y>} and e^{beta(<x,y>-1)}
# --------------------------------------------------------------------------------------


def _exp_factor(beta: Any, sign: float, value: Any, name: str) -> np.ndarray | float:
    beta = check_nonnegative(beta, "beta")
    value = np.asarray(value, dtype=float)
    with np.errstate(over="ignore"):
        out = value * np.exp(sign * beta)
    if np.any(np.isinf(out) & np.isfinite(value)):
        raise ValueError(
            f"converting {name} overflows at beta = {beta!r}: e^{sign * beta:g} is beyond float64; "
            f"stay in the rescaled convention"
        )
    return out if out.ndim else float(out)


def rescaled_time(t, beta: float, model: str = "USA"):
    r"""Time in the rescaled kernel :math:`e^{\beta(\langle x,y\rangle-1)}` of a plain-kernel time ``t``.

    USA's velocity carries the factor :math:`e^{\beta}`: :math:`v_{\rm plain} = e^{\beta}v_{\rm rescaled}`,
    so :math:`t_{\rm rescaled} = e^{\beta}t`.  SA's normalization cancels the factor: times agree.

    Examples
    --------
    >>> bool(rescaled_time(1.0, 2.0) == np.exp(2.0)), rescaled_time(1.0, 2.0, "SA")
    (True, 1.0)
    """
    if _check_model(model) == "SA":
        return np.asarray(t, dtype=float) if np.ndim(t) else float(t)
    return _exp_factor(beta, 1.0, t, "t")


def plain_time(t_rescaled, beta: float, model: str = "USA"):
    r"""Inverse of :func:`rescaled_time`: :math:`t = e^{-\beta}t_{\rm rescaled}` (USA), unchanged (SA).

    Examples
    --------
    >>> plain_time(rescaled_time(0.3, 5.0), 5.0) == 0.3
    True
    """
    if _check_model(model) == "SA":
        return np.asarray(t_rescaled, dtype=float) if np.ndim(t_rescaled) else float(t_rescaled)
    return _exp_factor(beta, -1.0, t_rescaled, "t_rescaled")


def rescaled_energy(energy, beta: float):
    r"""Energy in the rescaled kernel of a plain-kernel energy: :math:`E^{\rm resc}_\beta = e^{-\beta}E_\beta`.

    :math:`\frac1{2\beta}\iint e^{\beta(\langle x,y\rangle-1)}d\mu\,d\mu = e^{-\beta}E_\beta(\mu)`, for
    SA and USA alike (the functional is the same; only SA's clock ignores the factor).

    Examples
    --------
    >>> rescaled_energy(np.exp(3.0), 3.0)
    1.0
    """
    return _exp_factor(beta, -1.0, energy, "energy")


def plain_energy(energy_rescaled, beta: float):
    r"""Inverse of :func:`rescaled_energy`: :math:`E_\beta = e^{\beta}E^{\rm resc}_\beta`.

    Examples
    --------
    >>> plain_energy(1.0, 0.0)
    1.0
    """
    return _exp_factor(beta, 1.0, energy_rescaled, "energy_rescaled")


def heat_decay_rate(ell, d: int, kappa: float) -> np.ndarray:
    r"""Decay rate of degree-:math:`\ell` harmonics under :math:`\kappa^{-1}\Delta_S`: :math:`\ell(\ell+d-2)/\kappa`.

    Examples
    --------
    >>> from wflow.theory import heat_decay_rate
    >>> heat_decay_rate([0, 1, 2], 3, 2.0).tolist()  # l (l + 1) / kappa on S^2
    [0.0, 1.0, 3.0]
    """
    ell = np.asarray(ell, dtype=float)
    return ell * (ell + d - 2) / check_positive(kappa, "kappa")
