"""
Clustering on the circle
========================

Sixty-four tokens start uniformly on the circle :math:`S^1` and move under softmax
self-attention (SA) at inverse temperature :math:`\\beta = 9`. Nearby tokens attract:
they gather into a few clusters within a few time units, and the clusters then merge
far more slowly (metastability). The energy :math:`E_\\beta` increases all along.
"""

# %%
# Run the particle system
# -----------------------
import matplotlib.pyplot as plt
import numpy as np

import wflow
import wflow.plot as wp

x0 = wflow.sphere.uniform(64, 2, seed=1)  # 64 points on S^1, shape (64, 2)
model = wflow.SA(beta=9.0)
traj = wflow.simulate(model, x0, t_end=30.0, save_at=np.linspace(0, 30, 61))
print(traj)

# %%
# The angle of every token against time: the clusters form early, then merge.
ax = wp.plot_particles(traj)

# %%
# The summary figure (the one ``wflow run`` writes): snapshots, energy, cluster count.
fig = wp.plot_trajectory(traj)
plt.show()
