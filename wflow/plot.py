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

The module is notebook-safe: it never selects a matplotlib backend.  Functions that
draw one panel take ``ax=`` and return the :class:`~matplotlib.axes.Axes`; functions
that draw several take ``fig=`` and return the :class:`~matplotlib.figure.Figure`.
Without ``ax``/``fig`` a new pyplot figure is made (so it shows inline in a notebook),
except when a ``path`` is given: then the figure is a plain
:class:`~matplotlib.figure.Figure`, written and not registered with pyplot.

Asking a function for a picture it cannot draw (a particle plot of a density, say)
raises :class:`TypeError` naming the result kind and the function that draws it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "describe",
    "plot_particles",
    "plot_density",
    "plot_energy",
    "plot_diagnostics",
    "plot_trajectory",
    "plot_zonal",
    "animate",
]

_GEO = ("mollweide", "hammer", "aitoff", "lambert")


# ----------------------------------------------------------------------------- normalised views
@dataclass
class _Particles:
    kind: str
    times: np.ndarray  # (k,)
    points: np.ndarray  # (k, n, d), one system
    weights: np.ndarray  # (k, n)
    color: np.ndarray | None = None  # (k, n): transported density of Lagrangian nodes
    diagnostics: dict[str, np.ndarray] = field(default_factory=dict)  # each (k,)
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def d(self) -> int:
        return int(self.points.shape[-1])


@dataclass
class _Densities:
    kind: str
    times: np.ndarray  # (k,)
    values: np.ndarray  # (k, M)
    centers: np.ndarray | None  # (M, d) fixed cells or atoms
    mesh: Any = None  # mesh with vertices/regions (S^2) when known
    moving: np.ndarray | None = None  # (k, M, d): Lagrangian nodes
    diagnostics: dict[str, np.ndarray] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def d(self) -> int:
        return int((self.centers if self.centers is not None else self.moving).shape[-1])

    def points(self, i: int) -> np.ndarray:
        return self.moving[i] if self.moving is not None else self.centers


@dataclass
class _CentersMesh:
    """Cell centres only (the ``plot_density(times, values, centers)`` call form)."""

    centers: np.ndarray

    @property
    def d(self) -> int:
        return int(self.centers.shape[1])


def _kind(result: Any) -> str:
    """``"particles"``, ``"density"``, ``"lagrangian"``, ``"atoms-density"`` or a TypeError.

    A result's ``kind`` attribute decides when it has one (``"jko"`` is a density on a mesh
    or on a point cloud); otherwise its attributes do.
    """
    if isinstance(result, (_Particles, _Densities)):
        return result.kind
    kind = getattr(result, "kind", None)
    if kind == "jko" or (
        kind is None and hasattr(result, "free_energy") and hasattr(result, "reference")
    ):
        return "density" if getattr(result, "mesh", None) is not None else "atoms-density"
    if kind in ("particles", "lagrangian", "density", "as-particles"):
        return kind
    if hasattr(result, "jacobian") and hasattr(result, "density"):
        return "lagrangian"
    if (
        hasattr(result, "values")
        and getattr(result, "mesh", None) is not None
        and hasattr(result, "times")
    ):
        return "density"
    if hasattr(result, "times") and hasattr(result, "weights") and hasattr(result, "points"):
        pts, w = np.asarray(result.points), np.asarray(result.weights)
        if pts.ndim == 2 and w.ndim == 2:  # JKO on a point cloud: fixed support, moving weights
            return "atoms-density"
        if pts.ndim >= 3:
            return "particles"
    raise TypeError(
        f"wflow.plot cannot draw a {type(result).__name__}: expected a result of wflow.simulate, "
        f"solve_density, solve_lagrangian or solvers.jko.jko"
    )


def _density_values(result: Any) -> np.ndarray:
    """Densities ``(k, M)`` w.r.t. cell areas (or reference volumes on a point cloud)."""
    if hasattr(result, "values"):
        return np.asarray(result.values, dtype=float)
    return np.asarray(result.weights, dtype=float) / np.asarray(result.reference, dtype=float)


def _name(result: Any) -> str:
    return type(result).__name__


def _pick(a: Any, k: int, system: int, what: str) -> np.ndarray | None:
    """Column ``system`` of a per-save diagnostic of shape ``(k, ...batch)``."""
    if a is None:
        return None
    a = np.asarray(a, dtype=float)
    if a.ndim == 0:
        return None
    a = a.reshape(k, -1)
    if not 0 <= system < a.shape[1]:
        raise ValueError(
            f"system must be in [0, {a.shape[1]}) for this result's {what}, got {system}"
        )
    return a[:, system]


