r"""Eulerian finite-volume solver for the mean-field equation on :math:`S^1` and :math:`S^2`.

Solves, for a density :math:`\rho` with respect to the plain surface measure,

.. math::

    \partial_t \rho + \mathrm{div}_S\big(\rho\, v[\rho]\big) = \kappa^{-1}\Delta_S\rho ,

on a :class:`~wflow.mesh.CircleMesh` or :class:`~wflow.mesh.SphereMesh`.  The state is the
vector of cell masses :math:`m_i = \rho_i|C_i|`, updated by

.. math::

    \frac{dm_i}{dt} = -\sum_{e\in\partial C_i} s_{ie} F_e , \qquad
    F_e = \ell_e\big(u_e^+\rho_L^e + u_e^-\rho_R^e\big) - \kappa^{-1}\ell_e\frac{\rho_R - \rho_L}{\mathrm{dist}_e},

with :math:`s_{ie} = \pm1` the orientation of edge ``e`` seen from cell ``i``: mass is conserved to
round-off.  Edge values come from a limited linear reconstruction (Carrillo, Chertock & Huang 2015),
steps from SSP-RK3 with every stage below its positivity limit, so densities stay non-negative for
every ``cfl <= 1``; the error is measured per unit of change,
:math:`\|e\|_1 \le \text{atol} + \text{rtol}\,\|m^{n+1} - m^n\|_1` (``docs/continuum.md``,
``docs/solvers.md``).  Second order in space, third in time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from ..density import Density
from ..errors import check_positive, short_repr
from ..measure import Atoms
from ..mesh import Mesh, mesh_from_dict
from ..models import Model
from .base import Problem, Result, Tracker, get_solver, integrate, register_kind
from .trackers import Callback, ProgressBar

__all__ = ["FiniteVolume", "DensityTrajectory", "solve_density"]

logger = logging.getLogger(__name__)


class FiniteVolume(Problem):
    """The limited MUSCL finite-volume discretization of the continuity equation (module docstring): a
    :class:`~wflow.solvers.base.Problem` whose state is the vector of cell masses.

    Parameters
    ----------
    mesh : Mesh
    model, kappa, backend, limiter, cfl, max_step
        As :func:`solve_density`.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.solvers.eulerian import FiniteVolume
    >>> mesh = wflow.CircleMesh(32)
    >>> masses = wflow.Density.from_function(mesh, lambda x: 1 + 0.5 * x[:, 0]).masses()
    >>> problem = FiniteVolume(mesh, wflow.USA(1.0), backend="numpy")
    >>> dm, limit = problem.rhs_with_limit(0.0, masses)
    >>> dm.shape, bool(abs(dm.sum()) < 1e-15), bool(limit > 0)  # fluxes conserve mass
    ((32,), True, True)
    """

    kind = "density"
    order = 2  # spatial order

    def __init__(
        self,
        mesh: Mesh,
        model: Model | None,
        *,
        kappa: float | None = None,
        backend: str = "auto",
        limiter: bool = True,
        cfl: float = 0.4,
        max_step: float | None = None,
    ):
        super().__init__()
        if model is not None and model.space != "sphere":
            raise ValueError(
                f"{model!r} carries radii (tokens in R^d): the finite-volume solver moves densities on the "
                f"sphere; use the particle solver (wflow.simulate) for pre-ln, peri-ln and mix-ln"
            )
        if model is not None and model.ordered:
            raise ValueError(
                f"{model!r} is causal (it depends on the tokens' order, not on a density): the "
                f"finite-volume solver cannot serve it; use wflow.simulate"
            )
        self.kappa = kappa
        self.cfl = cfl
        self.limit_slack = 1.0 / cfl  # stages are checked against dt_max itself
        self.max_step = max_step
        self.mesh = mesh
        self.model = model
        self.inv_kappa = 0.0 if kappa is None or np.isinf(kappa) else 1.0 / kappa
        self.backend = backend
        self.limiter = limiter
        M = mesh.n_cells
        valid = mesh.cell_edges >= 0
        e = np.where(valid, mesh.cell_edges, 0)
        self._ell = np.where(valid, mesh.edge_length[e], 0.0)
        self._sign = mesh.cell_edge_sign.astype(float)
        self._e = e
        # diffusion part of the limit, per cell
        self._diff_rate = self.inv_kappa * np.sum(
            np.where(valid, mesh.edge_length[e] / mesh.edge_distance[e], 0.0), axis=1
        )
        # least-squares gradient: g_i = sum_t q_it (rho_{n_it} - rho_i); increments Delta_is = <g_i, r_is>
        r = mesh.cell_neighbor_offset
        r2 = np.sum(r * r, axis=-1)
        w = np.where(valid & (r2 > 0), 1.0 / np.where(r2 > 0, r2, 1.0), 0.0)
        A = np.einsum("ik,ika,ikb->iab", w, r, r)
        P = np.linalg.pinv(A, rcond=1e-10)
        q = np.einsum("iab,ikb->ika", P, w[..., None] * r)
        self._C = np.einsum("isa,ita->ist", mesh.cell_edge_offset, q)
        self._nbr = mesh.cell_neighbors
        self._M = M

    # -- pieces -------------------------------------------------------------------
    def edge_velocity(self, masses: np.ndarray, t: float = 0.0) -> np.ndarray:
        r"""Normal velocity :math:`u_e = \langle v[\mu_h](x_e), n_e\rangle` of the model acting at time ``t``, shape ``(E,)``."""
        mesh = self.mesh
        if self.model is None:
            return np.zeros(mesh.n_edges)
        mu = Atoms._trusted(mesh.centers, np.maximum(masses, 0.0))
        v = self.model.at(t, piece=self.piece_time(t)).velocity(
            mesh.edge_midpoint, mu, backend=self.backend
        )
        self.evaluations += 1
        return np.einsum("ed,ed->e", v, mesh.edge_normal)

    def reconstruct(self, rho: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Limited edge values ``(rho_L, rho_R)`` of the left and right cells, shape ``(E,)`` each."""
        mesh = self.mesh
        if self.limiter is None:
            return rho[mesh.cell_left], rho[mesh.cell_right]
        nb = rho[self._nbr]
        diff = nb - rho[:, None]
        delta = np.einsum("ist,it->is", self._C, diff)
        if self.limiter:
            upper = np.minimum(nb.max(axis=1), 2 * rho)
            upper = np.maximum(upper, rho)
            lower = np.maximum(np.minimum(nb.min(axis=1), rho), 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(
                    delta > 0,
                    (upper - rho)[:, None] / delta,
                    np.where(delta < 0, (lower - rho)[:, None] / delta, 1.0),
                )
            phi = np.clip(ratio.min(axis=1), 0.0, 1.0)
            delta = phi[:, None] * delta
        rec = np.maximum(rho[:, None] + delta, 0.0)  # clamping round-off keeps fluxes antisymmetric
        return rec[mesh.cell_left, mesh.edge_slot_left], rec[mesh.cell_right, mesh.edge_slot_right]

    def rhs_with_limit(self, t: float, masses: np.ndarray) -> tuple[np.ndarray, float]:
        """``(dm/dt, cfl * dt_max)``: the semi-discrete right-hand side and the usable positivity step limit."""
        dm, limit = self.positivity_rhs(masses, t)
        limit *= self.cfl
        if self.max_step is not None:
            limit = min(limit, self.max_step)
        return dm, limit

    def rhs(self, t: float, masses: np.ndarray) -> np.ndarray:
        return self.positivity_rhs(masses, t)[0]

    def breakpoints(self, t0: float, t_end: float) -> np.ndarray:
        return np.empty(0) if self.model is None else self.model.breakpoints(t0, t_end)

    def positivity_rhs(self, masses: np.ndarray, t: float = 0.0) -> tuple[np.ndarray, float]:
        """``(dm/dt, dt_max)``: the semi-discrete right-hand side and the positivity step limit of forward Euler."""
        mesh = self.mesh
        rho = masses / mesh.areas
        u = self.edge_velocity(masses, t)
        rho_l, rho_r = self.reconstruct(rho)
        flux = mesh.edge_length * (np.maximum(u, 0.0) * rho_l + np.minimum(u, 0.0) * rho_r)
        if self.inv_kappa:
            jump = rho[mesh.cell_right] - rho[mesh.cell_left]
            flux -= self.inv_kappa * mesh.edge_length * jump / mesh.edge_distance
        M = self._M
        dm = np.bincount(mesh.cell_right, weights=flux, minlength=M) - np.bincount(
            mesh.cell_left, weights=flux, minlength=M
        )
        out = np.sum(self._ell * np.maximum(self._sign * u[self._e], 0.0), axis=1)
        rate = 2.0 * out + self._diff_rate
        with np.errstate(divide="ignore"):
            limit = float(
                np.min(np.where(rate > 0, mesh.areas / np.where(rate > 0, rate, 1.0), np.inf))
            )
        return dm, limit

    # -- the contract's remaining pieces --------------------------------------------
    def error_norm(self, err, y0, y1, rtol, atol) -> float:
        r""":math:`\|e\|_1 / (\text{atol} + \text{rtol}\,\|m^{n+1} - m^n\|_1)`: error per unit of change (module docstring)."""
        return float(np.abs(err).sum() / (atol + rtol * np.abs(y1 - y0).sum()))

    def default_tolerances(self) -> tuple[float, float]:
        return 1e-3, 1e-12

    @property
    def gradient(self) -> bool:
        return self.model is not None and self.model.is_gradient

    def energy(self, masses: np.ndarray, t: float = 0.0) -> float:
        if self.model is None:  # no interaction: F = 0 (as for the JKO energy)
            return 0.0
        return float(
            self.model.at(t).energy(
                Atoms._trusted(self.mesh.centers, np.maximum(masses, 0.0)), backend=self.backend
            )
        )

    #: the name of the saved cell averages (``values`` in stores written by wflow 0.1; a resume keeps it)
    density_name = "density"

    def snapshot(self, t: float, masses: np.ndarray) -> dict:
        out = {
            self.density_name: (("cell",), masses / self.mesh.areas),
            # the state itself (density * areas is the masses only to rounding): resume is exact
            "masses": (("cell",), masses),
            "mass": ((), np.float64(masses.sum())),
        }
        if self.gradient:
            out["energy"] = ((), np.float64(self.energy(masses, t)))
        return out

    def static(self) -> dict:
        m = self.mesh
        return {
            "centers": (("cell", "coord"), m.centers),
            "areas": (("cell",), m.areas),
            "cell_pairs": (("edge", "side"), np.stack([m.cell_left, m.cell_right], axis=1)),
            "edge_length": (("edge",), m.edge_length),
        }

    def config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "model": None if self.model is None else self.model.to_dict(),
            "mesh": self.mesh.to_dict(),
            "kappa": self.kappa,
            "backend": self.backend,
            "limiter": self.limiter,
            "cfl": self.cfl,
            "max_step": self.max_step,
        }


