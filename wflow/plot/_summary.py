"""Figures that combine panels: :func:`plot_trajectory` (the summary ``wflow run`` writes),
:func:`plot_zonal`, and :func:`plot_density`'s front door (its older call form draws a summary).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ._density import circle_heatmap, circle_profiles, legacy_density, sphere_maps
from ._diagnostics import (
    diag_panel,
    diagnostic_series,
    n_eff_from_energy,
    progress_series,
    summary_series,
)
from ._draw import (
    color_norm,
    density_map,
    new_axes,
    new_figure,
    pooled_heatmap,
    progress_indices,
    save_figure,
    save_index,
)
from ._particles import plot_particles
from ._views import (
    DensitiesView,
    ParticlesView,
    densities_view,
    describe,
    particles_view,
    result_config,
    result_kind,
    sphere_label,
    type_name,
)

__all__ = ["plot_density", "plot_trajectory", "plot_zonal", "zonal_heatmap"]


def plot_density(
    result: Any,
    index: Any = None,
    *args: Any,
    ax: Any = None,
    fig: Any = None,
    view: str | None = None,
    norm: str = "log",
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str = "magma",
    colorbar: bool = True,
    n_snapshots: int = 4,
    system: int = 0,
    energy: Any = None,
    title: str | None = None,
):
    r"""Draw a density run: a heat map on :math:`S^1`, filled-cell maps on :math:`S^2`.

    Parameters
    ----------
    result : DensityTrajectory, JKOResult or LagrangianSolution
        A density result (finite volume, JKO on a mesh or point cloud, Lagrangian nodes).
    index : int or sequence of int, optional
        Save indices (default ``n_snapshots`` evenly spaced): the profiles on :math:`S^1`; on
        :math:`S^2` an int draws one map on ``ax``, a sequence one map per save on ``fig``, on
        one colour scale.
    ax, fig : optional
        Axes for a one-panel picture, figure for several.
    view : {"heatmap", "profile", "map"}, optional
        ``"heatmap"`` (default on :math:`S^1`): :math:`\theta` across, :math:`t` up;
        ``"profile"``: :math:`\rho(\theta)` at a few times; ``"map"`` (the only view on
        :math:`S^2`): Mollweide maps of the cells.
    norm : {"log", "linear"}
        Colour scale (log: down to :math:`10^{-6}` of the maximum unless ``vmin`` is given).
    vmin, vmax : float, optional
        Ends of the colour scale (default: the data's).
    cmap : str
    colorbar : bool
    n_snapshots : int
    system : int
        Which system of a batched Lagrangian run.
    energy : array_like, optional
        Only with the ``plot_density(times, values, centers, path)`` call form.
    title : str, optional

    Returns
    -------
    matplotlib.axes.Axes or matplotlib.figure.Figure
        The axes for one panel, the figure for several maps.

    Notes
    -----
    The older call form ``plot_density(times, values, centers, path, energy=..., title=...)``
    with raw arrays (values shape ``(k, M)``, centres ``(M, d)``) draws the
    :func:`plot_trajectory` summary of those arrays and writes it to ``path``.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import numpy as np, wflow
    >>> rho0 = wflow.Density.from_function(wflow.CircleMesh(64), lambda x: 1 + 0.1 * x[:, 0])
    >>> res = wflow.solve_density(wflow.USA(beta=2.0), rho0, 1.0, save_at=np.linspace(0, 1, 5))
    >>> ax = wflow.plot.plot_density(res)
    >>> ax.get_ylabel()
    't'
    """
    if isinstance(result, np.ndarray) or (
        isinstance(result, (list, tuple)) and index is not None and not np.isscalar(index)
    ):
        centers = args[0] if args else None
        path = args[1] if len(args) > 1 else None
        if centers is None:
            raise TypeError("plot_density(times, values, centers, path=None) needs centers")
        dens = legacy_density(result, index, centers, energy)
        return plot_trajectory(dens, path, fig=fig, title=title or "")
    if args:
        raise TypeError(
            "plot_density(result, index=None, *, ax=None, ...) takes one result and an index"
        )
    dens = densities_view(result, system)
    views = ("heatmap", "profile") if dens.d == 2 else ("map",)
    view = view or views[0]
    if view not in views:
        raise ValueError(
            f"view must be one of {views} for densities on {sphere_label(dens.d)}, got {view!r}"
        )
    if view == "heatmap":
        return circle_heatmap(dens, ax, norm, vmin, vmax, cmap, colorbar, title)
    if view == "profile":
        return circle_profiles(dens, index, ax, norm, n_snapshots, title)
    return sphere_maps(dens, index, ax, fig, norm, vmin, vmax, cmap, colorbar, n_snapshots, title)


def plot_trajectory(
    result: Any,
    path: str | Path | None = None,
    *,
    fig: Any = None,
    n_snapshots: int = 4,
    system: int = 0,
    title: str | None = None,
    dpi: int = 110,
):
    r"""The summary figure of a run (the one ``wflow run`` writes): snapshots above time series.

    Particles: the particles at ``n_snapshots`` times and, on :math:`S^1`, their angles against
    time.  Densities on :math:`S^1`: the :math:`\theta`--:math:`t` heat map and profiles; on
    :math:`S^2`: maps of the cells at ``n_snapshots`` times on one colour scale.  Zonal runs:
    :func:`plot_zonal`'s law of :math:`z` and its :math:`z`--:math:`t` heat map.  Bottom row: the
    time series the run recorded, with the snapshot times marked.

    The snapshot times follow the run's progress: the first and last saves, and between them the
    saves where :math:`\log N_{\mathrm{eff}}` (else the order parameter, the energy, ...) has done
    1/3, 2/3, ... of its total change.

    Parameters
    ----------
    result : any wflow result
    path : str or Path, optional
        Write the figure there (PNG, PDF, SVG, by suffix); the figure is then not
        registered with pyplot.
    fig : matplotlib Figure, optional
    n_snapshots : int
    system : int
        Which system of a batched run.
    title : str, optional
        Default :func:`describe` (model, β, n, d, mesh, method).
    dpi : int

    Returns
    -------
    matplotlib.figure.Figure
        ``fig.wflow_snapshots`` holds the save indices of the snapshots drawn.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import wflow
    >>> traj = wflow.simulate(wflow.SA(beta=4.0), wflow.sphere.uniform(32, 3, seed=0), 1.0)
    >>> fig = wflow.plot.plot_trajectory(traj)
    >>> fig.get_suptitle()
    'SA, β = 4 — n = 32 tokens on S² (d = 3), dopri5'
    """
    if getattr(result, "kind", None) == "zonal":  # five snapshots: it travels, then collapses
        n = n_snapshots if n_snapshots != 4 else 5
        return _zonal_summary(result, path, fig=fig, n_snapshots=n, title=title, dpi=dpi)
    kind = result_kind(result)
    times, diag, cfg = diagnostic_series(result, system)
    names = summary_series(diag)
    prog = progress_series(diag)
    idx = progress_indices(
        times, None if prog is None else prog[1], n_snapshots, log=bool(prog and prog[2])
    )
    view: ParticlesView | DensitiesView
    if kind in ("particles", "lagrangian"):
        view = particles_view(result, system)
        ncol = len(idx) + (view.d == 2 and kind == "particles")
    else:
        view = densities_view(result, system)
        ncol = 2 if view.d == 2 else len(idx)
    fig = new_figure(fig, path=path, figsize=(max(3.3 * ncol, 7.0), 6.6))
    rows = fig.add_gridspec(2, 1)  # each row its own columns
    grid = rows[0].subgridspec(1, max(ncol, 1))
    cols = grid.ncols
    if isinstance(view, ParticlesView):
        axes = []
        shape = "circle" if view.d == 2 else "3d"
        for j, i in enumerate(idx):
            a = fig.add_subplot(grid[0, j], projection=None if view.d == 2 else "3d")
            plot_particles(view, i, ax=a, view=shape, colorbar=False, title=f"t = {times[i]:.3g}")
            if view.d == 2:
                a.set_axis_off()
            axes.append(a)
        if view.color is not None:
            fig.colorbar(axes[-1].collections[-1], ax=axes, label="density ρ", shrink=0.6)
        if view.d == 2 and kind == "particles":
            a = fig.add_subplot(grid[0, len(idx) :])
            plot_particles(view, ax=a, view="angle", title="angles θᵢ(t)")
    elif view.d == 2:
        half = max(cols // 2, 1)
        plot_density(view, ax=fig.add_subplot(grid[0, :half]), title="density ρ(θ, t)")
        right = fig.add_subplot(grid[0, half:])
        plot_density(view, idx, ax=right, view="profile", title="profiles")
    else:
        scale = color_norm(view.values[idx], "log", None, None)
        cache: dict = {}
        axes = []
        for j, i in enumerate(idx):
            a = fig.add_subplot(grid[0, j], projection="mollweide")
            art = density_map(a, view, i, scale, "magma", cache)
            a.set_title(f"t = {times[i]:.3g}")
            axes.append(a)
        fig.colorbar(art, ax=axes, label="density ρ", orientation="horizontal", shrink=0.5)
    _series_row(fig, rows[1], times, names, diag, cfg, times[idx])
    fig.suptitle(title if title is not None else describe(result))
    fig.wflow_snapshots = np.asarray(idx)
    save_figure(fig, path, dpi)
    return fig


def _series_row(fig, spec, times, names, diag, cfg, marks) -> None:
    """The time-series panels of a summary figure, side by side in equal widths on ``spec``."""
    row = spec.subgridspec(1, max(len(names), 1))
    for j, name in enumerate(names):
        diag_panel(fig.add_subplot(row[0, j]), times, name, diag[name], cfg, marks=marks)


def _zonal_diagnostics(result: Any, cfg: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    diag = {"mean_z": np.asarray(result.mean_z, dtype=float)}
    energy = np.asarray(result.energy, dtype=float)
    if np.all(np.isfinite(energy)):
        diag["energy"] = energy
        n_eff = n_eff_from_energy(energy, cfg if cfg is not None else result_config(result))
        if n_eff is not None:
            diag["n_eff"] = n_eff
    diag["max_density"] = np.max(
        np.asarray(result.masses, float) / np.diff(np.asarray(result.edges, float)), axis=1
    )
    return diag


def _zonal_summary(result, path, *, fig, n_snapshots, title, dpi):
    """plot_trajectory of a zonal run: the law of z at snapshot times and its z--t heat map, over the time
    series (energy, mean of z, maximum of the law's density)."""
    times = np.asarray(result.times, dtype=float)
    cfg = result_config(result)
    diag = _zonal_diagnostics(result, cfg)
    prog = progress_series(diag)  # the mean of z: the law travels to the pole before E_beta moves
    idx = progress_indices(times, None if prog is None else prog[1], n_snapshots)
    names = [n for n in ("energy", "mean_z", "n_eff") if n in diag] or ["max_density"]
    fig = new_figure(fig, path=path, figsize=(10.0, 6.6))
    rows = fig.add_gridspec(2, 1)
    top = rows[0].subgridspec(1, 2)
    plot_zonal(result, ax=fig.add_subplot(top[0, 0]), index=idx)
    zonal_heatmap(result, ax=fig.add_subplot(top[0, 1]))
    _series_row(fig, rows[1], times, names, diag, cfg, times[idx])
    fig.suptitle(title if title is not None else describe(result))
    fig.wflow_snapshots = np.asarray(idx)
    save_figure(fig, path, dpi)
    return fig


def zonal_heatmap(result: Any, *, ax: Any = None, cmap: str = "magma"):
    r"""The density of the law of :math:`z = \langle x, e\rangle` of a zonal run on the :math:`z`--:math:`t`
    plane (log colour scale, eight decades, max-pooled to the image like every heat map). Returns the Axes."""
    ax = new_axes(ax, figsize=(6, 4))
    edges = np.asarray(result.edges, dtype=float)
    z = 0.5 * (edges[1:] + edges[:-1])
    p = np.asarray(result.masses, float) / np.diff(edges)
    top = float(np.nanmax(p))
    from matplotlib.colors import LogNorm

    art = pooled_heatmap(
        ax,
        z,
        result.times,
        p,
        norm=LogNorm(top * 1e-8, top, clip=True),
        cmap=cmap,
        x_range=(float(edges[0]), float(edges[-1])),
    )
    ax.figure.colorbar(art, ax=ax, label="density of the law of z")
    ax.set(xlabel="z = <x, e>", ylabel="t", title="law of z against t")
    return ax


def plot_zonal(result: Any, *, ax: Any = None, n_snapshots: int = 5, index: Any = None):
    r"""The law of :math:`z = \langle x, e\rangle` of a zonal run (:func:`wflow.solvers.zonal.solve_zonal`) at
    ``n_snapshots`` saved times, on a log scale (the density of the law, bands' masses over their widths).

    The times follow the run's progress (as in :func:`plot_trajectory`, by the mean of :math:`z`);
    ``index`` picks the saves instead.  Returns the Axes.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import numpy as np, wflow
    >>> r = wflow.solve_zonal(wflow.SA(beta=2.0), lambda z: np.exp(z), 1.0, d=3, n_cells=16, save_at=[0.0, 0.5, 1.0])
    >>> ax = wflow.plot.plot_zonal(r)
    >>> ax.get_xlabel(), ax.get_yscale(), len(ax.lines)  # one curve per saved time
    ('z = <x, e>', 'log', 3)
    """
    if getattr(result, "kind", None) != "zonal":
        raise TypeError(
            f"plot_zonal draws zonal runs (wflow.solvers.zonal.solve_zonal); got a {type_name(result)}: use "
            f"wflow.plot.plot_trajectory or plot_density"
        )
    ax = new_axes(ax, figsize=(6, 4))
    k = len(result.times)
    z = 0.5 * (result.edges[1:] + result.edges[:-1])
    top = 0.0
    if index is None:
        prog = progress_series(_zonal_diagnostics(result))
        index = progress_indices(
            np.asarray(result.times, float), None if prog is None else prog[1], n_snapshots
        )
    for i in [save_index(i, k) for i in np.atleast_1d(index)]:
        p = result.law_density(i)
        top = max(top, float(np.max(p)))
        ax.plot(z, p, label=f"t = {result.times[i]:.3g}")
    ax.set_yscale("log")
    ax.set_ylim(top * 1e-8, top * 3)  # eight decades: the tails of high dimensions reach 1e-300
    ax.set_xlabel("z = <x, e>")
    ax.set_ylabel("density of the law of z")
    ax.set_title("law of z at the snapshot times")
    ax.legend(fontsize=7)
    return ax
