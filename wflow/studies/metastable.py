r"""Metastable clusters: the linear phase selects the number of clusters (``metastable``).

Bruno, Pasqualotto and Agazzi, *Emergence of meta-stable clustering in mean-field transformer models*
(ICLR 2025, arXiv:2410.23228), Theorem 4.3 and Figure 4; Rigollet, *The mean-field dynamics of
transformers* (2025).  Around the uniform measure on :math:`S^1` Fourier mode :math:`k` grows at
:math:`\lambda_k = k^2 I_k(\beta)/(\beta I_0(\beta))` (SA, :func:`wflow.theory.growth_rate`), so the
linear phase leaves :math:`k^* = \arg\max_k k^2 I_k(\beta)` clusters at the maxima of
:math:`\cos(k^*\theta + \arg\hat c_{k^*}(0))`; on :math:`S^2` the degree :math:`\ell^*` of largest
rate should dominate.  The study measures, at the end of the linear phase (the first save at which
the largest Fourier coefficient reaches :data:`AMPLITUDE`), the dominant mode, the density peaks
and their angles, for finite volume and particles on :math:`S^1` and the degree spectrum of
particles on :math:`S^2`; near ties are judged by :func:`selection_probability`,
:func:`resolved_modes` and :func:`competitor_ratio`.  Method, measured values and why:
docs/papers/metastable.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scipy import integrate, special
from scipy.signal import find_peaks

from ..density import Density
from ..mesh import CircleMesh
from ..models import SA
from ..solvers.eulerian import solve_density
from ..solvers.particles import simulate
from ..solvers.saveat import SaveAt
from ..sphere import uniform
from ..theory import growth_rate, most_unstable_mode
from .parts import Parts
from .progress import numbered
from .report import StudyReport, register, save_figure, subplots

__all__ = [
    "metastable",
    "fourier_coefficients",
    "smoothed_density",
    "count_peaks",
    "predicted_angles",
    "angle_error",
    "degree_spectrum",
    "selection_probability",
    "resolved_modes",
    "competitor_ratio",
    "linear_prediction",
    "fit_growth",
    "PLANS",
]

#: largest Fourier coefficient |c_k| that ends the linear phase (density 1 + 2|c| cos: +-50 %)
AMPLITUDE = 0.25
#: Fourier modes examined on S^1; degrees on S^2
K_MAX = 12
L_MAX = 12
#: finite-volume initial amplitude per mode and number of perturbed modes
FV_EPS = 1e-3
FV_MODES = 24
#: save interval (the end of the linear phase is located to this), RK4 step of the particles
DT_SAVE = 0.2
DT = 0.2
#: last time searched for the end of the linear phase
T_MAX = 30.0
SAVE_TIMES = np.arange(0.0, T_MAX + 1e-9, DT_SAVE)
#: width (rad) of the wrapped-Gaussian smoothing that counts peaks; peak prominence / mean density
SIGMA = 0.1
PROMINENCE = 0.25
#: a mode (degree) at least this fraction of the leader's amplitude (power) is not separated from it
SEPARATION = 0.5
#: the growth of the degree spectrum is fitted while max_l A_l <= FIT_MAX (rms density modulation of
#: degree l*: sqrt((2l+1) FIT_MAX) ~ 0.25); measured A_l* / (2 lambda_l*) within FIT_TOL
FIT_MAX = 0.01
FIT_TOL = 0.1

PLANS: dict[str, dict[str, Any]] = {
    "quick": {
        "betas": (2.0, 5.0, 10.0),
        "n": 5000,
        "seeds": 2,
        "fv_cells": 256,
        "s2_betas": (5.0,),
        "s2_n": 1500,
        "s2_seeds": 1,
    },
    "full": {
        "betas": (1.0, 2.0, 5.0, 7.0, 10.0, 20.0),
        "n": 20_000,
        "seeds": 5,
        "fv_cells": 512,
        "s2_betas": (2.0, 5.0, 10.0),
        "s2_n": 3000,
        "s2_seeds": 2,
    },
}


def fourier_coefficients(theta, k_max: int = K_MAX, weights=None) -> np.ndarray:
    r""":math:`\hat c_k = \sum_i w_i e^{-ik\theta_i}` for :math:`k = 1..k_{\max}` (uniform weights by default).

    A density :math:`\frac{1}{2\pi}(1 + 2\sum_k |\hat c_k|\cos(k\theta + \arg\hat c_k))` has these
    coefficients; a single atom has :math:`|\hat c_k| = 1`.

    Examples
    --------
    Two antipodal atoms keep the even modes only:

    >>> np.round(np.abs(fourier_coefficients([0.0, np.pi], k_max=4)), 6)
    array([0., 1., 0., 1.])
    """
    theta = np.asarray(theta, dtype=float).ravel()
    w = (
        np.full(theta.size, 1.0 / theta.size)
        if weights is None
        else np.asarray(weights, float).ravel() / np.sum(weights)
    )
    k = np.arange(1, k_max + 1)
    return np.exp(-1j * np.outer(k, theta)) @ w


def smoothed_density(theta, m: int = 256, sigma: float = SIGMA, weights=None) -> np.ndarray:
    r"""Density on the grid :math:`2\pi(j + \frac12)/m - \pi` of the angles smoothed by a wrapped Gaussian.

    Histogram on ``m`` bins, then each Fourier mode multiplied by :math:`e^{-k^2\sigma^2/2}`; the
    result integrates to 1 (shape ``(m,)``, values in 1/rad).  With cell masses of a finite-volume
    density as ``weights`` at the cell centres it smooths that density the same way.

    Examples
    --------
    >>> rho = smoothed_density(np.zeros(10), m=64)
    >>> rho.shape, round(float(rho.sum() * 2 * np.pi / 64), 6)
    ((64,), 1.0)
    """
    theta = np.mod(np.asarray(theta, dtype=float).ravel() + np.pi, 2 * np.pi) - np.pi
    h, _ = np.histogram(theta, bins=m, range=(-np.pi, np.pi), weights=weights)
    g = np.fft.rfft(h / np.sum(h))
    k = np.arange(g.size)
    s = np.fft.irfft(g * np.exp(-0.5 * (k * sigma) ** 2), m)
    return s * m / (2 * np.pi)


def grid_angles(m: int) -> np.ndarray:
    """The angles of :func:`smoothed_density`'s grid."""
    return 2 * np.pi * (np.arange(m) + 0.5) / m - np.pi


