"""Cost of one JKO step (wflow.solvers.jko) on a 2048-cell circle mesh and a ~4000-cell S^2 mesh.

Run: ``python -m benchmarks.jko``.  Prints, per case, the set-up time (dense cost matrix and blur
variance), the first kernel-sum call of the process (numba compilation of ``backend="auto"``,
paid once per process and measured apart), the cold first step, a warm-started second step, and
how the step time splits between OT (scaling iterations or Newton-CG, and kernel rebuilds) and
energy gradients (model.first_variation / model.energy through the kernel sums).

``python -m benchmarks.jko --cells 2562,10242,40962,100002,163842`` instead prints cost against
cells on S^2 meshes (``SphereMesh(n)`` has 10 n^2 + 2 cells): one JKO step (USA(2), kappa = 4,
tau = 0.05, default eps; set-up included) and one finite-volume step (SSP-RK3 at half its
positivity limit, same model), each in its own process, with the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np

from wflow.density import Density
from wflow.measure import Atoms
from wflow.mesh import CircleMesh, SphereMesh
from wflow.models import USA
from wflow.solvers.jko import JKOStepper
from wflow.solvers.jko.step import default_eps, support


def _stepper(model, x, r, tau, eps, kappa, backend):
    """The benchmark's JKO stepper: geodesic cost, debiased Sinkhorn, tol 1e-6."""
    return JKOStepper(
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


def run(name, rho0, model, tau, kappa, backend="auto"):
    x, a, r, _ = support(rho0, None)
    eps = default_eps(x, r)
    t0 = time.perf_counter()
    model.first_variation(x, Atoms._trusted(x, a), backend=backend)  # first call: compilation
    t_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    st = _stepper(model, x, r, tau, eps, kappa, backend)
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


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def one(res: int, what: str) -> dict:
    """One step on ``SphereMesh(res)`` in this process: times (s) and peak memory (MB)."""
    t0 = time.perf_counter()
    mesh = SphereMesh(res)
    out = {"cells": mesh.n_cells, "mesh_s": time.perf_counter() - t0, "mesh_rss": _rss_mb()}
    rho0 = Density.from_function(mesh, lambda p: np.exp(2 * p[:, 0]) + np.exp(1.5 * p[:, 2]))
    model, tau, kappa = USA(2.0), 0.05, 4.0
    if what == "jko":
        x, a, r, _ = support(rho0, None)
        eps = default_eps(x, r)
        model.first_variation(x, Atoms._trusted(x, a), backend="auto")  # compilation apart
        t0 = time.perf_counter()
        st = _stepper(model, x, r, tau, eps, kappa, "auto")
        t_setup = time.perf_counter() - t0
        t0 = time.perf_counter()
        w, s = st.step(a)
        out.update(
            setup_s=t_setup,
            step_s=time.perf_counter() - t0,
            ot_s=s.time_ot,
            builds_s=st.ot.build_time,
            kernel="dense" if isinstance(st.C, np.ndarray) else "sparse",
            pairs_per_cell=(st.C.nnz / mesh.n_cells) if hasattr(st.C, "nnz") else mesh.n_cells,
            outer=s.iterations,
            inner=s.sinkhorn,
            residual=s.residual,
            mass_err=abs(float(w.sum()) - 1.0),
        )
    else:
        from wflow.solvers.eulerian import FiniteVolume
        from wflow.solvers.steppers import SSPRK3

        fv = FiniteVolume(mesh, model, kappa=kappa)
        y = rho0.masses()
        solver = SSPRK3()
        state = solver.init(fv, 0.0, y)  # first velocity evaluation (compilation, caches) apart
        dt = 0.5 * solver.limit(fv, 0.0, y, state)
        t0 = time.perf_counter()
        nxt, _ = solver.step(fv, 0.0, y, dt, state, rtol=1e-3, atol=1e-12)
        out.update(step_s=time.perf_counter() - t0, dt=dt, ok=bool(nxt.ok))
        out["mass_err"] = abs(float(np.sum(nxt.y)) - float(np.sum(y)))
    out["rss"] = _rss_mb()
    return out


def cells_table(resolutions: list[int]) -> None:
    print(
        "| cells | kernel | pairs / cell | mesh (s) | JKO set-up (s) | JKO step (s) | of which OT (s) "
        "| outer / inner it. | residual | JKO peak RSS (MB) | FV step (s) | FV peak RSS (MB) | mesh-only RSS (MB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for res in resolutions:
        rows = {}
        for what in ("jko", "fv"):
            cmd = [sys.executable, "-m", "benchmarks.jko", "--one", str(res), "--what", what]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows[what] = json.loads(done.stdout.strip().splitlines()[-1])
        j, f = rows["jko"], rows["fv"]
        print(
            f"| {j['cells']} | {j['kernel']} | {j['pairs_per_cell']:.0f} | {j['mesh_s']:.1f} | "
            f"{j['setup_s']:.1f} | {j['step_s']:.1f} | {j['ot_s']:.1f} | {j['outer']} / {j['inner']} | "
            f"{j['residual']:.1e} | {j['rss']:.0f} | {f['step_s']:.2f} | {f['rss']:.0f} | "
            f"{max(j['mesh_rss'], f['mesh_rss']):.0f} |",
            flush=True,
        )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cells", help="comma-separated SphereMesh cell counts 10 n^2 + 2 (cost table)")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    p.add_argument("--what", choices=("jko", "fv"), default="jko", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one(args.one, args.what)))
        return
    if args.cells is not None:
        res = []
        for c in args.cells.split(","):
            m = int(c) if c.strip().isdigit() else -1
            n = int(round(np.sqrt(max(m - 2, 0) / 10)))
            if n < 1 or 10 * n * n + 2 != m:
                p.error(f"--cells: S^2 meshes have 10 n^2 + 2 cells (2562, 10242, ...), got {c!r}")
            res.append(n)
        cells_table(res)
        return
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
