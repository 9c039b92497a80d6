"""
Normalization schemes as speed regulation
=========================================

Eight equiangular tokens under softmax attention (beta = 1) collapse to one point under every
normalization scheme, at very different speeds: Post-LN and nGPT exponentially, the
square-root scaling like e^{-4 sqrt(t+1)}, Pre-LN and Peri-LN like t^{-2}.  Dots: particles
(wflow.simulate, the schemes with radii integrated in R^d); lines: the reduced ODE for the
common cosine rho and radius r (wflow.theory.equiangular_scheme_solution).
"""

import matplotlib.pyplot as plt
import numpy as np

import wflow
from wflow import theory
from wflow.schemes import Normalized

n, beta, rho0 = 8, 1.0, 0.0
x0 = theory.equiangular_configuration(n, rho0)
t = np.concatenate([[0.0], np.logspace(-1, 2, 30)])
opts = {"mix-ln": {"tau": 2.0}, "ngpt": {"alpha": 0.5}}
fig, ax = plt.subplots(figsize=(6.5, 4.5))
for scheme in ("post-ln", "pre-ln", "peri-ln", "mix-ln", "ngpt", "sqrt"):
    kw = opts.get(scheme, {})
    traj = wflow.simulate(
        Normalized(wflow.SA(beta), scheme, **kw),
        x0,
        t[-1],
        save_at=wflow.SaveAt(t, diagnostics=()),
        method="dopri5",
        control=wflow.StepControl(rtol=1e-10, atol=1e-13),
        backend="numpy",
    )
    P = traj.points
    rho = np.einsum("tid,tjd->tij", P, P)[:, 0, 1]
    ref = theory.equiangular_scheme_solution(t, beta, n, "SA", scheme, rho0=rho0, **kw)
    (line,) = ax.loglog(t[1:], ref.gap[1:], label=scheme)
    ax.loglog(traj.times[1:], 1 - rho[1:], "o", ms=3, color=line.get_color())
ax.set_xlabel("t (depth)")
ax.set_ylabel("1 - rho (cosine gap)")
ax.set_ylim(1e-14, 2)
ax.set_title("SA, beta = 1, n = 8 equiangular tokens: lines ODE, dots particles")
ax.legend(fontsize=8)
fig.tight_layout()