def count_peaks(values, prominence: float = PROMINENCE) -> tuple[int, np.ndarray]:
    """Local maxima of a periodic density above its mean with prominence ``>= prominence * mean``.

    Returns the count and the peaks' indices into ``values``.

    Examples
    --------
    >>> theta = grid_angles(64)
    >>> count_peaks(1.0 + 0.5 * np.cos(3 * theta))[0]
    3
    """
    v = np.asarray(values, dtype=float).ravel()
    m = v.size
    mean = v.mean()
    tiled = np.concatenate([v, v, v])
    pk, _ = find_peaks(tiled, prominence=prominence * mean)
    pk = pk[(pk >= m) & (pk < 2 * m) & (tiled[pk] > mean)] - m
    return int(pk.size), pk


def predicted_angles(c_k: complex, k: int) -> np.ndarray:
    r"""Maxima of :math:`\operatorname{Re}(\hat c_k e^{ik\theta})`: :math:`\theta_j = (-\arg\hat c_k + 2\pi j)/k`, in :math:`[-\pi, \pi)`.

    Examples
    --------
    >>> np.round(predicted_angles(1.0, 2), 6)
    array([ 0.      , -3.141593])
    """
    a = (-np.angle(c_k) + 2 * np.pi * np.arange(k)) / k
    return np.mod(a + np.pi, 2 * np.pi) - np.pi


def angle_error(observed, predicted) -> float:
    """Largest circular distance (rad) from an observed angle to the nearest predicted one.

    Examples
    --------
    >>> round(angle_error([0.1, 3.0], [0.0, np.pi]), 6)  # pi - 3
    0.141593
    """
    o = np.asarray(observed, float).ravel()[:, None]
    p = np.asarray(predicted, float).ravel()[None, :]
    if o.size == 0 or p.size == 0:
        return float("nan")
    dist = np.abs(np.angle(np.exp(1j * (o - p))))
    return float(dist.min(axis=1).max())


