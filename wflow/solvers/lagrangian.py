r"""Lagrangian quadrature solver: the continuum equation along characteristics.

A smooth initial density :math:`\rho_0` (w.r.t. the surface measure) is a quadrature rule,
:math:`\mu_0 \approx \sum_k w_k\rho_0(x_k)\delta_{x_k}` -- the trapezoid rule on :math:`S^1`, Gauss--Legendre
x trapezoid on :math:`S^2` -- whose nodes the particle solver carries: :math:`\mu_t = X_t\#\mu_0` with
:math:`\dot X = v[\mu_t](X)`.  The density is :math:`\rho(t, X_t(x)) = \rho_0(x)/J_t(x)`, the Jacobian
:math:`J_t` measured by passive tracers at :math:`\exp_x(\pm\varepsilon e_a)` (central differences).
Before clusters form this is the high-accuracy continuum reference; once the flow map folds the
recovered density is no longer meaningful (the atoms remain a valid measure).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np

from ..errors import check_int, check_positive, short_repr
from ..measure import Atoms
from ..models import Model, model_from_dict
from ..sphere import circle_nodes, exp_map, gauss_sphere_nodes, tangent_frame
from .base import get_solver, integrate, register_kind
from .particles import ParticleProblem, Trajectory
from .trackers import ProgressBar

__all__ = ["solve_lagrangian", "LagrangianSolution", "LagrangianProblem", "quadrature_measure"]


def quadrature_measure(
    density: Callable[[np.ndarray], np.ndarray], d: int, nodes: int
) -> tuple[Atoms, np.ndarray]:
    r"""Quadrature atoms :math:`\sum_k w_k\rho_0(x_k)\delta_{x_k}` for a density on :math:`S^1` or :math:`S^2`.

    ``nodes`` is the number of trapezoid nodes on :math:`S^1` or of Gauss--Legendre latitudes on
    :math:`S^2` (with ``2 nodes`` longitudes).  Returns the atoms (weights normalized) and the values at
    the nodes of the density w.r.t. the surface measure.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.lagrangian import quadrature_measure
    >>> mu, rho = quadrature_measure(lambda x: 1 + 0.5 * x[:, 0], 2, 16)
    >>> mu.points.shape, round(float(mu.weights.sum()), 12), round(float(rho[0] * 2 * np.pi), 6)
    ((16, 2), 1.0, 1.5)
    """
    if not callable(density):
        raise TypeError(
            f"density must be a callable of points (n, d) -> values (n,), got {short_repr(density)}"
        )
    nodes = check_int(nodes, "nodes", minimum=4)
    if d == 2:
        x, q = circle_nodes(nodes)
    elif d == 3:
        x, q = gauss_sphere_nodes(nodes)
    else:
        raise ValueError(
            f"the Lagrangian quadrature solver works on S^1 (d=2) and S^2 (d=3), got d={d}"
        )
    rho = np.asarray(density(x), dtype=np.float64)
    if rho.shape != (x.shape[0],):
        raise ValueError(
            f"density must return one value per point, shape ({x.shape[0]},), got {rho.shape}"
        )
    if not np.all(np.isfinite(rho)) or np.any(rho < 0):
        raise ValueError("density must be finite and non-negative at every quadrature node")
    mass = float(q @ rho)
    if mass <= 0:
        raise ValueError("density integrates to 0")
    rho = rho / mass
    area = 2 * np.pi if d == 2 else 4 * np.pi  # |S^{d-1}|: rho w.r.t. the surface measure
    return Atoms(x, q * rho), rho / area


class LagrangianProblem(ParticleProblem):
    """Quadrature nodes and their Jacobian tracers moved by the flow (a particle problem of kind ``lagrangian``).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.solvers.lagrangian import LagrangianProblem, quadrature_measure
    >>> mu, rho = quadrature_measure(lambda x: 1 + 0.5 * x[:, 0], 2, 16)
    >>> problem = LagrangianProblem(wflow.USA(1.0), mu.weights, 2, rho, eps=1e-4, nodes=16, backend="numpy")
    >>> problem.kind, problem.n_tracers  # two tracers per node and tangent direction
    ('lagrangian', 32)
    """

    kind = "lagrangian"

    def __init__(
        self,
        model: Model,
        weights: np.ndarray,
        d: int,
        rho0: np.ndarray,
        *,
        eps: float,
        nodes: int,
        backend: str = "auto",
    ):
        super().__init__(
            model,
            weights,
            d,
            backend=backend,
            diagnostics=("energy",),
            n_tracers=2 * (d - 1) * len(rho0),
        )
        self.rho0 = rho0
        self.eps = eps
        self.nodes = nodes

    def static(self) -> dict:
        return {**super().static(), "rho0": (("particle",), self.rho0)}

    def config(self) -> dict[str, Any]:
        return {**super().config(), "eps": self.eps, "nodes": self.nodes}


class LagrangianSolution(Trajectory):
    """Nodes carried by the flow, with the density recovered along them (kind ``lagrangian``).

    Attributes
    ----------
    points : ndarray, shape (k, n, d)
        The quadrature atoms at the save times.
    rho0 : ndarray, shape (n,)
        Initial density at the nodes (w.r.t. the surface measure).
    jacobian : ndarray, shape (k, n)
        :math:`J_t` at each node and save time.
    eps : float
        Offset of the Jacobian tracers.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> sol = wflow.solve_lagrangian(wflow.USA(1.0), lambda x: 1 + 0.1 * x[:, 0], 0.5, nodes=16, backend="numpy")
    >>> sol.points.shape, sol.jacobian.shape, sol.rho0.shape
    ((11, 16, 2), (11, 16), (16,))
    >>> x, rho = sol.density(-1)  # rho0 / J_t at the moved nodes
    >>> x.shape, bool(np.allclose(rho, sol.rho0 / sol.jacobian[-1]))
    ((16, 2), True)
    """

    @property
    def trajectory(self) -> LagrangianSolution:
        """The nodes as a particle trajectory (this result itself)."""
        return self

    @property
    def rho0(self) -> np.ndarray:
        return self.static["rho0"][1]

    @property
    def eps(self) -> float:
        return float(self.config["eps"])

    @property
    def jacobian(self) -> np.ndarray:
        k, n, d = self.points.shape
        tracers = self.tracers
        if tracers is None:  # solve_lagrangian always carries them
            raise ValueError("this solution carries no Jacobian tracers")
        T = tracers.reshape(k, d - 1, 2, n, d)
        D = (T[:, :, 0] - T[:, :, 1]) / (2 * self.eps)  # (k, d-1, n, d): the frame vectors' images
        G = np.einsum("kanj,kbnj->knab", D, D)
        return np.sqrt(np.linalg.det(G))

    def density(self, i: int = -1, *, t: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        r"""``(points, rho)``: the density :math:`\rho_0/J_t` at the moved nodes at save index ``i`` (or at the
        saved time ``t``, :meth:`save_index`)."""
        if t is not None:
            i = self.save_index(t)
        return self.points[i], self.rho0 / self.jacobian[i]


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
    trackers: Any = (),
    keep: bool = True,
    throw: bool = True,
) -> LagrangianSolution:
    r"""Solve :math:`\partial_t\rho + \mathrm{div}_S(\rho\,v[\rho]) = 0` by quadrature nodes moved along characteristics.

    Parameters
    ----------
    model : Model
    density0 : callable
        :math:`\rho_0(x)` for points of shape ``(n, d)``; normalized to a probability density with
        respect to the surface measure (uniform: :math:`1/|S^{d-1}|`).
    t_end : float
    d : {2, 3}
        Circle or sphere.
    nodes : int
        Trapezoid nodes (S^1) or Gauss--Legendre latitudes (S^2, with ``2 nodes`` longitudes).
    method, rtol, atol, dt
        Solver of the contract (default ``dopri5`` at 1e-10); fixed-step methods take ``dt``.
    eps : float
        Offset of the Jacobian tracers (central differences, error ``O(eps^2)``).
    writer : Tracker, optional
        A recorder (e.g. :class:`wflow.io.ZarrRecorder`), which makes the run resumable.

    Returns
    -------
    LagrangianSolution

    Examples
    --------
    >>> import wflow
    >>> sol = wflow.solve_lagrangian(wflow.SA(1.0), lambda x: 1 + 0.1 * x[:, 0], 0.5, nodes=64)
    >>> bool(abs(sol.jacobian[0] - 1).max() < 1e-6), sol.points.shape
    (True, (11, 64, 2))
    """
    if not isinstance(model, Model):
        raise TypeError(f"model must be a wflow Model, got {short_repr(model)}")
    if model.space != "sphere":
        raise ValueError(
            f"{model!r} carries radii: the Lagrangian solver moves densities on the sphere; use "
            f"wflow.simulate for pre-ln, peri-ln and mix-ln"
        )
    if model.ordered:
        raise ValueError(
            f"{model!r} is causal (it depends on the tokens' order, not on a density): the Lagrangian "
            f"solver cannot serve it; use wflow.simulate"
        )
    model.check_dimension(d)
    eps = check_positive(eps, "eps")
    mu0, rho0 = quadrature_measure(density0, d, nodes)
    x = mu0.points
    frame = tangent_frame(x)  # (n, d-1, d)
    tracers = np.concatenate(
        [exp_map(x, s * eps * frame[:, a]) for a in range(d - 1) for s in (1.0, -1.0)], axis=0
    )
    problem = LagrangianProblem(model, mu0.weights, d, rho0, eps=eps, nodes=nodes, backend=backend)
    solver = get_solver(method)
    trs = list(trackers)
    if writer is not None:
        trs.insert(0, writer)
    if progress:
        trs.append(ProgressBar(f"lagrangian ({solver.name})"))
    kw: dict[str, Any] = dict(rtol=rtol, atol=atol) if solver.adaptive else {}
    r = integrate(
        problem,
        solver,
        np.concatenate([x, tracers], axis=0),
        0.0,
        t_end,
        save_at=save_at,
        dt=dt,
        trackers=trs,
        keep=keep,
        throw=throw,
        result_class=LagrangianSolution,
        **kw,
    )
    return cast(LagrangianSolution, r)  # integrate builds result_class


def _rebuild(cfg: dict[str, Any], stored: dict[str, Any]):
    weights = stored["static"]["weights"][1]
    problem = LagrangianProblem(
        model_from_dict(cfg["model"]),
        weights,
        cfg["d"],
        stored["static"]["rho0"][1],
        **{k: cfg[k] for k in ("eps", "nodes", "backend")},
    )
    y = np.concatenate([stored["data"]["points"][1][-1], stored["data"]["tracers"][1][-1]], axis=-2)
    return problem, get_solver(cfg["solver"], **cfg["solver_options"]), y


register_kind("lagrangian", LagrangianSolution, _rebuild)
