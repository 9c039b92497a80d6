"""Densities of a run: a heat map or profiles on :math:`S^1`, filled-cell maps on :math:`S^2`.

The front door, with the older call form on raw arrays, is :func:`wflow.plot.plot_density`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._draw import (
    circle_angles,
    color_norm,
    density_map,
    new_axes,
    new_figure,
    pooled_heatmap,
    save_index,
    snapshot_indices,
    theta_axis,
)
from ._views import CentersMesh, DensitiesView

__all__ = ["legacy_density", "circle_heatmap", "circle_profiles", "sphere_maps"]


def legacy_density(times: Any, values: Any, centers: Any, energy: Any) -> DensitiesView:
    times = np.asarray(times, dtype=float)
    values = np.asarray(values, dtype=float)
    centers = np.asarray(centers, dtype=float)
    if values.ndim != 2 or values.shape != (times.shape[0], centers.shape[0]):
        raise ValueError(
            f"values must have shape (len(times), len(centers)) = ({times.shape[0]}, "
            f"{centers.shape[0]}), got {values.shape}"
        )
    diag = {}
    if energy is not None and np.any(np.isfinite(energy)):
        diag["energy"] = np.asarray(energy, dtype=float)
    return DensitiesView(
        "density", times, values, centers, mesh=CentersMesh(centers), diagnostics=diag
    )


def circle_heatmap(
    dens: DensitiesView,
    ax: Any,
    norm: str,
    vmin: float | None,
    vmax: float | None,
    cmap: str,
    colorbar: bool,
    title: str | None,
):
    """The density on S^1 over time: angle across, time up (fixed cells, or moving nodes)."""
    k = len(dens.times)
    ax = new_axes(ax, figsize=(6, 4))
    scale = color_norm(dens.values, norm, vmin, vmax)
    if dens.moving is None:
        th = circle_angles(dens.cell_centers())
        order = np.argsort(th)
        if k > 1:  # (max-pooled to the axes' pixels: one-cell clusters stay visible)
            art = pooled_heatmap(
                ax,
                th[order],
                dens.times,
                dens.values[:, order],
                norm=scale,
                cmap=cmap,
                x_range=(0.0, 2 * np.pi),
            )
        else:
            art = ax.scatter(
                th[order],
                np.repeat(dens.times, th.size),
                c=dens.values[0, order],
                cmap=cmap,
                norm=scale,
                s=10,
            )
    else:
        th = circle_angles(dens.moving)
        art = ax.scatter(
            th.ravel(),
            np.repeat(dens.times, th.shape[1]),
            c=dens.values.ravel(),
            cmap=cmap,
            norm=scale,
            s=4,
            linewidths=0,
            rasterized=True,
        )
    theta_axis(ax, ylabel="t")
    if colorbar:
        ax.figure.colorbar(art, ax=ax, label="density ρ")
    ax.set_title(title if title is not None else "")
    return ax


def circle_profiles(
    dens: DensitiesView, index: Any, ax: Any, norm: str, n_snapshots: int, title: str | None
):
    """Profiles of the density on S^1 at a few saves (``index``, default ``n_snapshots`` of them)."""
    k = len(dens.times)
    ax = new_axes(ax, figsize=(6, 4))
    idx = (
        snapshot_indices(k, n_snapshots)
        if index is None
        else [save_index(i, k) for i in np.atleast_1d(index)]
    )
    for i in idx:
        th = circle_angles(dens.points(i))
        order = np.argsort(th)
        ax.plot(th[order], dens.values[i, order], label=f"t = {dens.times[i]:.3g}")
    if norm == "log":
        ax.set_yscale("log")
        top = float(np.nanmax(dens.values[idx]))
        if top > 0:  # eight decades (a collapsed profile reaches 1e-300 between its clusters)
            ax.set_ylim(top * 1e-8, top * 3)
    theta_axis(ax, ylabel="density ρ")
    ax.legend(fontsize="small")
    ax.set_title(title if title is not None else "")
    return ax


def sphere_maps(
    dens: DensitiesView,
    index: Any,
    ax: Any,
    fig: Any,
    norm: str,
    vmin: float | None,
    vmax: float | None,
    cmap: str,
    colorbar: bool,
    n_snapshots: int,
    title: str | None,
):
    """Maps of the density on S^2 (Mollweide): one on ``ax`` or at one save, else a row of them."""
    k = len(dens.times)
    single = ax is not None or (index is not None and np.isscalar(index))
    idx = (
        [save_index(index if index is not None else -1, k)]
        if single
        else (
            snapshot_indices(k, n_snapshots) if index is None else [save_index(i, k) for i in index]
        )
    )
    scale = color_norm(dens.values[idx], norm, vmin, vmax)
    cache: dict = {}
    if single:
        ax = new_axes(ax, projection="mollweide", figsize=(7, 4))
        art = density_map(ax, dens, idx[0], scale, cmap, cache)
        if colorbar:
            ax.figure.colorbar(art, ax=ax, label="density ρ", orientation="horizontal", shrink=0.6)
        ax.set_title(title if title is not None else f"t = {dens.times[idx[0]]:.3g}")
        return ax
    fig = new_figure(fig, figsize=(3.6 * len(idx), 2.9))
    axes = [fig.add_subplot(1, len(idx), j + 1, projection="mollweide") for j in range(len(idx))]
    art = None
    for a, i in zip(axes, idx):
        art = density_map(a, dens, i, scale, cmap, cache)
        a.set_title(f"t = {dens.times[i]:.3g}")
    if colorbar:
        fig.colorbar(art, ax=axes, label="density ρ", orientation="horizontal", shrink=0.5)
    if title:
        fig.suptitle(title)
    return fig