def degree_spectrum(points, ell_max: int = L_MAX, chunk: int = 2048) -> np.ndarray:
    r"""Degree spectrum of an empirical measure on :math:`S^{d-1}`: :math:`A_\ell = \frac{1}{N^2}\sum_{ij} P_\ell(\langle x_i, x_j\rangle)` (d = 3).

    :math:`A_\ell = \frac{4\pi}{2\ell+1}\sum_m |\hat\mu_{\ell m}|^2`, the mean power per component of
    degree :math:`\ell` (addition theorem): 1 for a point mass, :math:`1/N` in expectation for
    i.i.d. uniform points (every degree alike, so the degree that grows is the dynamics' choice).
    Legendre polynomials by the three-term recurrence, ``chunk`` rows of the Gram matrix at a time.
    Shape ``(ell_max + 1,)``.

    Examples
    --------
    A point mass has power 1 in every degree; two antipodal atoms keep the even degrees:

    >>> degree_spectrum(np.array([[0.0, 0.0, 1.0]] * 3), ell_max=3)
    array([1., 1., 1., 1.])
    >>> np.round(degree_spectrum(np.array([[0.0, 0.0, 1.0], [0.0, 0.0, -1.0]]), ell_max=3), 6) + 0.0
    array([1., 0., 1., 0.])
    """
    x = np.asarray(points, dtype=float).reshape(-1, np.shape(points)[-1])
    n = x.shape[0]
    out = np.zeros(ell_max + 1)
    for s in range(0, n, chunk):
        t = np.clip(x[s : s + chunk] @ x.T, -1.0, 1.0)
        p0, p1 = np.ones_like(t), t
        out[0] += p0.sum()
        if ell_max >= 1:
            out[1] += p1.sum()
        for ell in range(1, ell_max):
            p0, p1 = p1, ((2 * ell + 1) * t * p1 - ell * p0) / (ell + 1)
            out[ell + 1] += p1.sum()
    return out / n**2


def resolved_modes(rates, t: float, ratio: float = 0.5) -> list[int]:
    r"""Modes :math:`k` (1-based) whose linear amplitude at ``t`` from equal initial amplitudes is at least ``ratio`` of the leader's.

    :math:`e^{-(\lambda_{k^*} - \lambda_k)t} \ge` ``ratio``: the modes a linear phase of length ``t`` cannot
    separate from :math:`k^*`; ``[k*]`` alone when it can.

    Examples
    --------
    >>> resolved_modes([0.5, 1.0, 0.9], 10.0), resolved_modes([0.5, 1.0, 0.99], 10.0)
    ([2], [2, 3])
    """
    lam = np.asarray(rates, dtype=float)
    return [int(k) + 1 for k in np.flatnonzero(np.exp(-(lam.max() - lam) * t) >= ratio)]


def selection_probability(rates, t: float, winner: int | None = None, shape=None) -> float:
    r"""Probability that mode ``winner`` (index into ``rates``; default the fastest) dominates at time ``t``.

    Linear theory with i.i.d. Gaussian initial coefficients (the sampling noise of i.i.d. uniform
    tokens): the powers :math:`X_k = |\hat c_k(0)|^2 e^{2\lambda_k t}` are independent Gamma variables
    of shapes :math:`a_k` and means :math:`w_k \propto e^{2\lambda_k t}`, and
    :math:`P(X_* > X_k\ \forall k) = \int_0^\infty g_{a_*}(x)\prod_{k\ne *}P(a_k, a_k x w_*/w_k)\,dx`
    (:math:`g_a` the Gamma density of shape :math:`a` and mean 1, :math:`P` the regularised incomplete
    gamma function).  ``shape=None``: :math:`a_k = 1` (exponentials, a complex Fourier coefficient on
    :math:`S^1`), where the integrand is :math:`e^{-x}\prod_{k\ne *}(1 - e^{-x w_*/w_k})`; on
    :math:`S^2` the per-component power :math:`A_\ell` of degree :math:`\ell` has
    :math:`a_\ell = (2\ell+1)/2`.

    Examples
    --------
    Two tied modes win half the time each; a rate gap of 1 over ``t = 2`` gives :math:`1/(1+e^{-4})`:

    >>> round(selection_probability([1.0, 1.0], 1.0), 6), round(selection_probability([1.0, 0.0], 2.0), 6)
    (0.5, 0.982014)
    """
    lam = np.asarray(rates, dtype=float)
    i = int(np.argmax(lam)) if winner is None else int(winner)
    r = np.exp(-2 * (lam[i] - np.delete(lam, i)) * t)  # w_k / w_*
    if shape is None:

        def f(x: float) -> float:
            return float(np.exp(-x) * np.prod(-np.expm1(-x / r)))
    else:
        a = np.broadcast_to(np.asarray(shape, dtype=float), lam.shape)
        a_i, a_o = a[i], np.delete(a, i)

        def f(x: float) -> float:
            if x <= 0:
                return 0.0
            log_g = a_i * np.log(a_i) + (a_i - 1) * np.log(x) - a_i * x - special.gammaln(a_i)
            return float(np.exp(log_g) * np.prod(special.gammainc(a_o, a_o * x / r)))

    return float(integrate.quad(f, 0.0, np.inf, limit=200)[0])


