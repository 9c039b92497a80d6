r"""Normalization as speed regulation: ``wflow validate normalization [--quick]``.

Rigollet, *The Mean-Field Dynamics of Transformers* (2025, arXiv:2512.01868), §5 (Karagodin,
Geshkovski, Polyanskiy & Rigollet 2025): SA (:math:`Q = K = V = I`) under Post-LN, Pre-LN, Peri-LN,
Mix-LN, nGPT and :math:`\sqrt{}`-scaling clusters tokens at speeds the scheme sets --
:math:`1-\rho\sim e^{-2t}` (Post-LN; nGPT :math:`e^{-2\int\alpha}`), :math:`e^{-4\sqrt{t+1}}`
(:math:`\sqrt{}`-scaling), :math:`t^{-2}` (Pre-, Peri-, Mix-LN), with the constants of
:func:`wflow.theory.equiangular_asymptotics`.  Three starts, one part each per scheme:

* **equiangular** (:func:`equiangular_part`): particles against the reduced ODE, the fitted late
  rate (:func:`fit_rate`) and constant against the theory;
* **random** (:func:`random_part`, ``n = 32`` tokens in ``d = 512``, :math:`\beta = \sqrt d`): the
  early change of the mean cosine against the equiangular ODE from the measured mean cosine, whose
  ratio should be the Funk--Hecke constant :math:`c_0(\beta)` (:func:`wflow.theory.funk_hecke`);
* **collapse** (:func:`collapse_part`, the sphere schemes): the same tokens through the whole
  metastable staircase to one point by SciPy's BDF with the exact Jacobian, the late rate and the
  radii kept.

Why each check and the measured values: docs/papers/normalization.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from .. import theory
from ..diagnostics import batched_cluster_labels
from ..models import SA
from ..schemes import SCHEMES, Normalized
from ..solvers.control import StepControl
from ..solvers.particles import simulate
from ..solvers.saveat import SaveAt
from ..sphere import uniform
from ..theory.asymptotics import EquiangularLaw
from .normalization_figures import collapse_figure, study_figures
from .parts import Parts
from .progress import steps
from .report import StudyReport, register

__all__ = [
    "fit_rate",
    "scheme_law",
    "fit_scheme_rate",
    "sqrt_clock",
    "sqrt_time",
    "pair_gaps",
    "equiangular_part",
    "random_part",
    "collapse_part",
    "SCHEME_OPTIONS",
    "CLOCKS",
    "SPHERE_SCHEMES",
    "COLLAPSED_GAP",
    "COLLAPSE_TOL",
    "MERGED_ANGLE",
]


class SchemeOptions(TypedDict, total=False):
    """A scheme's extra parameters: the Mix-LN switch time ``tau``, the nGPT step ``alpha``."""

    tau: float
    alpha: float


#: the schemes' extra parameters (Mix-LN switch time, nGPT step)
SCHEME_OPTIONS: dict[str, SchemeOptions] = {"mix-ln": {"tau": 2.0}, "ngpt": {"alpha": 0.5}}
#: the clock in which each scheme's late-time law is linear: log(1-rho) = log C - rate * clock(t)
CLOCKS = {
    "exponential": lambda t: t,
    "exponential-sqrt": lambda t: np.sqrt(t + 1.0),
    "power": lambda t: np.log(t),
}
#: how the particles of the equiangular and random starts run
PARTICLE_RUN: dict[str, Any] = {
    "method": "dopri5",
    "control": StepControl(rtol=1e-10, atol=1e-13),
    "backend": "numpy",
}
#: gap window of the rate fits: late enough for the asymptotic law, above the rounding of the gaps
FIT_WINDOW = (1e-10, 1e-5)


