r"""Synchronization for small β in d ≥ 3 and the collapse of a hemisphere (``wflow validate dichotomy``).

Geshkovski--Letrouit--Polyanskiy--Rigollet, *A mathematical perspective on Transformers* (Bull. AMS
2025), Theorem 4.1 and §6; Markdahl--Thunberg--Gonçalves, IEEE TAC 2018 (the dichotomy between
:math:`d = 2` and :math:`d \ge 3`).  SA and USA, :math:`Q = K = V = I`, weights :math:`1/n`:

* for :math:`d \ge 3` and small β almost every start synchronizes: the fraction of uniform starts
  whose pairwise cosines all exceed :math:`1 - 10^{-6}` by ``T``;
* at the synchronized state the deviations decay at :math:`\lambda_{SA} = 1`,
  :math:`\lambda_{USA} = e^{\beta}` (:func:`linearized_rate`; the Jacobian's spectrum is
  :math:`-\lambda` and 0, :func:`jacobian_spectrum`): the late slope of
  :math:`\log\max_i d(x_i(t), m(t))`;
* tokens in an open hemisphere collapse to one point for every β, and
  :math:`\min_i\langle x_i(t), e\rangle` never decreases.

The derivation and the measured values: docs/papers/dichotomy.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
from scipy import stats

from ..measure import Atoms
from ..models import SA, USA
from ..solvers.particles import simulate
from ..solvers.saveat import SaveAt
from ..sphere import geodesic_distance, normalize, tangent_frame, uniform
from .parts import Parts
from .progress import steps
from .report import StudyReport, register, save_figure, subplots

__all__ = [
    "linearized_rate",
    "jacobian_spectrum",
    "deviation_from_mean",
    "diameter",
    "synchronized",
    "late_rate",
    "hemisphere_start",
    "study_dichotomy",
]

#: pairwise cosines above this count as one point
SYNC_COS = 1.0 - 1e-6
#: the late-time fit uses the saves where the deviation lies in this window (far below the nonlinear
#: corrections, relative O(deviation^2), and far above round-off)
FIT_WINDOW = (1e-10, 1e-4)
#: the hemisphere start: uniform on {<x, e_d> > HEMI_MARGIN}
HEMI_MARGIN = 0.1
#: RK4 step (relative error of a fitted rate ~ (lambda dt)^4 / 120 < 1e-5)
DT = 0.05
SAVE_EVERY = 0.25  # the fit window spans log(1e6)/lambda: ~55 saves at rate 1


class Plan(TypedDict):
    """The study's sizes: tokens ``n``, seeds, dimensions, betas (uniform and hemisphere starts), final time."""

    n: int
    seeds: int
    dims: tuple[int, ...]
    betas: tuple[float, ...]
    hemi_betas: tuple[float, ...]
    T: float


#: final time T (divided by :func:`run_scale` for USA)
QUICK: Plan = {
    "n": 16,
    "seeds": 48,
    "dims": (3, 8),
    "betas": (0.5, 1.0),
    "hemi_betas": (1.0, 4.0),
    "T": 30.0,
}
FULL: Plan = {**QUICK, "n": 32, "seeds": 256, "T": 45.0}
#: least fraction of seeds synchronized by T (from the hemisphere at beta = 4 a few seeds sit near two
#: clusters for a long time -- metastability -- and collapse later)
MIN_FRACTION = {"uniform": 0.95, "hemisphere": 0.8}
MODELS = {"SA": SA, "USA": USA}


def linearized_rate(model: str, beta: float) -> float:
    r"""Decay rate of the deviations at a synchronized state: 1 for SA, :math:`e^{\beta}` for USA (module docstring).

    Examples
    --------
    >>> linearized_rate("SA", 2.0), round(linearized_rate("USA", 1.0), 6)
    (1.0, 2.718282)
    """
    if model == "SA":
        return 1.0
    if model == "USA":
        return float(np.exp(beta))
    raise ValueError(f"model must be 'SA' or 'USA', got {model!r}")