def competitor_ratio(c, k: int) -> float:
    r"""Largest :math:`|\hat c_j| / |\hat c_k|` over the modes :math:`j \ne k` (1-based ``k``; ``c`` from :func:`fourier_coefficients`).

    Examples
    --------
    >>> competitor_ratio(np.array([0.1, 0.4, 0.2]), 2)
    0.5
    """
    a = np.abs(np.asarray(c)).ravel()
    return float(np.delete(a, k - 1).max() / a[k - 1])


def linear_prediction(spectrum0, rates, t: float) -> np.ndarray:
    r"""The linear theory's degree spectrum at ``t``: :math:`A_\ell(0)\,e^{2\lambda_\ell t}`, :math:`\ell = 1..`len(rates).

    Examples
    --------
    >>> np.round(linear_prediction(np.array([1.0, 0.1, 0.1]), [0.0, 0.5], 2.0), 6)
    array([0.1     , 0.738906])
    """
    lam = np.asarray(rates, dtype=float)
    return np.asarray(spectrum0, dtype=float)[1 : lam.size + 1] * np.exp(2 * lam * t)


def fit_growth(series, times, max_power: float = FIT_MAX) -> np.ndarray:
    r"""Least-squares slopes of :math:`\log A_\ell(t)` (``series`` of :func:`degree_spectrum`, shape ``(T, L+1)``) over the saves with :math:`\max_{\ell\ge1}A_\ell \le` ``max_power``.

    In the linear theory :math:`A_\ell(t) = A_\ell(0)e^{2\lambda_\ell t}` exactly, whatever the initial
    coefficients, so the slope of degree :math:`\ell` is :math:`2\lambda_\ell`.  Entry 0 (the mass) is 0;
    NaN when fewer than 3 saves qualify.

    Examples
    --------
    >>> t = np.linspace(0.0, 2.0, 5)
    >>> series = np.stack([np.ones(5), 1e-4 * np.exp(1.0 * t), 1e-4 * np.exp(2.0 * t)], axis=1)
    >>> np.round(fit_growth(series, t), 6) + 0.0
    array([0., 1., 2.])
    """
    a = np.asarray(series, dtype=float)
    t = np.asarray(times, dtype=float)
    m = a[:, 1:].max(axis=1) <= max_power
    if m.sum() < 3:
        return np.full(a.shape[1], np.nan)
    return np.polyfit(t[m], np.log(a[m]), 1)[0]


def _angles(points: np.ndarray) -> np.ndarray:
    return np.arctan2(points[..., 1], points[..., 0]).ravel()


def _circle_summary(theta_lin, weights, c0, t_lin, series, times, beta) -> dict[str, Any]:
    k_star = most_unstable_mode(beta, 2, "SA")
    c = fourier_coefficients(theta_lin, K_MAX, weights)
    dens = smoothed_density(theta_lin, weights=weights)
    n_peaks, idx = count_peaks(dens)
    peaks = grid_angles(dens.size)[idx]
    err = (
        angle_error(peaks, predicted_angles(c0[k_star - 1], k_star))
        if n_peaks == k_star
        else float("nan")
    )
    return {
        "t_lin": float(t_lin),
        "k_dom": int(np.argmax(np.abs(c)) + 1),
        "n_peaks": n_peaks,
        "angle_error": err,
        "peaks": peaks,
        "density": dens,
        "c0": c0,
        "c_lin": c,
        "series": np.asarray(series),
        "times": np.asarray(times),
    }


