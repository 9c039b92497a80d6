"""The particle solver on its fast kernel paths (issue 3, item 4).

Run ``python -m benchmarks.solvers [--quick]``.  Prints a Markdown table:

1. ``wflow.simulate`` with default settings (RK4, default step) for 10^5 particles on S^2,
   SA with beta = 10, to t = 1: ``backend="auto"`` (the spectral path) beside one velocity
   evaluation of the direct numba sums, scaled to the same number of evaluations.
2. 10^4 particles with general random Q, K, V (d = 3 and d = 16, SA, beta = 1): the same
   RK4 steps with ``backend="auto"`` (numba direct sums) and ``backend="numpy"``.

Times are medians of ``--repeat`` runs on this machine (2 shared cores: quote ratios).
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

import wflow
from wflow import sphere


def _median_time(fn, repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="10^4 instead of 10^5 particles in part 1")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    print(f"machine: {platform.processor() or platform.machine()}, wflow {wflow.__version__}\n")
    print("| case | backend | evaluations | seconds | ratio |")
    print("|---|---|---:|---:|---:|")

    n = 10_000 if args.quick else 100_000
    mu0 = wflow.Atoms(sphere.uniform(n, 3, seed=0))
    model = wflow.SA(10.0)
    model.velocity(
        mu0.points, mu0
    )  # load the compiled kernels of the path simulate takes (full size)
    t0 = time.perf_counter()
    traj = wflow.simulate(model, mu0, 1.0, save_at=[0.0, 1.0])
    t_sim = time.perf_counter() - t0
    ev = int(traj.stats["evaluations"][-1])
    used = wflow.kernel_sums(
        mu0.points, mu0.points, mu0.weights, 10.0
    ).backend  # what auto picks at this size
    rows = 2000
    wflow.kernel_sums(mu0.points[:10], mu0.points, mu0.weights, 10.0, backend="numba")
    t_direct = (
        _median_time(
            lambda: wflow.kernel_sums(
                mu0.points[:rows], mu0.points, mu0.weights, 10.0, backend="numba"
            ),
            1,
        )
        * n
        / rows
    )
    print(
        f"| simulate, {n} particles on S^2, SA beta=10, t=1, defaults (dt={traj.config['dt']:.3g}) | auto ({used}) "
        f"| {ev} | {t_sim:.1f} | 1 |"
    )
    print(
        f"| same evaluations with direct numba sums (one evaluation on {rows} rows, scaled) | numba | {ev} "
        f"| {t_direct * ev:.0f} | {t_direct * ev / t_sim:.1f} |"
    )

    rng = np.random.default_rng(1)
    for d in (3, 16):
        n2 = 10_000
        Q, K, V = (rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(3))
        m2 = wflow.SA(1.0, Q=Q, K=K, V=V)
        x0 = wflow.Atoms(sphere.uniform(n2, d, seed=2))
        kw = dict(save_at=[0.0, 0.1], dt=0.05)
        wflow.simulate(m2, wflow.Atoms(x0.points[:50]), 0.1, **kw)  # compile
        times = {}
        for backend in ("auto", "numpy"):
            times[backend] = _median_time(
                lambda: wflow.simulate(m2, x0, 0.1, backend=backend, **kw),
                args.repeat if backend == "auto" else 1,
            )
        used = wflow.kernel_sums(x0.points, x0.points, x0.weights, 1.0, Q=Q, K=K, V=V).backend
        for backend in ("auto", "numpy"):
            label = f"auto ({used})" if backend == "auto" else "numpy"
            print(
                f"| simulate, {n2} particles, d={d}, SA beta=1, general Q, K, V, 2 RK4 steps | {label} | 8 "
                f"| {times[backend]:.2f} | {times['numpy'] / times[backend]:.1f} |"
            )


if __name__ == "__main__":
    main()
