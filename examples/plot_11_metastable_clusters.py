"""
Metastable clusters: the linear phase picks k* = argmax k^2 I_k(beta)
=====================================================================

Softmax attention (SA) on the circle, started near the uniform measure: Fourier mode k grows at
rate k^2 I_k(beta) / (beta I_0(beta)) (wflow.theory.growth_rate), so the fastest mode k* sets the
number of clusters when the perturbation reaches order one (Bruno, Pasqualotto, Agazzi 2025).
Top: the density when its largest Fourier coefficient reaches 0.25 -- finite volume (black, from
uniform plus equal-amplitude modes with random phases) and 5000 particles drawn i.i.d. uniform
(orange); dotted lines are the cluster angles predicted from the initial phase of mode k*.
Bottom: the growth rates, k* marked.  The study ``wflow validate metastable`` runs the same at
more beta, more particles and more seeds.
"""

import matplotlib.pyplot as plt
import numpy as np

from wflow.studies import metastable as M
from wflow.theory import growth_rate, most_unstable_mode

betas = (2.0, 5.0)
ks = np.arange(1, M.K_MAX + 1)
fig, axes = plt.subplots(2, len(betas), figsize=(8, 6))
for j, beta in enumerate(betas):
    k_star = most_unstable_mode(beta, 2, "SA")
    fv = M.run_fv(beta, 256, 0)
    p = M.run_particles(beta, 5000, 0)
    th = M.grid_angles(fv["density"].size)
    ax = axes[0, j]
    ax.plot(
        th,
        fv["density"],
        "k-",
        label=f"finite volume: {fv['n_peaks']} peaks at t={fv['t_lin']:.1f}",
    )
    ax.plot(
        th, p["density"], color="C1", label=f"particles: {p['n_peaks']} peaks at t={p['t_lin']:.1f}"
    )
    for a in M.predicted_angles(fv["c0"][k_star - 1], k_star):
        ax.axvline(a, color="k", ls=":", lw=0.8)
    for a in M.predicted_angles(p["c0"][k_star - 1], k_star):
        ax.axvline(a, color="C1", ls=":", lw=0.8)
    ax.set_title(f"beta = {beta:g}: k* = {k_star}")
    ax.set_xlabel("angle theta (rad)")
    ax.set_ylabel("density (1/rad)")
    ax.legend(fontsize=7, loc="lower right")
    ax = axes[1, j]
    ax.plot(ks, growth_rate(ks, beta, 2, "SA"), "o-", ms=4)
    ax.axvline(k_star, color="C3", ls="--")
    ax.set_xlabel("Fourier mode k")
    ax.set_ylabel("growth rate (1/time)")
fig.tight_layout()
plt.show()
