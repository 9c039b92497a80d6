"""Time and accuracy of each Wasserstein method in wflow.transport.

Run: ``python -m benchmarks.transport`` (about 3-5 minutes on a 2-core CPU).

Measures: on S^1, a von Mises mixture (N samples) against N uniform samples; on S^2, a
von Mises--Fisher mixture against uniform samples.  The reference "exact" value is the
circle method on S^1 (exact at every N) and EMD on S^2 where it fits (N <= 5000).
Accuracy is |W_method - W_exact| for W_2 in radians.  Combinations that would take
too long on this machine are listed as skipped with the reason.
"""
from __future__ import annotations

import time

import numpy as np

from wflow import Atoms
from wflow.sphere import angles_to_points, uniform, vmf_mixture
from wflow.transport import wasserstein_result


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


def main() -> None:
    rng = np.random.default_rng(0)
    rows: list[tuple[str, str, str, str, str, str]] = []

    def add(sphere, method, n, res=None, dt=None, ref=None, note=""):
        if res is None:
            rows.append((sphere, method, f"{n:.0e}", "skipped", "", note))
            return
        err = "" if ref is None else f"{abs(res.value - ref):.1e}"
        rows.append((sphere, method, f"{n:.0e}", f"{dt:.3g}", f"{res.value:.6f}", (err + " " + note).strip()))
        print(rows[-1], flush=True)

    # ---- S^1 -----------------------------------------------------------------
    for n in (10**3, 10**4, 10**5, 10**6):
        mu, nu = _circle_pair(n, rng)
        exact, dt = _timed(lambda: wasserstein_result(mu, nu, 2, method="circle"))
        ref = exact.value
        if n == 10**3:
            emd, dte = _timed(lambda: wasserstein_result(mu, nu, 2, method="emd"))
            add("S1", "circle", n, exact, dt, emd.value, "(vs EMD)")
            add("S1", "emd", n, emd, dte, ref, "(vs circle)")
            sk, dts = _timed(lambda: wasserstein_result(mu, nu, 2, method="sinkhorn", reg=1e-2, backend="numpy"))
            add("S1", "sinkhorn eps=1e-2 numpy", n, sk, dts, ref, f"(vs circle; {sk.info['n_iter']} passes)")
        else:
            add("S1", "circle", n, exact, dt, None, "(exact)")
            if n == 10**4:
                add("S1", "emd", n, note="> max_emd; ~minutes, O(N^3)")
                add("S1", "sinkhorn", n, note="~4e9 pair evaluations per run: minutes on 2 cores")
        un, dtu = _timed(lambda: wasserstein_result(mu, "uniform", 2))
        add("S1", "uniform (closed form)", n, un, dtu, None, "mu to exact uniform")
    add("S1", "sinkhorn", 10**5, note="O(N^2) per pass: hours on CPU; GPU only")

    # ---- S^2 -----------------------------------------------------------------
    for n in (10**3, 10**4, 10**5):
        mu, nu = _sphere_pair(n, rng)
        ref = None
        if n == 10**3:
            emd, dte = _timed(lambda: wasserstein_result(mu, nu, 2, method="emd"))
            ref = emd.value
            add("S2", "emd", n, emd, dte, None, "(exact)")
            for backend in ("numpy", "keops"):
                sk, dts = _timed(lambda: wasserstein_result(mu, nu, 2, method="sinkhorn", reg=1e-2, backend=backend))
                add("S2", f"sinkhorn eps=1e-2 {backend}", n, sk, dts, ref, f"(vs EMD; {sk.info['n_iter']} passes)")
            sk, dts = _timed(lambda: wasserstein_result(mu, nu, 2, method="sinkhorn", reg=1e-3, backend="numpy"))
            add("S2", "sinkhorn eps=1e-3 numpy", n, sk, dts, ref, f"(vs EMD; {sk.info['n_iter']} passes)")
        else:
            add("S2", "emd", n, note="> max_emd (5000); ~minutes and N^2 memory")
            add("S2", "sinkhorn", n, note="O(N^2) per pass: minutes (1e4) to hours (1e5) on CPU; GPU only")
        if n <= 10**4:
            sl, dtl = _timed(lambda: wasserstein_result(mu, nu, 2, method="sliced", n_projections=50, seed=0))
            add("S2", "sliced (50 proj.)", n, sl, dtl, ref, "(vs EMD: a different distance)" if ref else "(proxy)")
        else:
            add("S2", "sliced (50 proj.)", n, note="~1 min for 50 projections at 1e5")

    print()
    print("| sphere | method | N | time (s) | W_2 (rad) | abs. error vs exact |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