class DensityTrajectory(Result):
    """Result of :func:`solve_density` (a :class:`~wflow.solvers.base.Result` of kind ``density``).

    Attributes
    ----------
    times : ndarray, shape (n_saves,)
    values : ndarray, shape (n_saves, M)
        Cell averages (plain surface measure) at the saved times.
    mesh : Mesh
    mass, energy : ndarray, shape (n_saves,)
        :math:`\\sum_i \\rho_i|C_i|`; the energy (None where the model is not a gradient flow).
    stats, status
        As for every :class:`~wflow.solvers.base.Result`.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> rho0 = wflow.Density.from_function(wflow.CircleMesh(32), lambda x: 1 + 0.5 * x[:, 0])
    >>> res = wflow.solve_density(wflow.USA(1.0), rho0, 0.5, save_at=[0.0, 0.25, 0.5], backend="numpy")
    >>> type(res).__name__, res.values.shape, bool(np.allclose(res.mass, 1.0))
    ('DensityTrajectory', (3, 32), True)
    >>> bool(np.all(np.diff(res.energy) > 0)), res.density(-1).values.shape  # USA ascends its energy
    (True, (32,))
    """

    _mesh: Mesh | None = None

    @property
    def mesh(self) -> Mesh:
        if self._mesh is None:
            self._mesh = mesh_from_dict(self.config["mesh"])
        return self._mesh

    @property
    def values(self) -> np.ndarray:
        """The cell averages, shape ``(n_saves, M)`` (the store's ``density``; ``values`` in older stores)."""
        return self.data["density" if "density" in self.data else "values"][1]

    @property
    def mass(self) -> np.ndarray:
        return self.data["mass"][1]

    @property
    def energy(self) -> np.ndarray | None:
        return self.data["energy"][1] if "energy" in self.data else None

    def density(self, i: int = -1, *, t: float | None = None) -> Density:
        """The saved density number ``i``, or the one saved at time ``t`` (:meth:`save_index`)."""
        return Density._trusted(self.mesh, self.values[i if t is None else self.save_index(t)])


