"""Spectral kernel sums: time and accuracy against direct sums.

Run ``python -m benchmarks.spectral`` (``--quick`` stops at N = 10^5).  For each N the
spectral backend sums over all N sources at all N queries (x = y, uniform weights,
points on the sphere).  The direct reference (backend ``"numpy"``) is computed for a
subset of 2000 query rows only (its time is scaled to N rows); errors are measured on
that subset: mass and vector in units of the spectral scale e^{c_i} (what the a-priori
bound bounds), and the softmax average (SA).  Times are medians of ``--repeat`` runs;
the machine is shared, so they are noisy.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from wflow.kernels import BACKENDS, kernel_sums

SUBSET = 2000


def _median_time(f, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def run(sizes, repeat: int, tol: float) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    backend = BACKENDS["spectral"]
    for d, beta in ((2, 100.0), (3, 10.0)):
        # compile (numba, cached on disk) outside the timings
        x0 = rng.normal(size=(500, d))
        x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
        kernel_sums(x0, x0, np.ones(500), beta, backend="spectral", tol=tol)
        for N in sizes:
            x = rng.normal(size=(N, d))
            x /= np.linalg.norm(x, axis=1, keepdims=True)
            w = np.full(N, 1.0 / N)
            t_sp, sp = _median_time(
                lambda: kernel_sums(x, x, w, beta, backend="spectral", tol=tol), repeat
            )
            sub = x[:SUBSET]
            t_ref, ref = _median_time(lambda: kernel_sums(sub, x, w, beta, backend="numpy"), 1)
            t_direct = t_ref * N / sub.shape[0]
            f = np.exp(ref.log_scale - sp.log_scale[:SUBSET])
            e_mass = np.abs(sp.mass[:SUBSET] - ref.mass * f).max()
            e_vec = np.abs(sp.vector[:SUBSET] - ref.vector * f[:, None]).max()
            sa_sp = sp.vector[:SUBSET] / sp.mass[:SUBSET, None]
            e_sa = np.abs(sa_sp - ref.softmax_average()).max()
            plan = backend.plan(_problem(x, w, beta, tol))
            rows.append(
                dict(
                    d=d,
                    beta=beta,
                    N=N,
                    degree=plan.degree,
                    bound=plan.bound,
                    t_spectral=t_sp,
                    t_direct=t_direct,
                    e_mass=e_mass,
                    e_vec=e_vec,
                    e_sa=e_sa,
                )
            )
            print(_fmt(rows[-1]), flush=True)
    return rows


def _problem(x, w, beta, tol):
    from wflow.kernels import KernelProblem

    return KernelProblem(
        x=x[None],
        y=x[None],
        weights=w[None],
        beta=beta,
        Q=None,
        K=None,
        V=None,
        values=True,
        tol=tol,
    )


HEADER = (
    "| sphere | beta | N | degree | a-priori bound | spectral (s) | direct numpy (s, est.) | speed-up "
    "| max err mass | max err vector | max err SA |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def _fmt(r: dict) -> str:
    s = "S^1" if r["d"] == 2 else "S^2"
    return (
        f"| {s} | {r['beta']:g} | {r['N']:.0e} | {r['degree']} | {r['bound']:.1e} | {r['t_spectral']:.3f} "
        f"| {r['t_direct']:.3g} | {r['t_direct'] / r['t_spectral']:.3g}x | {r['e_mass']:.1e} "
        f"| {r['e_vec']:.1e} | {r['e_sa']:.1e} |"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="stop at N = 10^5")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tol", type=float, default=1e-12)
    args = p.parse_args(argv)
    sizes = [10**4, 10**5] if args.quick else [10**4, 10**5, 10**6]
    print(
        f"# spectral kernel sums, tol={args.tol:g}, engine={BACKENDS['spectral'].engine}, "
        f"{platform.processor() or platform.machine()}; direct reference on {SUBSET} query rows, time scaled to N"
    )
    print(HEADER)
    run(sizes, args.repeat, args.tol)


if __name__ == "__main__":
    main()
