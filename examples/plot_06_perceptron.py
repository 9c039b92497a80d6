"""
Attention plus a perceptron
===========================

A Transformer layer is an attention block followed by a feed-forward perceptron. Here
tokens on the circle follow unnormalized attention (USA) at :math:`\\beta = 2` plus a conservative
ReLU perceptron :math:`W = A^\\top\\mathrm{diag}(\\omega)` with four neurons. The
perceptron adds the potential :math:`\\tfrac12\\int v_\\omega\\,d\\mu` to the energy
and pulls tokens towards the directions of its neurons, so the tokens cluster there
instead of wherever attention alone would have gathered them.
"""

# %%
import matplotlib.pyplot as plt
import numpy as np

import wflow
import wflow.plot as wp

phi = np.array([0.3, 1.9, 3.4, 5.0])  # neuron directions
A = 2.0 * np.stack([np.cos(phi), np.sin(phi)], axis=1)  # (m, d) = (4, 2)
perceptron = wflow.Perceptron.conservative(A, omega=np.full(4, 1.5), b=np.full(4, -0.5))
x0 = wflow.sphere.uniform(200, 2, seed=3)
saves = np.linspace(0, 15, 31)
alone = wflow.simulate(wflow.USA(beta=2.0), x0, 15.0, save_at=saves)
both = wflow.simulate(wflow.USA(beta=2.0) + perceptron, x0, 15.0, save_at=saves)

# %%
# Angles against time: attention alone, then attention with the perceptron (the
# neuron directions dotted).
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained", sharey=True)
wp.plot_particles(alone, ax=axes[0], size=2, title="USA(β = 2)")
wp.plot_particles(both, ax=axes[1], size=2, title="USA(β = 2) + perceptron")
for p in phi:
    axes[1].axvline(p, color="k", ls=":", lw=0.8)

# %%
# USA plus a conservative perceptron is a Wasserstein gradient flow: the energy it
# ascends increases. (Softmax attention plus a perceptron is not a gradient flow of
# one functional, and ``plot_energy`` would say so.)
fig, ax = plt.subplots(figsize=(5, 3.5), layout="constrained")
wp.plot_energy(both, ax=ax, title=wp.describe(both))
plt.show()
