"""
Particles against the continuum on :math:`S^2`
==============================================

The mean-field convergence of wflow's design, on the sphere: evolve a density
:math:`\\rho(t)` on :math:`S^2` with the finite-volume solver, evolve :math:`N` tokens
drawn from :math:`\\rho(0)`, and bracket :math:`W_2(\\mu_N(t), \\rho(t))` at every save.
The reference is a fine quadrature of the density (each cell cut into small triangles,
each carrying its exact mass), not its cell atoms: the quadrature moves mass by at most
``r`` in :math:`W_2`, and the semi-discrete solver brackets the distance to the
quadrature, so ``[lower - r, upper + r]`` contains the distance to the density.
"""

# %%
import numpy as np

import wflow
from wflow.sphere import density_quadrature, sample_sphere_density


def rho0(x):
    """Two von Mises--Fisher bumps (kappa = 4), at the north pole and on the equator."""
    return np.exp(4 * (x[:, 2] - 1)) + 0.5 * np.exp(4 * (x[:, 0] - 1))


model = wflow.SA(beta=4.0)
saves = [0.0, 1.0, 2.0]
rho = wflow.solve_density(
    model, wflow.Density.from_function(wflow.SphereMesh(8), rho0), saves[-1], save_at=saves
)
fine = [density_quadrature(rho.density(i), refine=4) for i in range(len(saves))]

sizes = [100, 400, 1600]
lower, upper = np.zeros((2, len(saves), len(sizes)))
for j, n in enumerate(sizes):
    x0 = sample_sphere_density(rho.density(0), n, seed=n)  # i.i.d. from the density
    tokens = wflow.simulate(model, x0, saves[-1], save_at=saves)
    for i, (y, w, r) in enumerate(fine):
        res = wflow.wasserstein_result(
            tokens.atoms(i), wflow.Atoms(y, w), method="semidiscrete", cost="chordal"
        )
        lower[i, j], upper[i, j] = res.info["lower"] - r, res.info["upper"] + r

print("   t      N   lower W2   upper W2")
for i, t in enumerate(saves):
    for j, n in enumerate(sizes):
        print(f"{t:4.1f} {n:6d} {lower[i, j]:10.4f} {upper[i, j]:10.4f}")
mid = 0.5 * (lower + upper)
slopes = [np.polyfit(np.log(sizes), np.log(m), 1)[0] for m in mid]
print("slope of W2 in N:", ", ".join(f"t = {t:g}: {s:.2f}" for t, s in zip(saves, slopes)))

# %%
# The brackets against :math:`N` on log-log axes, with the i.i.d. rate :math:`N^{-1/2}`.
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(5.5, 4), layout="constrained")
for i, t in enumerate(saves):
    ax.errorbar(
        sizes,
        mid[i],
        yerr=0.5 * (upper[i] - lower[i]),
        marker="o",
        capsize=3,
        label=f"t = {t:g}: slope {slopes[i]:.2f}",
    )
ax.plot(sizes, mid[0, 0] * np.sqrt(sizes[0] / np.array(sizes)), "k--", lw=0.8, label="∝ N^(-1/2)")
ax.set(xscale="log", yscale="log", xlabel="tokens N", ylabel="W₂(μ_N(t), ρ(t)), chordal")
ax.legend()
plt.show()
