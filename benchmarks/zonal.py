"""Zonal solver: kernel build, right-hand side and full solves to t = 30 (SA, beta = 9), factorized against
dense, the two time steppers side by side (``remap``: characteristics and remap, no positivity limit;
``ssprk3``: finite-volume stages below the positivity limit), and the particle run of the same quality
in d = 128.

    python benchmarks/zonal.py            # the tables of benchmarks/ZONAL.md (~15 minutes on 2 cores)
    python benchmarks/zonal.py --quick    # 1024 bands only (ssprk3 included), shorter particle runs

Quality of a full solve: the energy at t = 30 against that of the collapsed state, e^beta / (2 beta)
(the solution has gathered at the pole by then; a scheme that smears the cluster over bands falls short).

Particles "of the same quality": the W2 error of the z-marginal of N particles (measured at t = 1 for
N = 250..2000, fitted as C N^-1/2) equals the zonal solver's discretization error (W2 between the zonal
solutions on M and M/2 bands at t = 1, an upper bound of the M-band error) at N = (C / err)^2; the
time of that particle run is extrapolated from the measured ones as N^2 (dense kernel sums).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import wflow
from wflow.solvers.zonal import law_quantile, solve_zonal
from wflow.studies.zonal import sample_zonal
from wflow.zonal import ZonalFV

BETA, T_END = 9.0, 30.0


def f0(z):
    return np.exp(2.0 * np.asarray(z))


def timed(fn, repeat=1):
    t = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    return (time.perf_counter() - t) / repeat, out


def law_w2(a, b, n=1 << 16):
    s = (np.arange(n) + 0.5) / n
    return float(
        np.sqrt(
            np.mean(
                (law_quantile(a.edges, a.masses[-1], s) - law_quantile(b.edges, b.masses[-1], s))
                ** 2
            )
        )
    )


def main(quick: bool) -> None:
    print(f"load average before: {os.getloadavg()}")
    sizes = (1024,) if quick else (1024, 4096)
    print("| d | bands | kernel | build s | memory MB | rhs ms |")
    print("|---|---|---|---|---|---|")
    for d in (8, 128):
        for M in sizes:
            for method in ("auto", "dense"):
                if method == "dense" and M > 1024:
                    # dense at 4096 bands: 512 MB and 12-49 s to build (measured before the factorization)
                    continue
                tb, fv = timed(
                    lambda: ZonalFV(d, M, attention="SA", beta=BETA, kernel_method=method)
                )
                m = fv.masses_from_function(f0)
                tr, _ = timed(lambda: fv.rhs(m), 50)
                name = (
                    "dense"
                    if method == "dense"
                    else f"{fv._rows.method} P={fv._rows.panels} r={fv._rows.points}"
                )
                print(
                    f"| {d} | {M} | {name} | {tb:.2f} | {fv._rows.nbytes / 2**20:.1f} | {tr * 1e3:.2f} |",
                    flush=True,
                )
    print(f"load average: {os.getloadavg()}")
    print()
    collapsed = np.exp(BETA) / (2 * BETA)
    print(
        f"Full solves to t = {T_END:g} (rtol 1e-3, the default), SA beta = {BETA:g}, f0 = e^(2z):"
    )
    print()
    print(
        "| d | bands | method | solve s | steps | rejected | velocity evaluations | mass defect | "
        "1 - E(30) / E(collapsed) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for d in (8, 128):
        for M in sizes:
            for method in ("remap", "ssprk3"):
                if method == "ssprk3" and M > 1024:
                    continue  # ~4x the steps of 1024 bands: ~12 min here
                ts, r = timed(
                    lambda: solve_zonal(
                        wflow.SA(BETA),
                        f0,
                        T_END,
                        d=d,
                        n_cells=M,
                        save_at=[0, 1, T_END],
                        method=method,
                    )
                )
                print(
                    f"| {d} | {M} | {method} | {ts:.1f} | {r.stats['steps'][-1]} | {r.stats['rejected'][-1]} | "
                    f"{r.stats['evaluations'][-1]} | {abs(r.mass - 1).max():.1e} | "
                    f"{1 - r.energy[-1] / collapsed:.1e} |",
                    flush=True,
                )
    print(f"load average: {os.getloadavg()}")

    # particles of the same quality, d = 128, at t = 1
    d, t1 = 128, 1.0
    M = sizes[-1]
    fine = solve_zonal(wflow.SA(BETA), f0, t1, d=d, n_cells=M, grid="z", rtol=1e-6)
    coarse = solve_zonal(wflow.SA(BETA), f0, t1, d=d, n_cells=M // 2, grid="z", rtol=1e-6)
    err = law_w2(fine, coarse)
    tz, _ = timed(lambda: solve_zonal(wflow.SA(BETA), f0, t1, d=d, n_cells=M, grid="z", rtol=1e-6))
    Ns = (250, 500, 1000) if quick else (250, 500, 1000, 2000)
    rows = []
    for N in Ns:
        x0 = sample_zonal(f0, d, N, np.random.default_rng(N))
        tp, tr = timed(lambda: wflow.simulate(wflow.SA(BETA), x0, t1, dt=0.05, save_at=[0, t1]))
        rows.append((N, tp, fine.w2(tr.points[-1][:, -1], -1)))
    N = np.array([r[0] for r in rows], float)
    w2 = np.array([r[2] for r in rows])
    C = float(np.exp(np.mean(np.log(w2) + 0.5 * np.log(N))))
    n_eq = (C / err) ** 2
    t_eq = rows[-1][1] * (n_eq / rows[-1][0]) ** 2
    print()
    print(
        f"d = {d}, SA beta = {BETA:g}, t = {t1:g}: zonal ({M} bands uniform in z, remap, rtol 1e-6) {tz:.1f} s, "
        f"discretization error W2 <= {err:.2e}"
    )
    print("| N | particles s (RK4, dt 0.05) | W2 of z-marginal |")
    print("|---|---|---|")
    for n, tp, e in rows:
        print(f"| {n} | {tp:.2f} | {e:.2e} |")
    print(
        f"W2 ~ {C:.3f} N^-1/2: the same quality needs N ~ {n_eq:.1e} particles, ~{t_eq:.1e} s by N^2 scaling"
    )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main("--quick" in sys.argv)