def _particles(result: Any, system: int = 0) -> _Particles:
    kind = _kind(result)
    if isinstance(result, _Particles):
        return result
    if kind == "lagrangian":
        nodes = getattr(result, "trajectory", result)
        view = _particles(_AsParticles(nodes) if nodes is result else nodes, system)
        if hasattr(result, "rho0") and hasattr(result, "jacobian"):
            rho = np.asarray(result.rho0, dtype=float) / np.asarray(result.jacobian, dtype=float)
        else:
            rho = np.stack(
                [np.asarray(result.density(i)[1], dtype=float) for i in range(len(view.times))]
            )
        view.kind, view.color = "lagrangian", rho.reshape(view.points.shape[:2])
        return view
    if kind == "atoms-density":
        k = len(result.times)
        pts = np.broadcast_to(np.asarray(result.points, float), (k,) + np.shape(result.points))
        diag = {"energy": np.asarray(result.energy, float)}
        return _Particles(
            kind,
            np.asarray(result.times, float),
            pts,
            np.asarray(result.weights, float),
            diagnostics=diag,
            config=_config(result),
        )
    if kind not in ("particles", "as-particles"):
        raise TypeError(
            f"plot_particles draws particles; got a {_name(result)} (a density on a mesh): "
            f"use wflow.plot.plot_density"
        )
    times = np.asarray(result.times, dtype=float)
    k = len(times)
    pts = np.asarray(result.points)
    n, d = pts.shape[-2:]
    flat = pts.reshape(k, -1, n, d)
    if not 0 <= system < flat.shape[1]:
        raise ValueError(
            f"system must be in [0, {flat.shape[1]}) (the result holds {flat.shape[1]} systems), "
            f"got {system}"
        )
    w = np.asarray(result.weights, dtype=float).reshape(-1, n)
    w = w[system if w.shape[0] > 1 else 0]
    diag = {key: _pick(v, k, system, key) for key, v in getattr(result, "diagnostics", {}).items()}
    return _Particles(
        "particles",
        times,
        flat[:, system],
        np.broadcast_to(w, (k, n)),
        diagnostics={key: v for key, v in diag.items() if v is not None},
        config=_config(result),
    )


@dataclass
class _AsParticles:
    """A Lagrangian result seen as its nodes (a particle trajectory)."""

    result: Any
    kind: str = "as-particles"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.result, name)


def _densities(result: Any, system: int = 0, *, caller: str = "plot_density") -> _Densities:
    kind = _kind(result)
    if isinstance(result, _Densities):
        return result
    if kind == "density":
        mesh = result.mesh
        diag = {
            "energy": getattr(result, "energy", None),
            "mass": getattr(result, "mass", None),
            "free_energy": getattr(result, "free_energy", None),
        }
        k = len(result.times)
        diag = {key: _pick(v, k, 0, key) for key, v in diag.items()}
        return _Densities(
            kind,
            np.asarray(result.times, float),
            _density_values(result),
            np.asarray(mesh.centers, float),
            mesh=mesh,
            diagnostics={
                key: v for key, v in diag.items() if v is not None and np.any(np.isfinite(v))
            },
            config=_config(result),
        )
    if kind == "atoms-density":
        diag = {
            "energy": np.asarray(result.energy, float),
            "free_energy": np.asarray(result.free_energy, float),
        }
        return _Densities(
            kind,
            np.asarray(result.times, float),
            _density_values(result),
            np.asarray(result.points, float),
            diagnostics=diag,
            config=_config(result),
        )
    if kind == "lagrangian":
        view = _particles(result, system)
        return _Densities(
            kind,
            view.times,
            view.color,
            None,
            moving=view.points,
            diagnostics=view.diagnostics,
            config=view.config,
        )
    raise TypeError(
        f"{caller} draws densities; got a {_name(result)} (particles): use wflow.plot.plot_particles"
    )


def _config(result: Any) -> dict[str, Any]:
    cfg = getattr(result, "config", None)
    out = dict(cfg) if isinstance(cfg, dict) else {}
    for key in ("tau", "method", "scheme"):
        try:
            value = getattr(result, key, None)
        except (KeyError, TypeError, ValueError):
            value = None
        if key not in out and isinstance(value, (int, float, str)):
            out[key] = value
    out.setdefault("result", _name(result))
    return out


# ----------------------------------------------------------------------------- titles
def _sphere(d: int) -> str:
    return {2: "S¹", 3: "S²"}.get(d, f"S^{d - 1}")


def _model_label(spec: Any) -> str:
    if not isinstance(spec, dict):
        return ""
    kind = spec.get("type", "")
    if kind == "Sum":
        return " + ".join(_model_label(p) for p in spec.get("parts", []))
    if kind in ("SA", "USA"):
        label = f"{kind}, β = {float(spec.get('beta', 1.0)):g}"
        V = spec.get("V")
        if V is not None and np.allclose(np.asarray(V), -np.eye(len(V))):
            label += ", V = −I (repulsive)"
        return label
    if kind == "Perceptron":
        m = len(spec.get("A", []))
        return f"perceptron (m = {m}, {spec.get('activation', '')})"
    return str(kind)