def _until(beta: float, x0: np.ndarray, measure, reached) -> tuple[Any, np.ndarray, np.ndarray]:
    """SA particles from ``x0`` (spectral backend) until ``reached(measure(points))`` or T_MAX: the
    run, and the measure at every step with its time."""
    series, times = [], []

    def stop(t, mu):
        series.append(measure(mu.points))
        times.append(t)
        return reached(series[-1])

    saves = SaveAt(SAVE_TIMES, points=False, diagnostics=())
    tr = simulate(SA(beta), x0, T_MAX, dt=DT, save_at=saves, backend="spectral", trackers=[stop])
    return tr, np.asarray(series), np.asarray(times)


def run_particles(beta: float, n: int, seed: int) -> dict[str, Any]:
    """SA particles from ``n`` i.i.d. uniform tokens on S^1 until the end of the linear phase."""
    x0 = uniform(n, 2, seed=np.random.default_rng([int(round(10 * beta)), seed, 15]))
    tr, series, times = _until(
        beta, x0, lambda x: np.abs(fourier_coefficients(_angles(x))), lambda c: c.max() >= AMPLITUDE
    )
    c0 = fourier_coefficients(_angles(x0))
    return _circle_summary(_angles(tr.points_at(-1)), None, c0, tr.times[-1], series, times, beta)


def _fv_initial(seed: int):
    phases = np.random.default_rng([seed, 16]).uniform(0, 2 * np.pi, FV_MODES)
    k = np.arange(1, FV_MODES + 1)[:, None]

    def f(x):
        th = np.arctan2(x[:, 1], x[:, 0])[None]
        return 1.0 + 2 * FV_EPS * np.cos(k * th - phases[:, None]).sum(0)

    # c_k = eps e^{-i phi_k} for the density (1 + 2 eps sum cos(k theta - phi_k)) / 2 pi
    return f, FV_EPS * np.exp(-1j * phases[:K_MAX])


def run_fv(beta: float, cells: int, seed: int) -> dict[str, Any]:
    """Finite volume (SA) from uniform + equal-amplitude random-phase modes until the end of the linear phase."""
    mesh = CircleMesh(cells)
    f, c0 = _fv_initial(seed)
    rho0 = Density.from_function(mesh, f)
    th = mesh.center_angles
    series, times = [], []

    def stop(t, rho):
        c = np.abs(fourier_coefficients(th, K_MAX, rho.masses()))
        series.append(c)
        times.append(t)
        return c.max() >= AMPLITUDE

    sol = solve_density(
        SA(beta), rho0, T_MAX, save_at=SAVE_TIMES, backend="spectral", callback=stop, keep=False
    )
    return _circle_summary(th, sol.values[-1] * mesh.areas, c0, sol.times[-1], series, times, beta)


def run_sphere(beta: float, n: int, seed: int) -> dict[str, Any]:
    """SA particles from ``n`` i.i.d. uniform tokens on S^2 until the largest A_l (l >= 1) reaches AMPLITUDE^2."""
    x0 = uniform(n, 3, seed=np.random.default_rng([int(round(10 * beta)), seed, 17]))
    tr, a, times = _until(beta, x0, degree_spectrum, lambda a: a[1:].max() >= AMPLITUDE**2)
    return {
        "t_lin": float(tr.times[-1]),
        "l_dom": int(np.argmax(a[-1, 1:]) + 1),
        "spectrum0": a[0],
        "spectrum": a[-1],
        "series": a,
        "times": times,
    }


