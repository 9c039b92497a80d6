r"""The mean-field study's W2 in time on :math:`S^1`, against Dobrushin's :math:`e^{Lt}` (``mean-field``).

The mean-field limit comes with a stability estimate in time (Sznitman 1991; Rigollet 2025):
:math:`W_2(\mu_N(t), \mu(t)) \le e^{Lt} W_2(\mu_N(0), \mu(0))` with :math:`L = L_1 + L_2`
(:func:`lipschitz_bound`).  :func:`w2_in_time` measures the left side for SA and USA at
:math:`\beta \in \{1, 5\}` with the exact circle distance :func:`circle_w2` and states the
bound as expectations of the ``mean-field`` study (:mod:`wflow.studies.mean_field`), which calls it
with its initial density; each (model, beta) is a stored part (:class:`~wflow.studies.parts.Parts`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from .. import sphere
from ..measure import Atoms
from ..models import SA, USA
from ..solvers.control import StepControl
from ..solvers.particles import simulate
from ..solvers.saveat import SaveAt
from .parts import Parts
from .report import StudyReport, save_figure, subplots

__all__ = [
    "CHAOS_BETAS",
    "CHAOS_PLAN",
    "CHAOS_T",
    "CHAOS_SAVES",
    "CHAOS_FINE",
    "CHAOS_QUAD",
    "circle_w2",
    "lipschitz_bound",
    "w2_in_time",
]

#: an initial density on :math:`S^1`: points, shape (n, 2) -> values relative to the uniform measure
CircleDensity = Callable[[np.ndarray], np.ndarray]


def _sample(density: CircleDensity, n: int, rng: np.random.Generator) -> np.ndarray:
    return sphere.sample_circle_density(lambda th: density(sphere.angles_to_points(th)), n, rng)


def _quadrature(density: CircleDensity, nodes: int) -> Atoms:
    x, q = sphere.circle_nodes(nodes)
    return Atoms(x, q * density(x))


#: W2(mu_N(t), mu(t)) as a function of t on S^1 (the mean-field study's propagation-of-chaos part):
#: inverse temperatures, (N: seeds) per mode, final time (SA; USA runs to CHAOS_T e^(1 - beta), the same
#: number of its own time scales e^-beta), saves, fine reference nodes and quadrature nodes per mode
CHAOS_BETAS = (1.0, 5.0)
CHAOS_PLAN = {True: {100: 8, 400: 4}, False: {100: 32, 400: 16, 1600: 8, 3200: 4}}
CHAOS_T = 3.0
CHAOS_SAVES = 7
CHAOS_FINE = {True: 2**12, False: 2**14}
CHAOS_QUAD = {True: 256, False: 512}


def circle_w2(x: np.ndarray, a: np.ndarray, y: np.ndarray, b: np.ndarray) -> float:
    r"""Exact :math:`W_2` (geodesic) between two weighted point sets on :math:`S^1`.

    Delon--Salomon--Sobolevski (2010): with coordinates in :math:`[0, 1)` and quantile functions
    :math:`F^{-1}`, :math:`G^{-1}` (the latter extended by :math:`G^{-1}(s + k) = G^{-1}(s) + k`),
    :math:`W_2^2 = (2\pi)^2 \min_\theta \int_0^1 |F^{-1}(t) - G^{-1}(t + \theta)|^2 dt`, convex in
    :math:`\theta`; each evaluation is exact on the merged breakpoints (O((n + m) log(n + m))), the
    minimum by bounded Brent.

    Examples
    --------
    >>> from wflow import Atoms, transport
    >>> rng = np.random.default_rng(1)
    >>> x, y = sphere.uniform(40, 2, rng), sphere.vmf_mixture(300, [[1.0, 0.0]], [4.0], None, rng)
    >>> a, b = rng.uniform(0.1, 1, 40), np.full(300, 1 / 300)
    >>> pot = transport.wasserstein(Atoms(x, a / a.sum()), Atoms(y, b), method="circle")
    >>> bool(abs(circle_w2(x, a, y, b) - pot) < 1e-10)
    True
    """
    from scipy import optimize

    u = np.mod(np.arctan2(x[:, 1], x[:, 0]) / (2 * np.pi), 1.0)
    v = np.mod(np.arctan2(y[:, 1], y[:, 0]) / (2 * np.pi), 1.0)
    i, j = np.argsort(u), np.argsort(v)
    u, a = u[i], np.asarray(a, float)[i] / np.sum(a)
    v, b = v[j], np.asarray(b, float)[j] / np.sum(b)
    A, B = np.cumsum(a), np.cumsum(b)
    A[-1] = B[-1] = 1.0

    def cost(theta: float) -> float:
        edges = np.sort(np.concatenate([[0.0, 1.0], A[:-1], np.mod(B - theta, 1.0)]))
        t = 0.5 * (edges[1:] + edges[:-1])
        fu = u[np.minimum(np.searchsorted(A, t, side="right"), len(u) - 1)]
        s = t + theta
        m = np.floor(s)
        gv = v[np.minimum(np.searchsorted(B, s - m, side="right"), len(v) - 1)] + m
        return float(np.sum(np.diff(edges) * (fu - gv) ** 2))

    res = optimize.minimize_scalar(
        cost, bounds=(-1.0, 1.0), method="bounded", options={"xatol": 1e-13}
    )
    return float(2 * np.pi * np.sqrt(res.fun))


def lipschitz_bound(model: str, beta: float) -> tuple[float, float]:
    r"""Constants :math:`(L_1, L_2)` of the circle velocity: Lipschitz in the point and in the measure (:math:`W_1`).

    With :math:`h(u) = e^{\beta\cos u}\sin u` and :math:`M_1 = \sup|h'|`, :math:`M_2 = \sup_u \beta|\sin u|\,e^{\beta\cos u}`
    (computed on a fine grid; :math:`M_1 = e^{\beta}`):

    * USA, :math:`\dot\theta = -\int h(\theta - \varphi)\,d\mu(\varphi)`: :math:`L_1 = L_2 = M_1`;
    * SA, :math:`\dot\theta = -\int h\,d\mu / \int e^{\beta\cos}d\mu`: :math:`L_1 \le 1 + \beta` (the derivative is
      :math:`-E_p[\cos] + \beta\,\mathrm{Var}_p[\sin]`), :math:`L_2 \le (M_1 + M_2)\,e^{\beta}` (the normalizer is
      :math:`\ge e^{-\beta}` and :math:`|v| \le 1`).

    >>> np.allclose(lipschitz_bound("USA", 1.0), np.e), np.allclose(lipschitz_bound("SA", 0.0), (1.0, 1.0))
    (True, True)
    """
    u = np.linspace(-np.pi, np.pi, 200_001)
    m1 = float(np.max(np.abs(np.exp(beta * np.cos(u)) * (np.cos(u) - beta * np.sin(u) ** 2))))
    m2 = float(np.max(beta * np.abs(np.sin(u)) * np.exp(beta * np.cos(u))))
    if model == "USA":
        return m1, m1
    if model == "SA":
        return 1.0 + beta, (m1 + m2) * np.exp(beta)
    raise ValueError(f"model must be 'SA' or 'USA', got {model!r}")


def _part(
    density: CircleDensity,
    name: str,
    beta: float,
    plan: dict[int, int],
    times: np.ndarray,
    n_fine: int,
    n_quad: int,
) -> dict[str, Any]:
    """One (model, beta): the reference (n_quad and n_quad/2 nodes), every sample's W2 at every save."""
    model = {"SA": SA, "USA": USA}[name](beta)
    t0 = time.perf_counter()
    fx, fq = sphere.circle_nodes(n_fine, offset=np.pi / n_fine)
    fw = fq * density(fx)
    fw /= fw.sum()
    pushed: dict[int, np.ndarray] = {}
    saves = SaveAt(times, diagnostics=())
    run: dict[str, Any] = {"method": "dopri5", "control": StepControl(rtol=1e-10, atol=1e-12)}
    for M in (n_quad, n_quad // 2):
        ref = simulate(model, _quadrature(density, M), times[-1], save_at=saves, tracers=fx, **run)
        assert ref.tracers is not None  # tracers=fx asked for them
        pushed[M] = ref.tracers
    ref_err = np.array(
        [circle_w2(pushed[n_quad][i], fw, pushed[n_quad // 2][i], fw) for i in range(len(times))]
    )
    t_ref = time.perf_counter() - t0
    out: dict[str, Any] = {"ref_error": ref_err, "seconds_reference": t_ref}
    scale = 1.0 if name == "SA" else float(np.exp(beta - 1.0))
    for N, seeds in plan.items():
        x0 = np.stack(
            [_sample(density, N, np.random.default_rng([2, N, s, 8])) for s in range(seeds)]
        )
        tr = simulate(model, x0, times[-1], save_at=SaveAt(times, diagnostics=()), dt=0.05 / scale)
        w = np.full(N, 1.0 / N)
        out[f"W2_{N}"] = np.array(
            [
                [circle_w2(tr.points[i][s], w, pushed[n_quad][i], fw) for i in range(len(times))]
                for s in range(seeds)
            ]
        )
    out["seconds"] = time.perf_counter() - t0
    return out


def w2_in_time(
    rep: StudyReport,
    out: Path,
    quick: bool,
    density: CircleDensity,
    label: Callable[[str], str] = str,
) -> Path:
    r"""Propagation of chaos in time on :math:`S^1`: :math:`W_2(\mu_N(t), \mu(t))` against Dobrushin's :math:`e^{Lt}`.

    SA and USA at :data:`CHAOS_BETAS` from :math:`\rho_0` = ``density`` (points of :math:`S^1` ->
    values relative to the uniform measure): every sample's empirical rate
    :math:`\max_t \log(W_2(t)/W_2(0))/t` and the fitted growth rate (99 % CI) are expected below
    :math:`L = L_1 + L_2` (:func:`lipschitz_bound`); docs/validation.md gives the method.  Rows,
    expectations and notes go to ``rep``, the parts to ``out/parts/<rep.name>``, each announced by
    ``label``; returns the path of the figure.
    """
    parts = Parts(out, rep.name, quick)
    plan = CHAOS_PLAN[quick]
    curves = {}
    for name in ("SA", "USA"):
        for beta in CHAOS_BETAS:
            T = CHAOS_T if name == "SA" else CHAOS_T * float(np.exp(1.0 - beta))
            times = np.linspace(0.0, T, CHAOS_SAVES)
            key = {
                "part": "w2-in-time",
                "model": name,
                "beta": beta,
                "plan": plan,
                "T": T,
                "saves": CHAOS_SAVES,
                "fine": CHAOS_FINE[quick],
                "quad": CHAOS_QUAD[quick],
            }
            r = parts.get(
                key,
                lambda: _part(
                    density, name, beta, plan, times, CHAOS_FINE[quick], CHAOS_QUAD[quick]
                ),
                what=label(
                    f"S1 {name}, beta = {beta:g}: W2 in time, {sum(plan.values())} particle runs "
                    f"to t = {T:.3g}"
                ),
            )
            L1, L2 = lipschitz_bound(name, beta)
            L = L1 + L2
            worst, w2_min = -np.inf, np.inf
            fits = {}
            run = {
                "sphere": "S1",
                "model": name,
                "start": "iid-in-time",
                "beta": beta,
                "coupling": np.nan,
            }
            for N, seeds in plan.items():
                W = r[f"W2_{N}"]  # (seeds, saves)
                w2_min = min(w2_min, float(W.min()))
                ratio = np.log(W[:, 1:] / W[:, :1])
                worst = max(worst, float(np.max(ratio / times[1:])))
                tt = np.tile(times[1:], seeds)
                res = stats.linregress(
                    np.r_[np.zeros(seeds), tt], np.r_[np.zeros(seeds), ratio.ravel()]
                )
                half = float(stats.t.ppf(0.995, seeds * len(times) - 2) * res.stderr)
                fits[N] = (float(res.slope), half)
                for s in range(seeds):
                    for i, t in enumerate(times):
                        at = {"N": N, "seed": s, "t": float(t), "W2": float(W[s, i])}
                        rep.rows.append(run | at | {"reference_error": float(r["ref_error"][i])})
            curves[(name, beta)] = (times, {N: r[f"W2_{N}"] for N in plan}, fits, L)
            lab = f"S1 {name} beta={beta:g}, t <= {T:.3g}"
            rep.expect(
                f"{lab}: largest empirical rate max_t log(W2(t)/W2(0))/t over {sum(plan.values())} samples "
                f"<= Dobrushin L = L1 + L2 = {L1:.3g} + {L2:.3g}",
                worst,
                -np.inf,
                L,
            )
            top = max(f[0] + f[1] for f in fits.values())
            rep.expect(
                f"{lab}: fitted growth rate of W2 (upper 99% bound, largest over N) <= L = {L:.4g}",
                top,
                -np.inf,
                L,
            )
            rep.expect(
                f"{lab}: reference error W2({CHAOS_QUAD[quick]} vs {CHAOS_QUAD[quick] // 2} quadrature nodes) "
                f"/ smallest W2",
                float(r["ref_error"].max()) / w2_min,
                0.0,
                0.05,
            )
            growth = "; ".join(f"N={N}: {f[0]:.3f} ± {f[1]:.3f}" for N, f in fits.items())
            mean_ratio = ", ".join(
                f"N={N}: {np.exp(np.mean(np.log(r[f'W2_{N}'][:, -1] / r[f'W2_{N}'][:, 0]))):.3g}"
                for N in plan
            )
            rep.notes.append(
                f"{lab}: W2(mu_N(t), mu(t)) growth rate (OLS of log(W2(t)/W2(0)) on t, 99% CI) {growth}; "
                f"geometric-mean W2(T)/W2(0) {mean_ratio}; largest per-sample rate {worst:.3g} against "
                f"Dobrushin's L = {L:.4g}; reference error <= {r['ref_error'].max():.2g}; "
                f"{r['seconds']:.1f} s ({r['seconds_reference']:.1f} s reference)."
            )
    rep.notes.append(parts.note())
    return _figure(curves, out)


def _figure(curves, out: Path) -> Path:
    fig, axes = subplots(1, len(curves), figsize=(4.0 * len(curves), 3.6), constrained_layout=True)
    for ax, ((name, beta), (times, W, fits, L)) in zip(np.atleast_1d(axes), curves.items()):
        for N, w in W.items():
            g = np.exp(np.mean(np.log(w), axis=0))
            p = ax.semilogy(
                times, g, "o-", ms=3, label=f"N={N}: rate {fits[N][0]:.2f} ± {fits[N][1]:.2f}"
            )
            ax.semilogy(
                times, g[0] * np.exp(fits[N][0] * times), ":", color=p[0].get_color(), lw=0.8
            )
        g0 = min(np.exp(np.mean(np.log(w[:, 0]))) for w in W.values())
        tt = np.linspace(0, times[-1], 50)
        bound = g0 * np.exp(np.minimum(L * tt, 50))
        ax.semilogy(
            tt[bound < 10], bound[bound < 10], "k--", lw=0.8, label=f"e^(Lt) W2(0), L={L:.3g}"
        )
        ax.set_xlabel("time t (depth units)")
        if ax is np.atleast_1d(axes)[0]:
            ax.set_ylabel("W2(μ_N(t), μ(t)) (rad), geometric mean over seeds")
        ax.set_title(f"S1, {name}, β={beta:g}", fontsize=9)
        ax.legend(fontsize=6)
    return save_figure(fig, Path(out) / "mean_field_time.png", dpi=110)
