"""Drawing helpers shared by the figures: new figures and axes, coordinates, colour scales, cell maps.

:func:`cell_polygons` and :func:`density_map` draw the Voronoi cells of an :math:`S^2` mesh
(or of a point cloud) filled with their densities on a map projection.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._views import CentersMesh, DensitiesView

GEO = ("mollweide", "hammer", "aitoff", "lambert")


def new_figure(fig: Any = None, *, path: Any = None, figsize: tuple[float, float] = (8, 5)):
    if fig is not None:
        return fig
    if path is not None:
        from matplotlib.figure import Figure

        return Figure(figsize=figsize, layout="constrained")
    import matplotlib.pyplot as plt

    return plt.figure(figsize=figsize, layout="constrained")


def new_axes(
    ax: Any = None, *, projection: str | None = None, figsize: tuple[float, float] = (5, 4)
):
    if ax is not None:
        return ax
    fig = new_figure(figsize=figsize)
    return fig.add_subplot(projection=projection)


def save_figure(fig: Any, path: Any, dpi: int = 110) -> None:
    if path is not None:
        fig.savefig(path, dpi=dpi)


def project3(x: np.ndarray) -> np.ndarray:
    """Coordinates for a 3-D picture: as is for d = 3, first three principal axes for d > 3."""
    if x.shape[-1] == 3:
        return x
    c = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(c, full_matrices=False)
    return x @ vt[:3].T


def circle_angles(x: np.ndarray) -> np.ndarray:
    return np.mod(np.arctan2(x[..., 1], x[..., 0]), 2 * np.pi)


def theta_axis(ax: Any, **kw: Any) -> None:
    """The angle on S^1 across, [0, 2π] with ticks at multiples of π/2 (``kw``: more ``ax.set``)."""
    ax.set(xlim=(0, 2 * np.pi), xlabel="θ", **kw)
    ax.set_xticks(np.arange(5) * np.pi / 2, ["0", "π/2", "π", "3π/2", "2π"])


def lonlat(x: np.ndarray, degrees: bool) -> tuple[np.ndarray, np.ndarray]:
    x = project3(x) if x.shape[-1] > 3 else x
    r = np.linalg.norm(x, axis=-1)
    lon = np.arctan2(x[..., 1], x[..., 0])
    lat = np.arcsin(np.clip(x[..., 2] / r, -1.0, 1.0))
    return (np.degrees(lon), np.degrees(lat)) if degrees else (lon, lat)


def save_index(i: int, k: int) -> int:
    j = int(i)
    if not -k <= j < k:
        raise IndexError(f"save index {i} out of range for a result with {k} saves")
    return j % k


def snapshot_indices(k: int, n: int) -> np.ndarray:
    return np.unique(np.linspace(0, k - 1, max(1, min(n, k))).round().astype(int))


def progress_indices(
    times: np.ndarray,
    series: np.ndarray | None,
    n: int,
    *,
    log: bool = False,
    weight: float = 0.5,
) -> np.ndarray:
    r"""``n`` save indices chosen from a run's own progress: the first, the last, and between them the saves
    where the run's progress first reaches :math:`m/(n-1)`, :math:`m = 1, \dots, n-2`.

    The progress mixes how much ``series`` has changed and how much time has passed,

    .. math::

        c_i = w\,\frac{\sum_{j<i} |s_{j+1} - s_j|}{\sum_j |s_{j+1} - s_j|} + (1 - w)\,\frac{t_i - t_0}{t_{k-1} - t_0},

    (of :math:`\log s` with ``log=True``; :math:`w` = ``weight``): about half the snapshots follow
    the change and half the clock, so a collapse over by :math:`t = 5` of 30 gets snapshots while it
    happens and the long rest still gets one.  A pick that repeats is replaced by the save halfway,
    in progress, through the largest share of progress left between two picks.  Where the series is
    missing or constant the snapshots are evenly spaced in time (:func:`snapshot_indices`).

    Examples
    --------
    >>> t = np.linspace(0, 30, 31)
    >>> progress_indices(t, np.tanh(t - 3), 5).tolist()  # the change near t = 3 gets two snapshots
    [0, 3, 4, 16, 30]
    >>> progress_indices(t, t, 4).tolist()  # steady change: equally spaced
    [0, 10, 20, 30]
    """
    k = len(times)
    if n >= k:
        return np.arange(k)
    if n <= 1:
        return np.array([k - 1])
    even = snapshot_indices(k, n)
    if series is None:
        return even
    s = np.asarray(series, dtype=float).reshape(k, -1)[:, 0]
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.log(np.where(s > 0, s, np.nan))
    steps = np.abs(np.diff(s))
    steps = np.where(np.isfinite(steps), steps, 0.0)
    total = steps.sum()
    t = np.asarray(times, dtype=float)
    span = t[-1] - t[0]
    if not total > 0 or not span > 0:
        return even
    c = (
        weight * np.concatenate([[0.0], np.cumsum(steps)]) / total
        + (1 - weight) * (t - t[0]) / span
    )
    # (a level reached within rounding of a save counts as reached there)
    picks = [int(np.searchsorted(c, m / (n - 1) - 1e-12)) for m in range(1, n - 1)]
    chosen = sorted({0, k - 1, *picks})
    while len(chosen) < n:  # a repeated pick: split the largest share of progress left
        gaps = [(c[b] - c[a], a, b) for a, b in zip(chosen[:-1], chosen[1:]) if b - a > 1]
        if not gaps:
            break
        _, a, b = max(gaps)
        inner = np.arange(a + 1, b)
        i = int(inner[np.argmin(np.abs(c[inner] - 0.5 * (c[a] + c[b])))])
        chosen = sorted(chosen + [i])
    return np.asarray(chosen, dtype=int)


def max_pool(values: np.ndarray, cells: np.ndarray, bins: np.ndarray, axis: int = -1) -> np.ndarray:
    """The maximum of ``values`` over the cells (edges ``cells``, sorted, one more than the cells along
    ``axis``) that overlap each bin (edges ``bins``): every peak of the data survives, whatever the bin
    width, and a bin inside one wide cell takes that cell's value.  NaN for a bin no cell overlaps.

    Examples
    --------
    >>> v = np.array([[0.0, 0.0, 5.0, 0.0, 0.0, 1.0]])
    >>> max_pool(v, np.arange(7.0), np.array([0.0, 3.0, 6.0])).tolist()
    [[5.0, 1.0]]
    >>> max_pool(v, np.arange(7.0), np.array([2.0, 2.5, 3.0])).tolist()  # bins inside one cell
    [[5.0, 5.0]]
    """
    v = np.moveaxis(np.asarray(values, dtype=float), axis, -1)
    v = np.where(np.isfinite(v), v, -np.inf)
    cells = np.asarray(cells, dtype=float)
    bins = np.asarray(bins, dtype=float)
    first = np.searchsorted(cells, bins[:-1], side="right") - 1  # the cell of each bin's left end
    last = np.searchsorted(cells, bins[1:], side="left")  # one past the cell holding its right end
    first = np.clip(first, 0, v.shape[-1])
    last = np.clip(last, 0, v.shape[-1])
    out = np.full(v.shape[:-1] + (len(bins) - 1,), -np.inf)
    for j in range(len(bins) - 1):  # (a few hundred bins)
        if last[j] > first[j]:
            out[..., j] = v[..., first[j] : last[j]].max(axis=-1)
    out[np.isneginf(out)] = np.nan
    return np.moveaxis(out, -1, axis)


def _pixels(ax: Any) -> tuple[float, float]:
    """The axes' size in pixels at the figure's dpi (its position before any layout: an upper bound)."""
    fig = ax.figure
    w, h = fig.get_size_inches() * fig.dpi
    pos = ax.get_position()
    return float(pos.width * w), float(pos.height * h)


def _edges(x: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """Edges of cells centred at the sorted ``x``: midpoints, and ``lo``/``hi`` (or half a gap out) at the ends."""
    x = np.asarray(x, dtype=float)
    if x.size == 1:
        return np.array([x[0] - 0.5, x[0] + 0.5])
    mid = 0.5 * (x[1:] + x[:-1])
    first = x[0] - (mid[0] - x[0]) if lo is None else lo
    last = x[-1] + (x[-1] - mid[-1]) if hi is None else hi
    return np.concatenate([[first], mid, [last]])


def pooled_heatmap(
    ax: Any,
    x: np.ndarray,
    t: np.ndarray,
    values: np.ndarray,
    *,
    norm: Any,
    cmap: str,
    x_range: tuple[float, float] | None = None,
    pixels_per_cell: float = 3.0,
):
    """A heat map of ``values`` ``(len(t), len(x))`` (``x`` sorted) that keeps one-cell peaks visible.

    Where there are more cells (or saves) than the axes have pixels / ``pixels_per_cell``, the
    data are max-pooled onto that many equal bins first (:func:`max_pool`): a cluster one cell
    wide stays in the picture at any image size.  Returns the QuadMesh.
    """
    x = np.asarray(x, dtype=float)
    t = np.asarray(t, dtype=float)
    v = np.asarray(values, dtype=float)
    wpx, hpx = _pixels(ax)
    lo, hi = x_range if x_range is not None else (None, None)
    xe = _edges(x, lo, hi)
    nx = max(8, int(wpx / pixels_per_cell))
    if x.size > nx:
        bins = np.linspace(xe[0], xe[-1], nx + 1)
        v, xe = max_pool(v, xe, bins, axis=1), bins
    te = _edges(t)
    nt = max(8, int(hpx / pixels_per_cell))
    if t.size > nt:
        bins = np.linspace(te[0], te[-1], nt + 1)
        v, te = max_pool(v, te, bins, axis=0), bins
    art = ax.pcolormesh(xe, te, np.ma.masked_invalid(v), cmap=cmap, norm=norm, rasterized=True)
    ax.set_xlim(xe[0], xe[-1])
    ax.set_ylim(te[0], te[-1])
    return art


def color_norm(values: np.ndarray, kind: str, vmin: float | None, vmax: float | None):
    """One colour scale for all the given values (log: down to 1e-6 of the maximum)."""
    from matplotlib.colors import LogNorm, Normalize

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    hi = float(v.max()) if v.size else 1.0
    if kind == "log":
        pos = v[v > 0]
        hi = hi if hi > 0 else 1.0
        lo = max(float(pos.min()), 1e-6 * hi) if pos.size else 1e-6 * hi
        lo, hi = (vmin or lo), (vmax or hi)
        if hi <= lo * 1.001:
            lo, hi = lo / 1.05, hi * 1.05
        return LogNorm(vmin=lo, vmax=hi, clip=True)
    if kind != "linear":
        raise ValueError(f"norm must be 'log' or 'linear', got {kind!r}")
    lo = float(v.min()) if v.size else 0.0
    lo, hi = (lo if vmin is None else vmin), (hi if vmax is None else vmax)
    if hi <= lo:
        lo, hi = lo - 0.5 * max(abs(lo), 1.0), hi + 0.5 * max(abs(hi), 1.0)
    return Normalize(vmin=lo, vmax=hi)


def sphere_outline(ax: Any) -> None:
    u, v = np.meshgrid(np.linspace(0, 2 * np.pi, 25), np.linspace(0, np.pi, 13))
    ax.plot_wireframe(
        np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.75", lw=0.4, alpha=0.6
    )
    ax.set_box_aspect((1, 1, 1))
    ax.set(xlim=(-1, 1), ylim=(-1, 1), zlim=(-1, 1))
    for axis, label in zip((ax.xaxis, ax.yaxis, ax.zaxis), ("x₁", "x₂", "x₃")):
        axis.set_ticks([])
        axis.set_label_text(label, fontsize="small")
        axis.labelpad = -12


def map_axes_labels(ax: Any) -> None:
    ax.set_xlabel("longitude")
    ax.set_ylabel("latitude")
    if ax.name in GEO:
        ax.set_xticklabels([])
        ax.set_yticklabels([])
        ax.grid(True, lw=0.3, color="0.6")


def cell_polygons(mesh: Any, degrees: bool) -> tuple[list[np.ndarray], np.ndarray]:
    """Polygons ``(lon, lat)`` of the cells of an S^2 mesh and the cell of each polygon.

    Uses the mesh's ``vertices``/``regions`` when it has them, else the spherical Voronoi
    diagram of its centres.  A cell across the antimeridian is drawn twice (shifted by
    ±360°, the map clips it); a cell around a pole is closed along the pole's latitude.
    """
    if hasattr(mesh, "vertices") and hasattr(mesh, "regions"):
        verts, regions = np.asarray(mesh.vertices, float), mesh.regions
    else:
        from scipy.spatial import SphericalVoronoi

        c = np.asarray(mesh.centers, float)
        sv = SphericalVoronoi(c / np.linalg.norm(c, axis=1, keepdims=True), threshold=1e-10)
        sv.sort_vertices_of_regions()
        verts, regions = sv.vertices, sv.regions
    lon_all, lat_all = lonlat(verts, degrees=False)
    polys, cells = [], []
    full, quarter = 2 * np.pi, np.pi / 2
    for i, reg in enumerate(regions):
        reg = np.asarray(reg, dtype=np.intp)
        lon, lat = lon_all[reg], lat_all[reg]
        step = np.diff(np.concatenate([lon, lon[:1]]))
        step = (step + np.pi) % full - np.pi
        winding = step.sum()
        if abs(winding) > np.pi:  # a pole inside the cell
            order = np.argsort(lon)
            lo, la = lon[order], lat[order]
            pole = quarter if np.mean(lat) > 0 else -quarter
            # close the strip at lon = ±pi with the latitude interpolated across the seam
            gap = lo[0] + full - lo[-1]
            edge = la[-1] + (la[0] - la[-1]) * (np.pi - lo[-1]) / gap if gap > 0 else la[0]
            ring = np.column_stack(
                [
                    np.concatenate([[-np.pi, -np.pi], lo, [np.pi, np.pi]]),
                    np.concatenate([[pole, edge], la, [edge, pole]]),
                ]
            )
            polys.append(ring)
            cells.append(i)
            continue
        lon_u = lon[0] + np.concatenate([[0.0], np.cumsum(step[:-1])])
        ring = np.column_stack([lon_u, lat])
        polys.append(ring)
        cells.append(i)
        if lon_u.max() > np.pi:
            polys.append(ring - [full, 0.0])
            cells.append(i)
        elif lon_u.min() < -np.pi:
            polys.append(ring + [full, 0.0])
            cells.append(i)
    if degrees:
        polys = [np.degrees(p) for p in polys]
    return polys, np.asarray(cells, dtype=np.intp)


def density_map(
    ax: Any, dens: DensitiesView, i: int, norm: Any, cmap: str, cache: dict | None = None
):
    """Filled cells (fixed meshes and point clouds) or coloured nodes (Lagrangian) on a map."""
    from matplotlib.collections import PolyCollection

    degrees = ax.name not in GEO
    vals = dens.values[i]
    if dens.moving is None:
        key = ("cells", degrees)
        if cache is None or key not in cache:
            polys, cells = cell_polygons(
                dens.mesh if dens.mesh is not None else CentersMesh(dens.cell_centers()), degrees
            )
            if cache is not None:
                cache[key] = (polys, cells)
        else:
            polys, cells = cache[key]
        art = PolyCollection(
            polys, array=vals[cells], cmap=cmap, norm=norm, edgecolors="face", linewidths=0.2
        )
        ax.add_collection(art, autolim=False)
        if degrees:
            ax.set(xlim=(-180, 180), ylim=(-90, 90))
    else:
        lon, lat = lonlat(dens.moving[i], degrees)
        art = ax.scatter(lon, lat, c=vals, s=6, cmap=cmap, norm=norm, linewidths=0)
    map_axes_labels(ax)
    return art