def _sphere(
    rep: StudyReport,
    parts: Parts,
    plan: dict[str, Any],
    results: dict[tuple, dict[str, Any]],
    quick: bool,
    label: Callable[[str], str] = str,
) -> None:
    """S^2: the growth of A_l* over the linear phase against 2 lambda_l*, the dominant degree against the
    degrees the linear theory does not separate, and (full mode) how often l* wins against the theory."""
    s2_matches, s2_expected, s2_var = 0, 0.0, 0.0
    n = plan["s2_n"]
    ells = np.arange(1, L_MAX + 1)
    for beta in plan["s2_betas"]:
        l_star = most_unstable_mode(beta, 3, "SA")
        lam3 = growth_rate(ells, beta, 3, "SA")
        for seed in range(plan["s2_seeds"]):
            t0 = time.perf_counter()
            s = parts.get(
                {
                    "solver": "particles-s2",
                    "beta": beta,
                    "n": n,
                    "seed": seed,
                    "dt": DT,
                    "amplitude": AMPLITUDE,
                },
                lambda: run_sphere(beta, n, seed),
                what=label(f"S2, beta = {beta:g}: {n} particles, seed {seed}"),
            )
            results[("s2", beta, seed)] = s
            slope = fit_growth(s["series"], s["times"])[l_star]
            pred = linear_prediction(s["spectrum0"], lam3, s["t_lin"])
            pred_set = [int(x) for x in ells[pred >= SEPARATION * pred.max()]]
            prob = selection_probability(lam3, s["t_lin"], shape=(2 * ells + 1) / 2)
            s2_matches += int(s["l_dom"] == l_star)
            s2_expected += prob
            s2_var += prob * (1 - prob)
            rep.rows.append(
                {
                    "solver": "particles-s2",
                    "beta": beta,
                    "seed": seed,
                    "size": n,
                    "k_star": l_star,
                    "t_lin": s["t_lin"],
                    "k_dom": s["l_dom"],
                    "rate_kdom": float(lam3[s["l_dom"] - 1]),
                    "rate_kstar": float(lam3[l_star - 1]),
                    "p_kstar": prob,
                    "slope_kstar": float(slope),
                    "k_pred": int(np.argmax(pred) + 1),
                }
            )
            rep.expect(
                f"S^2 beta={beta:g} seed {seed}: growth of A_l* (l*={l_star}) over the linear phase "
                f"(max A_l <= {FIT_MAX:g}) / 2 lambda_l*",
                slope / (2 * lam3[l_star - 1]),
                1 - FIT_TOL,
                1 + FIT_TOL,
            )
            rep.expect(
                f"S^2 beta={beta:g} seed {seed}: dominant degree {s['l_dom']} among the degrees the linear theory "
                f"from the measured initial spectrum does not separate at t_lin, {pred_set} (1 = yes)",
                float(s["l_dom"] in pred_set),
                1,
                1,
            )
            rep.notes.append(
                f"S^2 beta={beta:g} seed {seed}: l*={l_star}, dominant {s['l_dom']}, predicted from "
                f"N A_l(0) = {', '.join(f'{x:.2f}' for x in s['spectrum0'][1:7] * n)}: "
                f"{int(np.argmax(pred) + 1)}; P(l* wins) {prob:.2f}; t_lin={s['t_lin']:.1f}, A_l = "
                f"{', '.join(f'{x:.3f}' for x in s['spectrum'][1:9])} ({time.perf_counter() - t0:.1f} s)"
            )
    if not quick:
        # like the circle: l* at least as often as the linear theory with chi^2_{2l+1} initial powers expects
        sd = np.sqrt(max(s2_var, 0.25))
        n_s2 = len(plan["s2_betas"]) * plan["s2_seeds"]
        rep.expect(
            f"S^2 particles: runs selecting l* ({s2_matches}/{n_s2}) - linear-theory expectation "
            f"({s2_expected:.1f}), in units of its binomial sd ({sd:.2f}); at least as often as the linear theory",
            (s2_matches - s2_expected) / sd,
            -2.0,
            np.inf,
        )


