"""W_2 on S^2 side by side: wflow's certified multiscale solver, POT and GeomLoss.

Run: ``nice -n 10 python -m benchmarks.transport_multiscale [N ...] [--repeats R] [--gpu]``
(default N = 1000 2000; each case runs in its own process, so peak memory is that
process's maximum resident set).  ``--gpu`` (a machine where PyTorch sees a GPU): wflow with
its passes on the GPU (``device="cuda"``) beside wflow on the CPU, and GeomLoss on the GPU
(KeOps), chordal cost only; POT is left out.

Same samples for every method: a von Mises--Fisher mixture (kappa 20 and 5) against uniform
samples on S^2, N each.  Costs: chordal |x - y|^2 (the only one GeomLoss has) and geodesic
theta^2 (wflow, POT).  epsilon = 0.01 in units of the cost; GeomLoss's cost is |x-y|^2/2, so
its blur is sqrt(eps/2) and its value is doubled.  Columns: time (median of the repeats),
peak memory, W_2 (for wflow the bracket's midpoint and its ends), and |W_2 - exact| where
``ot.emd2`` fits (N <= 5000).  The machine's load average is printed with the table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

EPS = 1e-2
#: ot.emd2 runs up to this many samples
EMD_MAX_N = 5000


def samples(n: int):
    from wflow.sphere import uniform, vmf_mixture

    x = vmf_mixture(n, [[0, 0, 1.0], [1.0, 0, 0]], [20.0, 5.0], seed=0)
    return x, uniform(n, 3, seed=1)


def geomloss_w2(
    x, y, a=None, b=None, *, eps: float = EPS, backend: str = "multiscale", device: str = "cpu"
) -> float:
    """GeomLoss's debiased Sinkhorn divergence S_eps as a chordal W_2: sqrt(2 S_eps).

    GeomLoss's cost is |x - y|^2 / 2, so its blur is sqrt(eps / 2) for eps in units of |x - y|^2.
    ``a``, ``b``: the weights of ``x`` and ``y`` (default uniform).
    """
    import numpy as np
    import torch
    from geomloss import SamplesLoss

    X, Y = (torch.tensor(v, dtype=torch.float64, device=device) for v in (x, y))
    loss = SamplesLoss("sinkhorn", p=2, blur=(eps / 2) ** 0.5, scaling=0.9, backend=backend)
    if a is None:
        s = loss(X, Y)
    else:
        A, B = (torch.tensor(v, dtype=torch.float64, device=device) for v in (a, b))
        s = loss(A, X, B, Y)
    return float(np.sqrt(max(2.0 * float(s), 0.0)))


def run_case(method: str, n: int, cost: str) -> dict:
    """One measurement in this process: value, seconds, and details.

    ``method`` may end in ``@cuda`` (the GPU) or ``@cpu``; wflow's default is ``device="auto"``.
    """
    import numpy as np

    method, _, where = method.partition("@")
    x, y = samples(n)
    out: dict = {}
    t0 = time.perf_counter()
    if method == "wflow-multiscale":
        from wflow.transport.multiscale import certified_w2

        r = certified_w2(x, y, cost=cost, reg=EPS, tol=1e-3, device=where or "auto")
        out.update(value=r["value"], lower=r["lower"], upper=r["upper"], certified=r["certified"])
    elif method == "pot-emd2":
        import ot

        from wflow.sphere import cost_matrix

        a = np.full(n, 1.0 / n)
        out["value"] = float(np.sqrt(ot.emd2(a, a, cost_matrix(x, y, cost=cost), numItermax=10**8)))
    elif method == "pot-sinkhorn2-log":
        import ot

        from wflow.sphere import cost_matrix

        a = np.full(n, 1.0 / n)
        M = cost_matrix(x, y, cost=cost)
        v = ot.sinkhorn2(a, a, M, EPS, method="sinkhorn_log", numItermax=1000, stopThr=1e-6)
        out["value"] = float(np.sqrt(max(float(v), 0.0)))  # biased: OT_eps, not debiased
    elif method.startswith("geomloss-"):
        out["value"] = geomloss_w2(x, y, backend=method.split("-", 1)[1], device=where or "cpu")
    else:
        raise ValueError(f"unknown method {method!r}")
    out["seconds"] = time.perf_counter() - t0
    import resource

    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _subprocess(method: str, n: int, cost: str, timeout: float) -> dict:
    code = (
        "import json, sys; from benchmarks.transport_multiscale import run_case; "
        f"print(json.dumps(run_case({method!r}, {n}, {cost!r})))"
    )
    try:
        p = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"not finished in {timeout:.0f} s"}
    if p.returncode:
        lines = p.stderr.strip().splitlines()
        return {
            "error": lines[-1][:120] if lines else f"exit status {p.returncode} (signal: a crash)"
        }
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    repeats = 1
    if "--repeats" in argv:
        i = argv.index("--repeats")
        repeats = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    gpu = "--gpu" in argv
    argv = [a for a in argv if a != "--gpu"]
    sizes = [int(float(a)) for a in argv] or [1000, 2000]
    print(f"load average at start: {os.getloadavg()}")
    print("| N | cost | method | time (s) | peak MB | W_2 | bracket | abs. error vs emd2 |")
    print("|---|---|---|---|---|---|---|---|")
    for n in sizes:
        for cost in ("chordal", "geodesic") if n < 10**5 and not gpu else ("chordal",):
            methods = ["pot-emd2"] if n <= EMD_MAX_N else []
            methods += ["wflow-multiscale"]
            if n <= 2000:
                methods += ["pot-sinkhorn2-log"]
            if cost == "chordal":
                # tensorized stores N^2 costs, online computes N^2 per iteration: not at 1e5
                methods += ["geomloss-tensorized"] if n < 10**5 else []
                methods += ["geomloss-multiscale"]
                if 10**4 <= n < 10**5:
                    methods += ["geomloss-online"]
            if gpu:  # both engines of wflow, GeomLoss multiscale on the GPU
                methods = [
                    "wflow-multiscale@cuda",
                    "wflow-multiscale@cpu",
                    "geomloss-multiscale@cuda",
                ]
            exact = None
            for method in methods:
                runs = [_subprocess(method, n, cost, 1800) for _ in range(repeats)]
                ok = [r for r in runs if "error" not in r]
                if not ok:
                    print(f"| {n} | {cost} | {method} | — | — | — | — | {runs[0]['error']} |")
                    continue
                ok.sort(key=lambda r: r["seconds"])
                r = ok[len(ok) // 2]
                if method == "pot-emd2":
                    exact = r["value"]
                bracket = (
                    f"[{r['lower']:.6f}, {r['upper']:.6f}]{'' if r['certified'] else ' (wider than tol)'}"
                    if "lower" in r
                    else ""
                )
                err = f"{abs(r['value'] - exact):.1e}" if exact is not None else ""
                print(
                    f"| {n} | {cost} | {method} | {r['seconds']:.3g} | {r['peak_mb']:.0f} | "
                    f"{r['value']:.6f} | {bracket} | {err} |",
                    flush=True,
                )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main(sys.argv[1:])
