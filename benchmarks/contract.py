"""The solver contract against the code it replaced: the same workloads, side by side, in one run.

Run ``python -m benchmarks.contract --old PATH`` with ``PATH`` a checkout of the commit before the
contract (``git worktree add ../wflow_old e877c76``).  Each workload runs in a fresh process
(imports and compilation warmed up first, then timed), old and new alternating, ``--repeat``
times; the table gives medians and the ratio new / old.  The machine is shared: read ratios
near 1 as "no change beyond noise" only when the repeats agree.

Each process runs its workload twice and times the second call (numba's disk caches are keyed by
the source path, so the first call of the old checkout compiles).  Workloads (all through the
public front doors, identical calls in both trees):

* ``simulate`` RK4 default step, 2e4 particles on S^2, SA beta = 10, t = 1 (kernel sums dominate);
* ``simulate`` dopri5, 500 particles on S^2, SA beta = 9, t = 10, 31 saves (driver overhead);
* ``simulate`` Euler dt = 0.1, 64 systems x 32 tokens in d = 128, t = 10, 51 saves (many small
  systems with the default save-time diagnostics; the old driver split each save interval into
  equal steps, so the table compares time per step);
* one SSP-RK3 finite-volume step on a 4096-cell circle and a 10242-cell sphere (SA beta = 4);
* ``jko``: three steps on a 2048-cell circle, USA(2), kappa = 4;
* the driver alone (``integrate`` on :math:`y' = -y` in R^8, where a step costs microseconds):
  RK4 with 10^4 fixed steps, dopri5 with about 2000 adaptive steps, each with 11 saves; the
  time per step is the driver's overhead.

``--old`` may be any checkout with the same front doors, e.g. the commit before a change to
the driver (``git worktree add ../wflow_old HEAD~1``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

COMMON = """
import json, time, numpy as np, wflow
from wflow import SA, USA, Atoms, sphere
from wflow.density import Density
from wflow.mesh import CircleMesh, SphereMesh
from wflow.solvers.base import Problem, integrate
class Decay(Problem):
    def rhs(self, t, y):
        return -y
def clock(f):
    f()  # the first call of a process compiles (numba caches are per checkout path): time the second
    t0 = time.perf_counter(); out = f(); return time.perf_counter() - t0, out
"""

WORKLOADS = {
    "simulate rk4, 2e4 on S^2, SA beta=10, t=1": """
x0 = sphere.uniform(20000, 3, seed=0)
sec, tr = clock(lambda: wflow.simulate(SA(10.0), x0, 1.0, save_at=[0.0, 1.0]))
print(json.dumps({"seconds": sec, "steps": int(tr.stats["steps"][-1])}))
""",
    "simulate dopri5, 500 on S^2, SA beta=9, t=10, 31 saves": """
x0 = sphere.uniform(500, 3, seed=0)
sec, tr = clock(lambda: wflow.simulate(SA(9.0), x0, 10.0, save_at=np.linspace(0, 10, 31), method="dopri5"))
print(json.dumps({"seconds": sec, "steps": int(tr.stats["steps"][-1])}))
""",
    "simulate euler dt=0.1, 64x32 tokens d=128, t=10, 51 saves (per step)": """
x0 = sphere.uniform(32, 128, seed=0, batch=(64,))
sec, tr = clock(lambda: wflow.simulate(SA(5.0), x0, 10.0, method="euler", dt=0.1, save_at=np.linspace(0, 10, 51)))
print(json.dumps({"seconds": sec / int(tr.stats["steps"][-1]), "steps": int(tr.stats["steps"][-1])}))
""",
    "finite-volume step, circle 4096 cells, SA beta=4": """
mesh = CircleMesh(4096)
rho0 = Density.from_function(mesh, lambda x: 1.0 + 0.5 * x[:, 0] + 0.3 * x[:, 1] ** 2)
STEP
""",
    "finite-volume step, sphere 10242 cells, SA beta=4": """
