"""
Mean-field convergence in :math:`W_2`
=====================================

How close are :math:`N` tokens to the continuum? Sample :math:`N` tokens from a
density :math:`\\rho_0` on the circle, evolve both the tokens and the density, and
measure the Wasserstein distance :math:`W_2(\\mu_N(t), \\rho(t))` (exact on the circle).
For independent samples it decreases like :math:`N^{-1/2}`, at :math:`t = 0` as at a
later time: the dynamics does not destroy the rate over a bounded time.
"""

# %%
import matplotlib.pyplot as plt
import numpy as np

import wflow


def f0(theta):
    return 1 + 0.5 * np.cos(theta) + 0.2 * np.cos(3 * theta)


def rho0(x):
    return f0(np.arctan2(x[:, 1], x[:, 0]))


model = wflow.SA(beta=3.0)
t_end = 2.0
mesh = wflow.CircleMesh(1024)
ref = wflow.solve_density(
    model, wflow.Density.from_function(mesh, rho0), t_end, save_at=[0.0, t_end]
)

sizes = np.array([16, 32, 64, 128, 256, 512, 1024])
seeds = range(6)
w2 = np.zeros((2, sizes.size, len(seeds)))
for a, n in enumerate(sizes):
    for s in seeds:
        x0 = wflow.sphere.sample_circle_density(f0, int(n), seed=s)
        traj = wflow.simulate(model, x0, t_end, save_at=[0.0, t_end])
        for k in range(2):
            w2[k, a, s] = wflow.wasserstein(traj.atoms(k), ref.density(k), method="circle")

# %%
# Mean over the seeds, with a fitted slope on log-log axes.
fig, ax = plt.subplots(figsize=(5.5, 4), layout="constrained")
for k, t in enumerate((0.0, t_end)):
    mean = w2[k].mean(axis=1)
    slope = np.polyfit(np.log(sizes), np.log(mean), 1)[0]
    ax.errorbar(
        sizes,
        mean,
        yerr=w2[k].std(axis=1),
        marker="o",
        capsize=3,
        label=f"t = {t:g}: slope {slope:.2f}",
    )
c = w2[0, 0].mean() * np.sqrt(sizes[0])
ax.plot(sizes, c * sizes**-0.5, "k--", lw=0.8, label="∝ N^(-1/2)")
ax.set(xscale="log", yscale="log", xlabel="tokens N", ylabel="W₂(μ_N(t), ρ(t))")
ax.legend()
plt.show()