def jacobian_spectrum(model: Any, n: int, d: int, *, h: float = 1e-6, seed: int = 0) -> np.ndarray:
    r"""Eigenvalues of the particle system's Jacobian at a synchronized state, by central differences.

    The state :math:`x_1 = \dots = x_n = x^*` (:math:`x^*` random); each token is displaced along
    an orthonormal tangent basis at :math:`x^*` (``(d-1)`` directions), giving the
    :math:`n(d-1)\times n(d-1)` matrix of :math:`\partial \dot\varepsilon / \partial\varepsilon`.
    Sorted ascending; theory: :math:`-\lambda` with multiplicity :math:`(n-1)(d-1)`, then 0 with
    multiplicity :math:`d-1`.

    Examples
    --------
    Three tokens in :math:`\mathbb{R}^3` under SA: :math:`-1` four times, then 0 twice.

    >>> from wflow.models import SA
    >>> ev = jacobian_spectrum(SA(1.0), 3, 3)
    >>> bool(np.allclose(ev, [-1, -1, -1, -1, 0, 0], atol=1e-6))
    True
    """
    xs = normalize(np.random.default_rng(seed).standard_normal((1, d)))[0]
    E = tangent_frame(xs)  # (d-1, d), orthonormal tangent basis at x*
    base = np.repeat(xs[None], n, axis=0)
    m = n * (d - 1)
    J = np.empty((m, m))
    for k in range(m):
        i, a = divmod(k, d - 1)
        cols = []
        for s in (h, -h):
            x = base.copy()
            x[i] = np.cos(s) * xs + np.sin(s) * E[a]
            v = model.velocity(x, Atoms(x), backend="numpy")
            cols.append((v @ E.T).reshape(m))  # tangent components at x* (first order suffices)
        J[:, k] = (cols[0] - cols[1]) / (2 * h)
    return np.sort(np.linalg.eigvals(J).real)


def deviation_from_mean(x: np.ndarray) -> np.ndarray:
    r""":math:`\max_i d(x_i, m)`, :math:`m = \bar x/|\bar x|` (geodesic), shape ``x.shape[:-2]``.

    Examples
    --------
    >>> round(float(deviation_from_mean(np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))), 6)  # pi / 4
    0.785398
    """
    m = normalize(np.mean(x, axis=-2, keepdims=True))
    return geodesic_distance(x, m).max(axis=-1)


def diameter(x: np.ndarray) -> np.ndarray:
    r""":math:`\max_{ij} d(x_i, x_j)` (geodesic), shape ``x.shape[:-2]``.

    Examples
    --------
    >>> round(float(diameter(np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))), 6)  # pi / 2
    1.570796
    """
    return geodesic_distance(x[..., :, None, :], x[..., None, :, :]).max(axis=(-1, -2))


def synchronized(x: np.ndarray, cos: float = SYNC_COS) -> np.ndarray:
    """True where every pairwise cosine exceeds ``cos``, shape ``x.shape[:-2]``.

    Examples
    --------
    >>> x = np.array([[[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]], [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    >>> synchronized(x)
    array([ True, False])
    """
    g = np.einsum("...id,...jd->...ij", x, x)
    return g.min(axis=(-1, -2)) > cos


def late_rate(
    t: np.ndarray, delta: np.ndarray, window: tuple[float, float] = FIT_WINDOW
) -> tuple[float, float, int]:
    r"""Decay rate :math:`-\,d\log\delta/dt` fitted (OLS) where :math:`\delta` lies in ``window``.

    Returns the rate, the half-width of its 99 % confidence interval and the number of points (NaN
    when fewer than 4 lie in the window).

    Examples
    --------
    >>> t = np.linspace(0.0, 10.0, 101)
    >>> rate, half, m = late_rate(t, 1e-3 * np.exp(-2.0 * t))
    >>> round(rate, 10), half < 1e-6, m
    (2.0, True, 69)
    """
    sel = (delta > window[0]) & (delta < window[1])
    if sel.sum() < 4:
        return np.nan, np.nan, int(sel.sum())
    res = stats.linregress(t[sel], np.log(delta[sel]))
    half = stats.t.ppf(0.995, sel.sum() - 2) * res.stderr
    return float(-res.slope), float(half), int(sel.sum())


def hemisphere_start(
    n: int, d: int, batch: int, rng: np.random.Generator, margin: float = HEMI_MARGIN
) -> np.ndarray:
    r"""``batch`` systems of ``n`` points uniform on :math:`\{x : \langle x, e_d\rangle > \text{margin}\}` (rejection).

    Examples
    --------
    >>> x = hemisphere_start(5, 3, 2, np.random.default_rng(0))
    >>> x.shape, bool((x[..., -1] > 0.1).all()), bool(np.allclose(np.linalg.norm(x, axis=-1), 1.0))
    ((2, 5, 3), True, True)
    """
    out = np.empty((batch, n, d))
    filled = 0
    flat = out.reshape(-1, d)
    while filled < flat.shape[0]:
        x = uniform(2 * (flat.shape[0] - filled) + 16, d, rng)
        x = x[x[:, -1] > margin][: flat.shape[0] - filled]
        flat[filled : filled + len(x)] = x
        filled += len(x)
    return out


def run_scale(model_name: str, beta: float) -> float:
    r"""Time scale of a run: step, save interval and final time are divided by :math:`\max(1, \lambda/2)`.

    USA moves on the time scale :math:`e^{-\beta}`: a fixed RK4 step of 0.05 at :math:`\lambda = e^4`
    would sit at the edge of RK4's stability interval and damp the measured rate."""
    return max(1.0, linearized_rate(model_name, beta) / 2.0)