mesh = SphereMesh(32)
rho0 = Density.from_function(mesh, lambda x: 1.0 + 0.5 * x[:, 0] + 0.3 * x[:, 1] ** 2)
STEP
""",
    "jko, 3 steps, circle 2048 cells, USA(2), kappa=4": """
mesh = CircleMesh(2048)
rho0 = Density.from_function(mesh, lambda p: np.exp(np.cos(np.arctan2(p[:, 1], p[:, 0]) - 0.3)) + 0.5 * np.exp(2 * p[:, 0]))
from wflow.solvers.jko import jko
sec, r = clock(lambda: jko(USA(2.0), rho0, 0.05, 3, kappa=4.0))
print(json.dumps({"seconds": sec, "steps": 3}))
""",
    "integrate rk4 dt=1e-4, y'=-y in R^8, 1e4 steps, 11 saves (per step)": """
sec, r = clock(lambda: integrate(Decay(), "rk4", np.ones(8), 0.0, 1.0, dt=1e-4))
print(json.dumps({"seconds": sec / int(r.stats["steps"][-1]), "steps": int(r.stats["steps"][-1])}))
""",
    "integrate dopri5 rtol=1e-12, y'=-y in R^8, t=20, 11 saves (per step)": """
sec, r = clock(lambda: integrate(Decay(), "dopri5", np.ones(8), 0.0, 20.0, rtol=1e-12, atol=1e-14))
print(json.dumps({"seconds": sec / int(r.stats["steps"][-1]), "steps": int(r.stats["steps"][-1])}))
""",
}

# one finite-volume step: the old FiniteVolume.step against the new SSPRK3.step on the FiniteVolume problem
FV_STEP = """
try:
    from wflow.solvers.steppers import SSPRK3
    from wflow.solvers.eulerian import FiniteVolume
    fv = FiniteVolume(mesh, SA(4.0), cfl=1.0)
    solver = SSPRK3()
    m = rho0.masses()
    state = solver.init(fv, 0.0, m)
    def one():
        return solver.step(fv, 0.0, m, 0.5 * state[1], state, rtol=1e-3, atol=1e-12)
except ImportError:
    from wflow.solvers.eulerian import FiniteVolume
    fv = FiniteVolume(mesh, SA(4.0))
    state = fv.init(rho0.masses())
    def one():
        return fv.step(state, 0.5 * state.limit)
times = [clock(one)[0] for _ in range(15)]
print(json.dumps({"seconds": min(times), "steps": 1}))
"""


def run_once(tree: str, body: str) -> dict:
    code = COMMON + textwrap.dedent(body).replace("STEP", FV_STEP)
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tree
    )
    if out.returncode != 0:
        raise RuntimeError(f"workload failed in {tree}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--old", required=True, help="checkout of the code before the contract")
    p.add_argument(
        "--new", default=str(Path(__file__).resolve().parents[1]), help="this checkout (default)"
    )
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", default="", help="run the workloads whose name contains this")
    args = p.parse_args(argv)
    print(
        f"python -m benchmarks.contract --old {args.old} --repeat {args.repeat}  (load {os.getloadavg()[0]:.1f})"
    )
    print("| workload | old (s) | new (s) | new / old | steps old, new | repeats new/old |")
    print("|---|---|---|---|---|---|")
    for name, body in WORKLOADS.items():
        if args.only and args.only not in name:
            continue
        res = {"old": [], "new": []}
        steps = {}
        for _ in range(args.repeat):
            for label, tree in (("old", args.old), ("new", args.new)):
                r = run_once(tree, body)
                res[label].append(r["seconds"])
                steps[label] = r["steps"]
        mo, mn = float(np.median(res["old"])), float(np.median(res["new"]))
        each = ", ".join(f"{n / o:.2f}" for n, o in zip(res["new"], res["old"]))
        unit = " per step" if "per step" in name else ""
        print(
            f"| {name} | {mo:.3g}{unit} | {mn:.3g}{unit} | {mn / mo:.2f} | {steps['old']}, {steps['new']} | {each} |",
            flush=True,
        )
    print(f"(load at the end {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
