"""What the figures draw from: every result kind seen as particles or as densities, and its title.

:func:`particles_view` and :func:`densities_view` turn a result of any solver (recognised by
its attributes, :func:`result_kind`) into a :class:`ParticlesView` or a
:class:`DensitiesView` (times, points or values, diagnostics, configuration);
:func:`describe` writes a result's one-line title.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class ParticlesView:
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
class DensitiesView:
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
        pts = self.centers if self.centers is not None else self.moving
        if pts is None:
            raise ValueError(f"a {self.kind!r} view has neither centres nor moving nodes")
        return int(pts.shape[-1])

    def points(self, i: int) -> np.ndarray:
        """Where the values of save ``i`` sit: the moving nodes, else the fixed centres."""
        return self.moving[i] if self.moving is not None else self.cell_centers()

    def cell_centers(self) -> np.ndarray:
        """The fixed cells' centres or atoms, shape ``(M, d)`` (views of moving nodes have none)."""
        if self.centers is None:
            raise ValueError(f"a {self.kind!r} view has moving nodes, not fixed centres")
        return self.centers


@dataclass
class CentersMesh:
    """Cell centres only (the ``plot_density(times, values, centers)`` call form)."""

    centers: np.ndarray

    @property
    def d(self) -> int:
        return int(self.centers.shape[1])


def result_kind(result: Any) -> str:
    """``"particles"``, ``"density"``, ``"lagrangian"``, ``"atoms-density"`` or a TypeError.

    A result's ``kind`` attribute decides when it has one (``"jko"`` is a density on a mesh
    or on a point cloud); otherwise its attributes do.
    """
    if isinstance(result, (ParticlesView, DensitiesView)):
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


def density_values(result: Any) -> np.ndarray:
    """Densities ``(k, M)`` w.r.t. cell areas (or reference volumes on a point cloud)."""
    if hasattr(result, "values"):
        return np.asarray(result.values, dtype=float)
    return np.asarray(result.weights, dtype=float) / np.asarray(result.reference, dtype=float)


def type_name(result: Any) -> str:
    return type(result).__name__


def pick_system(a: Any, k: int, system: int, what: str) -> np.ndarray | None:
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


def particles_view(result: Any, system: int = 0) -> ParticlesView:
    kind = result_kind(result)
    if isinstance(result, ParticlesView):
        return result
    if kind == "lagrangian":
        nodes = getattr(result, "trajectory", result)
        view = particles_view(AsParticles(nodes) if nodes is result else nodes, system)
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
        return ParticlesView(
            kind,
            np.asarray(result.times, float),
            pts,
            np.asarray(result.weights, float),
            diagnostics=diag,
            config=result_config(result),
        )
    if kind not in ("particles", "as-particles"):
        raise TypeError(
            f"plot_particles draws particles; got a {type_name(result)} (a density on a mesh): "
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
    picked = {
        key: pick_system(v, k, system, key) for key, v in getattr(result, "diagnostics", {}).items()
    }
    return ParticlesView(
        "particles",
        times,
        flat[:, system],
        np.broadcast_to(w, (k, n)),
        diagnostics={key: v for key, v in picked.items() if v is not None},
        config=result_config(result),
    )


@dataclass
class AsParticles:
    """A Lagrangian result seen as its nodes (a particle trajectory)."""

    result: Any
    kind: str = "as-particles"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.result, name)


def densities_view(result: Any, system: int = 0, *, caller: str = "plot_density") -> DensitiesView:
    kind = result_kind(result)
    if isinstance(result, DensitiesView):
        return result
    if kind in ("density", "atoms-density"):
        if kind == "density":  # on a mesh
            k = len(result.times)
            picked = {
                key: pick_system(getattr(result, key, None), k, 0, key)
                for key in ("energy", "mass", "free_energy")
            }
            diag = {key: v for key, v in picked.items() if v is not None and np.any(np.isfinite(v))}
            mesh, centers = result.mesh, result.mesh.centers
        else:  # on a point cloud
            diag = {
                key: np.asarray(getattr(result, key), float) for key in ("energy", "free_energy")
            }
            mesh, centers = None, result.points
        return DensitiesView(
            kind,
            np.asarray(result.times, float),
            density_values(result),
            np.asarray(centers, float),
            mesh=mesh,
            diagnostics=diag,
            config=result_config(result),
        )
    if kind == "lagrangian":
        view = particles_view(result, system)
        if view.color is None:  # particles_view colours Lagrangian nodes by their density
            raise TypeError(f"{caller}: {type_name(result)} carries no density at its nodes")
        return DensitiesView(
            kind,
            view.times,
            view.color,
            None,
            moving=view.points,
            diagnostics=view.diagnostics,
            config=view.config,
        )
    raise TypeError(
        f"{caller} draws densities; got a {type_name(result)} (particles): use wflow.plot.plot_particles"
    )


