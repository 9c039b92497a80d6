"""W_2 on S^2 at N = 10^3 ... 10^6: wflow, POT and GeomLoss in one table per N.

Run: ``nice -n 10 python -m benchmarks.w2_scale [N ...] [--large] [--timeout S] [--spectral]``
(default N = 1000 10000; ``--large`` adds 100000 and 1000000).  Each case runs in its own
process, stopped after ``--timeout`` seconds (default 1800), so peak memory is that process's
maximum resident set (``ru_maxrss``).  Two problems, chordal cost |x - y|^2:

* **semi-discrete**: N particles against 16 N weighted Fibonacci nodes
  (:func:`benchmarks.semidiscrete_scale.problem`; wflow's ``semidiscrete_w2``, timed after a
  warm-up solve);
* **point cloud**: N samples of a von Mises--Fisher mixture against N uniform samples
  (:func:`benchmarks.transport_multiscale.samples`; wflow's ``certified_w2`` with ``tol=1e-3``).

On both: ``ot.emd2`` where its dense cost matrix fits (semi-discrete: at most 2 GB; point
cloud: N <= 5000), and GeomLoss's multiscale Sinkhorn divergence (its value, no bracket; cost
|x - y|^2 / 2, so blur sqrt(eps / 2) and the value doubled).  GeomLoss's eps is 0.01 on the
point clouds and 0.01 * 4 pi / N on the semi-discrete problem, where W_2^2 is about 0.7 * 4 pi / N:
the same ratio eps / W_2^2 (about 1.4 %) on both.  Columns: time, peak memory, W_2 (for wflow the
bracket's midpoint), the bracket [lo, hi] on W_2, its relative width (hi - lo) / lo, and
|W_2 - emd2| where ``ot.emd2`` ran ("in bracket" when the bracket holds it).  ``--spectral``
then runs ``python -m benchmarks.spectral_scale --quick`` (the spectral kernel sums against the
direct numba sums, 10^4 ... 10^6 points).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

SEMI, CLOUD = "semi-discrete", "point cloud"


def geomloss_eps(problem: str, n: int) -> float:
    """GeomLoss's eps (units of |x - y|^2): the same ratio eps / W_2^2 on both problems."""
    from benchmarks.transport_multiscale import EPS

    return EPS * 4.0 * math.pi / n if problem == SEMI else EPS


def methods(problem: str, n: int) -> list[str]:
    """The methods run on ``problem`` at ``n``: ``ot.emd2`` only where its cost matrix fits."""
    from benchmarks.semidiscrete_scale import EMD_MAX_BYTES
    from benchmarks.transport_multiscale import EMD_MAX_N

    fits = 8.0 * n * 16 * n <= EMD_MAX_BYTES if problem == SEMI else n <= EMD_MAX_N
    return (["pot-emd2"] if fits else []) + ["wflow", "geomloss-multiscale"]


#: the warm-up case before the timed one (numba compilation, KeOps and torch loading): its N
WARM_UP = {
    (CLOUD, "wflow"): 1500,
    (SEMI, "geomloss-multiscale"): 300,
    (CLOUD, "geomloss-multiscale"): 300,
}


def run_case(problem: str, method: str, n: int, warm_up: bool = True) -> dict:
    """One measurement in this process: ``seconds``, ``peak_mb``, ``value`` and, for wflow,
    the bracket ``lo``, ``hi`` on W_2.  The time is the call alone, after a warm-up call on a
    small problem (semi-discrete wflow: :func:`benchmarks.semidiscrete_scale.run_case`'s own)."""
    from benchmarks import semidiscrete_scale, transport_multiscale

    if warm_up and (problem, method) in WARM_UP:
        run_case(problem, method, WARM_UP[problem, method], warm_up=False)
    if method == "geomloss-multiscale":
        if problem == SEMI:
            x, a, y, w = semidiscrete_scale.problem(n)
        else:
            (x, y), a, w = transport_multiscale.samples(n), None, None
        t0 = time.perf_counter()
        value = transport_multiscale.geomloss_w2(x, y, a, w, eps=geomloss_eps(problem, n))
        out = {"value": value, "seconds": time.perf_counter() - t0}
    elif problem == SEMI:
        out = semidiscrete_scale.run_case("emd" if method == "pot-emd2" else "wflow", n)
    else:
        name = "wflow-multiscale" if method == "wflow" else method
        out = transport_multiscale.run_case(name, n, "chordal")
        if "lower" in out:
            out.update(lo=out.pop("lower"), hi=out.pop("upper"))
    if "lo" in out:
        out.setdefault("value", 0.5 * (out["lo"] + out["hi"]))
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _subprocess(problem: str, method: str, n: int, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.w2_scale", "--case", problem, method, str(n)]
    root = Path(__file__).resolve().parents[1]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=root)
    except subprocess.TimeoutExpired:
        return {"error": f"not finished in {timeout:.0f} s"}
    if p.returncode:
        lines = p.stderr.strip().splitlines()
        return {"error": lines[-1][:120] if lines else f"exit status {p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def row(n: int, problem: str, method: str, r: dict, exact: float | None) -> str:
    """One Markdown row of the table."""
    if "error" in r:
        return f"| {n} | {problem} | {method} | {r['error']} | | | | | |"
    bracket = width = err = ""
    if "lo" in r:
        bracket = f"[{r['lo']:.6f}, {r['hi']:.6f}]"
        width = f"{(r['hi'] - r['lo']) / r['lo']:.1e}"
    elif method == "pot-emd2":
        bracket = "exact" if r.get("ok", True) else "not optimal (iteration limit)"
    if exact is not None:
        err = f"{abs(r['value'] - exact):.1e}"
        if "lo" in r:
            inside = r["lo"] - 1e-12 <= exact <= r["hi"] + 1e-12
            err += " (in bracket)" if inside else " (OUTSIDE the bracket)"
    return (
        f"| {n} | {problem} | {method} | {r['seconds']:.3g} | {r['peak_mb']:.0f} | "
        f"{r['value']:.6f} | {bracket} | {width} | {err} |"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sizes", nargs="*", type=float, help="N (default 1000 10000)")
    p.add_argument("--large", action="store_true", help="add N = 100000 and 1000000")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per case")
    p.add_argument("--spectral", action="store_true", help="then benchmarks.spectral_scale --quick")
    p.add_argument("--case", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        problem, method, n = args.case
        print(json.dumps(run_case(problem, method, int(n))))
        return
    sizes = [int(v) for v in args.sizes] or [1000, 10_000]
    sizes += [100_000, 1_000_000] if args.large else []
    print(
        f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())} on "
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()})"
    )
    print(
        "| N | problem | method | time (s) | peak MB | W₂ | bracket | rel. width | abs. error vs emd2 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        for problem in (SEMI, CLOUD):
            exact = None
            for method in methods(problem, n):
                r = _subprocess(problem, method, n, args.timeout)
                if method == "pot-emd2" and "error" not in r:
                    exact = r["value"]
                print(row(n, problem, method, r, exact), flush=True)
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if args.spectral:
        from benchmarks import spectral_scale

        print()
        spectral_scale.main(["--quick"])


if __name__ == "__main__":
    main(sys.argv[1:])