@register("metastable", group="papers")
def metastable(out: Path, quick: bool = True) -> StudyReport:
    """Number of clusters at the end of the linear phase against k* = argmax k^2 I_k(beta) (module docstring).

    Examples
    --------
    >>> rep = metastable("out/metastable", quick=True)  # doctest: +SKIP
    >>> rep.name  # doctest: +SKIP
    'metastable'
    """
    rep = StudyReport("metastable")
    plan = PLANS["quick" if quick else "full"]
    detection = {"amplitude": AMPLITUDE, "sigma": SIGMA, "prominence": PROMINENCE}
    parts = Parts(out, "metastable", quick)
    ks = np.arange(1, K_MAX + 1)
    results: dict[tuple, dict[str, Any]] = {}
    expected_matches, matches, n_runs = 0.0, 0, 0
    errors: list[float] = []
    errors_all: list[float] = []
    label = numbered(
        len(plan["betas"]) * (1 + plan["seeds"]) + len(plan["s2_betas"]) * plan["s2_seeds"]
    )
    for beta in plan["betas"]:
        k_star = most_unstable_mode(beta, 2, "SA")
        lam = growth_rate(ks, beta, 2, "SA")
        t0 = time.perf_counter()
        fv = parts.get(
            {"solver": "fv", "beta": beta, "cells": plan["fv_cells"], "seed": 0, "eps": FV_EPS}
            | detection,
            lambda: run_fv(beta, plan["fv_cells"], 0),
            what=label(f"S1, beta = {beta:g}: finite volume, {plan['fv_cells']} cells"),
        )
        t_fv = time.perf_counter() - t0
        results[("fv", beta, 0)] = fv
        rep.rows.append(_row("fv", beta, 0, plan["fv_cells"], k_star, fv, lam))
        near = resolved_modes(lam, fv["t_lin"])
        rep.expect(
            f"beta={beta:g} finite volume: dominant mode {fv['k_dom']} in the modes the linear phase cannot "
            f"separate from k*={k_star}, {near} (1 = yes)",
            float(fv["k_dom"] in near),
            1,
            1,
        )
        rep.expect(
            f"beta={beta:g} finite volume: {fv['n_peaks']} density peaks in {near} (1 = yes)",
            float(fv["n_peaks"] in near),
            1,
            1,
        )
        _collect_error(fv, k_star, errors, errors_all)
        t0 = time.perf_counter()
        agree, probs = [], []
        for seed in range(plan["seeds"]):
            p = parts.get(
                {"solver": "particles", "beta": beta, "n": plan["n"], "seed": seed, "dt": DT}
                | detection,
                lambda: run_particles(beta, plan["n"], seed),
                what=label(f"S1, beta = {beta:g}: {plan['n']} particles, seed {seed}"),
            )
            results[("particles", beta, seed)] = p
            rep.rows.append(_row("particles", beta, seed, plan["n"], k_star, p, lam))
            prob = selection_probability(lam, p["t_lin"])
            probs.append(prob)
            agree.append(p["k_dom"] == k_star)
            _collect_error(p, k_star, errors, errors_all)
        t_p = time.perf_counter() - t0
        expected_matches += sum(probs)
        matches += sum(agree)
        n_runs += len(agree)
        peaks = [results[("particles", beta, s)]["n_peaks"] for s in range(plan["seeds"])]
        rep.notes.append(
            f"beta={beta:g}: k*={k_star} (rates {', '.join(f'{x:.3f}' for x in lam[:8])}); FV t_lin="
            f"{fv['t_lin']:.1f}, mode {fv['k_dom']}, {fv['n_peaks']} peaks ({t_fv:.1f} s); particles "
            f"N={plan['n']}: dominant modes {[results[('particles', beta, s)]['k_dom'] for s in range(plan['seeds'])]}, "
            f"peaks {peaks}, linear-theory P(k* wins) {np.mean(probs):.2f} ({t_p:.1f} s)"
        )
    # particles: the number of seeds selecting k* against the linear theory's expected number (binomial 2 sigma)
    var = sum(r["p_kstar"] * (1 - r["p_kstar"]) for r in rep.rows if r["solver"] == "particles")
    sd = np.sqrt(max(var, 0.25))
    rep.expect(
        f"particles: runs selecting k* ({matches}/{n_runs}) - linear-theory expectation "
        f"({expected_matches:.1f}), in units of its binomial sd ({sd:.2f}); at least as often as the linear theory",
        (matches - expected_matches) / sd,
        -2.0,
        np.inf,
    )
    # the phase of mode k* predicts the peaks where the linear phase has separated k* (module docstring)
    rep.expect(
        f"angle error of the peaks vs the initial phase of mode k*, in units of half the spacing pi/k* "
        f"(max over the {len(errors)} runs with k* peaks, dominant mode k* and every other mode below "
        f"{SEPARATION:g} |c_k*|; median {np.median(errors) if errors else float('nan'):.2f})",
        max(errors) if errors else float("nan"),
        0.0,
        0.5,
    )
    if errors_all:
        rep.notes.append(
            f"angle error / (pi/k*) over all {len(errors_all)} runs with k* peaks and dominant mode k*, "
            f"separated or not: median {np.median(errors_all):.2f}, max {max(errors_all):.2f}"
        )
    _sphere(rep, parts, plan, results, quick, label)
    rep.notes.append(parts.note())
    rep.figures.append(_figure(results, plan, out))
    return rep


