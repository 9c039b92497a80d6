r"""Eulerian finite-volume solver for the mean-field equation on :math:`S^1` and :math:`S^2`.

Solves, for a density :math:`\rho` with respect to the plain surface measure,

.. math::

    \partial_t \rho + \mathrm{div}_S\big(\rho\, v[\rho]\big) = \kappa^{-1}\Delta_S\rho ,

on a :class:`~wflow.mesh.CircleMesh` or :class:`~wflow.mesh.SphereMesh`.  The state is the
vector of cell masses :math:`m_i = \rho_i|C_i|`, updated by

.. math::

    \frac{dm_i}{dt} = -\sum_{e\in\partial C_i} s_{ie} F_e , \qquad
    F_e = \ell_e\big(u_e^+\rho_L^e + u_e^-\rho_R^e\big) - \kappa^{-1}\ell_e\frac{\rho_R - \rho_L}{\mathrm{dist}_e},

with :math:`s_{ie} = \pm1` the orientation of edge ``e`` seen from cell ``i``.  Each flux is
computed once and added to one cell and subtracted from the other, so the total mass is
conserved to round-off.  Ingredients (Carrillo, Chertock & Huang 2015, *Commun. Comput.
Phys.* 17, on an unstructured mesh):

* **velocity** :math:`u_e = \langle v[\mu_h](x_e), n_e\rangle` at the edge midpoints, with
  :math:`\mu_h` = the cell masses at the cell centroids (``Density.to_atoms``) through
  ``model.velocity`` and hence the shared kernel sums (the spectral fast path when
  :math:`Q = K = I`);
* **reconstruction** :math:`\rho_i^e = \rho_i + \phi_i\,\langle g_i, \log_{c_i}(x_e)\rangle`,
  :math:`g_i` the least-squares gradient from the neighbours, :math:`\phi_i` the
  Barth--Jespersen limiter with bounds :math:`[\min_{\mathcal N(i)}\rho,\ \min(\max_{\mathcal N(i)}\rho, 2\rho_i)]`
  (on the circle it is the monotonized-central MUSCL slope).  So :math:`0\le\rho_i^e\le 2\rho_i`;
* **time** SSP-RK3 (Shu & Osher 1988), a convex combination of forward-Euler steps.

Positivity.  One forward-Euler step keeps :math:`m_i\ge0` when
:math:`\Delta t \le \Delta t_{\max} = \min_i |C_i| / \big(2\sum_{e}\ell_e (s_{ie}u_e)^+ + \kappa^{-1}\sum_e \ell_e/\mathrm{dist}_e\big)`
(outflow bounded by :math:`2\rho_i`, explicit diffusion included: the parabolic restriction
is part of the same limit).  The adaptive step is ``dt = cfl * dt_max`` evaluated at the
start of the step, and every Runge--Kutta stage is checked against its own limit: a
violation rejects the step and retries with the smaller limit.  A fixed ``dt`` must stay
below ``dt_max``.  Hence densities stay non-negative for every ``cfl <= 1``.

The scheme is second order in space and third order in time (``order = 2``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..density import Density
from ..errors import SolverError, check_positive, short_repr
from ..measure import Atoms
from ..mesh import Mesh
from ..models import Model

__all__ = ["FiniteVolume", "DensityTrajectory", "solve_density", "SCHEMES"]

logger = logging.getLogger(__name__)


class FiniteVolume:
    """One step of the limited MUSCL / SSP-RK3 finite-volume scheme (module docstring).

    The scheme holds the mesh, the model and the diffusion; it knows nothing about saving.
    ``init(masses)`` returns a state; ``step(state, dt)`` returns the next state or ``None``
    when a stage violates the positivity limit (then ``state.limit`` holds the smallest one).
    """

    name = "fv-muscl-ssprk3"
    order = 2

    def __init__(self, mesh: Mesh, model: Model | None, *, kappa: float | None = None, backend: str = "auto",
                 limiter: bool = True):
        self.mesh = mesh
        self.model = model
        self.inv_kappa = 0.0 if kappa is None or np.isinf(kappa) else 1.0 / kappa
        self.backend = backend
        self.limiter = limiter
        self.evaluations = 0
        M = mesh.n_cells
        valid = mesh.cell_edges >= 0
        e = np.where(valid, mesh.cell_edges, 0)
        self._valid = valid
        self._ell = np.where(valid, mesh.edge_length[e], 0.0)
        self._sign = mesh.cell_edge_sign.astype(float)
        self._e = e
        # diffusion part of the limit, per cell
        self._diff_rate = self.inv_kappa * np.sum(np.where(valid, mesh.edge_length[e] / mesh.edge_distance[e], 0.0), axis=1)
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
    def edge_velocity(self, masses: np.ndarray) -> np.ndarray:
        r"""Normal velocity :math:`u_e = \langle v[\mu_h](x_e), n_e\rangle`, shape ``(E,)``."""
        mesh = self.mesh
        if self.model is None:
            return np.zeros(mesh.n_edges)
        mu = Atoms._trusted(mesh.centers, np.maximum(masses, 0.0))
        v = self.model.velocity(mesh.edge_midpoint, mu, backend=self.backend)
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
                ratio = np.where(delta > 0, (upper - rho)[:, None] / delta,
                                 np.where(delta < 0, (lower - rho)[:, None] / delta, 1.0))
            phi = np.clip(ratio.min(axis=1), 0.0, 1.0)
            delta = phi[:, None] * delta
        rec = np.maximum(rho[:, None] + delta, 0.0)  # clamping round-off keeps fluxes antisymmetric
        return rec[mesh.cell_left, mesh.edge_slot_left], rec[mesh.cell_right, mesh.edge_slot_right]

    def rhs(self, masses: np.ndarray) -> tuple[np.ndarray, float]:
        """``(dm/dt, dt_max)``: the semi-discrete right-hand side and the positivity step limit."""
        mesh = self.mesh
        rho = masses / mesh.areas
        u = self.edge_velocity(masses)
        rho_l, rho_r = self.reconstruct(rho)
        flux = mesh.edge_length * (np.maximum(u, 0.0) * rho_l + np.minimum(u, 0.0) * rho_r)
        if self.inv_kappa:
            flux -= self.inv_kappa * mesh.edge_length * (rho[mesh.cell_right] - rho[mesh.cell_left]) / mesh.edge_distance
        M = self._M
        dm = np.bincount(mesh.cell_right, weights=flux, minlength=M) - np.bincount(mesh.cell_left, weights=flux, minlength=M)
        out = np.sum(self._ell * np.maximum(self._sign * u[self._e], 0.0), axis=1)
        rate = 2.0 * out + self._diff_rate
        with np.errstate(divide="ignore"):
            limit = float(np.min(np.where(rate > 0, mesh.areas / np.where(rate > 0, rate, 1.0), np.inf)))
        return dm, limit

    # -- contract: init / step ---------------------------------------------------
    def init(self, masses: np.ndarray) -> "FVState":
        dm, limit = self.rhs(masses)
        return FVState(masses, dm, limit)

    def step(self, state: "FVState", dt: float) -> "FVState | None":
        """One SSP-RK3 step of size ``dt``; ``None`` if a stage needs a smaller step (``state.limit`` updated)."""
        m0 = state.masses
        if dt > state.limit:
            return None
        m1 = m0 + dt * state.dm
        dm1, lim1 = self.rhs(m1)
        if dt > lim1:
            state.limit = lim1
            return None
        m2 = 0.75 * m0 + 0.25 * (m1 + dt * dm1)
        dm2, lim2 = self.rhs(m2)
        if dt > lim2:
            state.limit = min(lim1, lim2)
            return None
        # (m0 + 2 x) / 3, not m0/3 + 2x/3: fl(1/3) + fl(2/3) != 1 would drift the mass by ~2e-17 a step
        m3 = (m0 + 2.0 * (m2 + dt * dm2)) / 3.0
        return self.init(m3)


@dataclass
class FVState:
    masses: np.ndarray
    dm: np.ndarray
    limit: float


#: finite-volume schemes by name
SCHEMES: dict[str, type] = {FiniteVolume.name: FiniteVolume}


@dataclass
class DensityTrajectory:
    """Result of :func:`solve_density`.

    Attributes
    ----------
    times : ndarray, shape (n_saves,)
    values : ndarray, shape (n_saves, M)
        Cell averages (plain surface measure) at the saved times.
    mesh : Mesh
    mass : ndarray, shape (n_saves,)
        :math:`\\sum_i \\rho_i|C_i|` at the saved times.
    energy : ndarray, shape (n_saves,) or None
        ``model.energy(rho.to_atoms())`` where the model is a gradient flow.
    stats : dict
        ``steps``, ``rejected``, ``evaluations`` (velocity evaluations), ``dt_min``, ``dt_max``.
    status : int
        0: reached ``t_end``; 1: stopped by the callback.
    message : str
    """

    times: np.ndarray
    values: np.ndarray
    mesh: Mesh
    mass: np.ndarray
    energy: np.ndarray | None
    stats: dict[str, Any] = field(default_factory=dict)
    status: int = 0
    message: str = ""
    scheme: str = FiniteVolume.name

    def density(self, i: int = -1) -> Density:
        """The saved density number ``i``."""
        return Density._trusted(self.mesh, self.values[i])

    def __len__(self) -> int:
        return int(self.times.shape[0])

    def __repr__(self) -> str:
        return (f"DensityTrajectory(n_saves={len(self)}, t=[{self.times[0]:g}, {self.times[-1]:g}], mesh={self.mesh!r}, "
                f"steps={self.stats.get('steps')}, status={self.status})")


def _check_save_at(save_at: Any, t_end: float) -> np.ndarray:
    if save_at is None:
        return np.array([0.0, t_end]) if t_end > 0 else np.array([0.0])
    s = np.atleast_1d(np.asarray(save_at, dtype=float))
    if s.ndim != 1 or s.size == 0 or not np.all(np.isfinite(s)):
        raise ValueError(f"save_at must be a 1-d array of finite times, got {short_repr(save_at)}")
    if np.any(np.diff(s) <= 0):
        raise ValueError(f"save_at must be strictly increasing, got {short_repr(s)}")
    if s[0] < 0 or s[-1] > t_end:
        raise ValueError(f"save_at must lie in [0, t_end] = [0, {t_end:g}], got [{s[0]:g}, {s[-1]:g}]")
    return s


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
) -> DensityTrajectory:
    r"""Evolve a density by :math:`\partial_t\rho + \mathrm{div}_S(\rho v[\rho]) = \kappa^{-1}\Delta_S\rho`.

    Parameters
    ----------
    model : Model or None
        Gives the velocity; ``None`` for pure diffusion (needs ``kappa``).
    rho0 : Density
        Initial density; its mesh is the mesh of the run.
    t_end : float
        Final time, ``>= 0``.
    save_at : array_like, optional
        Increasing times in ``[0, t_end]`` at which the density is saved (steps land on them
        exactly); default ``[0, t_end]``.
    cfl : float
        Fraction of the positivity limit ``dt_max`` (module docstring) used by the adaptive
        step, in ``(0, 1]``.
    kappa : float, optional
        Inverse diffusivity; ``None`` or ``inf``: no diffusion.  Diffusion is explicit (two-point
        flux), its parabolic restriction is included in ``dt_max``.
    dt : float, optional
        Fixed step instead of the adaptive one; must stay ``<= dt_max``.
    max_step : float, optional
        Upper bound on the adaptive step (for accuracy when velocities are small).
    backend : str
        Kernel-sum backend for ``model.velocity``.
    limiter : bool
        Barth--Jespersen limited (``True``) or unlimited (``False``) linear reconstruction;
        positivity is guaranteed only with the limiter.
    callback : callable, optional
        ``callback(t, rho)`` after every step; a true return value stops the run.

    Returns
    -------
    DensityTrajectory

    Raises
    ------
    ValueError
        Bad input: a model whose dimension differs from the mesh's, a fixed ``dt`` above the
        initial limit, ...
    SolverError
        A fixed ``dt`` exceeds the limit later in the run, or the step underflows.
    """
    if not isinstance(rho0, Density):
        raise TypeError(f"rho0 must be a wflow Density, got {short_repr(rho0)}")
    mesh = rho0.mesh
    if model is not None:
        if not isinstance(model, Model):
            raise TypeError(f"model must be a wflow Model or None, got {short_repr(model)}")
        model.check_dimension(mesh.d)
    if isinstance(t_end, bool) or not isinstance(t_end, (int, float, np.integer, np.floating)) or not np.isfinite(t_end) or t_end < 0:
        raise ValueError(f"t_end must be a finite number >= 0, got {t_end!r}")
    t_end = float(t_end)
    cfl = check_positive(cfl, "cfl")
    if cfl > 1:
        raise ValueError(f"cfl must be in (0, 1] (positivity needs dt <= dt_max), got {cfl}")
    if kappa is not None:
        kappa = check_positive(kappa, "kappa", allow_inf=True)
    if model is None and (kappa is None or np.isinf(kappa)):
        raise ValueError("model=None (pure diffusion) needs a finite kappa")
    if dt is not None:
        dt = check_positive(dt, "dt")
    if max_step is not None:
        max_step = check_positive(max_step, "max_step")
    saves = _check_save_at(save_at, t_end)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {short_repr(callback)}")

    scheme = FiniteVolume(mesh, model, kappa=kappa, backend=backend, limiter=limiter)
    state = scheme.init(rho0.masses())
    if dt is not None and dt > state.limit:
        raise ValueError(f"dt={dt:g} is above the CFL (positivity) limit dt_max={state.limit:.6g} of the initial "
                         f"density; use dt <= {state.limit:.6g} or dt=None for the adaptive step")
    gradient = model is not None and model.is_gradient

    out_t, out_v, out_e = [], [], []

    def record(t: float, masses: np.ndarray) -> None:
        out_t.append(t)
        out_v.append(masses / mesh.areas)
        if gradient:
            out_e.append(float(model.energy(Atoms._trusted(mesh.centers, np.maximum(masses, 0.0)), backend=backend)))

    t, k = 0.0, 0
    steps = rejected = 0
    dts: list[float] = []
    status, message = 0, "reached t_end"
    if saves[0] == 0.0:
        record(0.0, state.masses)
        k = 1
    while k < saves.size:
        target = saves[k]
        h = dt if dt is not None else cfl * state.limit
        if max_step is not None:
            h = min(h, max_step)
        land = h >= target - t
        if land:
            h = target - t
        new = scheme.step(state, h)
        if new is None:
            if dt is not None:
                raise SolverError(f"the fixed step dt={dt:g} exceeds the CFL (positivity) limit {state.limit:.6g} "
                                  f"at t={t:.6g}; use a smaller dt or dt=None")
            rejected += 1
            if rejected > 100 * (steps + 1):
                raise SolverError(f"step size rejected {rejected} times at t={t:.6g}")
            state = FVState(state.masses, state.dm, state.limit)
            continue
        steps += 1
        dts.append(h)
        state = new
        t = float(target) if land else t + h
        if not np.all(np.isfinite(state.masses)):
            raise SolverError(f"non-finite density at t={t:.6g}; the velocity may have overflowed (USA at large beta)")
        if steps > max_steps:
            raise SolverError(f"more than max_steps={max_steps} steps before t={t:.6g}")
        if land:
            record(t, state.masses)
            k += 1
        if callback is not None and callback(t, Density._trusted(mesh, state.masses / mesh.areas)):
            status, message = 1, f"stopped by callback at t={t:.6g}"
            if not land:
                record(t, state.masses)
            break
        if state.limit < 1e-14 * max(t_end, 1.0) and dt is None:
            raise SolverError(f"step size underflow at t={t:.6g} (dt_max={state.limit:.3g})")
    logger.debug("solve_density: %d steps, %d rejected, %d evaluations", steps, rejected, scheme.evaluations)
    values = np.array(out_v)
    return DensityTrajectory(
        times=np.array(out_t), values=values, mesh=mesh, mass=values @ mesh.areas,
        energy=np.array(out_e) if gradient else None,
        stats={"steps": steps, "rejected": rejected, "evaluations": scheme.evaluations,
               "dt_min": min(dts) if dts else None, "dt_max": max(dts) if dts else None},
        status=status, message=message,
    )
