"""Cost of one JKO step (wflow.solvers.jko) on a 2048-cell circle mesh and a ~4000-cell S^2 mesh.

Run: ``python -m benchmarks.jko``.  Prints, per case, the set-up time (dense cost matrix and blur
variance), the first kernel-sum call of the process (numba compilation of ``backend="auto"``,
paid once per process and measured apart), the cold first step, a warm-started second step, and
how the step time splits between OT (scaling iterations or Newton-CG, and kernel rebuilds) and
energy gradients (model.first_variation / model.energy through the kernel sums).
"""

from __future__ import annotations

import time

import numpy as np

from wflow.density import Density
from wflow.measure import Atoms
from wflow.mesh import CircleMesh, SphereMesh
from wflow.models import USA
from wflow.solvers.jko import JKOStepper
from wflow.solvers.jko.step import default_eps, support


def run(name, rho0, model, tau, kappa, backend="auto"):
    x, a, r, _ = support(rho0, None)
    eps = default_eps(x, r)
    t0 = time.perf_counter()
    model.first_variation(x, Atoms._trusted(x, a), backend=backend)  # first call: compilation
    t_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    st = JKOStepper(
        model,
        x,
        r,
        tau=tau,
        eps=eps,
        cost="geodesic",
        kappa=kappa,
        method="sinkhorn",
        debias=True,
        eps_scaling=None,
        tol=1e-6,
        max_iter=200,
        max_sinkhorn=5000,
        backend=backend,
    )
    t_setup = time.perf_counter() - t0
    rows = []
    w = a
    for k in (1, 2):
        b0 = st.ot.build_time
        t0 = time.perf_counter()
        w, s = st.step(w)
        dt = time.perf_counter() - t0
        rows.append(
            (
                name,
                x.shape[0],
                k,
                eps,
                dt,
                s.time_ot,
                st.ot.build_time - b0,
                s.time_energy,
                s.iterations,
                s.sinkhorn,
                s.residual,
            )
        )
    return t_setup, t_compile, rows


def main() -> None:
    circle = CircleMesh(2048)
    rho_c = Density.from_function(
        circle,
        lambda p: np.exp(np.cos(np.arctan2(p[:, 1], p[:, 0]) - 0.3)) + 0.5 * np.exp(2 * p[:, 0]),
    )
    sphere = SphereMesh(20)
    rho_s = Density.from_function(sphere, lambda p: np.exp(2 * p[:, 0]) + np.exp(1.5 * p[:, 2]))
    cases = [
        ("S1 USA(2), no noise", rho_c, USA(2.0), 0.05, None),
        ("S1 USA(2), kappa=4", rho_c, USA(2.0), 0.05, 4.0),
        ("S2 USA(2), no noise", rho_s, USA(2.0), 0.05, None),
        ("S2 USA(2), kappa=4", rho_s, USA(2.0), 0.05, 4.0),
    ]
    print(
        "| case | cells | step | eps | step time (s) | OT (s) | of which kernel builds (s) | energy grads (s) "
        "| outer it. | inner it. | residual | set-up (s) | first kernel call (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, rho0, model, tau, kappa in cases:
        t_setup, t_compile, rows = run(name, rho0, model, tau, kappa)
        for nm, n, k, eps, dt, tot, tb, te, it, sk, res in rows:
            print(
                f"| {nm} | {n} | {k} | {eps:.2e} | {dt:.2f} | {tot:.2f} | {tb:.2f} | {te:.2f} | {it} | {sk} | "
                f"{res:.1e} | {t_setup:.2f} | {t_compile:.2f} |"
            )


if __name__ == "__main__":
    main()
