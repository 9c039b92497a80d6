"""
JKO steps to a stationary state
===============================

Unnormalized attention (USA) with :math:`Q = K = V = I` is a Wasserstein gradient
flow, so it can be solved by implicit steps (the Jordan–Kinderlehrer–Otto scheme)
:math:`\\mu_{k+1} = \\arg\\min_\\nu W_2^2(\\mu_k,\\nu)/2\\tau - F(\\nu) + \\kappa^{-1}\\int\\nu\\log\\nu`.
With noise (:math:`\\kappa = 2`) the uniform state is unstable at :math:`\\beta = 2`
(its first mode grows at :math:`I_1(2)/2 \\approx 0.80`, faster than diffusion damps it,
:math:`1/\\kappa = 0.5`), and the density settles on a single smooth bump. The free
energy :math:`\\Phi = -F + \\kappa^{-1}\\int\\rho\\log\\rho` decreases at every step.
"""

# %%
import matplotlib.pyplot as plt
import numpy as np

import wflow
import wflow.plot as wp
from wflow.solvers.jko import jko, stationary

mesh = wflow.CircleMesh(128)
rho0 = wflow.Density.from_function(mesh, lambda x: 1 + 0.05 * x[:, 0] + 0.03 * x[:, 1])
res = jko(wflow.USA(beta=2.0), rho0, tau=0.25, n_steps=40, kappa=2.0)
print(res)

# %%
# Profiles and free energy: the bump grows, then stops moving.
fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
wp.plot_density(
    res, [0, 4, 8, 16, 40], view="profile", norm="linear", ax=axes[0], title="ρ(θ) at k τ"
)
wp.plot_energy(res, which="free_energy", ax=axes[1], title="free energy")

# %%
# Without noise, a conservative perceptron added to a weak attention (``USA(0.1)``)
# localizes the stationary state on a few atoms, at the directions of its neurons.
# :func:`~wflow.solvers.jko.stationary` takes JKO steps with a growing step until the
# measure stops moving, then polishes the atoms.
phi = 0.2 + 2 * np.pi * np.arange(3) / 3
A = 3.0 * np.stack([np.cos(phi), np.sin(phi)], axis=1)  # three neurons in the plane
model = wflow.USA(beta=0.1) + wflow.Perceptron.conservative(
    A, omega=np.full(3, 5.0), b=np.full(3, -0.9)
)
st = stationary(model, rho0)
angles = np.degrees(np.arctan2(st.atoms[:, 1], st.atoms[:, 0]))
print(
    "atoms at",
    np.round(angles, 2),
    "degrees, masses",
    np.round(st.masses, 3),
    f"residual {st.residual:.1e}",
)

fig, ax = plt.subplots(figsize=(5, 4), layout="constrained")
ax.stem(np.mod(np.radians(angles), 2 * np.pi), st.masses, basefmt=" ")
ax.vlines(np.mod(phi, 2 * np.pi), 0, 1, colors="0.6", linestyles=":", label="neuron directions")
ax.set(xlim=(0, 2 * np.pi), ylim=(0, 1), xlabel="θ", ylabel="mass", title="stationary atoms")
ax.legend()
plt.show()
