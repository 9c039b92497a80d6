"""Time and accuracy of each Wasserstein method in wflow.transport.

Run: ``nice -n 10 python -m benchmarks.transport`` (about 9 minutes on a 2-core CPU).

Measures: on S^1, a von Mises mixture (N samples) against N uniform samples; on S^2, a
von Mises--Fisher mixture against uniform samples.  The reference "exact" value is the
circle method on S^1 (exact at every N) and EMD on S^2 where it fits (N <= 10^4, above
max_emd with allow_large=True).
Accuracy is |W_method - W_exact| for W_2 in radians.  The semi-discrete method is timed on
its own kind of pair (N samples against 16 N density-weighted Fibonacci nodes, chordal
cost), against EMD at N = 10^3 and by its certified bracket beyond.

Where a full run does not fit this machine (EMD past ~5000 atoms, Sinkhorn past 10^3 on a
CPU, sliced and semi-discrete at 10^5) the benchmark measures one unit of the work at that
size (one soft-min reduction, one projection batch, one k-d tree query) and multiplies it
by the unit count measured at a smaller N.  Those rows say "(extrapolated)" in the time
column and are estimates, not measurements; every other time is measured.
"""

from __future__ import annotations

import os
import platform
import time

import numpy as np

from wflow import Atoms
from wflow.sphere import fibonacci_nodes, uniform, vmf_mixture
from wflow.transport import wasserstein_result
from wflow.transport._sinkhorn import numpy_softmin


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def _circle_pair(n, rng):
    mix = vmf_mixture(n, [[1.0, 0.0], [-0.5, 0.8]], [4.0, 15.0], seed=rng)
    return Atoms(mix), Atoms(uniform(n, 2, rng))


def _sphere_pair(n, rng):
    mix = vmf_mixture(n, [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], [5.0, 20.0], seed=rng)
    return Atoms(mix), Atoms(uniform(n, 3, rng))


