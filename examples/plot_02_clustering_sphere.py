"""
Clustering on the sphere
========================

Four hundred tokens on :math:`S^2` under unnormalized attention with the repulsive and
the attractive sign of :math:`V`. With :math:`V = I` the tokens collapse into clusters;
with :math:`V = -I` they spread towards the uniform distribution and the energy
:math:`E_\\beta` decreases (so ``model.energy``, the functional the flow ascends,
:math:`-E_\\beta`, increases).
"""

# %%
import matplotlib.pyplot as plt
import numpy as np

import wflow
import wflow.plot as wp

x0 = wflow.sphere.von_mises_fisher(
    400, [0.0, 0.0, 1.0], kappa=2.0, seed=0
)  # a cap around the north pole
saves = np.linspace(0, 8, 17)
attract = wflow.simulate(wflow.SA(beta=6.0), x0, t_end=8.0, save_at=saves)
repel = wflow.simulate(wflow.USA(beta=1.0, V=-np.eye(3)), x0, t_end=8.0, save_at=saves)

# %%
# Final states side by side, on the sphere and on a Mollweide map.
fig = plt.figure(figsize=(10, 8), layout="constrained")
wp.plot_particles(attract, ax=fig.add_subplot(2, 2, 1, projection="3d"), title="SA, V = I, t = 8")
wp.plot_particles(repel, ax=fig.add_subplot(2, 2, 2, projection="3d"), title="USA, V = −I, t = 8")
wp.plot_particles(attract, view="map", ax=fig.add_subplot(2, 2, 3, projection="mollweide"))
wp.plot_particles(repel, view="map", ax=fig.add_subplot(2, 2, 4, projection="mollweide"))

# %%
# Energies: both runs ascend ``model.energy``.
fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), layout="constrained")
wp.plot_energy(attract, ax=axes[0], title="SA, V = I")
wp.plot_energy(repel, ax=axes[1], title="USA, V = −I")
plt.show()
