"""The finite-volume solver against theory (``eulerian``): growth rates, orders, heat equation, clusters.

``wflow validate eulerian [--quick]`` (:func:`eulerian`) checks
:func:`wflow.solvers.eulerian.solve_density` on S^1 and S^2: growth rates of modes 1..4 around the
uniform density against :func:`wflow.theory.growth_rate` (within 1 %), the observed order on a
smooth problem before clustering (S^1: in [1.8, 2.6]; S^2 reported in full mode), heat-equation
decay rates (within 1 %), and cluster formation at SA beta = 9 on S^1 (mass, positivity, k* +- 1
clusters at the end of the linear phase).  Sizes and measured values: docs/validation.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.special import eval_legendre

from .. import theory
from ..density import Density
from ..mesh import CircleMesh, SphereMesh
from ..models import SA, USA
from ..solvers.eulerian import solve_density
from ..sphere import points_to_angles
from .progress import numbered, phase
from .report import StudyReport, register, save_figure, subplots

__all__ = ["eulerian", "circle_growth_rates", "circle_order_errors", "heat_decay_rates"]

MODELS = {"SA": SA, "USA": USA}
#: the report's columns of the rows of :func:`circle_growth_rates` and :func:`heat_decay_rates`
GROWTH_COLUMNS = ("sphere", "model", "beta", "mode", "theory", "measured")
HEAT_COLUMNS = ("sphere", "cells", "mode", "theory", "measured")


def circle_growth_rates(
    M: int,
    betas: Sequence[float] = (1.0, 5.0),
    models: Sequence[str] = ("SA", "USA"),
    modes: Sequence[int] = (1, 2, 3, 4),
    backend: str = "auto",
) -> list[tuple[str, str, float, int, float, float]]:
    r"""Growth rates of Fourier modes around the uniform density on :math:`S^1`, finite volume against theory.

    For each beta, model and mode k, the density :math:`(1 + 10^{-5}\cos k\theta)/(2\pi)` on ``M`` cells
    runs for one e-folding time :math:`T = 1/\lambda_k` (steps at most T/50); the measured rate is
    :math:`\log(|\hat\rho_k(T)|/|\hat\rho_k(0)|)/T`, the theory's :func:`wflow.theory.growth_rate`.

    Returns
    -------
    list of (sphere, model, beta, k, theory, measured)

    Examples
    --------
    >>> [(m, k, round(lam, 4), round(meas / lam - 1, 4)) for _, m, _, k, lam, meas in
    ...  circle_growth_rates(32, betas=(1.0,), models=("SA",), modes=(1,))]
    [('SA', 1, 0.4464, -0.0016)]
    """
    mesh = CircleMesh(M)
    rows = []
    for beta in betas:
        for name in models:
            cls = MODELS[name]
            for k in modes:
                lam = float(theory.growth_rate(k, beta, 2, name))
                rho0 = Density.from_function(
                    mesh, lambda x: 1 + 1e-5 * np.cos(k * points_to_angles(x))
                )
                T = 1.0 / lam
                r = solve_density(cls(beta=beta), rho0, T, max_step=T / 50, backend=backend)
                a = np.abs((r.values * mesh.areas) @ np.exp(-1j * k * mesh.center_angles))
                rows.append(("S^1", name, beta, k, lam, float(np.log(a[1] / a[0]) / T)))
    return rows


def _sphere_growth(n: int, backend: str, eps: float = 1e-3) -> list[tuple]:
    """Perturbation eps P_l(z); the drift of the discrete uniform state is removed by a baseline run."""
    mesh = SphereMesh(n)
    beta = 4.0
    rows = []
    for name, cls in MODELS.items():
        model = cls(beta=beta)
        lams = [float(theory.growth_rate(ell, beta, 3, name)) for ell in range(1, 5)]
        for ell, lam in zip(range(1, 5), lams):
            T = 1.0 / lam
            base = solve_density(model, Density.uniform(mesh), T, max_step=T / 40, backend=backend)
            rho0 = Density.from_function(mesh, lambda x: 1 + eps * eval_legendre(ell, x[:, 2]))
            r = solve_density(model, rho0, T, max_step=T / 40, backend=backend)
            P = eval_legendre(ell, mesh.centers[:, 2])
            a = ((r.values - base.values) * mesh.areas) @ P
            a0 = ((rho0.values - base.values[0]) * mesh.areas) @ P
            rows.append(("S^2", name, beta, ell, lam, np.log(a[1] / a0) / T))
    return rows


def circle_order_errors(
    Ms: Sequence[int], M_ref: int, backend: str = "auto"
) -> list[tuple[str, int, float, float]]:
    r"""Errors of the finite-volume solution on :math:`S^1` under refinement, for its observed order.

    A smooth density :math:`\propto e^{x_1} + \tfrac12 e^{1.5 x_2}` runs under SA(beta = 2) to t = 1 (before
    clustering) on ``M`` cells for each ``M`` in ``Ms`` and on ``M_ref`` cells (a multiple of each);
    the error is the L1 distance of the cell averages to the reference's, averaged onto the coarse cells.

    Returns
    -------
    list of (sphere, M, h, error)

    Examples
    --------
    >>> rows = circle_order_errors([16, 32], 128)
    >>> [(M, round(h, 4)) for _, M, h, _ in rows], bool(rows[0][3] > 3 * rows[1][3])
    ([(16, 0.3927), (32, 0.1963)], True)
    """
    f = lambda x: np.exp(x[:, 0]) + 0.5 * np.exp(1.5 * x[:, 1])  # noqa: E731
    model, T = SA(beta=2.0), 1.0
    ref = solve_density(
        model, Density.from_function(CircleMesh(M_ref), f), T, backend=backend
    ).values[-1]
    rows = []
    for M in Ms:
        v = solve_density(
            model, Density.from_function(CircleMesh(M), f), T, backend=backend
        ).values[-1]
        err = np.sum(np.abs(v - ref.reshape(M, -1).mean(axis=1))) * 2 * np.pi / M
        rows.append(("S^1", M, 2 * np.pi / M, err))
    return rows


def _sphere_order(ns, n_ref: int, backend: str) -> list[tuple]:
    """Weak error: max over spherical-harmonic-like test functions (monomials of degree <= 3)
    of |sum_i m_i phi(c_i) - reference| (meshes are not nested)."""
    f = lambda x: np.exp(x[:, 0]) + 0.5 * np.exp(1.5 * x[:, 2])  # noqa: E731
    model, T = SA(beta=2.0), 0.5
    powers = [(a, b, c) for a in range(4) for b in range(4) for c in range(4) if 0 < a + b + c <= 3]

    def moments(mesh, values):
        x = mesh.centers
        return np.array(
            [
                np.sum(values * mesh.areas * x[:, 0] ** a * x[:, 1] ** b * x[:, 2] ** c)
                for a, b, c in powers
            ]
        )

    def run(n):
        mesh = SphereMesh(n)
        r = solve_density(model, Density.from_function(mesh, f), T, backend=backend)
        return mesh, moments(mesh, r.values[-1])

    _, ref = run(n_ref)
    rows = []
    for n in ns:
        mesh, mom = run(n)
        rows.append(("S^2", mesh.n_cells, mesh.spacing, float(np.abs(mom - ref).max())))
    return rows


def heat_decay_rates(
    meshes: Sequence[CircleMesh | SphereMesh],
    degrees: Sequence[int] = (1, 2, 3),
    kappa: float = 1.0,
    T: float = 0.1,
) -> list[tuple[str, int, int, float, float]]:
    r"""Decay rates of the heat equation (no model, diffusion :math:`\kappa^{-1}\Delta_S`), finite volume
    against :func:`wflow.theory.heat_decay_rate`, :math:`\ell(\ell+d-2)/\kappa`.

    On each mesh, for each degree l, the density :math:`1 + \tfrac12 g_\ell` (:math:`\cos\ell\theta` on
    :math:`S^1`, the Legendre polynomial :math:`P_\ell(z)` on :math:`S^2`) runs to ``T``; the measured rate
    is :math:`-\log(a(T)/a(0))/T` with :math:`a` the projection on :math:`g_\ell`.

    Returns
    -------
    list of (sphere, cells, degree, theory, measured)

    Examples
    --------
    The discrete Laplacian's relative error in the rate is :math:`(\ell h)^2/12` on the circle:

    >>> [(s, l, lam, round(meas / lam - 1, 5)) for s, _, l, lam, meas in heat_decay_rates([CircleMesh(64)], (1,))]
    [('S^1', 1, 1.0, -0.0008)]
    """
    rows = []
    for mesh in meshes:
        d = mesh.d
        for ell in degrees:
            if isinstance(mesh, CircleMesh):
                g = lambda x: np.cos(ell * points_to_angles(x))  # noqa: E731
                basis = np.cos(ell * mesh.center_angles)
            else:
                g = lambda x: eval_legendre(ell, x[:, 2])  # noqa: E731
                basis = eval_legendre(ell, mesh.centers[:, 2])
            rho0 = Density.from_function(mesh, lambda x: 1 + 0.5 * g(x))
            r = solve_density(None, rho0, T, kappa=kappa)
            a = (r.values * mesh.areas) @ basis
            rows.append(
                (
                    f"S^{d - 1}",
                    mesh.n_cells,
                    ell,
                    float(theory.heat_decay_rate(ell, d, kappa)),
                    float(-np.log(a[1] / a[0]) / T),
                )
            )
    return rows


def _clusters(M: int, backend: str, out: Path, T: float = 30.0) -> dict:
    beta = 9.0
    kstar = theory.most_unstable_mode(beta, 2, "SA")
    mesh = CircleMesh(M)
    rng = np.random.default_rng(0)
    ks = np.arange(1, 21)
    amp = 1e-3 * rng.standard_normal(ks.size)
    ph = rng.uniform(0, 2 * np.pi, ks.size)
    rho0 = Density.from_function(
        mesh, lambda x: 1 + np.sum(amp * np.cos(ks * points_to_angles(x)[:, None] + ph), axis=1)
    )
    r = solve_density(
        SA(beta=beta), rho0, T, save_at=np.linspace(0, T, int(10 * T) + 1), backend=backend
    )
    unif = 1 / (2 * np.pi)
    # end of the linear phase: the first save where the perturbation reaches 50 % of the uniform level
    dev = np.abs(r.values - unif).max(axis=1) / unif
    i_lin = int(np.argmax(dev > 0.5))

    def count(v):
        peaks = (v > np.roll(v, 1)) & (v >= np.roll(v, -1)) & (v > 1.25 * unif)
        return int(peaks.sum())

    def dominant_mode(v):
        a = np.abs((v * mesh.areas) @ np.exp(-1j * np.outer(mesh.center_angles, np.arange(1, 21))))
        return int(np.argmax(a) + 1)

    res = {
        "k_star": kstar,
        "t_linear_end": float(r.times[i_lin]),
        "dominant_mode_linear_end": dominant_mode(r.values[i_lin]),
        "clusters_linear_end": count(r.values[i_lin]),
        "clusters_final": count(r.values[-1]),
        "mass_error": float(np.abs(r.mass - 1).max()),
        "min_density": float(r.values.min()),
        "steps": int(r.stats["steps"][-1]),
    }
    fig, ax = subplots(figsize=(7, 4))
    log_rho = np.log10(np.maximum(r.values, 1e-12))
    im = ax.pcolormesh(mesh.center_angles, r.times, log_rho, shading="auto", cmap="magma")
    ax.axhline(r.times[i_lin], color="c", lw=0.8, ls="--")
    ax.set_xlabel(r"$\theta$")
    ax.set_ylabel("t")
    ax.set_title(f"SA, beta={beta:g}, M={M}: log10 density; most unstable mode k*={kstar}")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    save_figure(fig, out / "eulerian_clusters.png", dpi=120)
    return res


def _growth_figure(growth: list[tuple], out: Path) -> Path:
    fig, axes = subplots(1, 2, figsize=(9, 3.5))
    for ax, sph in zip(axes, ("S^1", "S^2")):
        for m, mk in (("SA", "o"), ("USA", "s")):
            for b in sorted({g[2] for g in growth if g[0] == sph}):
                sel = [g for g in growth if g[0] == sph and g[1] == m and g[2] == b]
                ks = [g[3] for g in sel]
                ax.plot(ks, [g[4] for g in sel], "-", color="0.7")
                ax.plot(ks, [g[5] for g in sel], mk, label=f"{m} beta={b:g}")
        ax.set(yscale="log", xlabel="mode", title=f"{sph}: measured (markers) vs theory (lines)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, out / "eulerian_growth.png", dpi=120)


def _order_table(orders: list[list[tuple]], out: Path) -> tuple[list[str], Path]:
    """Markdown rows (errors, pairwise orders, the fitted slope) and the log-log figure."""
    lines = []
    fig, ax = subplots(figsize=(5, 3.5))
    for rows in orders:
        prev = None
        for s, M, h, e in rows:
            order = "" if prev is None else f"{np.log(prev[1] / e) / np.log(prev[0] / h):.2f}"
            lines.append(f"| {s} | {M} | {h:.4g} | {e:.3e} | {order} |")
            prev = (h, e)
        hs, es = np.array([r[2] for r in rows]), np.array([r[3] for r in rows])
        slope = np.polyfit(np.log(hs), np.log(es), 1)[0]
        lines.append(f"| {rows[0][0]} | fit | | | **{slope:.2f}** |")
        ax.loglog(hs, es, "o-", label=f"{rows[0][0]} (slope {slope:.2f})")
    ax.loglog(hs, es[-1] * (hs / hs[-1]) ** 2, "k--", lw=0.8, label="h^2")
    ax.set(xlabel="h", ylabel="error")
    ax.legend()
    fig.tight_layout()
    path = out / "eulerian_order.png"
    save_figure(fig, path, dpi=120)
    return lines, path


@register("eulerian")
def eulerian(out: Path, quick: bool = True) -> StudyReport:
    """Finite volume against theory: growth rates, orders, heat equation, cluster formation (module docstring).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> eulerian(pathlib.Path(tempfile.mkdtemp()), quick=True).passed  # doctest: +SKIP
    True
    """
    rep = StudyReport("eulerian")
    label = numbered(4)
    phase(rep.name, label("growth rates around the uniform density, S1 and S2"))
    # S^2 at 1442 cells in both modes: mode 4 is off by 1.4 % at 642 cells (discretization), 0.6 % at 1442
    growth = circle_growth_rates(128 if quick else 256) + _sphere_growth(12, "auto")
    for g in growth:
        sph, m, b, k, lam, meas = g
        rep.rows.append({"kind": "growth", **dict(zip(GROWTH_COLUMNS, g))})
        err = abs(meas / lam - 1)
        rep.expect(f"{sph} {m} beta={b:g} mode {k}: growth rate relative error", err, 0.0, 0.01)
    rep.sections += [
        "## Growth rates around the uniform density\n\n"
        "| sphere | model | beta | mode | theory | measured | rel. error |\n"
        "|---|---|---:|---:|---:|---:|---:|\n"
        + "\n".join(
            f"| {s} | {m} | {b:g} | {k} | {lam:.6g} | {meas:.6g} | {meas / lam - 1:+.2e} |"
            for s, m, b, k, lam, meas in growth
        )
    ]
    rep.figures.append(_growth_figure(growth, out))
    phase(rep.name, label("observed order of convergence" + ("" if quick else ", S1 and S2")))
    o1 = circle_order_errors(
        [32, 64, 128, 256] if quick else [64, 128, 256, 512], 1024 if quick else 2048, "auto"
    )
    hs, es = np.array([r[2] for r in o1]), np.array([r[3] for r in o1])
    order = np.polyfit(np.log(hs), np.log(es), 1)[0]
    rep.expect("S^1 observed order (fit over refinements)", order, 1.8, 2.6)
    # full mode: the order on S^2 as well (reported; the meshes are not nested)
    orders = [o1] if quick else [o1, _sphere_order([4, 6, 8, 12], 20, "auto")]
    for rows in orders:
        rep.rows += [
            {"kind": "order", "sphere": s, "cells": M, "h": h, "error": e} for s, M, h, e in rows
        ]
    table, figure = _order_table(orders, out)
    rep.sections.append(
        "## Observed order of convergence (smooth problem, SA beta=2, before clustering)\n\n"
        "S^1: L1 error of cell averages at t=1 against a fine-grid solution restricted to the "
        "coarse cells.\n"
        + (
            ""
            if quick
            else "S^2: error of the moments of degree <= 3 at t=0.5 against a fine mesh (meshes "
            "are not nested).\n"
        )
        + "\n| sphere | cells | h | error | order (vs previous) |\n|---|---:|---:|---:|---:|\n"
        + "\n".join(table)
    )
    rep.figures.append(figure)
    phase(rep.name, label("heat equation decay rates, S1 and S2"))
    hrows = heat_decay_rates((CircleMesh(256), SphereMesh(16)))
    for g in hrows:
        sph, M, ell, lam, meas = g
        rep.rows.append({"kind": "heat", **dict(zip(HEAT_COLUMNS, g))})
        err = abs(meas / lam - 1)
        rep.expect(
            f"{sph} heat equation, M={M}, degree {ell}: decay rate relative error", err, 0.0, 0.01
        )
    rep.sections.append(
        "## Heat equation (no model, kappa = 1, t = 0.1)\n\n"
        "| sphere | cells | degree | theory rate | measured | rel. error |\n"
        "|---|---:|---:|---:|---:|---:|\n"
        + "\n".join(
            f"| {s} | {M} | {ell} | {lam:.6g} | {meas:.6g} | {meas / lam - 1:+.2e} |"
            for s, M, ell, lam, meas in hrows
        )
    )
    phase(rep.name, label(f"cluster formation, SA beta = 9 on S1 to t = {20 if quick else 30}"))
    c = _clusters(256 if quick else 512, "auto", out, T=20.0 if quick else 30.0)
    rep.rows.append({"kind": "clusters", **c})
    excess = c["clusters_linear_end"] - c["k_star"]
    rep.expect("SA beta=9 on S^1: clusters at the end of the linear phase minus k*", excess, -1, 1)
    rep.expect("cluster run: mass error", c["mass_error"], 0.0, 1e-13)
    rep.expect("cluster run: minimum density", c["min_density"], 0.0, np.inf)
    rep.sections.append(
        "## Cluster formation (SA, beta = 9, S^1, random perturbation of amplitude 1e-3 in "
        "modes 1..20)\n\n"
        "End of the linear phase: first save where max |rho - uniform| > uniform / 2. Clusters: "
        "local maxima above 1.25 x uniform. Modes 3 and 5 grow almost as fast as k* = 4 (0.59, "
        "0.66 vs 0.70), so the count at the end of the linear phase is k* +- 1 depending on the "
        "random data.\n\n| quantity | value |\n|---|---|\n"
        + "\n".join(f"| {k} | {v} |" for k, v in c.items())
    )
    rep.figures.append(out / "eulerian_clusters.png")
    return rep