def fit_rate(
    t: np.ndarray,
    gap: np.ndarray,
    law: str = "exponential",
    window: tuple[float, float] = FIT_WINDOW,
    clock=None,
) -> tuple[float, int]:
    r"""Least-squares rate :math:`\lambda` of :math:`\log(1-\rho) = \log C - \lambda\,\tau(t)` over the window.

    Parameters
    ----------
    t, gap : ndarray, shape (m,)
        Times and :math:`1-\rho`.
    law : {'exponential', 'exponential-sqrt', 'power'}
        The clock :math:`\tau`: :math:`t`, :math:`\sqrt{t+1}` or :math:`\log t`.
    window : (float, float)
        Only points with ``window[0] <= gap <= window[1]`` enter.
    clock : callable, optional
        Another clock (e.g. :math:`\int_0^t\alpha` for nGPT).

    Returns
    -------
    (float, int)
        The rate and the number of points fitted (``nan`` with fewer than 3).

    Examples
    --------
    >>> t = np.linspace(0, 20, 200)
    >>> rate, m = fit_rate(t, 3.0 * np.exp(-2.0 * t))
    >>> round(rate, 12), m > 10
    (2.0, True)
    """
    t, gap = np.asarray(t, dtype=float), np.asarray(gap, dtype=float)
    if t.shape != gap.shape or t.ndim != 1:
        raise ValueError(
            f"t and gap must be 1-d arrays of one shape, got {t.shape} and {gap.shape}"
        )
    if clock is None:
        if law not in CLOCKS:
            raise ValueError(f"law must be one of {sorted(CLOCKS)}, got {law!r}")
        clock = CLOCKS[law]
    keep = np.isfinite(gap) & (gap >= window[0]) & (gap <= window[1]) & (t > 0)
    if keep.sum() < 3:
        return float("nan"), int(keep.sum())
    slope = np.polyfit(clock(t[keep]), np.log(gap[keep]), 1)[0]
    return float(-slope), int(keep.sum())


def pair_gaps(points: np.ndarray) -> np.ndarray:
    r"""Mean over pairs :math:`i<j` of :math:`1-\langle\theta_i,\theta_j\rangle = |\theta_i-\theta_j|^2/2`.

    The directions :math:`\theta = x/|x|` of ``points`` of shape ``(..., n, d)``; the difference form keeps
    the relative accuracy of small gaps (``1 - x @ y`` loses it below 1e-8).

    Examples
    --------
    >>> float(pair_gaps(np.array([[1.0, 0.0], [0.0, 2.0]])))
    1.0
    >>> np.round(pair_gaps(np.array([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]])), 6)
    array([1.333333])
    """
    return _pair_gaps_each(points).mean(axis=-1)


def _pair_gaps_each(points: np.ndarray) -> np.ndarray:
    r""":math:`1-\langle\theta_i,\theta_j\rangle` of every pair :math:`i<j` (difference form), shape ``(..., n(n-1)/2)``."""
    x = np.asarray(points, dtype=float)
    x = x / np.linalg.norm(x, axis=-1, keepdims=True)
    i, j = np.triu_indices(x.shape[-2], 1)
    return 0.5 * np.sum((x[..., i, :] - x[..., j, :]) ** 2, axis=-1)


def scheme_law(beta: float, n: int, scheme: str, rho0: float) -> EquiangularLaw:
    """The late law of ``scheme`` from ``n`` equiangular tokens of cosine ``rho0`` (SA, the study's
    :data:`SCHEME_OPTIONS`): :func:`wflow.theory.equiangular_asymptotics`.

    Examples
    --------
    >>> law = scheme_law(1.0, 8, "post-ln", 0.0)
    >>> law.law, law.rate
    ('exponential', 2.0)
    """
    return theory.equiangular_asymptotics(
        beta, n, "SA", scheme, rho0=rho0, **SCHEME_OPTIONS.get(scheme, {})
    )


def fit_scheme_rate(t: np.ndarray, gap: np.ndarray, scheme: str, law: EquiangularLaw) -> float:
    r"""The late rate of ``gap`` = 1 - rho at times ``t`` (:func:`fit_rate`) in the clock of ``law``
    (:func:`scheme_law`); for nGPT the clock :math:`\int_0^t \alpha`.

    Examples
    --------
    >>> t = np.linspace(0.0, 14.0, 200)
    >>> round(fit_scheme_rate(t, 0.5 * np.exp(-2.0 * t), "post-ln", scheme_law(1.0, 8, "post-ln", 0.0)), 9)
    2.0
    """
    if scheme == "ngpt":
        return fit_rate(t, gap, clock=lambda s: SCHEME_OPTIONS["ngpt"]["alpha"] * s)[0]
    return fit_rate(t, gap, law.law)[0]


