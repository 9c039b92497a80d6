r"""Stationary states by iterated JKO steps with growing :math:`\tau`, and their atoms."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...density import Density
from ...errors import check_int, check_positive
from ...measure import Atoms
from ...mesh import Mesh
from ...models import Model
from ...sphere import tangent_frame
from .step import JKOStepper, check_eps_scaling, check_gradient_model, default_eps, support

__all__ = ["stationary", "StationaryResult", "cluster_atoms"]


def cluster_atoms(points: np.ndarray, weights: np.ndarray, *, mesh: Mesh | None = None,
                  threshold: float = 1e-3, radius: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Group the support points carrying mass into atoms.

    Points with ``weight >= threshold * max(weight)`` are linked to their mesh neighbours (or to
    points within ``radius``, default 2.5 x the spacing, on a point cloud); each connected
    component becomes one atom at its normalized barycentre with the component's mass.

    Returns
    -------
    atoms : ndarray, shape (k, d)
    masses : ndarray, shape (k,)
        Sorted by decreasing mass; they sum to the mass above the threshold.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    w = np.asarray(weights, dtype=float)
    keep = np.flatnonzero(w >= threshold * w.max())
    idx = -np.ones(w.size, dtype=np.intp)
    idx[keep] = np.arange(keep.size)
    if mesh is not None:
        nb = mesh.cell_neighbors[keep]
        rows = np.repeat(np.arange(keep.size), nb.shape[1])
        cols = idx[nb.reshape(-1)]
    else:
        from scipy.spatial import cKDTree

        if radius is None:
            n, d = points.shape
            radius = 2.5 * (2 * np.pi / n if d == 2 else np.sqrt(4 * np.pi / n))
        pairs = cKDTree(points[keep]).query_pairs(radius, output_type="ndarray")
        rows, cols = pairs[:, 0], pairs[:, 1]
    ok = cols >= 0
    G = coo_matrix((np.ones(int(ok.sum())), (rows[ok], cols[ok])), shape=(keep.size, keep.size))
    k, label = connected_components(G, directed=False)
    masses = np.bincount(label, weights=w[keep], minlength=k)
    bary = np.stack([np.bincount(label, weights=w[keep] * points[keep, c], minlength=k)
                     for c in range(points.shape[1])], axis=1)
    atoms = bary / np.linalg.norm(bary, axis=1, keepdims=True)
    order = np.argsort(-masses)
    return atoms[order], masses[order]


@dataclass
class StationaryResult:
    """Result of :func:`stationary`.

    Attributes
    ----------
    weights : ndarray, shape (n,)
        The final measure on the support.
    atoms, masses : ndarray, shapes (k, d), (k,)
        Its atoms (:func:`cluster_atoms`) and their masses.
    residual : float
        First-order residual of the atomic measure: :math:`\\max_k|\\nabla_S\\,\\delta F/\\delta\\mu(a_k)|`
        (= the velocity at the atoms), 0 at a critical point.
    residual_support : float
        :math:`\\sum_j\\nu_j|\\nabla_S\\,\\delta F/\\delta\\mu(x_j)|` on the (blurred) support measure.
    hessian : ndarray, shape (k, d-1)
        Eigenvalues of the tangential Hessian of :math:`\\delta F/\\delta\\mu[\\text{atoms}]` at each atom
        (finite differences); all :math:`< 0` for a stable critical point of the ascent flow.
    residual_grid : float or None
        The residual of the atoms before polishing (at the support's resolution, ``O(h |Hess|)``).
    potential_gap : float
        :math:`\\max_j \\psi(x_j) - \\min_k \\psi(a_k)` over the support, :math:`\\psi = \\delta F/\\delta\\mu`; :math:`\\le 0`
        (up to the resolution) when no support point would attract mass away from the atoms.
    """

    weights: np.ndarray
    points: np.ndarray
    atoms: np.ndarray
    masses: np.ndarray
    residual: float
    residual_support: float
    hessian: np.ndarray
    potential_gap: float
    energy: float
    steps: int
    tau: float
    converged: bool
    history: dict[str, list] = field(default_factory=dict)
    mesh: Mesh | None = None
    message: str = ""
    residual_grid: float | None = None

    def __repr__(self) -> str:
        return (f"StationaryResult(atoms={self.atoms.shape[0]}, residual={self.residual:.3g}, "
                f"steps={self.steps}, converged={self.converged})")


def _second_order(model: Model | None, atoms: np.ndarray, masses: np.ndarray, backend: str,
                  h: float = 1e-3) -> np.ndarray:
    k, d = atoms.shape
    if model is None:
        return np.zeros((k, d - 1))
    mu = Atoms._trusted(atoms, masses / masses.sum())
    B = tangent_frame(atoms)
    psi0 = model.first_variation(atoms, mu, backend=backend)
    H = np.zeros((k, d - 1, d - 1))
    for p in range(d - 1):
        for q in range(p, d - 1):
            vals = []
            for sp, sq in ((1, 1), (1, -1), (-1, 1), (-1, -1)):
                v = h * (sp * B[:, p] + sq * B[:, q]) / (1.0 if p == q else 1.0)
                y = np.cos(np.linalg.norm(v, axis=1))[:, None] * atoms + np.sinc(np.linalg.norm(v, axis=1) / np.pi)[:, None] * v
                vals.append(model.first_variation(y, mu, backend=backend))
            if p == q:
                # psi(exp(2h e)) etc. -> use the (1,1) and (-1,-1) points at distance 2h
                H[:, p, p] = (vals[0] + vals[3] - 2 * psi0) / (4 * h * h)
            else:
                H[:, p, q] = H[:, q, p] = (vals[0] - vals[1] - vals[2] + vals[3]) / (4 * h * h)
    return np.linalg.eigvalsh(H)


def stationary(
    model: Model | None,
    rho0: Density | Atoms,
    *,
    tau0: float = 0.1,
    growth: float = 1.5,
    tau_max: float = 1.0,
    kappa: float | None = None,
    eps: float | None = None,
    cost: str = "geodesic",
    method: str = "sinkhorn",
    tol: float = 1e-3,
    max_steps: int = 200,
    threshold: float = 1e-3,
    step_tol: float = 1e-5,
    polish: bool = True,
    backend: str = "auto",
    **kwargs: Any,
) -> StationaryResult:
    r"""A critical point of the free energy by iterated JKO steps with growing :math:`\tau`.

    Steps :math:`\tau_{k+1} = \min(\tau_{\max}, \text{growth}\cdot\tau_k)` from ``tau0`` until the
    measure stops moving, :math:`\|\nu_{k+1}-\nu_k\|_1 \le \text{tol}\cdot\min(1, \tau_k)` (a
    Wasserstein speed below ``tol``), or ``max_steps``.  Large steps keep the descent property of
    JKO (every step decreases the free energy), so the limit is a critical point reached by the
    Wasserstein flow, not an arbitrary one.

    Returns the measure, its atoms (:func:`cluster_atoms`), the first-order residual
    :math:`\max_k|\nabla_S\,\delta F/\delta\mu(a_k)|` of the atomic measure, the tangential
    Hessian eigenvalues of :math:`\delta F/\delta\mu` at the atoms (second order: all negative at a
    stable state of the ascent flow) and the potential gap (module :class:`StationaryResult`).
    With ``polish=True`` the atoms (masses fixed) are then moved off the support's grid to the
    nearby critical point of the finite-atom flow (damped Newton-like steps), so that
    ``residual`` measures criticality, not the mesh resolution (``residual_grid`` keeps the
    unpolished value).  Other keywords go to the JKO stepper (``tol`` there is ``step_tol``).
    """
    x, a, r, mesh = support(rho0, kwargs.pop("reference", None))
    check_gradient_model(model, x.shape[1])
    tau = check_positive(tau0, "tau0")
    tau_max = check_positive(tau_max, "tau_max")
    growth = check_positive(growth, "growth")
    if growth < 1:
        raise ValueError(f"growth must be >= 1, got {growth}")
    if model is None and (kappa is None or np.isinf(kappa)):
        raise ValueError("model=None (pure diffusion) needs a finite kappa")
    if kappa is not None:
        kappa = check_positive(kappa, "kappa", allow_inf=True)
    max_steps = check_int(max_steps, "max_steps")
    eps = default_eps(x, r) if eps is None else check_positive(eps, "eps")
    st = JKOStepper(model, x, r, tau=tau, eps=eps, cost=cost, kappa=kappa, method=method,
                  debias=kwargs.pop("debias", True), eps_scaling=check_eps_scaling(kwargs.pop("eps_scaling", None)), tol=step_tol,
                  max_iter=kwargs.pop("max_iter", 200), max_sinkhorn=kwargs.pop("max_sinkhorn", 5000),
                  backend=backend)
    if kwargs:
        raise TypeError(f"stationary() got unexpected keyword arguments {sorted(kwargs)}")
    w = a
    hist: dict[str, list] = {"tau": [], "change": [], "free_energy": [], "residual": []}
    converged = False
    k = 0
    for k in range(1, max_steps + 1):
        st.set_tau(tau)
        w_new, s = st.step(w)
        change = float(np.abs(w_new - w).sum())
        w = w_new
        F = st.energy.F(w)
        hist["tau"].append(tau)
        hist["change"].append(change)
        hist["free_energy"].append(-F + st.kappa_inv * st.energy.kl(w))
        hist["residual"].append(s.residual)
        if change <= tol * min(1.0, tau) and tau >= tau_max:
            converged = True
            break
        # grow tau while steps stay cheap; a step that needed many re-linearizations (repulsion:
        # proximal weight) is prox-dominated, so a larger tau would only cost more
        if s.iterations >= 30 or not s.converged:
            tau = max(tau0, tau / growth)
            tau_max = min(tau_max, tau)
        else:
            tau = min(tau_max, growth * tau)
    atoms, masses = cluster_atoms(x, w, mesh=mesh, threshold=threshold)
    mu_atoms = Atoms._trusted(atoms, masses / masses.sum())
    residual_grid = None
    if model is not None and polish and masses.size < x.shape[0] // 4:
        # the atoms sit at the support's resolution; move them (masses fixed) by damped Newton-like
        # ascent steps x <- exp_x(v / |Hess|) of the finite-atom flow to the nearby critical point
        residual_grid = float(np.max(np.linalg.norm(model.velocity(atoms, mu_atoms, backend=backend), axis=-1)))
        for _ in range(200):
            v = model.velocity(atoms, mu_atoms, backend=backend)
            if np.max(np.linalg.norm(v, axis=-1)) < 1e-12:
                break
            curv = np.max(np.abs(_second_order(model, atoms, masses, backend)), axis=1) + 1e-12
            step = v / curv[:, None]
            nv = np.linalg.norm(step, axis=-1, keepdims=True)
            atoms = np.cos(nv) * atoms + np.sinc(nv / np.pi) * step
            atoms /= np.linalg.norm(atoms, axis=-1, keepdims=True)
            mu_atoms = Atoms._trusted(atoms, masses / masses.sum())
        # atoms that met while polishing are one atom
        keep_a, keep_m = [], []
        for xa, ma in zip(atoms, masses):
            for j, xb in enumerate(keep_a):
                if np.linalg.norm(xa - xb) < 1e-6:
                    keep_m[j] += ma
                    break
            else:
                keep_a.append(xa)
                keep_m.append(ma)
        atoms, masses = np.array(keep_a), np.array(keep_m)
        mu_atoms = Atoms._trusted(atoms, masses / masses.sum())
    if model is None:
        residual, res_support, gap = 0.0, 0.0, 0.0
    else:
        v_atoms = model.velocity(atoms, mu_atoms, backend=backend)
        residual = float(np.max(np.linalg.norm(v_atoms, axis=-1)))
        v = model.velocity(x, Atoms._trusted(x, w), backend=backend)
        res_support = float(np.dot(w, np.linalg.norm(v, axis=-1)))
        psi_x = model.first_variation(x, mu_atoms, backend=backend)
        psi_a = model.first_variation(atoms, mu_atoms, backend=backend)
        gap = float(psi_x.max() - psi_a.min())
    hess = _second_order(model, atoms, masses, backend)
    msg = (f"stopped moving after {k} steps (tau={tau:g})" if converged
           else f"max_steps={max_steps} reached; last change {hist['change'][-1]:.3g}")
    return StationaryResult(weights=w, points=x, atoms=atoms, masses=masses, residual=residual,
                            residual_support=res_support, hessian=hess, potential_gap=gap,
                            energy=st.energy.F(w), steps=k, tau=tau, converged=converged, history=hist, mesh=mesh,
                            message=msg, residual_grid=residual_grid)
