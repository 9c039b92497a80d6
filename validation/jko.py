"""JKO vs the Eulerian finite-volume solver as tau -> 0: observed order in tau.

Run: ``python -m validation.jko``.  USA(beta=2) with noise kappa = 4 on a 128-cell circle, smooth
initial density, T = 0.4; the reference is ``solve_density`` on the same mesh.  Prints the L1
error of the cell masses at T for each tau, the fitted order, and the heat-equation check
(mode k = 2, kappa = 1) against exp(-k^2 t / kappa); then noise with eps << 2 tau / kappa on a
2048-cell circle against the Eulerian solver (:func:`noise_small_eps`, about 2 minutes).
"""

from __future__ import annotations

import time

import numpy as np

from wflow.density import Density
from wflow.mesh import CircleMesh
from wflow.models import USA
from wflow.solvers.eulerian import solve_density
from wflow.solvers.jko import jko


def noise_small_eps() -> None:
    """USA(2), kappa = 4 on a 2048-cell circle, default eps = 2 h^2 = 1/1300 of 2 tau/kappa at tau = 0.05:
    every step must reach tol; error against the Eulerian solver on 512 cells (masses summed 4:1)
    at T = 0.2, and the step's sensitivity to tol and eps."""
    th = lambda x: np.arctan2(x[:, 1], x[:, 0])  # noqa: E731
    f = lambda x: np.exp(np.cos(th(x) - 0.3)) + 0.5 * np.exp(2 * x[:, 0])  # noqa: E731
    T, kappa = 0.2, 4.0
    refs = {
        n: solve_density(USA(2.0), Density.from_function(CircleMesh(n), f), T, kappa=kappa)
        .density()
        .masses()
        for n in (256, 512)
    }
    print(
        f"Eulerian reference, 512 cells; its spatial error (L1, 256 vs 512 cells): "
        f"{np.abs(refs[512].reshape(256, 2).sum(1) - refs[256]).sum():.2e}"
    )
    m = CircleMesh(2048)
    rho0 = Density.from_function(m, f)
    print(
        "| tau | L1 error vs Eulerian | max residual | all converged | mean inner it. | time (s) |"
    )
    print("|---|---|---|---|---|---|")
    taus, errs = [0.05, 0.025, 0.0125], []
    for tau in taus:
        t0 = time.perf_counter()
        r = jko(USA(2.0), rho0, tau, int(round(T / tau)), kappa=kappa)
        errs.append(np.abs(r.weights[-1].reshape(512, 4).sum(1) - refs[512]).sum())
        print(
            f"| {tau:g} | {errs[-1]:.3e} | {r.stat('residual').max():.1e} | {bool(r.stat('converged').all())} | "
            f"{r.stat('sinkhorn').mean():.0f} | {time.perf_counter() - t0:.1f} |"
        )
    print(f"pairwise order in tau: {np.round(np.log2(np.array(errs[:-1]) / errs[1:]), 3).tolist()}")
    h = 2 * np.pi / m.n_cells
    tight = jko(USA(2.0), rho0, 0.05, 1, kappa=kappa, tol=1e-10, max_sinkhorn=50000)
    base = jko(USA(2.0), rho0, 0.05, 1, kappa=kappa)
    print(
        f"one step, tau = 0.05: L1 distance tol=1e-6 vs tol=1e-10: {np.abs(base.weights[-1] - tight.weights[-1]).sum():.1e}"
    )
    for c in (1.0, 8.0, 32.0):
        e = jko(USA(2.0), rho0, 0.05, 1, kappa=kappa, eps=c * h * h)
        print(
            f"  eps = {c:g} h^2 instead of 2 h^2: L1 distance {np.abs(e.weights[-1] - tight.weights[-1]).sum():.1e} "
            f"({int(e.stat('sinkhorn')[0])} inner it.)"
        )


def main() -> None:
    m = CircleMesh(128)
    th = lambda x: np.arctan2(x[:, 1], x[:, 0])  # noqa: E731
    rho0 = Density.from_function(
        m, lambda x: np.exp(np.cos(th(x) - 0.3)) + 0.5 * np.exp(2 * x[:, 0])
    )
    T, kappa = 0.4, 4.0
    ref = solve_density(USA(2.0), rho0, T, kappa=kappa, backend="numpy").density().masses()
    taus = np.array([0.1, 0.05, 0.025, 0.0125])
    errs = []
    print("| tau | L1 error vs Eulerian | time (s) | mean outer it. |")
    print("|---|---|---|---|")
    for tau in taus:
        t0 = time.perf_counter()
        r = jko(USA(2.0), rho0, tau, int(round(T / tau)), kappa=kappa, backend="numpy")
        errs.append(np.abs(r.weights[-1] - ref).sum())
        print(
            f"| {tau:g} | {errs[-1]:.3e} | {time.perf_counter() - t0:.2f} | {r.stat('iterations').mean():.1f} |"
        )
    errs = np.array(errs)
    print(
        f"observed order in tau (fit): {np.polyfit(np.log(taus), np.log(errs), 1)[0]:.3f}; "
        f"pairwise: {np.round(np.log2(errs[:-1] / errs[1:]), 3).tolist()}"
    )
    k, kap = 2, 1.0
    rho_h = Density.from_function(m, lambda x: 1 + 0.5 * np.cos(k * th(x)))
    print("| tau | mode ratio | exact exp(-k^2 t/kappa) | implicit Euler | rel. err. vs exact |")
    print("|---|---|---|---|---|")
    for tau in (0.02, 0.01, 0.005):
        n = int(round(0.2 / tau))
        r = jko(None, rho_h, tau, n, kappa=kap)
        amp = np.abs(r.weights @ np.exp(-1j * k * m.center_angles))
        ex = np.exp(-k * k * 0.2 / kap)
        print(
            f"| {tau:g} | {amp[-1] / amp[0]:.5f} | {ex:.5f} | {(1 + k * k * tau / kap) ** -n:.5f} | "
            f"{amp[-1] / amp[0] / ex - 1:.2e} |"
        )
    noise_small_eps()


if __name__ == "__main__":
    main()