def _run(
    model_name: str, beta: float, d: int, n: int, seeds: int, T: float, start: str
) -> dict[str, Any]:
    """One configuration: all seeds as one batch; deviation, diameter, hemisphere margin at every save."""
    rng = np.random.default_rng([d, n, int(beta * 100), 1 if start == "hemisphere" else 0, 31])
    x0 = (
        uniform(n, d, rng, batch=(seeds,))
        if start == "uniform"
        else hemisphere_start(n, d, seeds, rng)
    )
    model = MODELS[model_name](beta)
    scale = run_scale(model_name, beta)
    T = T / scale
    times = np.arange(0.0, T + 1e-9, SAVE_EVERY / scale)
    t0 = time.perf_counter()
    tr = simulate(model, x0, T, save_at=SaveAt(times, diagnostics=()), dt=DT / scale, method="rk4")
    seconds = time.perf_counter() - t0
    x = np.asarray(tr.points)  # (k, seeds, n, d)
    dev = deviation_from_mean(x)  # (k, seeds)
    diam = np.stack([diameter(xi) for xi in x])
    margin = x[..., -1].min(axis=-1)  # min_i <x_i, e_d>, (k, seeds)
    return {
        "times": np.asarray(tr.times),
        "deviation": dev,
        "diameter": diam,
        "margin": margin,
        "synced": synchronized(x[-1]),
        "seconds": seconds,
        "T": T,
    }


def _ci_mean(v: np.ndarray) -> tuple[float, float]:
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return (float(v.mean()) if len(v) else np.nan), np.inf
    return float(v.mean()), float(stats.t.ppf(0.995, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))


