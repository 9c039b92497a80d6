"""
The metastable energy staircase (GKPR)
======================================

Five tokens on the circle under unnormalized attention in the rescaled kernel
e^{beta(<x,y> - 1)} (Geshkovski, Koubbi, Polyanskiy & Rigollet), from the initial angles
0.5 [0, 0.5, 2, 4, 7] log(beta)/sqrt(beta).  The energy climbs a staircase: each plateau is a
configuration of clusters at rest (energy sum m_a^2 / (2 beta)), each merge is fast, and each
plateau lasts exponentially longer than the last -- at beta = 4000 the last merge comes at t ~ 1e78.
``coordinates="gaps"`` with the Rosenbrock solver ``ros2`` steps through all of it in seconds.
"""

import matplotlib.pyplot as plt
import numpy as np

import wflow
from wflow.studies.staircase import initial_angles

fig, ax = plt.subplots(figsize=(6.5, 4.0))
for beta in (500.0, 4000.0):
    th = initial_angles(beta)
    x0 = np.stack([np.cos(th), np.sin(th)], -1)
    traj = wflow.simulate(
        wflow.USA(beta, kernel="rescaled"),
        x0,
        1e90,
        method="ros2",
        control=wflow.StepControl(rtol=1e-4, atol=1e-10),
        save_at=wflow.SaveAt(
            np.concatenate([[0], np.logspace(-3, 90, 280)]), diagnostics=("log_energy",)
        ),
        coordinates="gaps",
    )
    e = 2 * beta * np.exp(traj.diagnostics["log_energy"])
    ax.plot(np.log10(traj.times[1:]), e[1:], label=rf"$\beta = {beta:g}$")
for level, masses in ((7 / 25, "2,1,1,1"), (11 / 25, "3,1,1"), (13 / 25, "3,2"), (1.0, "5")):
    ax.axhline(level, color="0.75", lw=0.6, ls=":")
    ax.text(88, level + 0.01, f"clusters {masses}", ha="right", fontsize=7, color="0.4")
ax.set_xlabel(r"$\log_{10} t$")
ax.set_ylabel(r"$2\beta E_\beta$ (rescaled energy)")
ax.legend()
plt.show()
