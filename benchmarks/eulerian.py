"""Cost of one finite-volume step (SSP-RK3: three velocity evaluations) on S^1 and S^2.

Run ``python -m benchmarks.eulerian [--repeat R] [--sphere-resolution N] [--circle-cells M]``;
prints a Markdown table: mesh, cells, edges, backend, seconds per step, seconds per velocity
evaluation, and the share of the step spent outside the kernel sums.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from wflow.density import Density
from wflow.kernels import kernel_sums
from wflow.mesh import CircleMesh, SphereMesh
from wflow.models import SA
from wflow.solvers.eulerian import FiniteVolume
from wflow.solvers.steppers import SSPRK3


def time_step(mesh, model, backend: str, repeat: int) -> tuple[float, float, str]:
    rho0 = Density.from_function(mesh, lambda x: 1.0 + 0.5 * x[:, 0] + 0.3 * x[:, 1] ** 2)
    fv = FiniteVolume(mesh, model, backend=backend)
    solver = SSPRK3()
    y = rho0.masses()
    state = solver.init(fv, 0.0, y)  # warm-up (imports, caches)
    used = kernel_sums(mesh.edge_midpoint, mesh.centers, y, model.beta, backend=backend).backend
    best = np.inf
    for _ in range(repeat):
        dt = 0.5 * solver.limit(fv, 0.0, y, state)
        t0 = time.perf_counter()
        nxt, state = solver.step(fv, 0.0, y, dt, state, rtol=1e-3, atol=1e-12)
        best = min(best, time.perf_counter() - t0)
        y = nxt.y
    ev = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fv.edge_velocity(y)
        ev = min(ev, time.perf_counter() - t0)
    return best, ev, used


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--circle-cells", type=int, default=4096)
    p.add_argument("--sphere-resolution", type=int, default=32)
    p.add_argument("--beta", type=float, default=4.0)
    p.add_argument("--backends", default="auto,spectral,numpy")
    args = p.parse_args(argv)
    meshes = [("S^1", CircleMesh(args.circle_cells)), ("S^2", SphereMesh(args.sphere_resolution))]
    print(
        f"python -m benchmarks.eulerian  (SA beta={args.beta}, best of {args.repeat}; "
        f"{platform.processor() or platform.machine()}, numpy {np.__version__})\n"
    )
    print(
        "| mesh | cells M | edges E | backend | used | s / step | s / velocity eval | non-kernel share |"
    )
    print("|---|---:|---:|---|---|---:|---:|---:|")
    for name, mesh in meshes:
        for backend in args.backends.split(","):
            try:
                step, ev, used = time_step(mesh, SA(beta=args.beta), backend, args.repeat)
            except ValueError as exc:  # backend missing on this machine or not taking this problem
                print(
                    f"| {name} | {mesh.n_cells} | {mesh.n_edges} | {backend} | - | - | - | ({exc}) |"
                )
                continue
            share = max(0.0, 1 - 3 * ev / step)
            print(
                f"| {name} | {mesh.n_cells} | {mesh.n_edges} | {backend} | {used} | {step:.4g} | {ev:.4g} | {share:.0%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
