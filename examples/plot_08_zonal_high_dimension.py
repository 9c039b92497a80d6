"""
A hemisphere collapses to its pole in :math:`d = 128`
======================================================

Meshes exist only on :math:`S^1` and :math:`S^2`; a density that depends only on the height
:math:`z = \\langle x, e\\rangle` is solved in any dimension by the zonal solver
(:func:`wflow.solvers.zonal.solve_zonal`, a 1-D finite volume in :math:`z`). Here the uniform
density on the upper hemisphere of :math:`S^{127}` (smoothed at the equator) moves under SA
(:math:`\\beta = 9`): in high dimension the law of :math:`z` starts squeezed against the equator
(mean :math:`\\approx 0.07`, width :math:`\\sim d^{-1/2}`), then the whole mass travels to the
pole :math:`z = 1`.

2000 tokens drawn from the same density (:func:`wflow.studies.zonal.sample_zonal`) show what
the mean field asks of :math:`N` in high dimension. Tokens of :math:`S^{127}` are nearly
orthogonal, so in a token's softmax the other :math:`N - 1` weigh
:math:`e^{\\beta\\langle x_i, x_j\\rangle} \\approx 1` each while the token itself weighs
:math:`e^{\\beta} \\approx 8100`: with :math:`N = 2000` the self-weight dominates the normalizer
and slows every token (the mean field has no self-interaction). The tokens follow the zonal
law at first, then lag behind it, and the :math:`W_2` distance of the :math:`z`-marginals
grows. The mean-field limit needs :math:`N \\gg e^{\\beta}` here;
``wflow validate mean-field-zonal`` (:math:`\\beta = 2`) checks the :math:`N^{-1/2}` rate where
that holds.

Run ``python examples/plot_08_zonal_high_dimension.py`` (about 30 s of CPU); with
``WFLOW_STATIC=1`` it also writes ``docs/_static/zonal_collapse.png``, the figure of the
zonal docs page.
"""

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import wflow
from wflow.solvers.zonal import solve_zonal
from wflow.studies.zonal import sample_zonal

d, beta = 128, 9.0
times = np.array([0.0, 1.0, 2.0, 3.0, 5.0])


def hemisphere(z):
    return 1.0 / (1.0 + np.exp(-200.0 * np.asarray(z)))


model = wflow.SA(beta)
zonal = solve_zonal(model, hemisphere, times[-1], d=d, n_cells=1024, grid="z", save_at=times)
x0 = sample_zonal(hemisphere, d, 2000, np.random.default_rng(0))
tokens = wflow.simulate(model, x0, times[-1], dt=0.1, save_at=times)
w2 = [zonal.w2(tokens.points[i][:, -1], i) for i in range(len(times))]
print("mean z (zonal):", np.round(zonal.mean_z, 4))
print("W2 of the z-marginal, 2000 tokens:", np.round(w2, 4))
print("mean z of the tokens:", np.round([p[:, -1].mean() for p in tokens.points], 4))
print(f"self-weight e^beta = {np.exp(beta):.0f} against N - 1 = {len(x0) - 1} others of weight ~1")
print("mass defect:", abs(zonal.mass - 1).max(), "  smallest band mass:", zonal.masses.min())

# %%
fig, axes = plt.subplots(1, len(times), figsize=(15, 3.2), sharey=False)
mid = 0.5 * (zonal.edges[1:] + zonal.edges[:-1])
for i, ax in enumerate(axes):
    z = tokens.points[i][:, -1]
    lo, hi = np.quantile(z, [0.0005, 0.9995])
    pad = 0.1 * (hi - lo) + 1e-3
    bins = np.linspace(lo - pad, min(1.0, hi + pad), 40)
    ax.hist(z, bins=bins, density=True, color="0.75", label="2000 tokens")
    ax.plot(mid, zonal.law_density(i), "C3", lw=1.5, label="zonal solver")
    ax.set_xlim(bins[0], bins[-1])
    ax.set_title(f"t = {times[i]:g}   $W_2$ = {w2[i]:.1e}", fontsize=9)
    ax.set_xlabel("z = <x, e>")
axes[0].set_ylabel("law of z")
axes[0].legend(fontsize=8)
fig.suptitle(
    f"SA, beta = {beta:g}, on $S^{{{d - 1}}}$: the upper hemisphere collapses to the pole",
    fontsize=10,
)
fig.tight_layout()
if os.environ.get("WFLOW_STATIC"):
    static = Path(__file__).resolve().parents[1] / "docs" / "_static"
    static.mkdir(exist_ok=True)
    fig.savefig(static / "zonal_collapse.png", dpi=100)
plt.show()