#: equiangular horizons: the exponential schemes until 1-rho ~ 1e-12, the power laws long enough for t^2 (1-rho)
EQ_HORIZON = {
    "post-ln": 14.0,
    "ngpt": 28.0,
    "sqrt": 60.0,
    "pre-ln": 1e4,
    "peri-ln": 1e4,
    "mix-ln": 1e4,
}


def _scheme_run(scheme: str, beta: float, x0: np.ndarray, t_end: float, t: np.ndarray):
    """The particles of ``scheme`` (SA) from ``x0``, saved at ``t`` (dopri5, rtol 1e-10), and the seconds taken."""
    model = Normalized(SA(beta), scheme, **SCHEME_OPTIONS.get(scheme, {}))
    t0 = time.perf_counter()
    traj = simulate(model, x0, t_end, save_at=SaveAt(t, diagnostics=()), **PARTICLE_RUN)
    return traj, time.perf_counter() - t0


def _half_time(scheme: str, n: int, beta: float, rho0: float) -> float:
    """When the equiangular ODE of ``scheme`` from cosine ``rho0`` reaches 1/2."""
    kw = SCHEME_OPTIONS.get(scheme, {})
    return float(theory.equiangular_time(beta, n, 0.5, rho0, "SA", scheme, t_max=1e30, **kw))


def equiangular_part(scheme: str, n: int, beta: float, rho0: float, t_end: float) -> dict[str, Any]:
    """Particles from ``n`` equiangular tokens against the reduced ODE at the same times.

    Examples
    --------
    >>> p = equiangular_part("post-ln", 3, 1.0, 0.0, 1.0)
    >>> float(p["gap"][0]), bool(np.allclose(p["gap"], p["gap_ode"], atol=1e-9))
    (1.0, True)
    """
    kw = SCHEME_OPTIONS.get(scheme, {})
    x0 = theory.equiangular_configuration(n, rho0)
    t = np.unique(
        np.concatenate([[0.0], np.logspace(-2, np.log10(t_end), 120), np.linspace(0, t_end, 120)])
    )
    traj, seconds = _scheme_run(scheme, beta, x0, t_end, t)
    P = np.asarray(traj.points)
    gap = pair_gaps(P)
    cos = np.einsum("tid,tjd->tij", P, P)
    iu = np.triu_indices(n, 1)
    spread = np.ptp(cos[:, iu[0], iu[1]], axis=1)  # zero while the equiangular symmetry is kept
    radii = (
        np.asarray(traj.radii).mean(axis=1)
        if getattr(traj, "radii", None) is not None
        else np.ones(t.size)
    )
    ref = theory.equiangular_scheme_solution(t, beta, n, "SA", scheme, rho0=rho0, **kw)
    return {
        "t": t,
        "gap": gap,
        "gap_ode": ref.gap,
        "r": radii,
        "r_ode": ref.r,
        "spread": spread,
        "seconds": seconds,
        "steps": int(np.asarray(traj.stats["steps"])[-1]),
    }


def random_part(
    scheme: str, n: int, d: int, beta: float, seed: int, t_end: float
) -> dict[str, Any]:
    """``n`` uniform tokens in ``d`` dimensions (wflow.simulate) and the equiangular ODE from their mean cosine.

    Examples
    --------
    >>> p = random_part("post-ln", 4, 8, 1.0, 0, 10.0)
    >>> p["t"].shape, bool(p["gap"][-1] < p["gap"][0]), bool(np.isclose(p["gap"][0], p["gap_ode"][0]))
    ((26,), True, True)
    """
    kw = SCHEME_OPTIONS.get(scheme, {})
    x0 = uniform(n, d, seed=seed)
    iu = np.triu_indices(n, 1)
    G = x0 @ x0.T
    rho0 = float(G[iu].mean())
    t = np.concatenate([[0.0], np.logspace(0, np.log10(t_end), 25)])
    traj, seconds = _scheme_run(scheme, beta, x0, t_end, t)
    gap = pair_gaps(np.asarray(traj.points))
    ref = theory.equiangular_scheme_solution(t, beta, n, "SA", scheme, rho0=rho0, **kw)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = (gap[0] - gap) / (ref.gap[0] - ref.gap)
    return {
        "t": t,
        "gap": gap,
        "gap_ode": ref.gap,
        "ratio": ratio,
        "rho0": rho0,
        "rho_spread": float(np.std(G[iu])),
        "seconds": seconds,
        "mean_exp": float(
            np.mean(np.exp(beta * (G[iu] - rho0)) * (1 - G[iu] ** 2)) / (1 - rho0**2)
        ),
        "t_merge_ode": _half_time(scheme, n, beta, rho0),
    }


