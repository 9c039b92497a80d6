"""
Particles against the Eulerian density
======================================

The mean-field equation :math:`\\partial_t\\rho + \\mathrm{div}(\\rho\\, v[\\rho]) = 0`
is the limit of the particle system as the number of tokens grows. Here both start
from the same density on the circle, a uniform one with a small bump: the
finite-volume solution on 512 cells and 2000 tokens sampled from it.
"""

# %%
import matplotlib.pyplot as plt
import numpy as np

import wflow
import wflow.plot as wp


def f0(theta):
    """A uniform density with two small bumps, as a function of the angle."""
    return 1 + 0.1 * np.cos(2 * theta) + 0.05 * np.cos(3 * theta)


def rho0(x):
    """The same density as a function of points on the circle, shape (n, 2)."""
    return f0(np.arctan2(x[:, 1], x[:, 0]))


model = wflow.SA(beta=4.0)
saves = np.linspace(0, 6, 25)
density = wflow.solve_density(
    model, wflow.Density.from_function(wflow.CircleMesh(512), rho0), 6.0, save_at=saves
)
x0 = wflow.sphere.sample_circle_density(f0, 2000, seed=0)
particles = wflow.simulate(model, x0, 6.0, save_at=saves)

# %%
# The heat map of the density (log colour scale) next to the tokens' angles.
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
wp.plot_density(density, ax=axes[0], title="finite volume, 512 cells")
wp.plot_particles(particles, ax=axes[1], size=1, title="2000 tokens")

# %%
# At the last time, the histogram of the tokens against the density.
theta = np.mod(np.arctan2(particles.points[-1, :, 1], particles.points[-1, :, 0]), 2 * np.pi)
ax = wp.plot_density(density, [0, len(saves) - 1], view="profile", norm="linear")
ax.hist(theta, bins=128, density=True, histtype="step", color="k", label="tokens, t = 6")
ax.legend()
plt.show()
