"""Particles (tokens) of a run: angles against time or the circle on :math:`S^1`, a sphere or a map on :math:`S^2`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._draw import (
    GEO,
    circle_angles,
    color_norm,
    lonlat,
    map_axes_labels,
    new_axes,
    project3,
    save_index,
    sphere_outline,
    theta_axis,
)
from ._views import describe, particles_view, sphere_label

__all__ = ["plot_particles"]


def plot_particles(
    result: Any,
    index: int = -1,
    *,
    ax: Any = None,
    view: str | None = None,
    system: int = 0,
    size: float | None = None,
    color: Any = None,
    colorbar: bool = True,
    title: str | None = None,
):
    r"""Draw particles (tokens) of a run.

    Parameters
    ----------
    result : Trajectory, LagrangianSolution or JKOResult on a point cloud
        A particle result; Lagrangian nodes are coloured by their transported density
        (log scale), JKO atoms sized by their mass.
    index : int
        Save index of the snapshot (views ``"circle"``, ``"3d"``, ``"map"``).
    ax : matplotlib Axes, optional
        Where to draw; a ``"3d"`` view needs 3-D axes (``projection="3d"``), a ``"map"``
        view a geographic projection such as ``"mollweide"`` (or plain axes, in degrees).
    view : {"angle", "circle", "3d", "map"}, optional
        On :math:`S^1`: ``"angle"`` (default), every particle's angle :math:`\theta_i(t)` across
        against time up; ``"circle"`` one snapshot.  On :math:`S^2` (and higher, by the first
        three principal axes): ``"3d"`` (default) or ``"map"`` (longitude--latitude, Mollweide).
    system : int
        Which system of a batched run.
    size, color : optional
        Marker size and colour.
    colorbar : bool
        Colour bar of a Lagrangian run's density (one scale for all its saves).
    title : str, optional
        Default: the snapshot's time.

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    TypeError
        For a density result (use :func:`plot_density`).

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import wflow
    >>> traj = wflow.simulate(wflow.SA(beta=4.0), wflow.sphere.uniform(32, 2, seed=0), 2.0)
    >>> ax = wflow.plot.plot_particles(traj)
    >>> ax.get_xlabel()
    'θ'
    """
    p = particles_view(result, system)
    d = p.d
    views = ("angle", "circle") if d == 2 else ("3d", "map")
    view = view or views[0]
    if view not in views:
        raise ValueError(
            f"view must be one of {views} for points on {sphere_label(d)}, got {view!r}"
        )
    i = save_index(index, len(p.times))
    c = color
    norm = None
    if c is None and p.color is not None:
        c, norm = p.color[i], color_norm(p.color, "log", None, None)
    s = size if size is not None else (12.0 if p.points.shape[1] <= 200 else 4.0)
    sizes = s
    if p.kind == "atoms-density":
        w = p.weights[i]
        sizes = s * 0.5 + 4 * s * w / max(float(w.max()), 1e-300)
    if view == "angle":
        from matplotlib.collections import LineCollection

        ax = new_axes(ax)
        th = circle_angles(p.points)  # (k, n)
        t = np.broadcast_to(p.times[:, None], th.shape)
        if len(p.times) > 1:
            seg = np.stack(
                [np.stack([th[:-1], t[:-1]], -1), np.stack([th[1:], t[1:]], -1)], axis=-2
            )
            keep = np.abs(th[1:] - th[:-1]) < np.pi  # no line across the seam 2π -> 0
            alpha = float(np.clip(25.0 / th.shape[1], 0.04, 0.5))  # many tokens: fainter lines
            lines = LineCollection(seg[keep], colors=color or "C0", linewidths=0.6, alpha=alpha)
            ax.add_collection(lines)
        ax.scatter(th[-1], t[-1], s=s, color=color or "C0", zorder=3)
        t_end = p.times[-1] if p.times[-1] > p.times[0] else p.times[0] + 1
        theta_axis(ax, ylim=(p.times[0], t_end), ylabel="t")
        ax.set_title(
            title if title is not None else describe(result) if p.kind == "particles" else ""
        )
        return ax
    if view == "circle":
        ax = new_axes(ax)
        th = np.linspace(0, 2 * np.pi, 200)
        ax.plot(np.cos(th), np.sin(th), color="0.75", lw=0.8)
        x = p.points[i]
        art = ax.scatter(x[:, 0], x[:, 1], s=sizes, c=c, norm=norm, alpha=0.8, zorder=3)
        ax.set(aspect="equal", xlim=(-1.15, 1.15), ylim=(-1.15, 1.15), xlabel="x₁", ylabel="x₂")
    elif view == "3d":
        if ax is None:
            ax = new_axes(projection="3d", figsize=(5, 5))
        elif ax.name != "3d":
            raise ValueError("view='3d' needs 3-D axes: fig.add_subplot(projection='3d')")
        sphere_outline(ax)
        x = project3(p.points[i])
        art = ax.scatter(
            x[:, 0], x[:, 1], x[:, 2], s=sizes, c=c, norm=norm, alpha=0.8, depthshade=False
        )
    else:
        ax = new_axes(ax, projection="mollweide", figsize=(7, 4))
        lon, lat = lonlat(p.points[i], degrees=ax.name not in GEO)
        art = ax.scatter(lon, lat, s=sizes, c=c, norm=norm, alpha=0.8)
        map_axes_labels(ax)
    if norm is not None and colorbar:
        ax.figure.colorbar(art, ax=ax, label="density ρ", shrink=0.7)
    ax.set_title(title if title is not None else f"t = {p.times[i]:.3g}")
    return ax