#: the sphere schemes (fields on the sphere: span coordinates and the exact Jacobian apply)
SPHERE_SCHEMES = ("post-ln", "ngpt", "sqrt")
#: the collapse is declared when every pair's 1 - <theta_i, theta_j> is below this
COLLAPSED_GAP = 1e-11
#: BDF's tolerances for the collapse
COLLAPSE_TOL = {"rtol": 1e-8, "atol": 1e-12}
#: tokens closer than this (geodesic, radians: 1 - cos = 1e-3) count as one cluster along the staircase
MERGED_ANGLE = float(np.arccos(1.0 - 1e-3))


def _clock_span(scheme: str, t_stop: float, units: float) -> np.ndarray:
    """Times covering the last ``units`` of the scheme's late-time clock before ``t_stop`` (the rate-fit window)."""
    if scheme == "sqrt":
        tau = np.linspace(max(1.0, np.sqrt(t_stop + 1.0) - units), np.sqrt(t_stop + 1.0), 401)
        return np.clip(tau**2 - 1.0, 0.0, t_stop)
    speed = SCHEME_OPTIONS["ngpt"]["alpha"] if scheme == "ngpt" else 1.0
    return np.linspace(max(0.0, t_stop - units / speed), t_stop, 401)


def sqrt_clock(t: Any) -> np.ndarray:
    r"""The clock in which √-scaling is autonomous: :math:`\tau = 2(\sqrt{t+1}-1)`, so :math:`d\theta/d\tau = P_\theta A`."""
    return 2.0 * (np.sqrt(1.0 + np.asarray(t, dtype=float)) - 1.0)


def sqrt_time(tau: Any) -> np.ndarray:
    """Inverse of :func:`sqrt_clock`.

    Examples
    --------
    >>> float(sqrt_time(sqrt_clock(3.0)))
    3.0
    """
    return (1.0 + 0.5 * np.asarray(tau, dtype=float)) ** 2 - 1.0


