r"""Lagrangian quadrature solver: the continuum equation along characteristics.

A smooth initial density :math:`\rho_0` (with respect to the normalized surface
measure :math:`\sigma`) is represented by a quadrature rule, :math:`\mu_0 \approx
\sum_k w_k\rho_0(x_k)\delta_{x_k}` -- the trapezoid rule on :math:`S^1` (spectrally
accurate for smooth periodic data) and the product Gauss--Legendre x trapezoid rule on
:math:`S^2`.  The nodes are carried by the particle solver, which is exact for the
continuity equation with a quadrature-discretized velocity:
:math:`\partial_t\mu + \mathrm{div}(\mu v[\mu]) = 0` holds for :math:`\mu_t = X_t\#\mu_0`
with :math:`\dot X = v[\mu_t](X)`.  The density is recovered from the Jacobian of the
flow map, :math:`\rho(t, X_t(x)) = \rho_0(x)/J_t(x)`, with :math:`J_t` measured by
passive tracers at :math:`\exp_x(\pm\varepsilon e_a)` along an orthonormal tangent frame
(central differences, error :math:`O(\varepsilon^2)`).

Before clusters form this is the high-accuracy continuum reference: its error is the
quadrature error of the velocity (spectral in the node count for smooth data) plus the
time-stepping tolerance.  Once the flow map folds (clusters) the Jacobian tends to 0
and the recovered density is no longer meaningful; the atoms remain a valid measure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import check_int, check_positive, short_repr
from ..measure import Atoms
from ..models import Model
from ..sphere import circle_nodes, exp_map, gauss_sphere_nodes
from .particles import Trajectory, simulate

__all__ = ["solve_lagrangian", "LagrangianSolution", "quadrature_measure"]


def quadrature_measure(density: Callable[[np.ndarray], np.ndarray], d: int, nodes: int) -> tuple[Atoms, np.ndarray]:
    r"""Quadrature atoms :math:`\sum_k w_k\rho_0(x_k)\delta_{x_k}` for a density on :math:`S^1` or :math:`S^2`.

    ``nodes`` is the number of trapezoid nodes on :math:`S^1` or of Gauss--Legendre
    latitudes on :math:`S^2` (with ``2 nodes`` longitudes).  Returns the atoms
    (weights normalized) and the density values at the nodes, normalized so that
    :math:`\sum_k w_k\rho_0(x_k) = 1`.
    """
    if not callable(density):
        raise TypeError(f"density must be a callable of points (n, d) -> values (n,), got {short_repr(density)}")
    nodes = check_int(nodes, "nodes", minimum=4)
    if d == 2:
        x, q = circle_nodes(nodes)
    elif d == 3:
        x, q = gauss_sphere_nodes(nodes)
    else:
        raise ValueError(f"the Lagrangian quadrature solver works on S^1 (d=2) and S^2 (d=3), got d={d}")
    rho = np.asarray(density(x), dtype=np.float64)
    if rho.shape != (x.shape[0],):
        raise ValueError(f"density must return one value per point, shape ({x.shape[0]},), got {rho.shape}")
    if not np.all(np.isfinite(rho)) or np.any(rho < 0):
        raise ValueError("density must be finite and non-negative at every quadrature node")
    mass = float(q @ rho)
    if mass <= 0:
        raise ValueError("density integrates to 0")
    rho = rho / mass
    return Atoms(x, q * rho), rho


def _tangent_frame(x: np.ndarray) -> np.ndarray:
    """Orthonormal tangent frames, shape (n, d-1, d), for d = 2 or 3."""
    n, d = x.shape
    if d == 2:
        return np.stack([-x[:, 1], x[:, 0]], axis=-1)[:, None, :]
    # e1 = normalized projection of the coordinate axis least aligned with x
    axis = np.eye(3)[np.argmin(np.abs(x), axis=1)]
    e1 = axis - np.sum(axis * x, -1, keepdims=True) * x
    e1 /= np.linalg.norm(e1, axis=-1, keepdims=True)
    e2 = np.cross(x, e1)
    return np.stack([e1, e2], axis=1)


@dataclass
class LagrangianSolution:
    """Nodes carried by the flow, with the density recovered along them.

    Attributes
    ----------
    trajectory : Trajectory
        The quadrature atoms at the save times (a valid measure at every time).
    rho0 : ndarray, shape (n,)
        Initial density at the nodes (normalized measure).
    jacobian : ndarray, shape (k, n)
        :math:`J_t` at each node and save time.
    """

    trajectory: Trajectory
    rho0: np.ndarray
    jacobian: np.ndarray
    eps: float

    @property
    def times(self) -> np.ndarray:
        return self.trajectory.times

    def atoms(self, i: int = -1) -> Atoms:
        return self.trajectory.atoms(i)

    def density(self, i: int = -1) -> tuple[np.ndarray, np.ndarray]:
        r"""``(points, rho)``: the density :math:`\rho_0/J_t` at the moved nodes at save index ``i``."""
        return self.trajectory.points[i], self.rho0 / self.jacobian[i]


def solve_lagrangian(
    model: Model,
    density0: Callable[[np.ndarray], np.ndarray],
    t_end: float,
    *,
    d: int = 2,
    nodes: int = 256,
    save_at: Any = None,
    method: str = "dopri5",
    rtol: float = 1e-10,
    atol: float = 1e-12,
    dt: float | None = None,
    eps: float = 1e-4,
    backend: str = "auto",
    progress: bool = False,
    writer: Any = None,
) -> LagrangianSolution:
    r"""Solve :math:`\partial_t\rho + \mathrm{div}_S(\rho\,v[\rho]) = 0` by quadrature nodes moved along characteristics.

    Parameters
    ----------
    model : Model
    density0 : callable
        :math:`\rho_0(x)` for points of shape ``(n, d)``, with respect to the normalized
        surface measure (need not be normalized).
    t_end : float
    d : {2, 3}
        Circle or sphere.
    nodes : int
        Trapezoid nodes (S^1) or Gauss--Legendre latitudes (S^2, with ``2 nodes`` longitudes).
    method, rtol, atol, dt
        Passed to :func:`wflow.simulate` (default ``dopri5`` at 1e-10).
    eps : float
        Offset of the Jacobian tracers (central differences, error ``O(eps^2)``).
    writer : SnapshotWriter, optional
        Receives each snapshot, nodes and tracers (e.g. :class:`wflow.io.ZarrWriter`); the
        run is then resumable with :func:`wflow.resume`.

    Returns
    -------
    LagrangianSolution
    """
    if not isinstance(model, Model):
        raise TypeError(f"model must be a wflow Model, got {short_repr(model)}")
    model.check_dimension(d)
    eps = check_positive(eps, "eps")
    mu0, rho0 = quadrature_measure(density0, d, nodes)
    x = mu0.points
    frame = _tangent_frame(x)  # (n, d-1, d)
    tr = [exp_map(x, s * eps * frame[:, a]) for a in range(d - 1) for s in (1.0, -1.0)]
    tracers = np.concatenate(tr, axis=0)
    kw = dict(rtol=rtol, atol=atol) if method == "dopri5" else {}
    traj = simulate(model, mu0, t_end, save_at=save_at, method=method, dt=dt, backend=backend,
                    tracers=tracers, progress=progress, writer=writer,
                    _config_update={"solver": "lagrangian", "nodes": nodes, "eps": eps}, **kw)
    return _solution(traj, rho0, eps)


def _solution(traj: Trajectory, rho0: np.ndarray, eps: float) -> LagrangianSolution:
    """Jacobians from the tracers of a Lagrangian run (also for one loaded from disk)."""
    k, n, d = traj.points.shape
    T = traj.tracers.reshape(k, d - 1, 2, n, d)
    D = (T[:, :, 0] - T[:, :, 1]) / (2 * eps)  # (k, d-1, n, d): images of the frame vectors
    G = np.einsum("kanj,kbnj->knab", D, D)
    jac = np.sqrt(np.linalg.det(G))
    return LagrangianSolution(trajectory=traj, rho0=rho0, jacobian=jac, eps=eps)
