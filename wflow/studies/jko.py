"""JKO against the finite-volume solver as tau -> 0, and against the heat equation (``jko``).

``wflow validate jko [--quick]`` (:func:`jko_study`) checks :func:`wflow.solvers.jko.jko` on a
128-cell circle: with USA(2) and noise kappa = 4 the L1 gap to
:func:`~wflow.solvers.eulerian.solve_density` at T = 0.4 has a fitted order in tau in [0.8, 1.2];
without a model a JKO step is an implicit Euler step of the heat equation, so a mode decays like
(1 + k^2 tau/kappa)^(-n) (within 5e-3).  Full mode adds, reported only, noise with
eps << 2 tau / kappa on 2048 cells (:func:`_small_eps`).  Details: docs/validation.md.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..density import Density
from ..mesh import CircleMesh
from ..models import USA
from ..solvers.eulerian import solve_density
from ..solvers.jko import jko
from .progress import numbered, phase
from .report import StudyReport, register

__all__ = ["jko_study"]


def _theta(x: np.ndarray) -> np.ndarray:
    return np.arctan2(x[:, 1], x[:, 0])


def _smooth(x: np.ndarray) -> np.ndarray:
    """The smooth initial density of both convergence checks (unnormalised)."""
    return np.exp(np.cos(_theta(x) - 0.3)) + 0.5 * np.exp(2 * x[:, 0])


def _small_eps(rep: StudyReport) -> None:
    """USA(2), kappa = 4 on a 2048-cell circle, default eps = 2 h^2 = 1/1300 of 2 tau/kappa at tau = 0.05.

    Every step must reach tol; error against the Eulerian solver on 512 cells (masses summed 4:1)
    at T = 0.2, and the step's sensitivity to tol and eps.  Rows ``kind = small-eps``, a table and
    notes; no expectation.
    """
    T, kappa = 0.2, 4.0
    refs = {
        n: solve_density(USA(2.0), Density.from_function(CircleMesh(n), _smooth), T, kappa=kappa)
        .density()
        .masses()
        for n in (256, 512)
    }
    spatial = np.abs(refs[512].reshape(256, 2).sum(1) - refs[256]).sum()
    m = CircleMesh(2048)
    rho0 = Density.from_function(m, _smooth)
    taus, errs, lines = [0.05, 0.025, 0.0125], [], []
    for tau in taus:
        t0 = time.perf_counter()
        r = jko(USA(2.0), rho0, tau, int(round(T / tau)), kappa=kappa)
        errs.append(float(np.abs(r.weights[-1].reshape(512, 4).sum(1) - refs[512]).sum()))
        row = {
            "kind": "small-eps",
            "tau": tau,
            "L1_error_vs_eulerian": errs[-1],
            "max_residual": float(r.stat("residual").max()),
            "all_converged": bool(r.stat("converged").all()),
            "mean_sinkhorn": float(r.stat("sinkhorn").mean()),
            "seconds": time.perf_counter() - t0,
        }
        rep.rows.append(row)
        lines.append(
            f"| {tau:g} | {row['L1_error_vs_eulerian']:.3e} | {row['max_residual']:.1e} | "
            f"{row['all_converged']} | {row['mean_sinkhorn']:.0f} | {row['seconds']:.1f} |"
        )
    pairwise = np.round(np.log2(np.array(errs[:-1]) / errs[1:]), 3).tolist()
    h = 2 * np.pi / m.n_cells
    tight = jko(USA(2.0), rho0, 0.05, 1, kappa=kappa, tol=1e-10, max_sinkhorn=50000)
    base = jko(USA(2.0), rho0, 0.05, 1, kappa=kappa)
    sens = [
        f"one step, tau = 0.05: L1 distance tol=1e-6 vs tol=1e-10: "
        f"{np.abs(base.weights[-1] - tight.weights[-1]).sum():.1e}"
    ]
    for c in (1.0, 8.0, 32.0):
        e = jko(USA(2.0), rho0, 0.05, 1, kappa=kappa, eps=c * h * h)
        sens.append(
            f"eps = {c:g} h^2 instead of 2 h^2: L1 distance "
            f"{np.abs(e.weights[-1] - tight.weights[-1]).sum():.1e} "
            f"({int(e.stat('sinkhorn')[0])} inner it.)"
        )
    rep.sections.append(
        "## Noise with eps << 2 tau / kappa (USA(2), kappa = 4, 2048 cells, T = 0.2)\n\n"
        f"Eulerian reference on 512 cells; its spatial error (L1, 256 vs 512 cells): {spatial:.2e}. "
        f"JKO masses summed 4:1 onto its cells. Pairwise order in tau: {pairwise}.\n\n"
        "| tau | L1 error vs Eulerian | max residual | all converged | mean inner it. | time (s) |\n"
        "|---|---|---|---|---|---|\n"
        + "\n".join(lines)
        + "\n\n"
        + "\n".join(f"- {s}" for s in sens)
    )


@register("jko")
def jko_study(out: Path, quick: bool = True) -> StudyReport:
    """JKO against the finite-volume solver as tau -> 0, and against the heat equation (module docstring).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> jko_study(pathlib.Path(tempfile.mkdtemp()), quick=True).passed  # doctest: +SKIP
    True
    """
    rep = StudyReport("jko")
    mesh = CircleMesh(128)
    th = mesh.center_angles
    rho0 = Density.from_function(mesh, _smooth)
    T, kappa, model = 0.4, 4.0, USA(2.0)
    taus = np.array([0.1, 0.05, 0.025] if quick else [0.1, 0.05, 0.025, 0.0125])
    label = numbered(2 if quick else 3)
    phase(rep.name, label(f"JKO against the finite-volume solver, tau = {taus[0]:g}..{taus[-1]:g}"))
    ref = solve_density(model, rho0, T, kappa=kappa).density().masses()
    errs, lines = [], []
    for tau in taus:
        start = time.perf_counter()
        r = jko(model, rho0, tau, int(round(T / tau)), kappa=kappa)
        errs.append(float(np.abs(r.weights[-1] - ref).sum()))
        seconds, outer = time.perf_counter() - start, float(r.stat("iterations").mean())
        rep.rows.append(
            {
                "kind": "order",
                "tau": tau,
                "L1_error_vs_eulerian": errs[-1],
                "mean_outer_iterations": outer,
                "seconds": seconds,
            }
        )
        lines.append(f"| {tau:g} | {errs[-1]:.3e} | {seconds:.2f} | {outer:.1f} |")
    order = np.polyfit(np.log(taus), np.log(errs), 1)[0]
    rep.expect(
        "USA(2), kappa=4: observed order in tau of the L1 gap to the Eulerian solution",
        order,
        0.8,
        1.2,
    )
    pairwise = np.round(np.log2(np.array(errs[:-1]) / errs[1:]), 3).tolist()
    rep.sections.append(
        "## Against the Eulerian solver (USA(2), kappa = 4, 128 cells, T = 0.4)\n\n"
        f"Observed order in tau (fit): {order:.3f}; pairwise: {pairwise}.\n\n"
        "| tau | L1 error vs Eulerian | time (s) | mean outer it. |\n|---|---|---|---|\n"
        + "\n".join(lines)
    )
    k, kap, t_heat = 2, 1.0, 0.2
    rho_h = Density.from_function(mesh, lambda x: 1 + 0.5 * np.cos(k * _theta(x)))
    lines = []
    phase(rep.name, label("JKO steps of the heat equation"))
    for tau in (0.02, 0.01) if quick else (0.02, 0.01, 0.005):
        n = int(round(t_heat / tau))
        r = jko(None, rho_h, tau, n, kappa=kap)
        amp = np.abs(r.weights @ np.exp(-1j * k * th))
        implicit_euler = (1 + k * k * tau / kap) ** -n
        exact = np.exp(-k * k * t_heat / kap)
        rep.rows.append(
            {
                "kind": "heat",
                "tau": tau,
                "ratio": amp[-1] / amp[0],
                "implicit_euler": implicit_euler,
                "exact": exact,
            }
        )
        lines.append(
            f"| {tau:g} | {amp[-1] / amp[0]:.5f} | {exact:.5f} | {implicit_euler:.5f} | "
            f"{amp[-1] / amp[0] / exact - 1:.2e} |"
        )
        if tau == 0.005:  # full mode: reported, no expectation
            continue
        # a JKO step of the entropy is an implicit Euler step of the heat equation, up to eps and the mesh
        rep.expect(
            f"heat equation, tau={tau:g}: mode decay vs implicit Euler (relative)",
            abs(amp[-1] / amp[0] / implicit_euler - 1),
            0.0,
            5e-3,
        )
    rep.sections.append(
        f"## Heat equation (no model, kappa = {kap:g}, mode k = {k}, t = {t_heat:g})\n\n"
        "| tau | mode ratio | exact exp(-k^2 t/kappa) | implicit Euler | rel. err. vs exact |\n"
        "|---|---|---|---|---|\n" + "\n".join(lines)
    )
    if not quick:
        phase(rep.name, label("small entropic epsilon against the finite-volume solver"))
        _small_eps(rep)
    return rep
