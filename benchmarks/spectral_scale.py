"""Spectral kernel sums at 10^6 - 10^8 points: time and peak memory against the arrays' size.

Run ``python -m benchmarks.spectral_scale`` (N = 10^4 ... 10^7; ``--big`` adds 10^8, which needs
about 8 GB of memory and minutes; ``--runs`` adds the particle runs of 10^6 tokens).  Each row runs
in a fresh process, so that its peak resident memory (``ru_maxrss``) is its own: "before" is the
process after imports and compilation, "arrays" the input (points x = y, weights) and the output
(``log_scale``, ``mass``, ``vector``), and "(peak - before) / arrays" what the sums cost beyond the
arrays.  Points are uniform on the sphere, weights uniform, tol = 1e-12; times are medians of
``--repeat`` calls.  The direct sums (backend ``"numba"``, exact) run up to ``--direct-max`` points;
the error column is the largest difference of the SA averages s^1/s^0 between the two.

``--runs``: ``wflow.simulate(wflow.SA(beta), x0, 1.0, method="rk4")`` with everything else default
(step :func:`wflow.solvers.particles.default_dt`, 11 saves with the default diagnostics) for
10^6 tokens on S^2 at beta = 1 and 5; the error column compares the final tokens of the same run at
``--check-n`` tokens with a run of a quarter of the step (RK4: about 1/256 of the error).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time

import numpy as np

GB = 2.0**30


def _rss() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # kB on Linux


def _points(n: int, d: int, seed: int = 0) -> np.ndarray:
    """Uniform points on S^{d-1}, drawn in blocks (no temporaries of the size of the array)."""
    rng = np.random.default_rng(seed)
    x = np.empty((n, d))
    for i0 in range(0, n, 1 << 20):
        b = x[i0 : i0 + (1 << 20)]
        b[...] = rng.normal(size=b.shape)
        b /= np.linalg.norm(b, axis=1, keepdims=True)
    return x


def _median(f, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def case_sums(d: int, n: int, beta: float, repeat: int, direct: bool) -> dict:
    """One row: the spectral sums at n points (and the direct ones when ``direct``)."""
    from wflow.kernels import kernel_sums
    from wflow.kernels.spectral import spectral_plan

    warm = _points(500, d, seed=1)
    kernel_sums(warm, warm, np.ones(500), beta, backend="spectral")  # compile / load the cache
    if direct:
        kernel_sums(warm, warm, np.ones(500), beta, backend="numba")
    before = _rss()
    x = _points(n, d)
    w = np.full(n, 1.0 / n)
    out: list = [None]

    def spectral() -> None:
        out[0] = None  # (the previous output is freed first: one output at a time)
        out[0] = kernel_sums(x, x, w, beta, backend="spectral")

    t = _median(spectral, repeat)
    s = out[0]
    arrays = x.nbytes + w.nbytes + s.log_scale.nbytes + s.mass.nbytes + s.vector.nbytes
    peak = _rss()
    row = dict(
        d=d,
        beta=beta,
        N=n,
        degree=spectral_plan(d, abs(beta), 0.0, 1e-12).degree,
        t=t,
        peak=peak,
        before=before,
        arrays=arrays,
        t_direct=None,
        err=None,
    )
    if direct:
        ref: list = [None]
        row["t_direct"] = _median(
            lambda: ref.__setitem__(0, kernel_sums(x, x, w, beta, backend="numba")),
            1 if n >= 10**5 else repeat,
        )
        row["err"] = float(np.abs(s.softmax_average() - ref[0].softmax_average()).max())
    return row


def case_run(n: int, beta: float, check_n: int) -> dict:
    """One particle run of n tokens to t = 1 with the defaults, and the step error at check_n tokens."""
    import wflow
    from wflow.solvers.particles import default_dt

    model = wflow.SA(beta=beta)
    wflow.simulate(
        model, _points(check_n, 3, seed=1), 1.0, method="rk4"
    )  # compile / load the cache
    before = _rss()
    x0 = _points(n, 3)
    t0 = time.perf_counter()
    traj = wflow.simulate(model, x0, 1.0, method="rk4")
    t = time.perf_counter() - t0
    peak = _rss()
    dt = default_dt(model, "rk4", np.linspace(0.0, 1.0, 11))
    small = _points(check_n, 3, seed=2)
    coarse = wflow.simulate(model, small, 1.0, method="rk4").points[-1]
    fine = wflow.simulate(model, small, 1.0, method="rk4", dt=dt / 4).points[-1]
    from wflow.kernels import KernelProblem
    from wflow.kernels.sums import _select

    x3 = x0[None]  # what the velocity's backend="auto" picks at n tokens
    problem = KernelProblem(
        x=x3, y=x3, weights=np.full((1, n), 1.0 / n), beta=beta, Q=None, K=None, V=None, values=True
    )
    backend = _select("auto", problem).name
    return dict(
        N=n,
        beta=beta,
        t=t,
        steps=int(traj.stats["steps"][-1]),
        evaluations=int(traj.stats["evaluations"][-1]),
        dt=dt,
        backend=backend,
        peak=peak,
        before=before,
        state=x0.nbytes,
        err=float(np.abs(np.asarray(coarse) - np.asarray(fine)).max()),
        check_n=check_n,
    )


def _child(args: list[str]) -> dict:
    """Run one case in a fresh process (its own peak memory); returns its row."""
    cmd = [sys.executable, "-m", "benchmarks.spectral_scale", "--case", json.dumps(args)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


SUMS_HEADER = (
    "| sphere | beta | N | degree | spectral (s) | direct numba (s) | max err SA | peak RSS (GB) "
    "| before (GB) | arrays (GB) | (peak - before) / arrays |\n|---|---|---|---|---|---|---|---|---|---|---|"
)
RUNS_HEADER = (
    "| run | N | backend | dt | steps | evaluations | time (s) | peak RSS (GB) | state (GB) "
    "| error vs dt/4 (at N) |\n|---|---|---|---|---|---|---|---|---|---|"
)


def _fmt_sums(r: dict) -> str:
    direct = "" if r["t_direct"] is None else f"{r['t_direct']:.3g}"
    err = "" if r["err"] is None else f"{r['err']:.1e}"
    return (
        f"| {'S^1' if r['d'] == 2 else 'S^2'} | {r['beta']:g} | {r['N']:.0e} | {r['degree']} | {r['t']:.3g} "
        f"| {direct} | {err} | {r['peak'] / GB:.2f} | {r['before'] / GB:.2f} | {r['arrays'] / GB:.2f} "
        f"| {(r['peak'] - r['before']) / r['arrays']:.2f} |"
    )


def _fmt_run(r: dict) -> str:
    return (
        f"| SA beta={r['beta']:g}, rk4, t = 1 | {r['N']:.0e} | {r['backend']} | {r['dt']:.4g} | {r['steps']} "
        f"| {r['evaluations']} | {r['t']:.1f} | {r['peak'] / GB:.2f} | {r['state'] / GB:.3f} "
        f"| {r['err']:.1e} (N = {r['check_n']:.0e}) |"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--big", action="store_true", help="add N = 10^8 (about 8 GB, minutes)")
    p.add_argument("--quick", action="store_true", help="N = 10^4 ... 10^6 only")
    p.add_argument("--runs", action="store_true", help="add the particle runs of 10^6 tokens")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--direct-max", type=float, default=1e5, help="largest N for the direct sums")
    p.add_argument("--check-n", type=int, default=10**4, help="tokens of the step-error check")
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        kind, *rest = json.loads(args.case)
        row = case_sums(*rest) if kind == "sums" else case_run(*rest)
        print(json.dumps(row))
        return
    sizes = [10**4, 10**5, 10**6] + ([] if args.quick else [10**7]) + ([10**8] if args.big else [])
    print(
        f"# spectral kernel sums, x = y uniform, tol = 1e-12, median of {args.repeat}; "
        f"{platform.processor() or platform.machine()}"
    )
    print(SUMS_HEADER)
    for d, beta in ((2, 100.0), (3, 10.0)):
        for n in sizes:
            repeat = 1 if n >= 10**8 else args.repeat
            print(_fmt_sums(_child(["sums", d, n, beta, repeat, n <= args.direct_max])), flush=True)
    if args.runs:
        print()
        print(RUNS_HEADER)
        for beta in (1.0, 5.0):
            print(_fmt_run(_child(["run", 10**6, beta, args.check_n])), flush=True)


if __name__ == "__main__":
    main()
