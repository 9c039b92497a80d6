r"""The mean field in high dimension: particles on :math:`S^{d-1}` against the zonal solver (``mean-field-zonal``).

For a zonal initial density :math:`\mu_0 = f(\langle x, e\rangle)\sigma` (:func:`initial_density`),
:math:`d \in \{8, 128\}`, SA and USA: :math:`N` particles drawn exactly from :math:`\mu_0`
(:func:`sample_zonal`) and moved by :func:`wflow.simulate` (RK4) against the zonal finite-volume
solve (:func:`wflow.solvers.zonal.solve_zonal`, whose own error is its :math:`W_2` to the solve on
half the bands).  The error is the exact one-dimensional :math:`W_2` between the laws of
:math:`z = \langle x, e\rangle`; its slope in :math:`N` should be :math:`-1/2` (docs/zonal.md).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from ..models import SA, USA
from ..solvers.particles import simulate
from ..solvers.zonal import law_quantile, solve_zonal
from .progress import numbered, phase
from .report import StudyReport, fit_slope, register, save_figure, subplots

__all__ = ["mean_field_zonal", "sample_zonal", "initial_density"]

#: (N, seeds) in quick and full mode
QUICK_PLAN = {100: 8, 300: 6, 1000: 4, 3000: 2, 10_000: 1}
FULL_PLAN = {100: 16, 300: 12, 1000: 8, 3000: 4, 10_000: 2, 30_000: 1, 100_000: 1}
#: dimensions, models (beta), final time
DIMENSIONS = (8, 128)
BETA = 2.0
T_END = 1.0
#: the zonal reference per dimension: (bands, grid); its error is measured against half the bands.  In
#: d = 128 the law of z is ~0.1 wide: bands uniform in z (an angle grid of 1024 bands put only ~30 across it)
ZONAL_GRID = {8: (1024, "angle"), 128: (2048, "z")}
#: error per unit of change of the reference solves (the default 1e-3 would dominate the space error)
ZONAL_RTOL = 1e-6
#: RK4 step of the particles (time error ~1e-6, far below the W2 values)
PARTICLE_DT = 0.25


def initial_density(d: int):
    r""":math:`f(z) = e^{2\sqrt d\,z}`: shifts the law of :math:`z` (width :math:`\sim d^{-1/2}`) by about its width.

    Normalized to 1 at the pole :math:`z = 1` (:math:`e^{2\sqrt d\,(z - 1)}`).

    Examples
    --------
    >>> f = initial_density(8)
    >>> float(f(1.0)), round(float(f(0.0)), 6)
    (1.0, 0.003493)
    """
    a = 2.0 * np.sqrt(d)
    return lambda z: np.exp(a * (np.asarray(z) - 1.0))


def sample_zonal(f, d: int, n: int, rng: np.random.Generator, *, grid: int = 1 << 16) -> np.ndarray:
    r"""``n`` points of :math:`S^{d-1}` from :math:`\mu = f(\langle x, e_d\rangle)\sigma` (:math:`e = e_d`).

    :math:`z` by inverse CDF of :math:`p(z) \propto f(z)(1-z^2)^{(d-3)/2}`, tabulated on ``grid``
    points uniform in the polar angle (where :math:`p\,dz \propto f\sin^{d-2}\varphi\,d\varphi` is
    smooth), then :math:`x = z e + \sqrt{1-z^2}\,u`, :math:`u` uniform on :math:`S^{d-2} \subset e^\perp`.

    Examples
    --------
    With :math:`f = 1` on :math:`S^2` the law of :math:`z` is uniform on [-1, 1] (Archimedes): variance 1/3.

    >>> import numpy as np
    >>> x = sample_zonal(lambda z: np.ones_like(z), 3, 20000, np.random.default_rng(0))
    >>> x.shape, bool(np.allclose(np.linalg.norm(x, axis=1), 1)), round(float(np.var(x[:, 2])), 2)
    ((20000, 3), True, 0.33)
    """
    phi = np.linspace(0.0, np.pi, grid + 1)
    z = np.cos(phi)
    with np.errstate(divide="ignore"):
        logw = np.log(np.maximum(f(z), 0.0)) + (d - 2) * np.log(np.sin(phi))
    w = np.exp(logw - np.max(logw))
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (w[1:] + w[:-1]) * np.diff(phi))])
    cdf /= cdf[-1]
    keep = np.concatenate([[True], np.diff(cdf) > 0])
    zs = np.interp(rng.uniform(size=n), cdf[keep], z[keep])
    u = rng.standard_normal((n, d - 1))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    s = np.sqrt(np.maximum(1.0 - zs * zs, 0.0))
    return np.concatenate([s[:, None] * u, zs[:, None]], axis=1)


def _law_w2(edges_a, m_a, edges_b, m_b, n: int = 1 << 16) -> float:
    """W2 between two band laws by their quantile functions on a fine midpoint grid."""
    s = (np.arange(n) + 0.5) / n
    return float(
        np.sqrt(np.mean((law_quantile(edges_a, m_a, s) - law_quantile(edges_b, m_b, s)) ** 2))
    )


@register("mean-field-zonal")
def mean_field_zonal(out: Path, quick: bool = True) -> StudyReport:
    """Particles in d = 8 and d = 128 against the zonal solution: W2 of the z-marginal, slope in N (module docstring).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> rep = mean_field_zonal(pathlib.Path(tempfile.mkdtemp()), quick=True)  # doctest: +SKIP
    >>> rep.passed  # doctest: +SKIP
    True
    """
    rep = StudyReport("mean-field-zonal")
    plan = QUICK_PLAN if quick else FULL_PLAN
    results = {}
    label = numbered(4 * len(DIMENSIONS))
    for d in DIMENSIONS:
        f = initial_density(d)
        for name, model in (("SA", SA(BETA)), ("USA", USA(BETA))):
            t0 = time.perf_counter()
            bands, grid = ZONAL_GRID[d]
            phase(rep.name, label(f"d = {d} {name}: zonal solves, {bands} and {bands // 2} bands"))
            grid_kw: dict[str, Any] = {"d": d, "grid": grid, "rtol": ZONAL_RTOL}
            ref, coarse = (
                solve_zonal(model, f, T_END, n_cells=m, save_at=[0.0, T_END], **grid_kw)
                for m in (bands, bands // 2)
            )
            ref_err = _law_w2(ref.edges, ref.masses[-1], coarse.edges, coarse.masses[-1])
            t_zonal = time.perf_counter() - t0
            rows = []
            run = {"d": d, "model": name, "beta": BETA, "reference_error": ref_err}
            t1 = time.perf_counter()
            runs = f"{sum(plan.values())} particle runs, N = {min(plan)}..{max(plan)}"
            phase(rep.name, label(f"d = {d} {name}: {runs}, to t = {T_END:g}"))
            for N, seeds in plan.items():
                for s in range(seeds):
                    rng = np.random.default_rng([d, N, s, 18])
                    x0 = sample_zonal(f, d, N, rng)
                    tr = simulate(
                        model, x0, T_END, dt=PARTICLE_DT, save_at=[0.0, T_END], method="rk4"
                    )
                    for i, t in enumerate(tr.times):
                        w2 = ref.w2(tr.points[i][:, -1], i)
                        rows.append(run | {"N": N, "seed": s, "t": float(t), "W2": w2})
            t_part = time.perf_counter() - t1
            rep.rows.extend(rows)
            for t in (0.0, T_END):
                sel = [r for r in rows if r["t"] == t]
                Ns, w2 = np.array([(r["N"], r["W2"]) for r in sel], float).T
                slope, half = fit_slope(Ns, w2)
                results[(d, name, t)] = (Ns, w2, slope, half)
                if t == T_END:
                    rep.expect_slope(
                        f"d={d} {name} beta={BETA:g}: slope of W2(z-marginal) in N at t={t:g}",
                        slope,
                        half,
                        -0.5,
                    )
            w2_max_n = float(
                np.mean([r["W2"] for r in rows if r["t"] == T_END and r["N"] == max(plan)])
            )
            rep.expect(
                f"d={d} {name}: reference error W2({bands} bands, {bands // 2} bands) / mean W2 at N={max(plan)}",
                ref_err / w2_max_n,
                0.0,
                0.25,
            )
            s0 = results[(d, name, 0.0)]
            rep.notes.append(
                f"d={d} {name}: zonal solves {t_zonal:.1f} s, particles {t_part:.1f} s; slope at t=0 "
                f"(sampling only) {s0[2]:.3f} ± {s0[3]:.3f}; reference error {ref_err:.2e}, mean W2 at "
                f"N={max(plan)} {w2_max_n:.2e}; mean z {ref.mean_z[0]:.4f} -> {ref.mean_z[-1]:.4f}"
            )
    rep.figures.append(_figure(results, out))
    return rep


def _figure(results, out: Path) -> Path:
    fig, axes = subplots(1, len(DIMENSIONS), figsize=(10, 3.8), sharey=False)
    for ax, d in zip(np.atleast_1d(axes), DIMENSIONS):
        for (dd, name, t), (Ns, w2, slope, half) in results.items():
            if dd != d or t != T_END:
                continue
            p = ax.loglog(
                Ns, w2, "o", ms=3, alpha=0.6, label=f"{name}: slope {slope:.2f} ± {half:.2f}"
            )
            n = np.unique(Ns)
            fit = np.exp(np.mean(np.log(w2) + 0.5 * np.log(Ns))) * n**-0.5
            ax.loglog(n, fit, "-", color=p[0].get_color(), lw=0.8)
        ax.set(title=f"$S^{{{d - 1}}}$: $W_2$ of $z$-marginal at t={T_END:g}", xlabel="N")
        ax.legend(fontsize=8)
    np.atleast_1d(axes)[0].set_ylabel("$W_2(\\mu_N^z(t), \\mu^z(t))$")
    fig.tight_layout()
    return save_figure(fig, Path(out) / "mean_field_zonal.png", dpi=110)