def describe(result: Any) -> str:
    """A one-line human-readable title for a result: model, β, size, mesh, method.

    Parameters
    ----------
    result : result of a wflow solver
        Particles, densities, Lagrangian or JKO.

    Returns
    -------
    str

    Examples
    --------
    >>> import numpy as np, wflow
    >>> traj = wflow.simulate(wflow.SA(beta=4.0), wflow.sphere.uniform(10, 3, seed=0), 0.1)
    >>> wflow.plot.describe(traj)
    'SA, β = 4 — 10 tokens on S², rk4'
    """
    kind = _kind(result)
    cfg = _particles(result).config if kind in ("particles", "lagrangian") else _config(result)
    model = _model_label(cfg.get("model"))
    if kind == "particles":
        view = _particles(result)
        parts = [model, f"{view.points.shape[1]} tokens on {_sphere(view.d)}"]
        method = cfg.get("method") or cfg.get("solver")
        if isinstance(method, str) and method not in ("particles", "lagrangian"):
            parts[-1] += f", {method}"
        if cfg.get("kappa"):
            parts.append(f"κ = {float(cfg['kappa']):g}")
        return " — ".join(p for p in parts if p)
    if kind == "lagrangian":
        view = _particles(result)
        return " — ".join(
            p
            for p in ("Lagrangian", model, f"{view.points.shape[1]} nodes on {_sphere(view.d)}")
            if p
        )
    dens = _densities(result)
    mesh = dens.mesh
    if mesh is not None and hasattr(mesh, "n_cells"):
        where = f"{type(mesh).__name__}, {mesh.n_cells} cells on {_sphere(dens.d)}"
    else:
        where = f"{dens.values.shape[1]} points on {_sphere(dens.d)}"
    if cfg.get("result") == "JKOResult" or cfg.get("kind") == "jko" or cfg.get("tau"):
        solver = f"JKO, τ = {float(cfg['tau']):g}" if cfg.get("tau") else "JKO"
    else:
        solver = "finite volume"
    return " — ".join(p for p in (solver, model, where) if p)


# ----------------------------------------------------------------------------- figure helpers
def _figure(fig: Any = None, *, path: Any = None, figsize: tuple[float, float] = (8, 5)):
    if fig is not None:
        return fig
    if path is not None:
        from matplotlib.figure import Figure

        return Figure(figsize=figsize, layout="constrained")
    import matplotlib.pyplot as plt

    return plt.figure(figsize=figsize, layout="constrained")


def _axes(ax: Any = None, *, projection: str | None = None, figsize: tuple[float, float] = (5, 4)):
    if ax is not None:
        return ax
    fig = _figure(figsize=figsize)
    return fig.add_subplot(projection=projection)


def _save(fig: Any, path: Any, dpi: int = 110) -> None:
    if path is not None:
        fig.savefig(path, dpi=dpi)


def _project3(x: np.ndarray) -> np.ndarray:
    """Coordinates for a 3-D picture: as is for d = 3, first three principal axes for d > 3."""
    if x.shape[-1] == 3:
        return x
    c = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(c, full_matrices=False)
    return x @ vt[:3].T


def _angles(x: np.ndarray) -> np.ndarray:
    return np.mod(np.arctan2(x[..., 1], x[..., 0]), 2 * np.pi)


def _lonlat(x: np.ndarray, degrees: bool) -> tuple[np.ndarray, np.ndarray]:
    x = _project3(x) if x.shape[-1] > 3 else x
    r = np.linalg.norm(x, axis=-1)
    lon = np.arctan2(x[..., 1], x[..., 0])
    lat = np.arcsin(np.clip(x[..., 2] / r, -1.0, 1.0))
    return (np.degrees(lon), np.degrees(lat)) if degrees else (lon, lat)


def _index(i: int, k: int) -> int:
    j = int(i)
    if not -k <= j < k:
        raise IndexError(f"save index {i} out of range for a result with {k} saves")
    return j % k


def _snapshots(k: int, n: int) -> np.ndarray:
    return np.unique(np.linspace(0, k - 1, max(1, min(n, k))).round().astype(int))


def _norm(values: np.ndarray, kind: str, vmin: float | None, vmax: float | None):
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


def _sphere_outline(ax: Any) -> None:
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


def _map_axes_labels(ax: Any) -> None:
    ax.set_xlabel("longitude")
    ax.set_ylabel("latitude")
    if ax.name in _GEO:
        ax.set_xticklabels([])
        ax.set_yticklabels([])
        ax.grid(True, lw=0.3, color="0.6")


# ----------------------------------------------------------------------------- Voronoi cells on a map
def _cell_polygons(mesh: Any, degrees: bool) -> tuple[list[np.ndarray], np.ndarray]:
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
    lon_all, lat_all = _lonlat(verts, degrees=False)
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
            polys.append(ring), cells.append(i)
            continue
        lon_u = lon[0] + np.concatenate([[0.0], np.cumsum(step[:-1])])
        ring = np.column_stack([lon_u, lat])
        polys.append(ring), cells.append(i)
        if lon_u.max() > np.pi:
            polys.append(ring - [full, 0.0]), cells.append(i)
        elif lon_u.min() < -np.pi:
            polys.append(ring + [full, 0.0]), cells.append(i)
    if degrees:
        polys = [np.degrees(p) for p in polys]
    return polys, np.asarray(cells, dtype=np.intp)