def _collect_error(r, k_star, errors, errors_all) -> None:
    """Angle error in units of pi/k* of a run with dominant mode and peak count k*: to ``errors`` too if k* is separated."""
    if r["k_dom"] == k_star and np.isfinite(r["angle_error"]):
        e = float(r["angle_error"]) * k_star / np.pi
        errors_all.append(e)
        if competitor_ratio(r["c_lin"], k_star) <= SEPARATION:
            errors.append(e)


def _row(solver, beta, seed, size, k_star, r, lam) -> dict[str, Any]:
    return {
        "solver": solver,
        "beta": beta,
        "seed": seed,
        "size": size,
        "k_star": k_star,
        "t_lin": r["t_lin"],
        "k_dom": r["k_dom"],
        "n_peaks": r["n_peaks"],
        "angle_error": r["angle_error"],
        "rate_kdom": float(lam[r["k_dom"] - 1]),
        "rate_kstar": float(lam[k_star - 1]),
        "p_kstar": selection_probability(lam, r["t_lin"])
        if solver == "particles"
        else float("nan"),
        "c_kstar_0": float(abs(r["c0"][k_star - 1])),
        "c_kstar_lin": float(abs(r["c_lin"][k_star - 1])),
        "competitor_ratio": competitor_ratio(r["c_lin"], k_star),
    }


def _figure(results, plan, out: Path) -> Path:
    betas = plan["betas"]
    fig, axes = subplots(2, len(betas), figsize=(3.2 * len(betas), 6.2), squeeze=False)
    ks = np.arange(1, K_MAX + 1)
    for j, beta in enumerate(betas):
        k_star = most_unstable_mode(beta, 2, "SA")
        ax = axes[0, j]
        fv = results[("fv", beta, 0)]
        th = grid_angles(fv["density"].size)
        ax.plot(th, fv["density"], "k-", lw=1.2, label=f"finite volume, t={fv['t_lin']:.1f}")
        p = results[("particles", beta, 0)]
        label = f"particles N={plan['n']}, t={p['t_lin']:.1f}"
        ax.plot(th, p["density"], "-", color="C1", lw=1, label=label)
        for a in predicted_angles(fv["c0"][k_star - 1], k_star):
            ax.axvline(a, color="k", ls=":", lw=0.8)
        for a in predicted_angles(p["c0"][k_star - 1], k_star):
            ax.axvline(a, color="C1", ls=":", lw=0.8)
        ax.set(title=f"β={beta:g}: k*={k_star}", xlabel="angle θ (rad)")
        ax.legend(fontsize=6, loc="upper right")
        ax = axes[1, j]
        lam = growth_rate(ks, beta, 2, "SA")
        ax.plot(ks, lam, "o-", color="0.5", ms=3, label="λ_k = k² I_k(β)/(β I_0(β))")
        counts = [results[("particles", beta, s)]["n_peaks"] for s in range(plan["seeds"])]
        vals, num = np.unique(counts, return_counts=True)
        ax2 = ax.twinx()
        ax2.bar(vals, num, width=0.4, color="C1", alpha=0.5, label="particle runs with k peaks")
        ax2.bar(
            [fv["n_peaks"] + 0.3], [1], width=0.2, color="k", alpha=0.7, label="finite volume peaks"
        )
        ax2.set_ylim(0, plan["seeds"] + 1)
        ax.axvline(k_star, color="C3", ls="--", lw=0.8)
        ax.set_xlabel("mode k")
        ax.set_xlim(0.5, K_MAX + 0.5)
        if j == 0:
            ax.set_ylabel("growth rate λ_k (1/time)")
            ax.legend(fontsize=6, loc="upper left")
        if j == len(betas) - 1:
            ax2.set_ylabel("runs")
            ax2.legend(fontsize=6, loc="upper right")
    axes[0, 0].set_ylabel("density at end of linear phase (1/rad)")
    fig.tight_layout()
    return save_figure(fig, Path(out) / "metastable.png", dpi=100)
