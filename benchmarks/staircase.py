"""The metastable staircase of GKPR (USA, rescaled kernel, n = 5 on S^1): time to run through every merge.

    python -m benchmarks.staircase            # beta = 500, 1000, 2000, 4000 (a few minutes on 2 cores)
    python -m benchmarks.staircase --quick    # beta = 4000 only

Initial angles 0.5 [0, 0.5, 2, 4, 7] log(beta)/sqrt(beta) (Geshkovski, Koubbi, Polyanskiy & Rigollet,
"Dynamic metastability in the self-attention model"); the run goes to t = 1e90, past the last merge
(t ~ 1e78 at beta = 4000).  Side by side, each with a wall-clock budget of BUDGET seconds:

* wflow, ``coordinates="gaps"``, ``method="ros2"`` (rtol 1e-4 and 1e-6);
* wflow, ``coordinates="angles"``, ``method="ros2"`` (the angle form: the rotation mode's rounding);
* scipy's Radau and BDF stepping the same angle ODE with wflow's exact Jacobian (what a user would
  pick for a stiff system), advanced step by step until t = 1e90, a failure, or the budget.

Reported: wall time, accepted steps, the times of the merges (a gap between neighbours below 1e-6) and
the time reached.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import wflow
from wflow import USA
from wflow.solvers.base import Tracker
from wflow.studies.staircase import initial_angles

T_END = 1e90
BUDGET = 120.0


def merges(times: np.ndarray, angles: np.ndarray) -> list[str]:
    th = np.sort(np.mod(angles, 2 * np.pi), axis=1)
    gaps = np.diff(np.concatenate([th, th[:, :1] + 2 * np.pi], axis=1), axis=1)
    clusters = np.maximum((gaps > 1e-6).sum(axis=1), 1)
    return [f"{times[i + 1]:.2g}" for i in np.flatnonzero(np.diff(clusters))]


class Budget(Tracker):
    """Stops a run after BUDGET seconds of wall time (status 1, "stopped by budget")."""

    name = "budget"

    def __init__(self):
        self.t0 = time.perf_counter()

    def step(self, t, dt, res):
        return time.perf_counter() - self.t0 > BUDGET


def run_wflow(
    beta: float, coordinates: str, rtol: float
) -> tuple[float, int, list[str], float, str]:
    th = initial_angles(beta)
    x0 = np.stack([np.cos(th), np.sin(th)], -1)
    save = np.concatenate([[0], np.logspace(-3, 90, 187)])
    t = time.perf_counter()
    r = wflow.simulate(
        USA(beta, kernel="rescaled"),
        x0,
        T_END,
        method="ros2",
        control=wflow.StepControl(rtol=rtol, atol=1e-10),
        save_at=wflow.SaveAt(save, diagnostics=("log_energy",)),
        coordinates=coordinates,
        throw=False,
        trackers=[Budget()],
    )
    wall = time.perf_counter() - t
    ang = r.data["angles"][1]
    return wall, int(r.stats["steps"][-1]), merges(r.times, ang), float(r.times[-1]), r.message


def run_scipy(beta: float, method: str) -> tuple[float, int, list[str], float, str]:
    from scipy.integrate import BDF, Radau

    model = USA(beta, kernel="rescaled")
    w = np.full(5, 0.2)
    save = list(np.logspace(-3, 90, 187))
    cls = {"Radau": Radau, "BDF": BDF}[method]
    solver = cls(
        lambda t, y: model.angular_velocity(y, w),
        0.0,
        initial_angles(beta),
        T_END,
        rtol=1e-6,
        atol=1e-10,
        jac=lambda t, y: model.angular_jacobian(y, w),
    )
    t0 = time.perf_counter()
    times, states, steps, msg = [0.0], [initial_angles(beta)], 0, "reached t_end"
    while solver.status == "running":
        if time.perf_counter() - t0 > BUDGET:
            msg = f"budget of {BUDGET:.0f} s spent"
            break
        m = solver.step()
        steps += 1
        if m is not None:
            msg = m
            break
        while save and save[0] <= solver.t:
            times.append(save.pop(0))
            states.append(solver.dense_output()(times[-1]))
    wall = time.perf_counter() - t0
    return wall, steps, merges(np.array(times), np.array(states)), float(solver.t), msg


def main(quick: bool) -> None:
    print(f"load average before: {os.getloadavg()}")
    print("| beta | solver | wall s | steps | merge times | t reached | message |")
    print("|---|---|---|---|---|---|---|")
    for beta in (4000.0,) if quick else (500.0, 1000.0, 2000.0, 4000.0):
        rows = [
            (f"wflow gaps ros2 rtol {rtol:g}", lambda rtol=rtol: run_wflow(beta, "gaps", rtol))
            for rtol in (1e-4, 1e-6)
        ]
        rows.append(("wflow angles ros2 rtol 1e-06", lambda: run_wflow(beta, "angles", 1e-6)))
        rows += [
            (f"scipy {m} (angles, exact J) rtol 1e-06", lambda m=m: run_scipy(beta, m))
            for m in ("Radau", "BDF")
        ]
        for name, fn in rows:
            wall, steps, mt, reached, msg = fn()
            print(
                f"| {beta:g} | {name} | {wall:.1f} | {steps} | {', '.join(mt)} | {reached:.3g} | {msg[:60]} |",
                flush=True,
            )


if __name__ == "__main__":
    main("--quick" in sys.argv)