def _load() -> str:
    return "/".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    t_start = time.perf_counter()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"load average (1/5/15 min) at start: {_load()}",
        flush=True,
    )
    rng = np.random.default_rng(0)
    rows: list[tuple[str, str, str, str, str, str]] = []

    def add(sphere, method, n, res=None, dt=None, ref=None, note=""):
        if res is None:
            rows.append((sphere, method, f"{n:.0e}", "skipped", "", note))
            return
        err = "" if ref is None else f"{abs(res.value - ref):.1e}"
        rows.append(
            (
                sphere,
                method,
                f"{n:.0e}",
                f"{dt:.3g}",
                f"{res.value:.6f}",
                (err + " " + note).strip(),
            )
        )
        print(rows[-1], flush=True)

    def estimate(sphere, method, n, seconds, note):
        rows.append(
            (sphere, method, f"{n:.0e}", f"~{seconds:.3g} (extrapolated)", "", "not run: " + note)
        )
        print(rows[-1], flush=True)

    def one_softmin(d, n, rows_measured):
        """Seconds of one numpy soft-min over ``rows_measured`` x ``n`` pairs, scaled to n x n."""
        x = uniform(rows_measured, d, rng)
        y = uniform(n, d, rng)
        sm = numpy_softmin(x, y, "geodesic", 2.0)
        _, dt = _timed(lambda: sm(1e-2, x, y, np.zeros(n)))
        return dt * n / rows_measured

    # ---- S^1 -----------------------------------------------------------------
    emd_t = {}
    s1_passes = 18
    for n in (10**3, 10**4, 10**5, 10**6):
        mu, nu = _circle_pair(n, rng)
        if n == 10**3:  # warm-up: the first POT import and call, not the method's cost
            wasserstein_result(mu, nu, 2, method="circle")
        exact, dt = _timed(lambda: wasserstein_result(mu, nu, 2, method="circle"))
        ref = exact.value
        if n == 10**3:
            emd, dte = _timed(lambda: wasserstein_result(mu, nu, 2, method="emd"))
            emd_t["S1"] = dte
            add("S1", "circle", n, exact, dt, emd.value, "(vs EMD)")
            add("S1", "emd", n, emd, dte, ref, "(vs circle)")
            sk, dts = _timed(
                lambda: wasserstein_result(mu, nu, 2, method="sinkhorn", reg=1e-2, backend="numpy")
            )
            s1_passes = sk.info["n_iter"]
            add(
                "S1", "sinkhorn eps=1e-2 numpy", n, sk, dts, ref, f"(vs circle; {s1_passes} passes)"
            )
        else:
            add("S1", "circle", n, exact, dt, None, "(exact)")
        un, dtu = _timed(lambda: wasserstein_result(mu, "uniform", 2))
        add("S1", "uniform (closed form)", n, un, dtu, None, "mu to exact uniform")

    # ---- S^2 -----------------------------------------------------------------
    s2_passes = 35
    sliced_t = {}
    for n in (10**3, 3000, 10**5):
        mu, nu = _sphere_pair(n, rng)
        ref = None
        if n <= 3000:
            emd, dte = _timed(lambda: wasserstein_result(mu, nu, 2, method="emd"))
            ref = emd.value
            emd_t[n] = dte
            add("S2", "emd", n, emd, dte, None, "(exact)")
        if n == 10**3:
            for backend in ("numpy", "keops"):
                sk, dts = _timed(
                    lambda: wasserstein_result(
                        mu, nu, 2, method="sinkhorn", reg=1e-2, backend=backend
                    )
                )
                add(
                    "S2",
                    f"sinkhorn eps=1e-2 {backend}",
                    n,
                    sk,
                    dts,
                    ref,
                    f"(vs EMD; {sk.info['n_iter']} passes)",
                )
                s2_passes = sk.info["n_iter"]
            sk, dts = _timed(
                lambda: wasserstein_result(mu, nu, 2, method="sinkhorn", reg=1e-3, backend="numpy")
            )
            add(
                "S2",
                "sinkhorn eps=1e-3 numpy",
                n,
                sk,
                dts,
                ref,
                f"(vs EMD; {sk.info['n_iter']} passes)",
            )
        if n == 10**3:
            sl, dtl = _timed(
                lambda: wasserstein_result(mu, nu, 2, method="sliced", n_projections=50, seed=0)
            )
            sliced_t[n] = dtl
            add(
                "S2",
                "sliced (50 proj.)",
                n,
                sl,
                dtl,
                ref,
                "(vs EMD: a different distance)" if ref else "(proxy)",
            )
        elif (
            n == 10**5
        ):  # 5 projections measured, x 10 (the cost is linear in the projection count)
            sl, dtl = _timed(
                lambda: wasserstein_result(mu, nu, 2, method="sliced", n_projections=5, seed=0)
            )
            add("S2", "sliced (5 proj.)", n, sl, dtl, None, "(proxy; measured)")
            estimate("S2", "sliced (50 proj.)", n, 10 * dtl, "10 x the measured 5-projection run")

    # EMD above max_emd: measured once at 1e4 (0.8 GB cost matrix), then the network simplex's
    # exponent between 3e3 and 1e4 carries it to 1e5 (80 GB: beyond this machine's 23 GB)
    mu, nu = _sphere_pair(10**4, rng)
    emd, dte = _timed(lambda: wasserstein_result(mu, nu, 2, method="emd", allow_large=True))
    emd_t[10**4] = dte
    add("S2", "emd (allow_large)", 10**4, emd, dte, None, "(exact; 0.8 GB cost matrix)")
    sl, dtl = _timed(
        lambda: wasserstein_result(mu, nu, 2, method="sliced", n_projections=50, seed=0)
    )
    add("S2", "sliced (50 proj.)", 10**4, sl, dtl, emd.value, "(vs EMD: a different distance)")
    alpha = float(np.log(emd_t[10**4] / emd_t[3000]) / np.log(10**4 / 3000))
    estimate(
        "S2",
        "emd",
        10**5,
        emd_t[10**4] * 10**alpha,
        f"time ~ N^{alpha:.2f} fitted on the measured 3e3 and 1e4 runs; 80 GB cost matrix "
        "(more than this machine's 23 GB)",
    )
    estimate(
        "S1",
        "emd",
        10**4,
        emd_t["S1"] * (emd_t[10**4] / emd_t[10**3]),
        "S1 1e3 time x the measured S2 ratio 1e4/1e3; the circle method is exact and faster",
    )

    # Sinkhorn beyond 1e3: one soft-min reduction measured at each size (a row block of it at
    # 1e5, scaled to all rows), x 4 reductions per pass x the pass count measured at 1e3.
    # The pass count grows slowly with N (log-domain eps-scaling): a lower estimate.
    for d, name, passes in ((2, "S1", s1_passes), (3, "S2", s2_passes)):
        for n, rows_measured in ((10**4, 10**4), (10**5, 10**3)):
            t1 = one_softmin(d, n, rows_measured)
            if rows_measured == n:
                rows.append(
                    (
                        name,
                        "sinkhorn numpy: one soft-min",
                        f"{n:.0e}",
                        f"{t1:.3g}",
                        "",
                        f"measured: {n * n:.0e} pairs",
                    )
                )
            else:
                rows.append(
                    (
                        name,
                        "sinkhorn numpy: one soft-min",
                        f"{n:.0e}",
                        f"~{t1:.3g} (scaled)",
                        "",
                        f"{rows_measured} of its {n} rows measured ({t1 * rows_measured / n:.3g} s), x {n // rows_measured}",
                    )
                )
            print(rows[-1], flush=True)
            estimate(
                name,
                "sinkhorn eps=1e-2 numpy",
                n,
                4 * passes * t1,
                f"4 soft-mins/pass x {passes} passes (measured at 1e3) x the measured soft-min",
            )

    # ---- S^2, semi-discrete: N samples against 16 N Fibonacci nodes weighted by the density ----------
    from wflow.transport.semidiscrete import semidiscrete_w2

    means, kappas = [[0.0, 0.0, 1.0], [0.9, 0.0, -0.4]], [3.0, 3.0]

    def dens(z):
        m = np.asarray(means) / np.linalg.norm(means, axis=1, keepdims=True)
        return np.exp(3.0 * (z @ m.T - 1)).sum(axis=1)

    for n in (10**3, 10**4, 10**5):
        x = Atoms(vmf_mixture(n, means, kappas, seed=rng))
        z = fibonacci_nodes(16 * n)
        fine = Atoms(z, dens(z))
        res, dt = _timed(
            lambda: wasserstein_result(x, fine, 2, method="semidiscrete", cost="chordal")
        )
        rel = (res.info["upper"] - res.info["lower"]) / res.info["lower"]
        note = (
            f"bracket [{res.info['lower']:.6f}, {res.info['upper']:.6f}] (rel. width {rel:.1e}): "
            f"error <= {0.5 * (res.info['upper'] - res.info['lower']):.1e}; {res.info['newton_steps']} "
            f"Newton steps, {res.info['queries']} full k-d queries"
        )
        ref = None
        if n == 10**3:  # exact LP on the same pair (16000 x 1000 costs)
            emd, dte = _timed(
                lambda: wasserstein_result(
                    x, fine, 2, method="emd", cost="chordal", allow_large=True
                )
            )
            ref = emd.value
            add(
                "S2 semi-discrete pair",
                "emd (chordal)",
                n,
                emd,
                dte,
                None,
                "(exact; M = 16 N fine atoms)",
            )
            note = "(vs EMD) " + note
        add("S2 semi-discrete pair", "semidiscrete (chordal)", n, res, dt, ref, note)
        if n <= 10**4:  # supports by k-d queries only, the path before the walk
            w = fine.weights / fine.weights.sum()
            a = x.weights / x.weights.sum()
            r, dq = _timed(lambda: semidiscrete_w2(x.points, a, z, w, walk=False))
            rows.append(
                (
                    "S2 semi-discrete pair",
                    "semidiscrete, walk=False",
                    f"{n:.0e}",
                    f"{dq:.3g}",
                    f"{np.sqrt(0.5 * (r['lo'] + r['hi'])):.6f}",
                    f"{dq / dt:.2g}x the walk's time; {r['newton_steps']} Newton steps, "
                    f"{r['queries']} full k-d queries",
                )
            )
            print(rows[-1], flush=True)

    print()
    print(
        f"total {time.perf_counter() - t_start:.0f} s; load average (1/5/15 min) at end: {_load()}"
    )
    print()
    print("| sphere | method | N | time (s) | W_2 (rad) | abs. error vs exact |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
