r"""The equiangular reduction for every normalization scheme: its ODE, solutions and times.

All pairwise inner products equal :math:`\rho`, all radii equal :math:`r`: every scheme reduces
to an ODE in :math:`(\rho, r)` (Rigollet §5, Karagodin--Geshkovski--Polyanskiy--Rigollet 2025;
``docs/theory.md``).  The late-time laws are in :mod:`wflow.theory.asymptotics`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import SolverError, check_int, check_nonnegative, check_positive, short_repr
from .checks import check_model, check_real, check_rho, check_scheme

_CONVENTIONS = ("plain", "rescaled")
#: largest beta for which e^{beta} is a finite float64 (USA in the plain convention)
_BETA_PLAIN_MAX = 700.0


class _Alpha:
    r"""nGPT step :math:`\alpha(t)`: a constant, a callable, or values on a time grid ``alpha_times``
    (linear in between, constant beyond the ends)."""

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


class EquiangularSystem:
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
        self.model = check_model(model)
        self.scheme = check_scheme(scheme)
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
        # plain floats (the ODE solver's scalar state) go through math
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
        norm = sqrt(1.0 + 2 * (n - 1) * q * rho + q * q * (n - 1) * (1 + (n - 2) * rho))  # |A|/a
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

    All pairwise cosines of the directions equal :math:`\rho`, all radii :math:`r`; with the
    attention average :math:`A_i = a\theta_i + b\sum_{j\ne i}\theta_j` and the scheme's speed
    divisor :math:`s`, :math:`\rho' = (2/s)\,b\,(1-\rho)(1+(n-1)\rho)`; :math:`a`, :math:`b`, :math:`s`
    and the radius law of each scheme: ``docs/theory.md``.

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
    sys = EquiangularSystem(beta, n, model, scheme, convention, tau, alpha, alpha_times)
    rho = np.asarray(rho, dtype=float)
    r = np.asarray(r, dtype=float)
    if np.any(~np.isfinite(rho)) or np.any(rho < -1.0 / (sys.n - 1) - 1e-15) or np.any(rho > 1):
        raise ValueError(
            f"rho must lie in [-1/(n-1), 1] = [{-1 / (sys.n - 1):.6g}, 1], got {short_repr(rho)}"
        )
    if np.any(~np.isfinite(r)) or np.any(r <= 0):
        raise ValueError(f"r must be finite and > 0, got {short_repr(r)}")
    du, dr = sys.rates(check_real(t, "t"), 1.0 - rho, r)
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

    The state :math:`(1-\rho, r)` by scipy's DOP853 with dense output, between the kinks (the
    Mix-LN switch, the grid of an array :math:`\alpha`); :math:`1-\rho` controlled relatively.

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
    sys = EquiangularSystem(beta, n, model, scheme, convention, tau, alpha, alpha_times)
    t = _check_times(t)
    rho0 = check_rho(rho0, sys.n, "rho0")
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

    :math:`x_i = a e_i + b\mathbf{1}`; needs :math:`-1/(n-1) < \rho < 1`.

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

    A terminal event of the integration of :func:`equiangular_scheme_solution`.  0 when
    :math:`\rho_0\ge\rho_{\rm target}`, ``inf`` when the target is not reached by ``t_max``.

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
        sys = EquiangularSystem(
            float(b_arr[idx]), n, model, scheme, convention, tau, alpha, alpha_times
        )
        target = check_rho(float(tgt_arr[idx]), n, "rho_target", closed=False)
        start = check_rho(float(rho0_arr[idx]), n, "rho0")
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