def collapse_part(
    scheme: str,
    n: int,
    d: int,
    beta: float,
    seed: int,
    t_end: float = 1e20,
    rtol: float = COLLAPSE_TOL["rtol"],
    atol: float = COLLAPSE_TOL["atol"],
    own_clock: bool = True,
) -> dict[str, Any]:
    r"""``n`` uniform tokens in ``d`` dimensions followed through the whole metastable staircase to one point.

    The tokens evolve in the coordinates of their initial span (:class:`~wflow.solvers.particles.SpanProblem`),
    integrated by SciPy's BDF with the field's exact Jacobian (the merged clusters' O(1) decay beside
    inter-cluster forces of size :math:`ne^{-\beta}` make explicit methods crawl), until every pair's
    gap :math:`1-\langle\theta_i,\theta_j\rangle` is below :data:`COLLAPSED_GAP` (or ``t_end``).
    With ``own_clock`` (the default) √-scaling is integrated in its autonomous clock
    :math:`\tau = 2(\sqrt{t+1}-1)` (:func:`sqrt_clock`) and its times mapped back exactly; the other
    schemes ignore the flag.

    Returns the mean pair gap and the number of clusters (joined below :data:`MERGED_ANGLE`) at
    log-spaced times, the merge times, the mean gap over the last 40 units of the scheme's clock (for
    the late rate), the time the mean cosine crosses 1/2, and the largest drift of the radii (BDF's
    error: the field keeps them).

    Examples
    --------
    >>> p = collapse_part("post-ln", 6, 16, 4.0, 0)
    >>> bool(p["collapsed"]), int(p["clusters"][0]), int(p["clusters"][-1])
    (True, 6, 1)
    """
    from scipy.integrate import solve_ivp

    from ..kernels.small import span_coordinates
    from ..kernels.threads import blas_threads
    from ..solvers.particles import SpanProblem

    if scheme not in SPHERE_SCHEMES:
        raise ValueError(
            f"scheme must be one of {SPHERE_SCHEMES} (fields on the sphere), got {scheme!r}"
        )
    x0 = uniform(n, d, seed=seed)
    y0, basis = span_coordinates(x0)
    if basis is None:
        basis = np.eye(d)
    clock: Callable[[Any], np.ndarray]  # the integration clock of t, and its inverse
    time_of: Callable[[Any], np.ndarray]
    if scheme == "sqrt" and own_clock:
        model = Normalized(SA(beta), "post-ln")
        clock, time_of = sqrt_clock, sqrt_time
    else:
        model = Normalized(SA(beta), scheme, **SCHEME_OPTIONS.get(scheme, {}))
        clock = time_of = np.array  # a copy: the end point below is set on the clock's array
    prob = SpanProblem(model, np.full(n, 1.0 / n), basis, backend="numpy")
    r = y0.shape[-1]

    def collapsed(t, y):
        return float(np.log(_pair_gaps_each(y.reshape(n, r)).max() / COLLAPSED_GAP))

    # solve_ivp's event protocol: attributes set on the function, which mypy cannot type
    collapsed.terminal = True  # type: ignore[attr-defined]
    collapsed.direction = -1  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    with blas_threads(1):
        sol = solve_ivp(
            lambda t, y: prob.rhs(t, y.reshape(n, r)).reshape(-1),
            (0.0, float(clock(t_end))),
            y0.reshape(-1),
            method="BDF",
            jac=lambda t, y: prob.jacobian(t, y.reshape(n, r)),
            rtol=rtol,
            atol=atol,
            dense_output=True,
            events=collapsed,
        )
    seconds = time.perf_counter() - t0
    if sol.status < 0:
        raise RuntimeError(f"BDF failed for {scheme}: {sol.message}")
    t_stop = float(time_of(sol.t[-1]))
    t_log = np.concatenate([[0.0], np.logspace(-1, np.log10(t_stop), 300)])
    t_log[-1] = t_stop
    tau_log = clock(t_log)
    tau_log[-1] = sol.t[-1]
    Y = sol.sol(tau_log).T.reshape(-1, n, r)
    g = _pair_gaps_each(Y)
    clusters = batched_cluster_labels(Y / np.linalg.norm(Y, axis=-1, keepdims=True), MERGED_ANGLE)[
        0
    ]
    drops = np.nonzero(np.diff(clusters) < 0)[0] + 1
    t_fit = _clock_span(scheme, t_stop, 40.0)
    g_fit = pair_gaps(sol.sol(np.minimum(clock(t_fit), sol.t[-1])).T.reshape(-1, n, r))
    rho = 1.0 - g.mean(axis=-1)
    half = np.nonzero(rho >= 0.5)[0]
    radii = np.linalg.norm(sol.y.T.reshape(-1, n, r), axis=-1)
    return {
        "t": t_log,
        "gap": g.mean(axis=-1),
        "clusters": clusters,
        "merge_times": t_log[drops],
        "merge_counts": clusters[drops],
        "t_fit": t_fit,
        "gap_fit": g_fit,
        "t_stop": t_stop,
        "collapsed": bool(sol.status == 1),
        "t_half": float(t_log[half[0]]) if half.size else np.inf,
        "rho0": float(1.0 - g[0].mean()),
        "radius_drift": float(np.max(np.abs(radii - 1.0))),
        "steps": int(sol.t.size - 1),
        "nfev": int(sol.nfev),
        "njev": int(sol.njev),
        "seconds": seconds,
    }


