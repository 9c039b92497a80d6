"""Semi-discrete W_2 on S^2 at scale: N particles against 16 N weighted quadrature nodes.

Run: ``nice -n 10 python -m benchmarks.semidiscrete_scale [N ...] [--large]``
(default N = 1000 10000 100000; ``--large`` adds 1000000).  Each case runs in its own process,
after a warm-up solve that compiles the numba kernels, so peak memory is that process's
maximum resident set and the time is the solve alone.

The problem is the mean-field study's at t = 0 (:mod:`wflow.studies.mean_field`): N i.i.d.
samples of the two-cap von Mises--Fisher mixture (kappa = 3) with equal weights, against
16 N Fibonacci nodes weighted by the mixture's density; squared chordal cost.  Columns: time,
peak memory, Newton steps, the certified bracket lo <= W_2 <= hi, its relative width
(hi - lo) / lo, and ``ot.emd2`` with its time and memory where its dense cost matrix fits in 2 GB
(N <= 3950).  The
machine's load average is printed with the table.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

#: ot.emd2 runs where its dense N x 16 N cost matrix takes at most this many bytes
EMD_MAX_BYTES = 2e9


def problem(n: int):
    import numpy as np

    from wflow import sphere
    from wflow.studies.mean_field import _S2_MEANS, _sphere_density

    x = sphere.vmf_mixture(n, _S2_MEANS, [3.0, 3.0], None, np.random.default_rng([3, n, 0]))
    y = sphere.fibonacci_nodes(16 * n)
    w = _sphere_density(y)
    return x, np.full(n, 1.0 / n), y, w / w.sum()


def run_case(method: str, n: int) -> dict:
    """One measurement in this process."""
    import numpy as np

    x, a, y, w = problem(n)
    out: dict = {}
    if method == "wflow":
        from wflow.transport.semidiscrete import semidiscrete_w2

        semidiscrete_w2(*problem(50))  # compile the numba kernels (cached on disk)
        t0 = time.perf_counter()
        r = semidiscrete_w2(x, a, y, w)
        out["seconds"] = time.perf_counter() - t0
        out.update(lo=float(np.sqrt(r["lo"])), hi=float(np.sqrt(r["hi"])), steps=r["newton_steps"])
    else:
        import ot

        from wflow.sphere import cost_matrix

        t0 = time.perf_counter()
        w22, log = ot.emd2(a, w, cost_matrix(x, y, cost="chordal"), numItermax=10**8, log=True)
        out["seconds"] = time.perf_counter() - t0
        out["value"] = float(np.sqrt(w22))
        out["ok"] = log["result_code"] == 1
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--case":
        print(json.dumps(run_case(argv[1], int(argv[2]))))
        return
    sizes = [int(float(v)) for v in argv if not v.startswith("--")] or [1000, 10_000, 100_000]
    if "--large" in argv:
        sizes.append(1_000_000)
    print(
        f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} on {os.cpu_count()} CPUs"
    )
    print(
        f"{'N':>8} {'M':>9} {'seconds':>8} {'peak MB':>8} {'steps':>5} {'W2 lo':>10} {'W2 hi':>10} "
        f"{'rel width':>9} | {'emd2 s':>7} {'emd2 MB':>7} {'emd2 W2':>10} {'in bracket':>10}"
    )
    for n in sizes:
        r = _case("wflow", n)
        emd = _case("emd", n) if 8.0 * n * 16 * n <= EMD_MAX_BYTES else None
        line = (
            f"{n:>8} {16 * n:>9} {r['seconds']:>8.2f} {r['peak_mb']:>8.0f} {r['steps']:>5} "
            f"{r['lo']:>10.6g} {r['hi']:>10.6g} {(r['hi'] - r['lo']) / r['lo']:>9.2e} | "
        )
        if emd is not None:
            inside = r["lo"] - 1e-12 <= emd["value"] <= r["hi"] + 1e-12
            line += (
                f"{emd['seconds']:>7.1f} {emd['peak_mb']:>7.0f} {emd['value']:>10.6g} "
                f"{str(inside and emd['ok']):>10}"
            )
        print(line, flush=True)


def _case(method: str, n: int) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.semidiscrete_scale", "--case", method, str(n)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main(sys.argv[1:])