def _density_map(
    ax: Any, dens: _Densities, i: int, norm: Any, cmap: str, cache: dict | None = None
):
    """Filled cells (fixed meshes and point clouds) or coloured nodes (Lagrangian) on a map."""
    from matplotlib.collections import PolyCollection

    degrees = ax.name not in _GEO
    vals = dens.values[i]
    if dens.moving is None:
        key = ("cells", degrees)
        if cache is None or key not in cache:
            polys, cells = _cell_polygons(
                dens.mesh if dens.mesh is not None else _CentersMesh(dens.centers), degrees
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
        lon, lat = _lonlat(dens.moving[i], degrees)
        art = ax.scatter(lon, lat, c=vals, s=6, cmap=cmap, norm=norm, linewidths=0)
    _map_axes_labels(ax)
    return art


# ----------------------------------------------------------------------------- particles
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
        On :math:`S^1`: ``"angle"`` (default) draws every particle's angle
        :math:`\theta_i(t)` against time (:math:`\theta` across, :math:`t` up, like
        :func:`plot_density`'s heat map); ``"circle"`` one snapshot on the circle.  On
        :math:`S^2` (and higher, by the first three principal axes): ``"3d"`` (default)
        with the sphere's outline, or ``"map"`` (longitude--latitude, Mollweide).
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
    p = _particles(result, system)
    d = p.d
    views = ("angle", "circle") if d == 2 else ("3d", "map")
    view = view or views[0]
    if view not in views:
        raise ValueError(f"view must be one of {views} for points on {_sphere(d)}, got {view!r}")
    i = _index(index, len(p.times))
    c = color
    norm = None
    if c is None and p.color is not None:
        c, norm = p.color[i], _norm(p.color, "log", None, None)
    s = size if size is not None else (12.0 if p.points.shape[1] <= 200 else 4.0)
    sizes = s
    if p.kind == "atoms-density":
        w = p.weights[i]
        sizes = s * 0.5 + 4 * s * w / max(float(w.max()), 1e-300)
    if view == "angle":
        from matplotlib.collections import LineCollection

        ax = _axes(ax)
        th = _angles(p.points)  # (k, n)
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
        ax.set(
            xlim=(0, 2 * np.pi),
            ylim=(p.times[0], p.times[-1] if p.times[-1] > p.times[0] else p.times[0] + 1),
            xlabel="θ",
            ylabel="t",
        )
        ax.set_xticks(np.arange(5) * np.pi / 2, ["0", "π/2", "π", "3π/2", "2π"])
        ax.set_title(
            title if title is not None else describe(result) if p.kind == "particles" else ""
        )
        return ax
    if view == "circle":
        ax = _axes(ax)
        th = np.linspace(0, 2 * np.pi, 200)
        ax.plot(np.cos(th), np.sin(th), color="0.75", lw=0.8)
        x = p.points[i]
        art = ax.scatter(x[:, 0], x[:, 1], s=sizes, c=c, norm=norm, alpha=0.8, zorder=3)
        ax.set(aspect="equal", xlim=(-1.15, 1.15), ylim=(-1.15, 1.15), xlabel="x₁", ylabel="x₂")
    elif view == "3d":
        if ax is None:
            ax = _axes(projection="3d", figsize=(5, 5))
        elif ax.name != "3d":
            raise ValueError("view='3d' needs 3-D axes: fig.add_subplot(projection='3d')")
        _sphere_outline(ax)
        x = _project3(p.points[i])
        art = ax.scatter(
            x[:, 0], x[:, 1], x[:, 2], s=sizes, c=c, norm=norm, alpha=0.8, depthshade=False
        )
    else:
        ax = _axes(ax, projection="mollweide", figsize=(7, 4))
        lon, lat = _lonlat(p.points[i], degrees=ax.name not in _GEO)
        art = ax.scatter(lon, lat, s=sizes, c=c, norm=norm, alpha=0.8)
        _map_axes_labels(ax)
    if norm is not None and colorbar:
        ax.figure.colorbar(art, ax=ax, label="density ρ", shrink=0.7)
    ax.set_title(title if title is not None else f"t = {p.times[i]:.3g}")
    return ax


# ----------------------------------------------------------------------------- densities
def _legacy_density(times: Any, values: Any, centers: Any, energy: Any) -> _Densities:
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
    return _Densities(
        "density", times, values, centers, mesh=_CentersMesh(centers), diagnostics=diag
    )


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
        Save indices.  On :math:`S^1` with ``view="profile"``: the profiles drawn (default
        ``n_snapshots`` evenly spaced).  On :math:`S^2`: an int draws one map on ``ax``;
        a sequence (default ``n_snapshots`` evenly spaced) draws one map per save on
        ``fig``, all on one colour scale with one colour bar.
    ax, fig : optional
        Axes for a one-panel picture, figure for several.
    view : {"heatmap", "profile", "map"}, optional
        ``"heatmap"`` (default on :math:`S^1`): :math:`\theta` across, :math:`t` up,
        colour the density; ``"profile"``: :math:`\rho(\theta)` at a few times;
        ``"map"`` (the only view on :math:`S^2`): Mollweide maps of the Voronoi cells,
        filled with their cell averages.
    norm : {"log", "linear"}
        Colour scale.  The default log scale shows the exponentially growing modes of a
        near-uniform start as well as the clusters that follow (down to :math:`10^{-6}`
        of the maximum unless ``vmin`` is given).
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
        dens = _legacy_density(result, index, centers, energy)
        return plot_trajectory(dens, path, fig=fig, title=title or "")
    if args:
        raise TypeError(
            "plot_density(result, index=None, *, ax=None, ...) takes one result and an index"
        )
    dens = _densities(result, system)
    d = dens.d
    views = ("heatmap", "profile") if d == 2 else ("map",)
    view = view or views[0]
    if view not in views:
        raise ValueError(f"view must be one of {views} for densities on {_sphere(d)}, got {view!r}")
    k = len(dens.times)
    if view == "heatmap":
        ax = _axes(ax, figsize=(6, 4))
        scale = _norm(dens.values, norm, vmin, vmax)
        if dens.moving is None:
            th = _angles(dens.centers)
            order = np.argsort(th)
            if k > 1:
                art = ax.pcolormesh(
                    th[order],
                    dens.times,
                    dens.values[:, order],
                    shading="nearest",
                    cmap=cmap,
                    norm=scale,
                    rasterized=True,
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
            th = _angles(dens.moving)
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
        ax.set(xlim=(0, 2 * np.pi), xlabel="θ", ylabel="t")
        ax.set_xticks(np.arange(5) * np.pi / 2, ["0", "π/2", "π", "3π/2", "2π"])
        if colorbar:
            ax.figure.colorbar(art, ax=ax, label="density ρ")
        ax.set_title(title if title is not None else "")
        return ax
    if view == "profile":
        ax = _axes(ax, figsize=(6, 4))
        idx = (
            _snapshots(k, n_snapshots)
            if index is None
            else [_index(i, k) for i in np.atleast_1d(index)]
        )
        for i in idx:
            th = _angles(dens.points(i))
            order = np.argsort(th)
            ax.plot(th[order], dens.values[i, order], label=f"t = {dens.times[i]:.3g}")
        if norm == "log":
            ax.set_yscale("log")
        ax.set(xlim=(0, 2 * np.pi), xlabel="θ", ylabel="density ρ")
        ax.set_xticks(np.arange(5) * np.pi / 2, ["0", "π/2", "π", "3π/2", "2π"])
        ax.legend(fontsize="small")
        ax.set_title(title if title is not None else "")
        return ax
    # S^2 maps
    single = ax is not None or (index is not None and np.isscalar(index))
    idx = (
        [_index(index if index is not None else -1, k)]
        if single
        else (_snapshots(k, n_snapshots) if index is None else [_index(i, k) for i in index])
    )
    scale = _norm(dens.values[idx], norm, vmin, vmax)
    cache: dict = {}
    if single:
        ax = _axes(ax, projection="mollweide", figsize=(7, 4))
        art = _density_map(ax, dens, idx[0], scale, cmap, cache)
        if colorbar:
            ax.figure.colorbar(art, ax=ax, label="density ρ", orientation="horizontal", shrink=0.6)
        ax.set_title(title if title is not None else f"t = {dens.times[idx[0]]:.3g}")
        return ax
    fig = _figure(fig, figsize=(3.6 * len(idx), 2.9))
    axes = [fig.add_subplot(1, len(idx), j + 1, projection="mollweide") for j in range(len(idx))]
    art = None
    for a, i in zip(axes, idx):
        art = _density_map(a, dens, i, scale, cmap, cache)
        a.set_title(f"t = {dens.times[i]:.3g}")
    if colorbar:
        fig.colorbar(art, ax=axes, label="density ρ", orientation="horizontal", shrink=0.5)
    if title:
        fig.suptitle(title)
    return fig


# ----------------------------------------------------------------------------- diagnostics
_LABELS = {
    "energy": "energy E (ascended)",
    "free_energy": "free energy Φ (descended)",
    "order_parameter": "order parameter |Σ wᵢ xᵢ|",
    "mass": "mass",
    "max_density": "max density",
}


def _diagnostics(
    result: Any, system: int
) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, Any]]:
    kind = _kind(result)
    if kind in ("particles", "lagrangian"):
        v = _particles(result, system)
        return v.times, dict(v.diagnostics), v.config
    v = _densities(result, system)
    diag = dict(v.diagnostics)
    diag["max_density"] = v.values.max(axis=1)
    return v.times, diag, v.config


def _plain_axis(ax: Any) -> None:
    from matplotlib.ticker import ScalarFormatter

    fmt = ScalarFormatter(useOffset=False)
    ax.yaxis.set_major_formatter(fmt)


def plot_energy(
    result: Any, *, ax: Any = None, system: int = 0, which: str = "energy", title: str | None = None
):
    r"""Energy of a gradient-flow run against time.

    Parameters
    ----------
    result : any wflow result
        Particles, densities, Lagrangian or JKO.
    ax : matplotlib Axes, optional
    system : int
        Which system of a batched run.
    which : {"energy", "free_energy"}
        ``"energy"``: the functional :math:`E` the flow ascends (non-decreasing);
        ``"free_energy"`` (JKO runs): :math:`\Phi = -E + \kappa^{-1}\int\rho\log\rho`,
        non-increasing.
    title : str, optional

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    ValueError
        When the run has no such energy (the model is not a gradient flow).

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import wflow
    >>> traj = wflow.simulate(wflow.USA(beta=1.0), wflow.sphere.uniform(16, 3, seed=0), 1.0)
    >>> wflow.plot.plot_energy(traj).get_ylabel()
    'energy E (ascended)'
    """
    times, diag, _ = _diagnostics(result, system)
    if which not in ("energy", "free_energy"):
        raise ValueError(f"which must be 'energy' or 'free_energy', got {which!r}")
    e = diag.get(which)
    if e is None or not np.any(np.isfinite(e)):
        raise ValueError(
            f"this {_name(result)} has no {which.replace('_', ' ')} (the model is not a gradient flow, "
            f"or the solver does not record it); plot_diagnostics draws what it has"
        )
    ax = _axes(ax, figsize=(5, 3.5))
    ax.plot(times, e, marker=".")
    _plain_axis(ax)
    ax.set(xlabel="t", ylabel=_LABELS[which])
    ax.set_title(title if title is not None else "")
    return ax


def plot_diagnostics(result: Any, *, fig: Any = None, system: int = 0, title: str | None = None):
    r"""Everything a run recorded at its save times, one panel each.

    Particles: energy (gradient flows), order parameter :math:`|\sum_i w_i x_i|`, cluster
    count.  Densities: energy, free energy (JKO), mass, maximum density.

    The cluster count is the number of connected components of the graph joining
    particles closer than the threshold (single linkage).  From a uniform start it first
    counts percolation components of a random point set, not clusters: it can rise
    before the clusters form and merge.

    Parameters
    ----------
    result : any wflow result
    fig : matplotlib Figure, optional
    system : int
    title : str, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import wflow
    >>> traj = wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(8, 3, seed=0), 0.5, dt=0.1, backend="numpy")
    >>> fig = wflow.plot.plot_diagnostics(traj)
    >>> len(fig.axes), fig.axes[0].get_ylabel()  # energy, order parameter, clusters
    (3, 'energy E (ascended)')
    """
    times, diag, cfg = _diagnostics(result, system)
    names = [
        n
        for n in ("energy", "free_energy", "order_parameter", "n_clusters", "mass", "max_density")
        if n in diag and np.any(np.isfinite(diag[n]))
    ]
    fig = _figure(fig, figsize=(3.6 * max(len(names), 1), 3.2))
    axes = [fig.add_subplot(1, max(len(names), 1), j + 1) for j in range(max(len(names), 1))]
    for ax, name in zip(axes, names):
        _diag_panel(ax, times, name, diag[name], cfg)
    fig.suptitle(title if title is not None else describe(result))
    return fig


def _diag_panel(
    ax: Any, times: np.ndarray, name: str, values: np.ndarray, cfg: dict[str, Any]
) -> None:
    if name == "n_clusters":
        ax.step(times, values, where="post")
        if np.nanmax(values) > 10 * max(np.nanmin(values), 1):
            ax.set_yscale("log")
        thr = cfg.get("cluster_threshold", 0.1)
        ax.set_ylabel(f"clusters (single linkage, {float(thr):g} rad)")
    else:
        ax.plot(times, values, marker=".")
        _plain_axis(ax)
        ax.set_ylabel(_LABELS.get(name, name))
    ax.set_xlabel("t")


# ----------------------------------------------------------------------------- summary figure
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
    r"""The summary figure of a run (the one ``wflow run`` writes): snapshots above diagnostics.

    Particles: the particles at ``n_snapshots`` times (circle, or 3-D sphere) and, on
    :math:`S^1`, their angles against time.  Densities on :math:`S^1`: the
    :math:`\theta`--:math:`t` heat map (log colour scale) and profiles; on :math:`S^2`:
    maps of the cells at ``n_snapshots`` times on one colour scale.  Bottom row: what
    :func:`plot_diagnostics` draws.

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
        Default :func:`describe` (model, β, size, mesh, method).
    dpi : int

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import wflow
    >>> traj = wflow.simulate(wflow.SA(beta=4.0), wflow.sphere.uniform(32, 3, seed=0), 1.0)
    >>> fig = wflow.plot.plot_trajectory(traj)
    >>> fig.get_suptitle()
    'SA, β = 4 — 32 tokens on S², rk4'
    """
    if getattr(result, "kind", None) == "zonal":
        fig = plot_zonal(result, n_snapshots=n_snapshots).figure
        if title is not None:
            fig.suptitle(title)
        if path is not None:
            _save(fig, path, dpi)
        return fig
    kind = _kind(result)
    times, diag, cfg = _diagnostics(result, system)
    names = [
        n
        for n in ("energy", "free_energy", "order_parameter", "n_clusters", "max_density")
        if n in diag and np.any(np.isfinite(diag[n]))
    ]
    if "energy" in names and "order_parameter" in names:
        names.remove("order_parameter")
    k = len(times)
    idx = _snapshots(k, n_snapshots)
    if kind in ("particles", "lagrangian"):
        view = _particles(result, system)
        ncol = len(idx) + (view.d == 2 and kind == "particles")
    else:
        view = _densities(result, system)
        ncol = 2 if view.d == 2 else len(idx)
    fig = _figure(fig, path=path, figsize=(max(3.3 * ncol, 7.0), 6.6))
    grid = fig.add_gridspec(2, max(ncol, len(names), 1))
    cols = grid.ncols
    if isinstance(view, _Particles):
        axes = []
        for j, i in enumerate(idx):
            a = fig.add_subplot(grid[0, j], projection=None if view.d == 2 else "3d")
            plot_particles(
                view,
                i,
                ax=a,
                view="circle" if view.d == 2 else "3d",
                colorbar=False,
                title=f"t = {times[i]:.3g}",
            )
            if view.d == 2:
                a.set_axis_off()
            axes.append(a)
        if view.color is not None:
            fig.colorbar(axes[-1].collections[-1], ax=axes, label="density ρ", shrink=0.6)
        if view.d == 2 and kind == "particles":
            a = fig.add_subplot(grid[0, len(idx) :])
            plot_particles(view, ax=a, view="angle", title="angles θᵢ(t)")
    elif view.d == 2:
        half = cols // 2
        plot_density(view, ax=fig.add_subplot(grid[0, : max(half, 1)]), title="density ρ(θ, t)")
        plot_density(
            view,
            ax=fig.add_subplot(grid[0, max(half, 1) :]),
            view="profile",
            n_snapshots=n_snapshots,
            title="profiles",
        )
    else:
        scale = _norm(view.values[idx], "log", None, None)
        cache: dict = {}
        axes = []
        for j, i in enumerate(idx):
            a = fig.add_subplot(grid[0, j], projection="mollweide")
            art = _density_map(a, view, i, scale, "magma", cache)
            a.set_title(f"t = {times[i]:.3g}")
            axes.append(a)
        fig.colorbar(art, ax=axes, label="density ρ", orientation="horizontal", shrink=0.5)
    n = max(len(names), 1)
    bounds = np.linspace(0, cols, n + 1).round().astype(int)
    for j, name in enumerate(names):
        _diag_panel(
            fig.add_subplot(grid[1, bounds[j] : max(bounds[j + 1], bounds[j] + 1)]),
            times,
            name,
            diag[name],
            cfg,
        )
    fig.suptitle(title if title is not None else describe(result))
    _save(fig, path, dpi)
    return fig


# ----------------------------------------------------------------------------- animations
def animate(
    result: Any,
    path: str | Path,
    *,
    fps: int = 10,
    system: int = 0,
    view: str | None = None,
    norm: str = "log",
    dpi: int = 100,
    title: str | None = None,
) -> Path:
    r"""Write an animation of a run, one frame per save: GIF (Pillow) or MP4.

    Particles on :math:`S^1` (circle) and :math:`S^2` (3-D sphere, or ``view="map"``);
    densities on :math:`S^1` (the profile :math:`\rho(\theta)`) and :math:`S^2` (the
    cell map), on one colour scale for the whole run.

    Parameters
    ----------
    result : any wflow result
    path : str or Path
        ``.gif`` (Pillow, always available) or ``.mp4`` (needs the ``imageio-ffmpeg``
        package, or an ``ffmpeg`` on the PATH).
    fps : int
        Frames per second.
    system : int
        Which system of a batched run.
    view : str, optional
        ``"circle"``/``"3d"``/``"map"`` for particles, ``"profile"``/``"map"`` for densities.
    norm : {"log", "linear"}
        Colour or profile scale of densities.
    dpi : int
    title : str, optional
        Default :func:`describe`; the frame's time is added.

    Returns
    -------
    pathlib.Path
        ``path``.

    Examples
    --------
    >>> import wflow, tempfile, pathlib
    >>> traj = wflow.simulate(wflow.SA(beta=4.0), wflow.sphere.uniform(16, 2, seed=0), 1.0)
    >>> out = wflow.plot.animate(traj, pathlib.Path(tempfile.mkdtemp()) / "run.gif", fps=5)
    >>> out.suffix
    '.gif'
    """
    from matplotlib import animation
    from matplotlib.figure import Figure

    path = Path(path)
    if not isinstance(fps, (int, np.integer)) or fps < 1:
        raise ValueError(f"fps must be a positive integer, got {fps!r}")
    suffix = path.suffix.lower()
    if suffix == ".gif":
        writer = animation.PillowWriter(fps=int(fps))
    elif suffix == ".mp4":
        writer = _mp4_writer(int(fps))
    else:
        raise ValueError(f"path must end in .gif or .mp4, got {path.name!r}")
    kind = _kind(result)
    head = title if title is not None else describe(result)
    fig = Figure(figsize=(6, 5), layout="constrained")
    if kind in ("particles", "lagrangian"):
        p = _particles(result, system)
        view = view or ("circle" if p.d == 2 else "3d")
        if view not in ("circle", "3d", "map"):
            raise ValueError(f"view must be 'circle', '3d' or 'map' for particles, got {view!r}")
        proj = {"3d": "3d", "map": "mollweide"}.get(view)

        def draw(i: int) -> None:
            fig.clear()
            ax = fig.add_subplot(projection=proj)
            plot_particles(p, i, ax=ax, view=view, title=f"t = {p.times[i]:.3g}")
            fig.suptitle(head, fontsize="medium")

        frames = len(p.times)
    else:
        dens = _densities(result, system, caller="animate")
        view = view or ("profile" if dens.d == 2 else "map")
        if (dens.d == 2) != (view == "profile"):
            raise ValueError(f"view must be 'profile' on S¹ and 'map' on S², got {view!r}")
        scale = _norm(dens.values, norm, None, None)
        cache: dict = {}
        frames = len(dens.times)

        def draw(i: int) -> None:
            fig.clear()
            if view == "profile":
                ax = fig.add_subplot()
                th = _angles(dens.points(i))
                order = np.argsort(th)
                ax.plot(th[order], dens.values[i, order])
                if norm == "log":
                    ax.set_yscale("log")
                ax.set(
                    xlim=(0, 2 * np.pi),
                    ylim=(scale.vmin, scale.vmax),
                    xlabel="θ",
                    ylabel="density ρ",
                )
            else:
                ax = fig.add_subplot(projection="mollweide")
                art = _density_map(ax, dens, i, scale, "magma", cache)
                fig.colorbar(art, ax=ax, label="density ρ", orientation="horizontal", shrink=0.6)
            ax.set_title(f"t = {dens.times[i]:.3g}")
            fig.suptitle(head, fontsize="medium")

    with writer.saving(fig, str(path), dpi):
        for i in range(frames):
            draw(i)
            writer.grab_frame()
    return path


def _mp4_writer(fps: int):
    import shutil

    import matplotlib
    from matplotlib import animation

    try:
        import imageio_ffmpeg

        matplotlib.rcParams["animation.ffmpeg_path"] = imageio_ffmpeg.get_ffmpeg_exe()
    except ImportError:
        if shutil.which(matplotlib.rcParams["animation.ffmpeg_path"]) is None:
            raise RuntimeError(
                "writing MP4 needs ffmpeg: pip install imageio-ffmpeg, or write a .gif"
            ) from None
    return animation.FFMpegWriter(fps=fps, codec="h264", extra_args=["-pix_fmt", "yuv420p"])


def plot_zonal(result: Any, *, ax: Any = None, n_snapshots: int = 5):
    r"""The law of :math:`z = \langle x, e\rangle` of a zonal run (:func:`wflow.solvers.zonal.solve_zonal`) at
    ``n_snapshots`` saved times, on a log scale (the density of the law, bands' masses over their widths).

    Returns the Axes.

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
            f"plot_zonal draws zonal runs (wflow.solvers.zonal.solve_zonal); got a {_name(result)}: use "
            f"wflow.plot.plot_trajectory or plot_density"
        )
    ax = _axes(ax, figsize=(6, 4))
    k = len(result.times)
    z = 0.5 * (result.edges[1:] + result.edges[:-1])
    top = 0.0
    for i in _snapshots(k, n_snapshots):
        p = result.law_density(i)
        top = max(top, float(np.max(p)))
        ax.plot(z, p, label=f"t = {result.times[i]:.3g}")
    ax.set_yscale("log")
    ax.set_ylim(top * 1e-8, top * 3)  # eight decades: the tails of high dimensions reach 1e-300
    ax.set_xlabel("z = <x, e>")
    ax.set_ylabel("density of the law of z")
    d = result.config.get("d", "?")
    ax.set_title(f"zonal density on S^{int(d) - 1 if isinstance(d, (int, float)) else d}")
    ax.legend(fontsize=7)
    return ax