def _key(start: str, scheme: str, **fields: Any) -> dict[str, Any]:
    """The key of a part: its start, scheme, parameters and the scheme's :data:`SCHEME_OPTIONS`."""
    return {"start": start, "scheme": scheme, **fields, **SCHEME_OPTIONS.get(scheme, {})}


def _equiangular(
    rep: StudyReport, parts: Parts, n: int, beta: float, rho0: float, horizon: dict[str, float]
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The equiangular start, every scheme: particles against the reduced ODE, the late law's rate and
    constant against :func:`wflow.theory.equiangular_asymptotics`; returns the parts and the laws."""
    eq, laws = {}, {}
    what = f"equiangular start, n = {n}: the schemes against the reduced ODE"
    for scheme in steps(rep.name, what, SCHEMES):
        p = parts.get(
            _key("equiangular", scheme, n=n, beta=beta, rho0=rho0, t_end=horizon[scheme]),
            lambda: equiangular_part(scheme, n, beta, rho0, horizon[scheme]),
        )
        eq[scheme] = p
        laws[scheme] = law = scheme_law(beta, n, scheme, rho0)
        err = float(np.max(np.abs(p["gap"] - p["gap_ode"])))
        rate = fit_scheme_rate(p["t"], p["gap"], scheme, law)
        rate_ode = fit_scheme_rate(p["t"], p["gap_ode"], scheme, law)
        target = 2.0 if scheme != "sqrt" else 4.0
        ratio_c = float(p["gap"][-1] / law.gap(p["t"][-1]))
        rep.rows.append(
            {
                "start": "equiangular",
                "scheme": scheme,
                "n": n,
                "d": n,
                "beta": beta,
                "rho0": rho0,
                "law": law.formula,
                "rate_theory": law.rate,
                "rate_particles": rate,
                "rate_ode": rate_ode,
                "constant_theory": law.constant,
                "constant_ratio_at_end": ratio_c,
                "t_end": p["t"][-1],
                "gap_end": p["gap"][-1],
                "max_abs_gap_error": err,
                "max_cosine_spread": float(np.max(p["spread"])),
                "max_abs_radius_error": float(np.max(np.abs(p["r"] - p["r_ode"]))),
                "seconds": p["seconds"],
                "steps": p["steps"],
            }
        )
        rep.expect(
            f"equiangular {scheme}: particles vs reduced ODE, max |(1-rho)_particles - (1-rho)_ODE|",
            err,
            0.0,
            1e-8,
        )
        what = (
            f"fitted rate / theory ({law.formula}, rate {target:g}"
            f"{' in int alpha' if scheme == 'ngpt' else ''})"
            if law.law != "power"
            else "fitted exponent of t in the late window / theory (-2)"
        )
        rep.expect(f"equiangular {scheme}: {what}", rate / law.rate, 0.98, 1.02)
        rep.expect(
            f"equiangular {scheme}: (1-rho) / (C f(t)) at t = {p['t'][-1]:g}, C = {law.constant:.6g} "
            "from equiangular_asymptotics",
            ratio_c,
            0.99,
            1.01,
        )
    rep.notes.append(
        "fitted rates use the window 1e-10 <= 1-rho <= 1e-5 in the clock of each law (t, "
        "sqrt(t+1), log t, alpha t); for the power laws the window is the last decade(s) of t "
        "where 1-rho lies in it"
    )
    return eq, laws


def _random_starts(
    rep: StudyReport, parts: Parts, n_r: int, d_r: int, seeds: tuple[int, ...], t_end_random: float
) -> dict[str, list]:
    """Random starts, the early phase: the change of the mean gap, tokens against the equiangular ODE from
    the measured mean cosine, over c_0; returns each scheme's parts (one per seed)."""
    beta_r = float(np.sqrt(d_r))
    rnd: dict[str, list] = {}
    c0 = float(theory.funk_hecke(0, beta_r, d_r))
    what = f"random starts, n = {n_r}, d = {d_r}: the schemes, {len(seeds)} seeds each"
    for scheme in steps(rep.name, what, SCHEMES):
        runs = []
        for seed in seeds:
            p = parts.get(
                _key("random", scheme, n=n_r, d=d_r, beta=beta_r, seed=seed, t_end=t_end_random),
                lambda: random_part(scheme, n_r, d_r, beta_r, seed, t_end_random),
            )
            runs.append(p)
            rep.rows.append(
                {
                    "start": "random",
                    "scheme": scheme,
                    "n": n_r,
                    "d": d_r,
                    "beta": beta_r,
                    "seed": seed,
                    "rho0": p["rho0"],
                    "rho_spread": p["rho_spread"],
                    "t_end": t_end_random,
                    "gap_start": float(p["gap"][0]),
                    "gap_end_tokens": float(p["gap"][-1]),
                    "gap_end_ode": float(p["gap_ode"][-1]),
                    "change_ratio": float(p["ratio"][-1]),
                    "c0": c0,
                    "empirical_weight_ratio": p["mean_exp"],
                    "t_half_ode": p["t_merge_ode"],
                    "seconds": p["seconds"],
                }
            )
        rnd[scheme] = runs
        ratios = np.array([p["ratio"][-1] for p in runs])
        rep.expect(
            f"random starts, {scheme}: change of the mean gap by t = {t_end_random:g}, tokens / equiangular "
            f"ODE, over c_0 = E e^(beta rho) = {c0:.4f} (worst seed)",
            float(ratios[np.argmax(np.abs(np.log(ratios / c0)))] / c0),
            0.8,
            1.25,
        )
    randoms = [r for r in rep.rows if r["start"] == "random"]
    emp = np.array([r["change_ratio"] / r["empirical_weight_ratio"] for r in randoms])
    rep.notes.append(
        "random starts: change ratio over the empirical pair average of e^(beta (rho_ij - rho0)) "
        f"(1 - rho_ij^2) / (1 - rho0^2) of the seed: {emp.min():.4f} to {emp.max():.4f}"
    )
    rep.notes.append(
        f"random starts: the equiangular ODE from the measured mean cosine reaches rho = 1/2 at t = "
        f"{np.mean([p['t_merge_ode'] for p in rnd['post-ln']]):.3g} (post-ln), "
        f"{np.mean([p['t_merge_ode'] for p in rnd['ngpt']]):.3g} (ngpt), "
        f"{np.mean([p['t_merge_ode'] for p in rnd['sqrt']]):.3g} (sqrt); the tokens are followed "
        f"only to t = {t_end_random:g} (module docstring: the collapse is a stiff metastable staircase)"
    )
    rep.notes.append(
        "random starts are not equiangular: what is measured is how the single equiangular ODE from the "
        "measured mean cosine predicts the early growth of the mean cosine, and by which factor it errs"
    )
    return rnd


def _collapse(rep: StudyReport, parts: Parts, n_r: int, d_c: int) -> dict[str, dict[str, Any]]:
    """Random starts followed through the whole staircase to one point (the sphere schemes): collapsed,
    the late rate against theory, the radii kept; returns each scheme's part."""
    beta_c = float(np.sqrt(d_c))
    col, half_ode = {}, {}
    what = f"random starts, n = {n_r}, d = {d_c}: the sphere schemes through the staircase (BDF)"
    for scheme in steps(rep.name, what, SPHERE_SCHEMES):
        clock = "tau" if scheme == "sqrt" else "t"
        p = parts.get(
            _key(
                "collapse", scheme, n=n_r, d=d_c, beta=beta_c, seed=0, clock=clock, **COLLAPSE_TOL
            ),
            lambda: collapse_part(
                scheme, n_r, d_c, beta_c, 0, rtol=COLLAPSE_TOL["rtol"], atol=COLLAPSE_TOL["atol"]
            ),
        )
        col[scheme] = p
        law = scheme_law(beta_c, n_r, scheme, p["rho0"])
        rate = fit_scheme_rate(p["t_fit"], p["gap_fit"], scheme, law) if p["collapsed"] else np.nan
        half_ode[scheme] = t_half_ode = _half_time(scheme, n_r, beta_c, p["rho0"])
        rep.rows.append(
            {
                "start": "collapse",
                "scheme": scheme,
                "n": n_r,
                "d": d_c,
                "beta": beta_c,
                "seed": 0,
                "rho0": p["rho0"],
                "t_end": p["t_stop"],
                "collapsed": p["collapsed"],
                "first_merge": float(p["merge_times"][0]) if len(p["merge_times"]) else np.nan,
                "merges": len(p["merge_times"]),
                "t_half_tokens": p["t_half"],
                "t_half_ode": t_half_ode,
                "rate_theory": law.rate,
                "rate_particles": rate,
                "radius_drift": p["radius_drift"],
                "steps": p["steps"],
                "seconds": p["seconds"],
            }
        )
        rep.expect(
            f"collapse from a random start, {scheme} (d = {d_c}): every pair within 1 - cos < "
            f"{COLLAPSED_GAP:g}, reached at t = {p['t_stop']:.3g}",
            float(p["collapsed"]),
            1.0,
            1.0,
        )
        rep.expect(
            f"collapse from a random start, {scheme}: fitted late rate / theory ({law.formula})",
            rate / law.rate,
            0.99,
            1.01,
        )
        rep.expect(
            f"collapse from a random start, {scheme}: largest drift of a radius (the field keeps radii; "
            "BDF's error)",
            p["radius_drift"],
            0.0,
            1e-5,
        )
    rep.notes.append(
        f"collapse from random starts (n = {n_r}, d = {d_c}, beta = sqrt(d), seed 0; span coordinates, "
        f"SciPy BDF with the exact Jacobian, rtol {COLLAPSE_TOL['rtol']:g}, atol {COLLAPSE_TOL['atol']:g}): "
        + "; ".join(
            f"{k}: {len(p['merge_times'])} merges from t = {p['merge_times'][0]:.3g} to "
            f"{p['merge_times'][-1]:.3g}, mean cosine 1/2 at t = {p['t_half']:.3g} "
            f"(equiangular ODE from the same mean cosine: {half_ode[k]:.3g}), {p['steps']} steps, "
            f"{p['seconds']:.0f} s"
            for k, p in col.items()
            if len(p["merge_times"])
        )
    )
    rep.notes.append(
        "Pre-, Peri- and Mix-LN carry radii that grow like t: their directions move like "
        "d(theta)/d(log t) ~ n e^-beta, so the same staircase takes log t ~ e^beta / n (t beyond "
        "any float); their late laws are checked from the equiangular start only"
    )
    return col


@register("normalization", group="papers")
def study_normalization(out: Path, quick: bool) -> StudyReport:
    """Speeds of the six normalization schemes (module docstring)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rep = StudyReport("normalization")
    parts = Parts(out, "normalization", quick)
    n, beta, rho0 = 8, 1.0, 0.0
    d_r = 512
    n_r, beta_r = 32, float(np.sqrt(d_r))
    seeds = (0, 1) if quick else tuple(range(6))
    horizon = (
        dict(EQ_HORIZON) if quick else {**EQ_HORIZON, "pre-ln": 1e6, "peri-ln": 1e6, "mix-ln": 1e6}
    )
    rep.notes.append(
        f"{'quick' if quick else 'full'} mode: equiangular n = {n}, beta = {beta:g}, rho0 = {rho0:g} "
        f"(particles in R^{n}, dopri5 rtol 1e-10); random starts n = {n_r}, d = {d_r}, "
        f"beta = sqrt(d) = {beta_r:.3f}, seeds {list(seeds)}; Mix-LN tau = 2, nGPT alpha = 0.5"
    )

    eq, laws = _equiangular(rep, parts, n, beta, rho0, horizon)
    # random starts: the early phase
    t_end_random = 1e6 if quick else 2e6
    rnd = _random_starts(rep, parts, n_r, d_r, seeds, t_end_random)
    # random starts: the whole staircase to one point (the sphere schemes; BDF with the exact Jacobian)
    d_c = 64 if quick else d_r
    col = _collapse(rep, parts, n_r, d_c)
    rep.figures.append(collapse_figure(out, col, n_r, d_c))
    rep.figures.extend(study_figures(out, eq, rnd, laws, beta_r, n_r, d_r))
    rep.notes.append(parts.note())
    return rep