def solve_density(
    model: Model | None,
    rho0: Density,
    t_end: float,
    *,
    save_at: Any = None,
    cfl: float = 0.4,
    kappa: float | None = None,
    dt: float | None = None,
    max_step: float | None = None,
    max_steps: int = 10**7,
    backend: str = "auto",
    limiter: bool = True,
    callback: Callable[[float, Density], Any] | None = None,
    method: str = "ssprk3",
    rtol: float | None = None,
    atol: float | None = None,
    progress: bool = False,
    trackers: Sequence[Tracker] = (),
    keep: bool = True,
    throw: bool = True,
) -> DensityTrajectory:
    r"""Evolve a density by :math:`\partial_t\rho + \mathrm{div}_S(\rho v[\rho]) = \kappa^{-1}\Delta_S\rho`.

    Parameters
    ----------
    model : Model or None
        Gives the velocity; ``None`` for pure diffusion (needs ``kappa``).
    rho0 : Density
        Initial density; its mesh is the mesh of the run.
    t_end : float
        Final time, ``> 0``.
    save_at : array_like, optional
        Save times in ``[0, t_end]`` (steps land on them); default ``[0, t_end]``.
    cfl : float
        Fraction of the positivity limit ``dt_max`` a step may use, in ``(0, 1]``.
    kappa : float, optional
        Inverse diffusivity; ``None`` or ``inf``: no diffusion (explicit, two-point flux).
    dt : float, optional
        Fixed step instead of the error-controlled one; must stay ``<= dt_max``.
    max_step : float, optional
        Upper bound on the step.
    backend : str
        Kernel-sum backend for ``model.velocity``.
    limiter : bool
        Barth--Jespersen limited (``True``, positive) or unlimited (``False``) reconstruction.
    callback : callable, optional
        ``callback(t, rho)`` after every step; a true return value stops the run (status 1).
    method : str
        Time stepper of the solver contract; ``"ssprk3"`` (default, positivity preserving).
    rtol, atol : float, optional
        Tolerances of the error per unit of change (module docstring); default 1e-3, 1e-12.
    progress, trackers, keep, throw
        See :func:`wflow.solvers.base.integrate`; ``progress`` adds a progress bar.

    Returns
    -------
    DensityTrajectory

    Raises
    ------
    ValueError
        A model whose dimension differs from the mesh's, a fixed ``dt`` above the initial limit, ...
    SolverError
        A fixed ``dt`` exceeds the limit later in the run, or the step underflows.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow import SA, CircleMesh, Density, solve_density
    >>> rho0 = Density.from_function(CircleMesh(64), lambda x: 1 + 0.5 * x[:, 0])
    >>> r = solve_density(SA(beta=2.0), rho0, 1.0, save_at=[0, 0.5, 1.0])
    >>> r.values.shape, bool(abs(r.mass - 1).max() < 1e-13)
    ((3, 64), True)
    """
    if not isinstance(rho0, Density):
        raise TypeError(f"rho0 must be a wflow Density, got {short_repr(rho0)}")
    mesh = rho0.mesh
    if model is not None:
        if not isinstance(model, Model):
            raise TypeError(f"model must be a wflow Model or None, got {short_repr(model)}")
        model.check_dimension(mesh.d)
    t_end = check_positive(t_end, "t_end")
    cfl = check_positive(cfl, "cfl")
    if cfl > 1:
        raise ValueError(f"cfl must be in (0, 1] (positivity needs dt <= dt_max), got {cfl}")
    if kappa is not None:
        kappa = check_positive(kappa, "kappa", allow_inf=True)
        if np.isinf(kappa):
            kappa = None
    if model is None and kappa is None:
        raise ValueError("model=None (pure diffusion) needs a finite kappa")
    if max_step is not None:
        max_step = check_positive(max_step, "max_step")
    solver = get_solver(method)
    problem = FiniteVolume(
        mesh, model, kappa=kappa, backend=backend, limiter=limiter, cfl=cfl, max_step=max_step
    )
    masses = rho0.masses()
    if dt is not None:
        dt = check_positive(dt, "dt")
        limit = problem.positivity_rhs(masses)[1]
        if dt > limit:
            raise ValueError(
                f"dt={dt:g} is above the CFL (positivity) limit dt_max={limit:.6g} of the initial "
                f"density; use dt <= {limit:.6g} or dt=None for the adaptive step"
            )
    trs = list(trackers)
    if callback is not None:
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {short_repr(callback)}")
        trs.append(
            Callback(
                lambda t, m: callback(t, Density._trusted(mesh, m / mesh.areas)), every_step=True
            )
        )
    if progress:
        trs.append(ProgressBar(f"finite volume ({solver.name})"))
    r = integrate(
        problem,
        solver,
        masses,
        0.0,
        t_end,
        save_at=[0.0, t_end] if save_at is None else save_at,
        dt=dt,
        rtol=rtol,
        atol=atol,
        adaptive=dt is None and solver.adaptive,
        max_steps=max_steps,
        trackers=trs,
        keep=keep,
        throw=throw,
        result_class=DensityTrajectory,
    )
    traj = cast(DensityTrajectory, r)  # integrate builds result_class
    traj._mesh = mesh
    logger.debug("solve_density: %s", traj)
    return traj


def _rebuild(cfg: dict[str, Any], stored: dict[str, Any]):
    from ..models import model_from_dict

    mesh = mesh_from_dict(cfg["mesh"])
    model = None if cfg["model"] is None else model_from_dict(cfg["model"])
    kw = {k: cfg[k] for k in ("kappa", "backend", "limiter", "cfl", "max_step")}
    problem = FiniteVolume(mesh, model, **kw)
    data = stored["data"]
    if "values" in data and "density" not in data:  # a store from before the rename
        problem.density_name = "values"
    name = problem.density_name
    # stores from before the masses were saved restart from density * areas (equal to rounding)
    masses = data["masses"][1][-1] if "masses" in data else data[name][1][-1] * mesh.areas
    return problem, get_solver(cfg["solver"], **cfg["solver_options"]), masses


register_kind("density", DensityTrajectory, _rebuild)
