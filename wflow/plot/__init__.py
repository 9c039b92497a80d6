r"""Figures and animations of wflow results (matplotlib).

Every function works on every result kind that makes sense for it, recognised by its
attributes rather than its class:

* particles (:func:`~wflow.solvers.particles.simulate`): points on :math:`S^1` or :math:`S^2` (3-D view
  or map); higher dimensions by their first three principal axes;
* densities (:func:`~wflow.solvers.eulerian.solve_density`, :func:`~wflow.solvers.jko.jko` on a mesh or
  a point cloud): a :math:`\theta`--:math:`t` heat map on :math:`S^1`, filled Voronoi
  cells on a Mollweide map on :math:`S^2`;
* Lagrangian nodes (:func:`~wflow.solvers.lagrangian.solve_lagrangian`): moving nodes coloured by the
  density they carry.

The module never selects a matplotlib backend.  Functions that draw one panel take ``ax=``
and return the :class:`~matplotlib.axes.Axes`; functions that draw several take ``fig=`` and
return the :class:`~matplotlib.figure.Figure`.  Without them a new pyplot figure is made,
except when a ``path`` is given: then a plain :class:`~matplotlib.figure.Figure` is written.
Asking for a picture a function cannot draw raises :class:`TypeError` naming the function that
draws it.
"""

from ._animate import animate
from ._diagnostics import plot_diagnostics, plot_energy
from ._particles import plot_particles
from ._summary import plot_density, plot_trajectory, plot_zonal, zonal_heatmap
from ._sweep import plot_sweep
from ._views import describe

__all__ = [
    "describe",
    "plot_particles",
    "plot_density",
    "plot_energy",
    "plot_diagnostics",
    "plot_trajectory",
    "plot_zonal",
    "zonal_heatmap",
    "plot_sweep",
    "animate",
]