@register("dichotomy", group="papers")
def study_dichotomy(out: Path, quick: bool = True) -> StudyReport:
    """Synchronization fraction, final rate vs the linearization, hemisphere collapse (module docstring).

    Examples
    --------
    >>> rep = study_dichotomy("out/dichotomy", quick=True)  # doctest: +SKIP
    >>> rep.name  # doctest: +SKIP
    'dichotomy'
    """
    cfg = QUICK if quick else FULL
    rep = StudyReport("dichotomy")
    parts = Parts(out, "dichotomy", quick)
    n, seeds, T = cfg["n"], cfg["seeds"], cfg["T"]
    curves = {}
    # the linearization, by finite differences of wflow's velocity (independent of the fits below)
    for name in MODELS:
        for beta in cfg["betas"]:
            ev = jacobian_spectrum(MODELS[name](beta), 6, 3)
            lam = linearized_rate(name, beta)
            k = 5 * 2  # (n - 1)(d - 1) with n = 6, d = 3
            err = max(np.abs(ev[:k] / -lam - 1).max(), np.abs(ev[k:]).max() / lam)
            rep.rows.append(
                {
                    "part": "jacobian",
                    "model": name,
                    "beta": beta,
                    "n": 6,
                    "d": 3,
                    "theory_rate": lam,
                    "eigs_min": ev[0],
                    "eigs_max": ev[-1],
                    "relative_error": err,
                }
            )
            rep.expect(
                f"{name} beta={beta:g}: Jacobian at a synchronized state (n=6, d=3) = -lambda (x10), 0 (x2); "
                f"lambda = {lam:.4g}, largest relative error",
                err,
                0.0,
                1e-6,
            )
    configs = [
        (start_kind, name, d, beta)
        for start_kind, betas in (("uniform", cfg["betas"]), ("hemisphere", cfg["hemi_betas"]))
        for name in MODELS
        for d in cfg["dims"]
        for beta in betas
    ]
    what = f"{len(configs)} configurations of {seeds} seeds, n = {n}, RK4 to t = {T:g}"
    for start_kind, name, d, beta in steps("dichotomy", what, configs):
        key = {
            "start": start_kind,
            "model": name,
            "beta": beta,
            "d": d,
            "n": n,
            "seeds": seeds,
            "T": T,
            "dt": DT,
            "save": SAVE_EVERY,
            "scale": run_scale(name, beta),
        }
        r = parts.get(key, lambda: _run(name, beta, d, n, seeds, T, start_kind))
        lam = linearized_rate(name, beta)
        series = r["deviation"] if start_kind == "uniform" else r["diameter"]
        fits = np.array([late_rate(r["times"], series[:, s]) for s in range(seeds)])
        rates = fits[:, 0]
        mean, half = _ci_mean(rates)
        frac = float(np.mean(r["synced"]))
        curves[(start_kind, name, d, beta)] = (r["times"], series, lam)
        label = f"{start_kind} start, {name}, d={d}, beta={beta:g}"
        row = {
            "part": start_kind,
            "model": name,
            "beta": beta,
            "d": d,
            "n": n,
            "seeds": seeds,
            "fraction_synchronized": frac,
            "theory_rate": lam,
            "rate_mean": mean,
            "rate_ci99": half,
            "rate_min": float(np.nanmin(rates)),
            "rate_max": float(np.nanmax(rates)),
            "fitted_seeds": int(np.isfinite(rates).sum()),
            "median_fit_halfwidth": float(np.nanmedian(fits[:, 1])),
            "seconds": r["seconds"],
        }
        if start_kind == "hemisphere":
            margin = r["margin"][0] - np.minimum.accumulate(r["margin"], axis=0)[-1]
            row["margin_drop"] = float(np.max(margin))
            # the time to shrink the diameter by 1e-4 (average rate over the whole approach)
            hit = np.argmax(r["diameter"] < 1e-4 * r["diameter"][0], axis=0)
            ok = r["diameter"][-1] < 1e-4 * r["diameter"][0]
            avg = np.log(1e4) / r["times"][hit[ok]] if ok.any() else np.array([np.nan])
            row["average_rate_1e-4_mean"] = float(np.mean(avg))
            row["average_rate_1e-4_min"] = float(np.min(avg))
        rep.rows.append(row)
        row["T"] = t_end = float(r["T"])
        row["final_spread_max"] = float(series[-1].max())
        rep.expect(
            f"{label}: fraction of {seeds} seeds synchronized (all cosines > 1 - 1e-6) by "
            f"t={t_end:.3g}",
            frac,
            MIN_FRACTION[start_kind],
            1.0,
        )
        rep.expect(
            f"{label}: late rate {mean:.5f} ± {half:.1e} (99% CI over seeds) / linearization "
            f"{lam:.5f} - 1",
            abs(mean / lam - 1),
            0.0,
            1e-3,
        )
        if start_kind == "hemisphere":
            rep.expect(
                f"{label}: largest decrease of min_i <x_i(t), e> (cone invariance)",
                row["margin_drop"],
                0.0,
                1e-9,
            )
    rep.notes.append(
        "Rates: per seed, OLS slope of log(deviation) against t over the saves with deviation in "
        f"[{FIT_WINDOW[0]:g}, {FIT_WINDOW[1]:g}] (uniform start: max_i geodesic distance to the normalized mean; "
        "hemisphere start: the geodesic diameter); the table gives the mean over seeds with its 99% CI. "
        f"RK4 dt={DT:g}, saves every {SAVE_EVERY:g} (both divided by max(1, lambda/2) for USA, and T too). "
        "The 99% CIs are narrower than the gap to theory: the fits carry the RK4 error of the rate, "
        "(lambda dt)^4/120 = 5.2e-8 relative (the measured gap is 5-9e-8); the nonlinear corrections are "
        "O(deviation^2) < 1e-8 in the fit window."
    )
    rep.notes.append(
        "Hemisphere start: uniform on {<x, e> > 0.1}. CSV column average_rate_1e-4_* is log(1e4) / (time for the "
        "diameter to shrink by 1e-4), the average rate over the whole collapse (slower than the final rate: the "
        "early phase is nonlinear)."
    )
    rep.notes.append(parts.note())
    rep.figures.append(_figure(out, curves))
    return rep


def _figure(out: Path, curves) -> Path:
    fig, axes = subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
    for ax, kind in zip(axes, ("uniform", "hemisphere")):
        for (k, name, d, beta), (t, series, lam) in curves.items():
            if k != kind or d != min(dd for (kk, _, dd, _) in curves if kk == kind):
                continue
            med = np.exp(np.median(np.log(np.maximum(series, 1e-300)), axis=1))
            p = ax.semilogy(
                lam * t, med, label=f"{name}, β={beta:g} (λ={lam:.3g}): median of seeds"
            )
            # the linearization's slope -1 in lambda t, anchored where the median enters the fit window
            i = int(np.argmax(med < FIT_WINDOW[1]))
            tt = lam * t[i:]
            ax.semilogy(tt, med[i] * np.exp(-(tt - tt[0])), ":", color=p[0].get_color(), lw=1.5)
        ax.set_ylim(1e-14, 4)
        ax.axhspan(*FIT_WINDOW, color="0.9", zorder=0)
        dmin = min(dd for (kk, _, dd, _) in curves if kk == kind)
        ax.set_xlabel("λ t (time in units of 1/λ, dimensionless)")
        ax.set_ylabel(
            "max_i d(x_i, mean) (rad)" if kind == "uniform" else "diameter max_ij d(x_i, x_j) (rad)"
        )
        ax.set_title(
            f"{kind} start, d={dmin}: dotted = e^(-λt) (on the curves), shaded = fit window",
            fontsize=9,
        )
        ax.legend(fontsize=7)
    return save_figure(fig, Path(out) / "dichotomy.png", dpi=110)
