"""JKO vs the Eulerian finite-volume solver as tau -> 0: observed order in tau.

Run: ``python -m validation.jko``.  USA(beta=2) with noise kappa = 4 on a 128-cell circle, smooth
initial density, T = 0.4; the reference is ``solve_density`` on the same mesh.  Prints the L1
error of the cell masses at T for each tau, the fitted order, and the heat-equation check
(mode k = 2, kappa = 1) against exp(-k^2 t / kappa).
"""
from __future__ import annotations

import time

import numpy as np

from wflow.density import Density
from wflow.mesh import CircleMesh
from wflow.models import USA
from wflow.solvers.eulerian import solve_density
from wflow.solvers.jko import jko


def main() -> None:
    m = CircleMesh(128)
    th = lambda x: np.arctan2(x[:, 1], x[:, 0])  # noqa: E731
    rho0 = Density.from_function(m, lambda x: np.exp(np.cos(th(x) - 0.3)) + 0.5 * np.exp(2 * x[:, 0]))
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
        print(f"| {tau:g} | {errs[-1]:.3e} | {time.perf_counter() - t0:.2f} | {r.stat('iterations').mean():.1f} |")
    errs = np.array(errs)
    print(f"observed order in tau (fit): {np.polyfit(np.log(taus), np.log(errs), 1)[0]:.3f}; "
          f"pairwise: {np.round(np.log2(errs[:-1] / errs[1:]), 3).tolist()}")
    k, kap = 2, 1.0
    rho_h = Density.from_function(m, lambda x: 1 + 0.5 * np.cos(k * th(x)))
    print("| tau | mode ratio | exact exp(-k^2 t/kappa) | implicit Euler | rel. err. vs exact |")
    print("|---|---|---|---|---|")
    for tau in (0.02, 0.01, 0.005):
        n = int(round(0.2 / tau))
        r = jko(None, rho_h, tau, n, kappa=kap)
        amp = np.abs(r.weights @ np.exp(-1j * k * m.center_angles))
        ex = np.exp(-k * k * 0.2 / kap)
        print(f"| {tau:g} | {amp[-1] / amp[0]:.5f} | {ex:.5f} | {(1 + k * k * tau / kap) ** -n:.5f} | "
              f"{amp[-1] / amp[0] / ex - 1:.2e} |")


if __name__ == "__main__":
    main()