def result_config(result: Any) -> dict[str, Any]:
    cfg = getattr(result, "config", None)
    out = dict(cfg) if isinstance(cfg, dict) else {}
    for key in ("tau", "method", "scheme"):
        try:
            value = getattr(result, key, None)
        except (KeyError, TypeError, ValueError):
            value = None
        if key not in out and isinstance(value, (int, float, str)):
            out[key] = value
    out.setdefault("result", type_name(result))
    return out


def _ambient(cfg: dict[str, Any], d: int) -> int:
    """The tokens' dimension: the configuration's ``d`` (span coordinates keep fewer), else the points'."""
    value = cfg.get("d")
    return int(value) if isinstance(value, (int, np.integer)) and value >= d else d


def sphere_label(d: int) -> str:
    return {2: "S¹", 3: "S²"}.get(d, f"S^{d - 1}")


def where_label(count: int, what: str, d: int) -> str:
    """``n = 32 tokens on S² (d = 3)``: the size, the sphere and the ambient dimension of a title."""
    return f"n = {count} {what} on {sphere_label(d)} (d = {d})"


def model_label(spec: Any) -> str:
    if not isinstance(spec, dict):
        return ""
    kind = spec.get("type", "")
    if kind == "Sum":
        return " + ".join(model_label(p) for p in spec.get("parts", []))
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
    """A one-line human-readable title for a result: model, β, size n, dimension d, mesh, method.

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
    'SA, β = 4 — n = 10 tokens on S² (d = 3), dopri5'
    """
    if getattr(result, "kind", None) == "zonal":
        cfg = result_config(result)
        d = int(cfg.get("d", 0))
        bands = np.shape(getattr(result, "masses", np.zeros((1, 0))))[-1]
        spec = {"type": cfg.get("attention", ""), "beta": cfg.get("beta", 0.0)}
        if cfg.get("sign", 1) < 0:
            spec["V"] = (-np.eye(2)).tolist()
        return _title("zonal", model_label(spec), where_label(bands, "bands in z", d))
    kind = result_kind(result)
    particles = kind in ("particles", "lagrangian")
    cfg = particles_view(result).config if particles else result_config(result)
    model = model_label(cfg.get("model"))
    if kind == "particles":
        view = particles_view(result)
        parts = [model, where_label(view.points.shape[1], "tokens", _ambient(cfg, view.d))]
        method = cfg.get("method") or cfg.get("solver")
        if isinstance(method, str) and method not in ("particles", "lagrangian"):
            parts[-1] += f", {method}"
        if cfg.get("kappa"):
            parts.append(f"κ = {float(cfg['kappa']):g}")
        return _title(*parts)
    if kind == "lagrangian":
        view = particles_view(result)
        return _title("Lagrangian", model, where_label(view.points.shape[1], "nodes", view.d))
    dens = densities_view(result)
    mesh = dens.mesh
    if mesh is not None and hasattr(mesh, "n_cells"):
        where = f"{type(mesh).__name__}, " + where_label(mesh.n_cells, "cells", dens.d)
    else:
        where = where_label(dens.values.shape[1], "points", dens.d)
    if cfg.get("result") == "JKOResult" or cfg.get("kind") == "jko" or cfg.get("tau"):
        solver = f"JKO, τ = {float(cfg['tau']):g}" if cfg.get("tau") else "JKO"
    else:
        solver = "finite volume"
    return _title(solver, model, where)


def _title(*parts: str) -> str:
    return " — ".join(p for p in parts if p)
