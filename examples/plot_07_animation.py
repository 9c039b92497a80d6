"""
Animations
==========

:func:`wflow.plot.animate` writes one frame per save time, as a GIF (with Pillow,
always available) or an MP4 (when ``imageio-ffmpeg`` is installed). It works on
particles on :math:`S^1` and :math:`S^2` and on densities (a profile on :math:`S^1`, a
cell map on :math:`S^2`). Here: tokens clustering on the sphere, and the density of the
continuum equation on a Voronoi mesh of :math:`S^2`; a few frames of each GIF are shown
below.
"""

# %%
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from PIL import Image

import wflow
import wflow.plot as wp

out = Path(tempfile.mkdtemp())
traj = wflow.simulate(
    wflow.SA(beta=9.0), wflow.sphere.uniform(300, 3, seed=0), 12.0, save_at=np.linspace(0, 12, 25)
)
gif = wp.animate(traj, out / "tokens.gif", fps=6)

mesh = wflow.SphereMesh(8)  # 642 cells
rho0 = wflow.Density.from_function(mesh, lambda x: 1 + 0.2 * x[:, 2] + 0.1 * x[:, 0] * x[:, 1])
res = wflow.solve_density(wflow.SA(beta=6.0), rho0, 4.0, save_at=np.linspace(0, 4, 9))
gif2 = wp.animate(res, out / "density.gif", fps=4)
print(gif.name, gif.stat().st_size // 1024, "kB;", gif2.name, gif2.stat().st_size // 1024, "kB")


# %%
# Frames of the two animations.
def frames(path, which):
    with Image.open(path) as im:
        shots = []
        for i in which:
            im.seek(i)
            shots.append(np.asarray(im.convert("RGB")))
    return shots


fig, axes = plt.subplots(2, 3, figsize=(12, 7), layout="constrained")
for ax, img in zip(axes[0], frames(gif, [0, 8, 24])):
    ax.imshow(img)
    ax.set_axis_off()
for ax, img in zip(axes[1], frames(gif2, [0, 4, 8])):
    ax.imshow(img)
    ax.set_axis_off()
plt.show()
