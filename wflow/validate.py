r"""Validation studies: the solvers against theory and against each other.

Each study is a function ``study(out: Path, quick: bool) -> StudyReport`` registered in
:data:`STUDIES`; ``wflow validate`` runs them, writes Markdown, CSV and PNG files into a
report folder, prints a summary, and exits non-zero when a stated expectation fails.

The mean-field study (:func:`mean_field`) is the central check of the package: finite-N
particle systems converge to the continuum solution at the predicted rates.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import special, stats

from . import sphere
from .measure import Atoms
from .models import SA, USA
from .solvers.particles import simulate
from .studies.parts import Parts
from .studies.report import STUDIES, Expectation, StudyReport, register, run_studies, write_report

__all__ = [
    "Expectation",
    "StudyReport",
    "STUDIES",
    "mean_field",
    "run_studies",
    "write_report",
    "register",
    "circle_w2",
    "lipschitz_bound",
]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ problem
def _circle_density(x: np.ndarray) -> np.ndarray:
    """Smooth initial density on S^1: two von Mises bumps (kappa = 2) at theta = 0 and 2.2, mean 1."""
    th = np.arctan2(x[..., 1], x[..., 0])
    k = 2.0
    return (
        0.5
        * (np.exp(k * (np.cos(th) - 1)) + np.exp(k * (np.cos(th - 2.2) - 1)))
        / special.ive(0, k)
    )


_S2_MEANS = sphere.normalize(np.array([[0.0, 0.0, 1.0], [0.9, 0.0, -0.4]]))


def _sphere_density(x: np.ndarray) -> np.ndarray:
    """Smooth initial density on S^2: two von Mises-Fisher bumps (kappa = 3), mean 1."""
    k = 3.0
    c0 = np.sinh(k) / k * np.exp(-k)  # E_unif[e^{k(<m,x>-1)}]
    return 0.5 * np.sum(np.exp(k * (x @ _S2_MEANS.T - 1)), axis=-1) / c0


#: atoms of the S^2 reference measure and the largest N whose W2 to it is computed by EMD (quick mode)
S2_REFERENCE_ATOMS = 4096
S2_EMD_MAX_N = 1600
#: full mode, S^2: W2(mu_N(t), mu(t)) by semi-discrete transport for these N (seeds each), against
#: the push-forward of S2_ATOMS_PER_PARTICLE * N rho_0-weighted Fibonacci nodes; at the smallest N
#: also against S2_REFINED_ATOMS_PER_PARTICLE * N nodes, which measures the reference's own error
S2_SD_PLAN = {100: 16, 1000: 8, 10_000: 2}
#: ... at these times; expectations only up to S2_SD_ASSERT_UNTIL (later times are reported).  Not
#: t = 2: by then the pushed Fibonacci set is far from quasi-uniform (SA: nearest-neighbour spacing
#: 0.029..0.39 against 0.077..0.088 at t = 0); the solver converges there at N <= 1000 (one seed:
#: brackets 5e-5..7.4e-4 wide, USA up to 35 s a solve), but N = 1e4 solves already take 544 s
#: (USA, mean) at t = 1 and would take much longer at t = 2
S2_SD_TIMES = (0.0, 1.0)
S2_SD_ASSERT_UNTIL = 1.0
S2_ATOMS_PER_PARTICLE = 16
S2_REFINED_ATOMS_PER_PARTICLE = 64


def _sample(d: int, n: int, rng: np.random.Generator) -> np.ndarray:
    if d == 2:
        return sphere.sample_circle_density(
            lambda th: _circle_density(sphere.angles_to_points(th)), n, rng
        )
    return sphere.vmf_mixture(n, _S2_MEANS, [3.0, 3.0], None, rng)


def _quadrature(d: int, nodes: int) -> Atoms:
    if d == 2:
        x, q = sphere.circle_nodes(nodes)
        return Atoms(x, q * _circle_density(x))
    x, q = sphere.gauss_sphere_nodes(nodes)
    return Atoms(x, q * _sphere_density(x))


def _fit_slope(N: np.ndarray, err: np.ndarray, level: float = 0.99) -> tuple[float, float]:
    """OLS slope of log err against log N, with the half-width of its ``level`` confidence interval."""
    res = stats.linregress(np.log(N), np.log(err))
    half = stats.t.ppf(0.5 + level / 2, len(N) - 2) * res.stderr if len(N) > 2 else np.inf
    return float(res.slope), float(half)


def _akt_slope(n_min: float, n_max: float) -> float:
    """Secant slope of log sqrt(log N / N) against log N between ``n_min`` and ``n_max``."""
    return -0.5 + 0.5 * np.log(np.log(n_max) / np.log(n_min)) / np.log(n_max / n_min)


def _s2_semidiscrete_w2(
    rep: StudyReport,
    name: str,
    model: Any,
    quad: Atoms,
    sd_plan: dict[int, int],
    times: np.ndarray,
    rk4_dt: float,
) -> None:
    r"""S^2: :math:`W_2(\mu_N(t), \mu(t))` (chordal) by semi-discrete transport; rows, expectations, notes.

    :math:`\mu(t)` is the push-forward of ``16 N`` Fibonacci nodes weighted by :math:`\rho_0`
    (one set per N, carried as tracers by one reference run); each value is the midpoint of
    the certified bracket of :func:`wflow.semidiscrete.semidiscrete_w2`.  At the smallest N
    the same is computed against ``64 N`` nodes: the change is the reference's own error.
    Expected: the i.i.d. rate on a 2-dimensional sphere, :math:`\sqrt{\log N / N}`
    (Ajtai--Komlós--Tusnády), whose secant slope between the smallest and the largest N lies
    between -1/2 and :func:`_akt_slope`; asserted (with the brackets' widths and the
    reference's error) for ``t <= S2_SD_ASSERT_UNTIL``, reported in the notes after.
    """
    import warnings

    from .transport import wasserstein_result

    t0 = time.perf_counter()
    n_ref = min(sd_plan)
    sizes = {
        **{N: S2_ATOMS_PER_PARTICLE * N for N in sd_plan},
        "refined": S2_REFINED_ATOMS_PER_PARTICLE * n_ref,
    }
    ref_sets = {key: sphere.fibonacci_nodes(M) for key, M in sizes.items()}
    ref_w = {key: _sphere_density(z) / _sphere_density(z).sum() for key, z in ref_sets.items()}
    tracers = np.concatenate(list(ref_sets.values()))
    # RK4 at dt = 0.05: error ~1e-7, far below the W2 values (>= 1e-2) and the brackets' widths
    ref = simulate(model, quad, times[-1], save_at=times, dt=0.05, tracers=tracers)
    offsets = np.cumsum([0] + [len(z) for z in ref_sets.values()])
    pushed = {
        key: [
            Atoms._trusted(ref.tracers[i, offsets[q] : offsets[q + 1]], ref_w[key])
            for i in range(len(times))
        ]
        for q, key in enumerate(ref_sets)
    }
    t_ref = time.perf_counter() - t0
    rows, n_stalled = [], 0
    for N, seeds in sd_plan.items():
        for s in range(seeds):  # the same samples as the main loop (seeds [3, N, s])
            x0 = _sample(3, N, np.random.default_rng([3, N, s]))
            traj = simulate(model, Atoms(x0), times[-1], save_at=times, dt=rk4_dt)
            for i, t in enumerate(times):
                targets = [N, "refined"] if N == n_ref else [N]
                res = {}
                for key in targets:
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always", UserWarning)
                        res[key] = wasserstein_result(
                            traj.atoms(i), pushed[key][i], method="semidiscrete", cost="chordal"
                        )
                    n_stalled += bool(caught)
                r = res[N]
                row = {
                    "sphere": "S2",
                    "model": name,
                    "start": "iid",
                    "N": N,
                    "seed": s,
                    "t": float(t),
                    "coupling": np.nan,
                    "W2": r.value,
                    "W2_method": "semidiscrete",
                    "W2_lower": r.info["lower"],
                    "W2_upper": r.info["upper"],
                    "sd_seconds": r.info["seconds"],
                }
                if "refined" in res:
                    row["W2_refined"] = res["refined"].value
                    row["sd_seconds_refined"] = res["refined"].info["seconds"]
                rows.append(row)
    rep.rows.extend(rows)
    later = []
    for t in times:
        sel = [r for r in rows if r["t"] == t]
        Ns = np.array([r["N"] for r in sel], float)
        slope, half = _fit_slope(Ns, np.array([r["W2"] for r in sel]))
        akt = _akt_slope(Ns.min(), Ns.max())
        width = max((r["W2_upper"] - r["W2_lower"]) / r["W2"] for r in sel)
        label = (
            f"S2 {name} W2 slope in N at t={t:g}, semi-discrete ({slope:.3f} ± {half:.3f}, "
            f"N={int(Ns.min())}..{int(Ns.max())})"
        )
        if t > S2_SD_ASSERT_UNTIL:
            later.append(
                f"t={t:g}: slope {slope:.3f} ± {half:.3f} (99% CI), brackets up to {width:.2g} wide "
                "(relative)"
            )
            continue
        ok = bool(
            np.isfinite(slope) and slope - half <= akt and slope + half >= -0.5 and half <= 0.25
        )
        rep.expectations.append(
            Expectation(
                label,
                slope,
                f"99% CI meets [-0.5, {akt:.3f}] (N^-1/2 .. sqrt(log N/N)), half-width <= 0.25",
                ok,
            )
        )
    early = [r for r in rows if r["t"] <= S2_SD_ASSERT_UNTIL]
    gap = max((r["W2_upper"] - r["W2_lower"]) / r["W2"] for r in early)
    quant = max(abs(r["W2"] / r["W2_refined"] - 1) for r in early if "W2_refined" in r)
    rep.expect(
        f"S2 {name} semi-discrete brackets at t <= {S2_SD_ASSERT_UNTIL:g}: largest relative width "
        f"(hi - lo) / W2",
        gap,
        0.0,
        1e-3,
    )
    rep.expect(
        f"S2 {name} reference error at t <= {S2_SD_ASSERT_UNTIL:g}: largest "
        f"|W2(16N nodes) / W2(64N nodes) - 1| at N={n_ref}",
        quant,
        0.0,
        0.02,
    )
    solves = len(rows) + sum("W2_refined" in r for r in rows)
    per_n = ", ".join(
        f"N={N}: {np.mean([r['sd_seconds'] for r in rows if r['N'] == N]):.2g} s" for N in sd_plan
    )
    growth = ", ".join(
        f"{np.mean([r['W2'] for r in rows if r['N'] == max(sd_plan) and r['t'] == t]):.4g}"
        for t in times
    )
    rep.notes.append(
        f"S2 {name}: W2(mu_N(t), mu(t)) (chordal) by semi-discrete transport against the push-forward of 16 N "
        f"rho_0-weighted Fibonacci nodes (rows with W2_method = semidiscrete): at t <= {S2_SD_ASSERT_UNTIL:g} "
        f"certified brackets of relative width <= {gap:.2g}; against 64 N nodes at N={n_ref} the values change by <= "
        f"{quant:.2g} (the reference's own error). Reported, not asserted (the pushed reference is no longer "
        f"quasi-uniform): {'; '.join(later) or 'none'}. Mean W2 at N={max(sd_plan)} and t = "
        f"{', '.join(f'{t:g}' for t in times)}: {growth}. {solves} solves ({n_stalled} stopped early with a "
        f"valid, wider bracket), mean time per solve {per_n}; reference run {t_ref:.0f} s, all "
        f"{time.perf_counter() - t0:.0f} s."
    )


# ------------------------------------------------------------------------------ W2 in time (S^1)
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
    minimum by bounded Brent.  Agrees with POT's ``wasserstein_circle`` to 1e-11 and is 10-100x faster
    on 10^3-10^4 atoms.

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

    Coupling the two flows from an optimal plan of the initial data gives
    :math:`\frac{d}{dt}D \le L_1 D + L_2 W_1 \le (L_1 + L_2) D`, hence Dobrushin's estimate
    :math:`W_2(\mu_N(t), \mu(t)) \le e^{Lt} W_2(\mu_N(0), \mu(0))`, :math:`L = L_1 + L_2`
    (Sznitman 1991; Rigollet 2025, the mean-field limit).

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


def _chaos_part(
    name: str, beta: float, plan: dict[int, int], times: np.ndarray, n_fine: int, n_quad: int
) -> dict[str, Any]:
    """One (model, beta): the reference (n_quad and n_quad/2 nodes), every sample's W2 at every save."""
    model = {"SA": SA, "USA": USA}[name](beta)
    t0 = time.perf_counter()
    fx, fq = sphere.circle_nodes(n_fine, offset=np.pi / n_fine)
    fw = fq * _circle_density(fx)
    fw /= fw.sum()
    pushed = {}
    for M in (n_quad, n_quad // 2):
        ref = simulate(
            model,
            _quadrature(2, M),
            times[-1],
            save_at=times,
            method="dopri5",
            rtol=1e-10,
            atol=1e-12,
            tracers=fx,
            diagnostics=(),
        )
        pushed[M] = ref.tracers
    ref_err = np.array(
        [circle_w2(pushed[n_quad][i], fw, pushed[n_quad // 2][i], fw) for i in range(len(times))]
    )
    t_ref = time.perf_counter() - t0
    out: dict[str, Any] = {"ref_error": ref_err, "seconds_reference": t_ref}
    scale = 1.0 if name == "SA" else float(np.exp(beta - 1.0))
    for N, seeds in plan.items():
        x0 = np.stack([_sample(2, N, np.random.default_rng([2, N, s, 8])) for s in range(seeds)])
        tr = simulate(model, x0, times[-1], save_at=times, dt=0.05 / scale, diagnostics=())
        w = np.full(N, 1.0 / N)
        out[f"W2_{N}"] = np.array(
            [
                [circle_w2(tr.points[i][s], w, pushed[n_quad][i], fw) for i in range(len(times))]
                for s in range(seeds)
            ]
        )
    out["seconds"] = time.perf_counter() - t0
    return out


def _chaos_in_time(rep: StudyReport, out: Path, quick: bool) -> Path:
    r"""Propagation of chaos in time on :math:`S^1`: :math:`W_2(\mu_N(t), \mu(t))` against Dobrushin's :math:`e^{Lt}`.

    SA and USA at :math:`\beta \in \{1, 5\}`; :math:`\mu(t)` is the push-forward of ``CHAOS_FINE``
    equispaced :math:`\rho_0`-weighted nodes by the Lagrangian quadrature solver (``CHAOS_QUAD`` nodes;
    its error is the :math:`W_2` to the solve on half the nodes).  Per sample the exact circle
    :math:`W_2` (:func:`circle_w2`) at every save.  Expected (what theory guarantees): every sample's
    empirical rate :math:`\max_t \log(W_2(t)/W_2(0))/t` is below :math:`L = L_1 + L_2`
    (:func:`lipschitz_bound`), and so is the fitted growth rate (OLS of :math:`\log(W_2(t)/W_2(0))`
    against :math:`t`, pooled over seeds, one fit per N, 99 % CI).  Reported: the fitted rates.
    """
    parts = Parts(out, "mean-field", quick)
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
                lambda: _chaos_part(name, beta, plan, times, CHAOS_FINE[quick], CHAOS_QUAD[quick]),
            )
            L1, L2 = lipschitz_bound(name, beta)
            L = L1 + L2
            worst, w2_min = -np.inf, np.inf
            fits = {}
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
                        rep.rows.append(
                            {
                                "sphere": "S1",
                                "model": name,
                                "start": "iid-in-time",
                                "beta": beta,
                                "N": N,
                                "seed": s,
                                "t": float(t),
                                "coupling": np.nan,
                                "W2": float(W[s, i]),
                                "reference_error": float(r["ref_error"][i]),
                            }
                        )
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
    return _chaos_figure(curves, out)


def _chaos_figure(curves, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(curves), figsize=(4.0 * len(curves), 3.6), constrained_layout=True
    )
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
    path = Path(out) / "mean_field_time.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------ study
def mean_field(out: Path, quick: bool = True) -> StudyReport:
    r"""Finite-N particle systems against the continuum solution (Lagrangian quadrature).

    For a smooth initial density :math:`\rho_0` on :math:`S^1` and :math:`S^2` and the SA
    and USA models (:math:`\beta = 1`):

    * the continuum flow map :math:`X_t` is computed by the Lagrangian quadrature solver
      (trapezoid rule with 512 nodes on :math:`S^1`, Gauss--Legendre 24 x 48 on
      :math:`S^2`; ``dopri5`` at rtol 1e-10) and applied to any point as a passive tracer;
    * particles start from :math:`N` i.i.d. samples of :math:`\rho_0` (several seeds);
    * the *coupling error* :math:`D_N(t) = (\frac1N\sum_i d(x_i(t), X_t(x_i(0)))^2)^{1/2}`
      bounds :math:`W_2(\mu_N(t), X_t\#\mu_N(0))` and should fall like :math:`N^{-1/2}`
      (propagation of chaos) in every dimension;
    * on :math:`S^1` also the exact :math:`W_2(\mu_N(t), \mu(t))` (POT's circle solver),
      with :math:`\mu(t)` the push-forward of :math:`2^{15}` equispaced weighted nodes:
      the i.i.d. empirical rate :math:`N^{-1/2}`;
    * on :math:`S^2`, full mode only, :math:`W_2(\mu_N(t), \mu(t))` (chordal) by
      semi-discrete transport against 16 N pushed Fibonacci nodes per N, with the slope's
      99 % CI against :math:`\sqrt{\log N/N}` (:func:`_s2_semidiscrete_w2`);
    * from a deterministic start (trapezoid nodes with weights :math:`\rho_0/N`) the
      :math:`W_2` error falls like :math:`N^{-1}` (the atoms' spacing) while smooth
      moments are exact to spectral accuracy;
    * on :math:`S^1`, SA and USA at :math:`\beta \in \{1, 5\}`: :math:`W_2(\mu_N(t), \mu(t))` as a
      function of :math:`t` against Dobrushin's :math:`e^{Lt}W_2(\mu_N(0), \mu(0))`, with the fitted
      growth rates (:func:`_chaos_in_time`; resumable parts in ``out/parts/mean-field``).

    Examples
    --------
    The quick mode takes 3-6 minutes on two cores (``wflow validate mean-field --quick``), so it is
    not run here:

    >>> import pathlib, tempfile
    >>> rep = mean_field(pathlib.Path(tempfile.mkdtemp()), quick=True)  # doctest: +SKIP
    >>> rep.passed  # doctest: +SKIP
    True
    """
    from .transport import wasserstein

    t0 = time.perf_counter()
    rep = StudyReport("mean-field")
    times = np.array([0.0, 1.0, 2.0])
    # samples per N: the slope's error is dominated by the spread of log W at each N, which
    # hardly depends on N, so small N (cheap) get more seeds
    if quick:
        plan = {2: {100: 40, 400: 30, 1600: 20, 6400: 12}, 3: {100: 16, 400: 12, 1600: 8}}
        models = {2: {"SA": SA(1.0), "USA": USA(1.0)}, 3: {"SA": SA(1.0)}}
        quad_N = [16, 32, 64, 128]
    else:
        plan = {
            2: {100: 64, 1000: 32, 10_000: 16, 100_000: 8},
            3: {100: 32, 1000: 16, 10_000: 8, 100_000: 4},
        }
        models = {2: {"SA": SA(1.0), "USA": USA(1.0)}, 3: {"SA": SA(1.0), "USA": USA(1.0)}}
        quad_N = [16, 32, 64, 128, 256, 512, 1024]
    ref_nodes = {2: 512, 3: 24}
    rk4_dt = 0.1  # RK4 error ~1e-6, far below the N^{-1/2} effects measured
    for d, seeds_per_N in plan.items():
        quad = _quadrature(d, ref_nodes[d])
        for name, model in models[d].items():
            samples = {
                (N, s): _sample(d, N, np.random.default_rng([d, N, s]))
                for N, seeds in seeds_per_N.items()
                for s in range(seeds)
            }
            # one reference run carries every sample (and, on S^1, a fine set of nodes) as passive tracers
            parts = list(samples.values())
            if d == 2:
                fx, fq = sphere.circle_nodes(2**15, offset=np.pi / 2**15)
            else:  # S^2: a Fibonacci set (quasi-Monte Carlo weights), for an EMD reference at t_end
                fx = sphere.fibonacci_nodes(S2_REFERENCE_ATOMS)
                fq = np.full(len(fx), 1.0 / len(fx))
            fine_w = fq * (_circle_density(fx) if d == 2 else _sphere_density(fx))
            fine_w /= fine_w.sum()
            parts.append(fx)
            tracers = np.concatenate(parts)
            if (
                d == 3 and len(tracers) > 200_000
            ):  # full mode on S^2: RK4 (error ~1e-7, far below D_N) keeps it affordable
                ref = simulate(model, quad, times[-1], save_at=times, dt=0.05, tracers=tracers)
            else:
                ref = simulate(
                    model,
                    quad,
                    times[-1],
                    save_at=times,
                    method="dopri5",
                    rtol=1e-10,
                    atol=1e-12,
                    tracers=tracers,
                )
            offsets = np.cumsum([0] + [len(p) for p in parts])
            fine = [
                Atoms._trusted(ref.tracers[i, offsets[-2] :], fine_w) for i in range(len(times))
            ]
            per_t: dict[float, list[tuple[int, float, float]]] = {t: [] for t in times}
            for k, ((N, s), x0) in enumerate(samples.items()):
                traj = simulate(model, Atoms(x0), times[-1], save_at=times, dt=rk4_dt)
                chars = ref.tracers[:, offsets[k] : offsets[k + 1]]
                for i, t in enumerate(times):
                    coupling = float(
                        np.sqrt(np.mean(sphere.geodesic_distance(traj.points[i], chars[i]) ** 2))
                    )
                    if d == 2:
                        w2 = wasserstein(traj.atoms(i), fine[i], method="circle")
                    elif quick and i == len(times) - 1 and N <= S2_EMD_MAX_N:
                        w2 = wasserstein(traj.atoms(i), fine[i], method="emd")
                    else:
                        w2 = np.nan
                    per_t[t].append((N, coupling, w2))
                    rep.rows.append(
                        {
                            "sphere": f"S{d - 1}",
                            "model": name,
                            "start": "iid",
                            "N": N,
                            "seed": s,
                            "t": t,
                            "coupling": coupling,
                            "W2": w2,
                        }
                    )
            for t in times:
                arr = np.array(per_t[t])
                if t > 0:
                    slope, half = _fit_slope(arr[:, 0], arr[:, 1])
                    rep.expect_slope(
                        f"S{d - 1} {name} coupling error D_N slope in N at t={t:g}",
                        slope,
                        half,
                        -0.5,
                    )
                if d == 2:
                    slope, half = _fit_slope(arr[:, 0], arr[:, 2])
                    rep.expect_slope(f"S1 {name} W2 slope in N at t={t:g}", slope, half, -0.5)
            if (
                d == 3 and not quick
            ):  # S^2 W2 by semi-discrete transport, with its slope (full mode only)
                _s2_semidiscrete_w2(
                    rep, name, model, quad, S2_SD_PLAN, np.array(S2_SD_TIMES), rk4_dt
                )
            if (
                d == 3 and quick
            ):  # S^2 W2 at t_end by EMD against the Fibonacci push-forward (reported, not asserted)
                R = sphere.random_rotation(3, np.random.default_rng(7))
                rx = sphere.fibonacci_nodes(S2_REFERENCE_ATOMS) @ R.T
                other = Atoms(rx, _sphere_density(rx))
                floor = wasserstein(other, fine[0], method="emd")
                rep.notes.append(
                    f"S2 {name}: W2(mu_N(t_end), mu(t_end)) by EMD against the push-forward of {S2_REFERENCE_ATOMS} "
                    f"Fibonacci atoms (N <= {S2_EMD_MAX_N}; CSV column W2). The reference's own discretization, "
                    f"measured as W2 between two rotated {S2_REFERENCE_ATOMS}-atom representations of rho_0, is "
                    f"{floor:.3g}: W2 values near it are floored, so no slope is asserted on S2; the coupling "
                    f"error D_N carries the rate there."
                )
            for t in times:  # growth of the error with t, at the largest N
                Nmax = max(seeds_per_N)
                vals = [
                    r
                    for r in rep.rows
                    if r["sphere"] == f"S{d - 1}"
                    and r["model"] == name
                    and r["start"] == "iid"
                    and r["N"] == Nmax
                    and r["t"] == t
                ]
                rep.notes.append(
                    f"S{d - 1} {name} N={Nmax} t={t:g}: mean D_N = "
                    f"{np.mean([r['coupling'] for r in vals]):.4g}, mean W2 = "
                    f"{np.nanmean([r['W2'] for r in vals]) if any(np.isfinite(r['W2']) for r in vals) else float('nan'):.4g}"
                )
            if d == 2:  # the continuum reference cross-checked with the finite-volume solver
                from .density import Density
                from .mesh import CircleMesh
                from .solvers.eulerian import solve_density

                gaps = []
                for M in (
                    256,
                    512,
                ):  # orders 1.80 / 2.18 (SA / USA) at 128..256, 1.90 / 2.13 at 256..512
                    fv = (
                        solve_density(
                            model,
                            Density.from_function(CircleMesh(M), _circle_density),
                            times[-1],
                            save_at=[0.0, times[-1]],
                        )
                        .density(-1)
                        .to_atoms()
                    )
                    ks = np.arange(1, 4)
                    mom = lambda mu: (
                        np.exp(
                            1j * ks[:, None] * np.arctan2(mu.points[:, 1], mu.points[:, 0])[None]
                        )
                        @ mu.weights
                    )  # noqa: E731
                    gaps.append(float(np.abs(mom(fv) - mom(fine[-1])).max()))
                rep.expect(
                    f"S1 {name} Lagrangian vs finite volume (M=512), Fourier moments 1..3 at t={times[-1]:g}",
                    gaps[1],
                    0.0,
                    2e-4,
                )
                rep.expect(
                    f"S1 {name} Lagrangian vs finite volume, observed order M=256..512",
                    np.log2(gaps[0] / gaps[1]),
                    1.8,
                    2.3,
                )
            if d == 2:  # deterministic quadrature start
                errs, moms = [], []
                for N in quad_N:
                    qx, qq = sphere.circle_nodes(N, offset=np.pi / N)
                    start = Atoms(qx, qq * _circle_density(qx))
                    tr = simulate(
                        model,
                        start,
                        times[-1],
                        save_at=times,
                        method="dopri5",
                        rtol=1e-11,
                        atol=1e-13,
                    )
                    w2 = wasserstein(tr.atoms(-1), fine[-1], method="circle")
                    m_err = float(np.abs(tr.atoms(-1).mean() - fine[-1].mean()).max())
                    errs.append(w2)
                    moms.append(m_err)
                    rep.rows.append(
                        {
                            "sphere": "S1",
                            "model": name,
                            "start": "quadrature",
                            "N": N,
                            "seed": -1,
                            "t": times[-1],
                            "coupling": np.nan,
                            "W2": w2,
                            "moment_error": m_err,
                        }
                    )
                slope, half = _fit_slope(np.array(quad_N, float), np.array(errs))
                rep.expect(
                    f"S1 {name} quadrature-start W2 slope at t={times[-1]:g} ({slope:.3f} ± {half:.3f})",
                    slope,
                    -1.1,
                    -0.9,
                )
                # smooth moments converge spectrally until the time-stepping tolerance (~1e-11)
                order = np.log(moms[0] / moms[2]) / np.log(quad_N[2] / quad_N[0])
                rep.expect(
                    f"S1 {name} quadrature-start moment error, observed order N={quad_N[0]}..{quad_N[2]}",
                    order,
                    6.0,
                    np.inf,
                )
                rep.expect(
                    f"S1 {name} quadrature-start moment error at N={quad_N[-1]}",
                    moms[-1],
                    0.0,
                    1e-10,
                )
    t_chaos = time.perf_counter()
    rep.figures.append(_figure(rep, out))
    rep.figures.append(_chaos_in_time(rep, out, quick))
    rep.notes.append(
        f"W2 in time on S1 (SA, USA, beta = {', '.join(f'{b:g}' for b in CHAOS_BETAS)}): "
        f"{time.perf_counter() - t_chaos:.0f} s"
    )
    rep.seconds = time.perf_counter() - t0
    return rep


def _figure(rep: StudyReport, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    groups = sorted({(r["sphere"], r["model"]) for r in rep.rows if r["start"] == "iid"})
    fig, axes = plt.subplots(
        1, len(groups) + 1, figsize=(4.2 * (len(groups) + 1), 3.8), constrained_layout=True
    )
    for ax, (sph, name) in zip(axes, groups):
        rows = [
            r for r in rep.rows if r["sphere"] == sph and r["model"] == name and r["start"] == "iid"
        ]
        for t in sorted({r["t"] for r in rows}):
            for key, style in (("coupling", "o-"), ("W2", "s--")):
                pts = [
                    (r["N"], r[key])
                    for r in rows
                    if r["t"] == t and np.isfinite(r[key]) and r[key] > 0
                ]
                if not pts:
                    continue
                Ns = sorted({p[0] for p in pts})
                means = [np.mean([v for n, v in pts if n == N]) for N in Ns]
                ax.loglog(Ns, means, style, label=f"{key}, t={t:g}", ms=4)
        Ns = np.array(sorted({r["N"] for r in rows}), float)
        ax.loglog(Ns, 0.5 * Ns**-0.5, "k:", label="N^-1/2")
        ax.set_title(f"{sph}, {name}, i.i.d. start")
        ax.set_xlabel("N")
        ax.legend(fontsize=7)
    q = [r for r in rep.rows if r["start"] == "quadrature"]
    ax = axes[-1]
    for name in sorted({r["model"] for r in q}):
        Ns = [r["N"] for r in q if r["model"] == name]
        ax.loglog(Ns, [r["W2"] for r in q if r["model"] == name], "o-", label=f"W2, {name}")
        ax.loglog(
            Ns,
            [max(r["moment_error"], 1e-17) for r in q if r["model"] == name],
            "s--",
            label=f"|moment error|, {name}",
        )
    if q:
        Ns = np.array(sorted({r["N"] for r in q}), float)
        ax.loglog(Ns, 1.0 / Ns, "k:", label="N^-1")
    ax.set_title("S1, quadrature start, t = 2")
    ax.set_xlabel("N")
    ax.legend(fontsize=7)
    path = out / "mean_field.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _validation_module(name: str):
    """Import ``validation.<name>`` from the source checkout beside the package, or ``None``."""
    import importlib
    import sys

    root = Path(__file__).resolve().parents[1]
    if not (root / "validation" / f"{name}.py").is_file():
        return None
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(f"validation.{name}")


def eulerian(out: Path, quick: bool = True) -> StudyReport:
    """Finite volume against theory: growth rates, orders, heat equation, cluster formation (validation/eulerian.py)."""
    t0 = time.perf_counter()
    rep = StudyReport("eulerian")
    mod = _validation_module("eulerian")
    if mod is None:
        rep.notes.append(
            "validation/eulerian.py is not present (package installed without the source tree)"
        )
        return rep
    # S^2 at 1442 cells in both modes: mode 4 is off by 1.4 % at 642 cells (discretization), 0.6 % at 1442
    growth = mod.circle_growth(128 if quick else 256, "auto") + mod.sphere_growth(12, "auto")
    for sph, m, b, k, lam, meas in growth:
        rep.rows.append(
            {
                "kind": "growth",
                "sphere": sph,
                "model": m,
                "beta": b,
                "mode": k,
                "theory": lam,
                "measured": meas,
            }
        )
        rep.expect(
            f"{sph} {m} beta={b:g} mode {k}: growth rate relative error",
            abs(meas / lam - 1),
            0.0,
            0.01,
        )
    o1 = mod.circle_order(
        [32, 64, 128, 256] if quick else [64, 128, 256, 512], 1024 if quick else 2048, "auto"
    )
    hs, es = np.array([r[2] for r in o1]), np.array([r[3] for r in o1])
    rep.expect(
        "S^1 observed order (fit over refinements)",
        np.polyfit(np.log(hs), np.log(es), 1)[0],
        1.8,
        2.6,
    )
    for sph, M, ell, lam, meas in mod.heat("auto"):
        rep.expect(
            f"{sph} heat equation, M={M}, degree {ell}: decay rate relative error",
            abs(meas / lam - 1),
            0.0,
            0.01,
        )
    c = mod.clusters(256 if quick else 512, "auto", out, T=20.0 if quick else 30.0)
    rep.rows.append({"kind": "clusters", **c})
    rep.expect(
        "SA beta=9 on S^1: clusters at the end of the linear phase minus k*",
        c["clusters_linear_end"] - c["k_star"],
        -1,
        1,
    )
    rep.expect("cluster run: mass error", c["mass_error"], 0.0, 1e-13)
    rep.expect("cluster run: minimum density", c["min_density"], 0.0, np.inf)
    rep.figures.append(out / "eulerian_clusters.png")
    rep.seconds = time.perf_counter() - t0
    return rep


def jko_study(out: Path, quick: bool = True) -> StudyReport:
    """JKO against the finite-volume solver as tau -> 0, and against the heat equation (S^1, 128 cells)."""
    from .density import Density
    from .mesh import CircleMesh
    from .solvers.eulerian import solve_density
    from .solvers.jko import jko

    t0 = time.perf_counter()
    rep = StudyReport("jko")
    mesh = CircleMesh(128)
    th = mesh.center_angles
    rho0 = Density.from_function(
        mesh,
        lambda x: np.exp(np.cos(np.arctan2(x[:, 1], x[:, 0]) - 0.3)) + 0.5 * np.exp(2 * x[:, 0]),
    )
    T, kappa, model = 0.4, 4.0, USA(2.0)
    ref = solve_density(model, rho0, T, kappa=kappa).density().masses()
    taus = np.array([0.1, 0.05, 0.025] if quick else [0.1, 0.05, 0.025, 0.0125])
    errs = []
    for tau in taus:
        r = jko(model, rho0, tau, int(round(T / tau)), kappa=kappa)
        errs.append(float(np.abs(r.weights[-1] - ref).sum()))
        rep.rows.append({"kind": "order", "tau": tau, "L1_error_vs_eulerian": errs[-1]})
    rep.expect(
        "USA(2), kappa=4: observed order in tau of the L1 gap to the Eulerian solution",
        np.polyfit(np.log(taus), np.log(errs), 1)[0],
        0.8,
        1.2,
    )
    k, kap, t_heat = 2, 1.0, 0.2
    rho_h = Density.from_function(
        mesh, lambda x: 1 + 0.5 * np.cos(k * np.arctan2(x[:, 1], x[:, 0]))
    )
    for tau in (0.02, 0.01):
        n = int(round(t_heat / tau))
        r = jko(None, rho_h, tau, n, kappa=kap)
        amp = np.abs(r.weights @ np.exp(-1j * k * th))
        implicit_euler = (1 + k * k * tau / kap) ** -n
        rep.rows.append(
            {
                "kind": "heat",
                "tau": tau,
                "ratio": amp[-1] / amp[0],
                "implicit_euler": implicit_euler,
                "exact": np.exp(-k * k * t_heat / kap),
            }
        )
        # a JKO step of the entropy is an implicit Euler step of the heat equation, up to eps and the mesh
        rep.expect(
            f"heat equation, tau={tau:g}: mode decay vs implicit Euler (relative)",
            abs(amp[-1] / amp[0] / implicit_euler - 1),
            0.0,
            5e-3,
        )
    rep.seconds = time.perf_counter() - t0
    return rep


register("mean-field")(mean_field)
register("eulerian")(eulerian)
register("jko")(jko_study)
