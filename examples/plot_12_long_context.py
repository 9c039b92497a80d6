"""
Long context: the phase transition of one attention layer at beta = gamma log n
===============================================================================

n equiangular tokens of cosine rho pass through one Pre-LN softmax attention layer with
beta = gamma log n.  Every token sees itself with weight e^beta and the n - 1 others with
e^{beta rho}, so the output cosine is a closed form of n (``wflow.theory.long_context_cosine``);
as n grows it tends to 1, 4 rho/(1 + 3 rho) or rho as gamma is below, at or above
gamma_c = 1/(1 - rho).  Left: the closed form for n = 10^2 ... 10^6 (lines) and wflow's kernel
sums on explicit equiangular tokens in d = n for n = 100, 400 (dots).  Right: the (rho, gamma)
map at n = 10^6 with the line gamma = 1/(1 - rho).  ``wflow validate long-context`` runs the study.
"""

import matplotlib.pyplot as plt
import numpy as np

from wflow import theory
from wflow.studies.long_context import direct_cosines

rho = 0.5
gc = 1 / (1 - rho)
g = np.linspace(0.0, 3.0, 301) * gc
fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
for k, n in enumerate([1e2, 1e3, 1e4, 1e5, 1e6]):
    ax.plot(
        g, theory.long_context_cosine(rho, g, n), color=plt.cm.viridis(k / 4), label=f"n = {n:.0e}"
    )
for n, mk in ((100, "o"), (400, "s")):
    gs = np.linspace(0.2, 3.0, 8) * gc
    ax.plot(
        gs,
        [direct_cosines(n, rho, x)[0] for x in gs],
        mk,
        color="k",
        ms=4,
        mfc="none",
        label=f"kernel sums, n = {n}",
    )
ax.plot([0, gc], [1, 1], "k--", lw=1)
ax.plot([gc, g[-1]], [rho, rho], "k--", lw=1, label="limit n -> inf")
ax.plot([gc], [4 * rho / (1 + 3 * rho)], "ro", label="4 rho / (1 + 3 rho)")
ax.set(
    xlabel="gamma = beta / log n", ylabel="output cosine", title=f"rho = {rho}: gamma_c = {gc:g}"
)
ax.legend(fontsize=7)

r = np.linspace(0.02, 0.98, 150)
gg = np.linspace(0.01, 10, 150)
R, G = np.meshgrid(r, gg)
im = ax2.pcolormesh(
    R, G, (theory.long_context_cosine(R, G, 1e6) - R) / (1 - R), shading="auto", cmap="magma"
)
ax2.plot(r, 1 / (1 - r), "c-", label="gamma = 1/(1 - rho)")
ax2.set(
    xlabel="rho (input cosine)",
    ylabel="gamma",
    ylim=(0, 10),
    title="n = 1e6: (cos - rho)/(1 - rho)",
)
ax2.legend(fontsize=7, loc="upper left")
fig.colorbar(im, ax=ax2, label="1: collapse, 0: identity")
