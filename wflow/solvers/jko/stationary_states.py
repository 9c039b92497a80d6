r"""Stationary states by iterated JKO steps with growing :math:`\tau`, and their atoms.

:func:`stationary` steps until the measure stops moving, then reads the atoms off the mass
(:func:`atom_groups`, through :func:`wflow.diagnostics.mass_clusters`), checks them and says
what it found: ``converged`` only when the measure stopped moving *and* the first-order
residual is below the resolution of the support (for an atomic limit: the velocity at the
atoms too); polishing the atoms off the grid is kept only when it does not move an atom off
its mass and does not raise the residual (``polished`` and the message say which).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...density import Density
from ...diagnostics import check_points_weights, mass_clusters
from ...errors import check_int, check_positive
from ...measure import Atoms
from ...mesh import Mesh
from ...models import Model
from ...sphere import exp_map, tangent_frame
from .stepper import (
    JKOStepper,
    check_eps_scaling,
    check_gradient_model,
    default_eps,
    spacing,
    support,
)

__all__ = ["stationary", "StationaryResult", "cluster_atoms", "atom_groups", "AtomGroups"]


@dataclass
class AtomGroups:
    """Groups of mass on a support, found by :func:`atom_groups`.

    Attributes
    ----------
    atoms : ndarray, shape (k, d)
        One point per group: the normalized barycentre of the group's core (its points above
        the separating threshold).
    masses : ndarray, shape (k,)
        All the mass of the support, each point's to its nearest atom; sorted decreasing.
    spread : ndarray, shape (k,)
        Root-mean-square geodesic distance of each group's mass to its atom.
    threshold : float
        The highest threshold (relative to the largest weight) at which a group was still whole.
    counts : dict
        Number of core groups at each threshold of the ladder.

    Examples
    --------
    Two bumps of mass on a circle of 64 points: two groups, sorted by mass.

    >>> import numpy as np
    >>> th = np.linspace(0, 2 * np.pi, 64, endpoint=False)
    >>> x = np.stack([np.cos(th), np.sin(th)], axis=1)
    >>> w = 2 * np.exp(-((th - th[10]) / 0.1) ** 2) + np.exp(-((th - th[40]) / 0.1) ** 2)
    >>> g = atom_groups(x, w / w.sum())
    >>> type(g).__name__, g.atoms.shape, np.round(g.masses, 3).tolist()
    ('AtomGroups', (2, 2), [0.667, 0.333])
    """

    atoms: np.ndarray
    masses: np.ndarray
    spread: np.ndarray
    threshold: float
    counts: dict[float, int]


def _neighbor_array(
    x: np.ndarray, neighbors: np.ndarray | None, radius: float | None
) -> np.ndarray:
    """Mesh neighbours, or the neighbours of a point cloud within ``radius`` (padded with -1)."""
    if neighbors is not None:
        nb = np.asarray(neighbors)
        if nb.ndim != 2 or nb.shape[0] != x.shape[0] or not np.issubdtype(nb.dtype, np.integer):
            raise ValueError(
                f"neighbors must be an integer array of shape ({x.shape[0]}, k), got {nb.dtype} {nb.shape}"
            )
        return nb
    from scipy.spatial import cKDTree

    n, d = x.shape
    if radius is None:
        radius = 2.5 * (2 * np.pi / n if d == 2 else np.sqrt(4 * np.pi / n))
    radius = check_positive(radius, "radius")
    lists = cKDTree(x).query_ball_point(x, radius)
    width = max(len(row) for row in lists)
    nb = -np.ones((n, width), dtype=np.intp)
    for i, row in enumerate(lists):
        nb[i, : len(row)] = row
    return nb


def _components(w: np.ndarray, nb: np.ndarray, t: float) -> list[np.ndarray]:
    """Members of each component of the points with ``w >= t max(w)`` (single linkage along ``nb``).

    :func:`wflow.diagnostics.mass_clusters` returns each component's normalized barycentre;
    given the indicator vectors :math:`e_i` as points, the barycentre of a component is supported
    exactly on its members (their weights are positive), so the one cluster finder of the
    package also gives the membership.
    """
    bary, _ = mass_clusters(np.eye(w.size), w, neighbors=nb, threshold=t)
    return [np.flatnonzero(b > 0) for b in bary]


def atom_groups(
    points: np.ndarray,
    weights: np.ndarray,
    *,
    neighbors: np.ndarray | None = None,
    radius: float | None = None,
    threshold: float = 1e-3,
    top: float = 0.5,
    levels: int = 25,
) -> AtomGroups:
    r"""The mass groups of a measure on a support, separated wherever a valley separates them.

    A single linkage threshold cannot do this: a thin bridge of mass (a measure that has not
    finished concentrating, or the blur of two atoms a few cells apart) joins two groups at a
    low threshold, and a high one drops small atoms.  So the components of the points above a
    threshold (:func:`wflow.diagnostics.mass_clusters`) are followed up a geometric ladder of
    ``levels`` thresholds from ``threshold`` to ``top`` (relative to the largest weight): a
    component that splits into several as the threshold rises is several groups (a valley
    separates them), one that disappears is a small group of its own.  Each group's atom is the
    normalized barycentre of its last core (its points above the highest threshold at which it
    is still one component); every point's mass then goes to its nearest atom, so the masses sum
    to 1 (tails and bridges included).

    Parameters
    ----------
    points : ndarray, shape (n, d)
    weights : ndarray, shape (n,)
    neighbors : ndarray of int, shape (n, k), optional
        Mesh neighbours (``Mesh.cell_neighbors``, padded with the cell itself or -1); without
        them, a point cloud is linked within ``radius``.
    radius : float, optional
        Default 2.5 x the spacing, :math:`2\pi/n` on :math:`S^1` and :math:`\sqrt{4\pi/n}` otherwise.
    threshold, top : float
        The ladder's ends, ``0 < threshold <= top < 1``.
    levels : int
        Number of thresholds in the ladder.

    Examples
    --------
    Two bumps joined by a bridge of 1e-2 of their peaks: one component at the threshold 1e-3,
    two groups once the threshold rises above the bridge.

    >>> import numpy as np
    >>> th = np.linspace(0, 2 * np.pi, 64, endpoint=False)
    >>> x = np.stack([np.cos(th), np.sin(th)], axis=1)
    >>> w = np.exp(-((th - th[10]) / 0.1) ** 2) + np.exp(-((th - th[20]) / 0.1) ** 2)
    >>> w[11:20] += 1e-2
    >>> nb = np.stack([np.roll(np.arange(64), 1), np.roll(np.arange(64), -1)], axis=1)
    >>> g = atom_groups(x, w / w.sum(), neighbors=nb)
    >>> np.round(np.arctan2(g.atoms[:, 1], g.atoms[:, 0]) / (th[1]), 3).tolist(), np.round(g.masses, 3).tolist()
    ([10.0, 20.0], [0.501, 0.499])
    """
    x, w = check_points_weights(points, weights)
    threshold = check_positive(threshold, "threshold")
    top = check_positive(top, "top")
    levels = check_int(levels, "levels")
    if not threshold <= top < 1:
        raise ValueError(f"need 0 < threshold <= top < 1, got threshold={threshold:g}, top={top:g}")
    ladder = np.geomspace(threshold, top, levels) if top > threshold else np.array([threshold])
    nb = _neighbor_array(x, neighbors, radius)
    # work on the points above the lowest threshold only (the rest never joins a component)
    keep = np.flatnonzero(w >= threshold * w.max())
    idx = -np.ones(x.shape[0], dtype=np.intp)
    idx[keep] = np.arange(keep.size)
    sub = nb[keep]
    sub = np.where(sub >= 0, idx[np.maximum(sub, 0)], -1)
    ws = w[keep] / w.max()
    comps = [_components(ws, sub, float(t)) for t in ladder]
    counts = {float(t): len(c) for t, c in zip(ladder, comps)}
    # follow each component up the ladder: split -> several groups, vanish -> a group (its last core)
    cores: list[np.ndarray] = []
    level_of = []
    stack = [(0, c) for c in comps[0]]
    while stack:
        i, c = stack.pop()
        if i + 1 == len(comps):
            cores.append(c)
            level_of.append(i)
            continue
        inside = set(c.tolist())
        children = [ch for ch in comps[i + 1] if ch[0] in inside]
        if not children:
            cores.append(c)
            level_of.append(i)
        else:
            stack.extend((i + 1, ch) for ch in children)
    bary = np.stack([ws[c] @ x[keep[c]] for c in cores])
    atoms = bary / np.linalg.norm(bary, axis=1, keepdims=True)
    # every point's mass to its nearest atom (largest inner product)
    cos = np.clip(x @ atoms.T, -1.0, 1.0)
    owner = np.argmax(cos, axis=1)
    k = atoms.shape[0]
    masses = np.bincount(owner, weights=w, minlength=k)
    dist2 = np.arccos(cos[np.arange(x.shape[0]), owner]) ** 2
    spread = np.sqrt(
        np.bincount(owner, weights=w * dist2, minlength=k) / np.maximum(masses, 1e-300)
    )
    masses = masses / w.sum()
    order = np.argsort(-masses, kind="stable")
    split = [float(ladder[i]) for i in level_of]
    return AtomGroups(atoms[order], masses[order], spread[order], max(split), counts)


def cluster_atoms(
    points: np.ndarray,
    weights: np.ndarray,
    *,
    mesh: Mesh | None = None,
    threshold: float = 1e-3,
    radius: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Atoms and masses of the mass groups of a measure (:func:`atom_groups`).

    Parameters
    ----------
    points : ndarray, shape (n, d)
    weights : ndarray, shape (n,)
    mesh : Mesh, optional
        Links points through ``mesh.cell_neighbors``; otherwise within ``radius``.
    threshold : float
        The lowest relative threshold of the ladder of :func:`atom_groups`.

    Returns
    -------
    atoms : ndarray, shape (k, d)
    masses : ndarray, shape (k,)
        Sorted by decreasing mass; they sum to 1 (every point's mass goes to its nearest atom).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow import CircleMesh
    >>> from wflow.solvers.jko.stationary_states import cluster_atoms
    >>> mesh = CircleMesh(32)
    >>> theta = np.arctan2(mesh.centers[:, 1], mesh.centers[:, 0])
    >>> w = np.exp(-((theta - 1.0) / 0.2) ** 2) + np.exp(-((theta + 2.0) / 0.2) ** 2)  # two bumps
    >>> atoms, masses = cluster_atoms(mesh.centers, w / w.sum(), mesh=mesh)
    >>> np.round(np.arctan2(atoms[:, 1], atoms[:, 0]), 1).tolist(), np.round(masses, 3).tolist()
    ([-2.0, 1.0], [0.5, 0.5])
    """
    g = atom_groups(
        points,
        weights,
        neighbors=None if mesh is None else mesh.cell_neighbors,
        radius=radius,
        threshold=threshold,
    )
    return g.atoms, g.masses


@dataclass
class StationaryResult:
    """Result of :func:`stationary`.

    Attributes
    ----------
    weights : ndarray, shape (n,)
        The final measure on the support ``points``.
    atoms, masses : ndarray, shapes (k, d), (k,)
        Its mass groups (:func:`atom_groups`): locations (polished when ``polished``) and masses
        (summing to 1).
    spread : ndarray, shape (k,)
        RMS distance of each group's mass to its atom.
    atomic : bool
        Every group is concentrated within ``atom_width`` (default three spacings of the
        support): the limit is a sum of Diracs, blurred by the grid and the entropic term.
    residual : float
        First-order residual of the atomic measure: :math:`\\max_k|\\nabla_S\\,\\delta F/\\delta\\mu(a_k)|`
        (= the velocity at the atoms), 0 at a critical point.
    residual_support : float
        :math:`\\sum_j\\nu_j|\\nabla_S\\,\\delta F/\\delta\\mu(x_j)|` on the (blurred) support measure.
    residual_tol : float
        The tolerance both residuals are held to for ``converged``: by default the velocity
        error of an atom one spacing :math:`h` off, :math:`h\\max(1, |\\mathrm{Hess}|)`.
    residual_grid : float or None
        The atoms' residual before polishing (at the support's resolution, ``O(h |Hess|)``).
    polished : bool
        The atoms were moved off the grid to the nearby critical point of the finite-atom flow.
        Polishing is kept only when every atom stays within ``atom_width`` of its mass group,
        no two atoms meet and the residual does not rise; otherwise ``message`` says why not.
    hessian : ndarray, shape (k, d-1)
        Eigenvalues of the tangential Hessian of :math:`\\delta F/\\delta\\mu[\\text{atoms}]` at each atom
        (finite differences); all :math:`< 0` for a stable critical point of the ascent flow.
    potential_gap : float
        :math:`\\max_j \\psi(x_j) - \\min_k \\psi(a_k)` over the support, :math:`\\psi = \\delta F/\\delta\\mu`; :math:`\\le 0`
        (up to the resolution) when no support point would attract mass away from the atoms.
    stopped : bool
        The measure stopped moving (``change <= tol``) at ``tau_max``.
    converged : bool
        ``stopped``, ``residual_support <= residual_tol`` and, for an atomic limit,
        ``residual <= residual_tol``.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.solvers.jko import stationary
    >>> rho0 = wflow.Density.from_function(wflow.CircleMesh(24), lambda x: np.exp(3 * x[:, 0]))
    >>> s = stationary(wflow.USA(4.0), rho0, backend="numpy")
    >>> s.converged, s.atomic, s.polished, s.hessian.shape
    (True, True, True, (1, 1))
    >>> bool(np.isclose(s.hessian[0, 0], -np.exp(4.0), rtol=1e-3))  # USA at a Dirac: -e^beta
    True
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
    spread: np.ndarray | None = None
    atomic: bool = False
    polished: bool = False
    stopped: bool = False
    residual_tol: float = 0.0
    separation_threshold: float = 0.0

    def __repr__(self) -> str:
        return (
            f"StationaryResult(atoms={self.atoms.shape[0]}, atomic={self.atomic}, residual={self.residual:.3g}, "
            f"residual_support={self.residual_support:.3g}, steps={self.steps}, converged={self.converged})"
        )


def _second_order(
    model: Model | None, atoms: np.ndarray, masses: np.ndarray, backend: str, h: float = 1e-3
) -> np.ndarray:
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
                v = h * (sp * B[:, p] + sq * B[:, q])
                nv = np.linalg.norm(v, axis=1)
                y = np.cos(nv)[:, None] * atoms + np.sinc(nv / np.pi)[:, None] * v
                vals.append(model.first_variation(y, mu, backend=backend))
            if p == q:
                # the (1,1) and (-1,-1) points lie at distance 2h along the same direction
                H[:, p, p] = (vals[0] + vals[3] - 2 * psi0) / (4 * h * h)
            else:
                H[:, p, q] = H[:, q, p] = (vals[0] - vals[1] - vals[2] + vals[3]) / (4 * h * h)
    return np.linalg.eigvalsh(H)


def _max_speed(
    model: Model,
    atoms: np.ndarray,
    masses: np.ndarray,
    backend: str,
    which: np.ndarray | None = None,
) -> float:
    """Largest speed of the (``which``) atoms in the flow of the atomic measure."""
    mu = Atoms._trusted(atoms, masses / masses.sum())
    speed = np.linalg.norm(model.velocity(atoms, mu, backend=backend), axis=-1)
    return float(np.max(speed if which is None else speed[which], initial=0.0))


def _polish(
    model: Model,
    atoms: np.ndarray,
    masses: np.ndarray,
    backend: str,
    width: float,
    free: np.ndarray,
) -> tuple[np.ndarray, str]:
    r"""Newton steps on the finite-atom flow (masses fixed, only the ``free`` atoms move); the
    polished atoms, or the unpolished ones and the reason the polish was refused.

    The unknowns are the tangent coordinates :math:`c` of the free atoms in the frame at the
    current atoms, the equations their velocities :math:`g(c) = B^\top v(a)`.  The Jacobian is
    the *whole* one, by forward differences: moving one atom changes the field at every other
    atom by :math:`O(m)`, while an atom's own curvature (the Hessian of
    :math:`\delta F/\delta\mu` at fixed :math:`\mu`) can be far smaller where repulsion and the
    perceptron nearly cancel, so a per-atom step :math:`v/|\mathrm{Hess}|` overshoots and cycles.
    Each step is cut to half ``width`` per atom and halved until :math:`|g|` decreases.
    """
    start = atoms
    res0 = _max_speed(model, atoms, masses, backend, free)
    idx = np.flatnonzero(free)
    k, d = idx.size, atoms.shape[1]
    weights = masses / masses.sum()

    def exp(a: np.ndarray, u: np.ndarray) -> np.ndarray:
        y = exp_map(a, u)
        return y / np.linalg.norm(y, axis=-1, keepdims=True)

    def tangent(a: np.ndarray, frame: np.ndarray) -> np.ndarray:
        v = model.velocity(a, Atoms._trusted(a, weights), backend=backend)
        return np.einsum("kpd,kd->kp", frame, v[idx]).ravel()

    delta = 1e-6
    for _ in range(50):
        B = tangent_frame(atoms)[idx]  # (k, d-1, d)
        g = tangent(atoms, B)
        gn = np.linalg.norm(g)
        if not np.all(np.isfinite(g)) or np.max(np.abs(g), initial=0.0) < 1e-13:
            break
        J = np.empty((g.size, g.size))
        for col in range(g.size):
            i, p = divmod(col, d - 1)
            u = np.zeros_like(atoms)
            u[idx[i]] = delta * B[i, p]
            J[:, col] = (tangent(exp(atoms, u), B) - g) / delta
        c = np.linalg.lstsq(J, -g, rcond=None)[0].reshape(k, d - 1)
        u = np.zeros_like(atoms)
        u[idx] = np.einsum("kp,kpd->kd", c, B)
        nu = np.linalg.norm(u, axis=-1, keepdims=True)
        u = u * np.minimum(1.0, 0.5 * width / np.maximum(nu, 1e-300))
        for _ in range(30):  # backtrack until the residual decreases
            trial = exp(atoms, u)
            if np.linalg.norm(tangent(trial, tangent_frame(trial)[idx])) < gn:
                break
            u = 0.5 * u
        else:
            break
        atoms = trial
    moved = np.arccos(np.clip(np.sum(atoms * start, axis=-1), -1.0, 1.0))
    res1 = _max_speed(model, atoms, masses, backend, free)
    if atoms.shape[0] > 1:
        gap = np.arccos(np.clip(atoms @ atoms.T, -1.0, 1.0))
        gap[np.diag_indices(atoms.shape[0])] = np.inf
        closest = float(gap.min())
    else:
        closest = np.inf
    if not np.all(np.isfinite(atoms)):
        return start, "polishing produced non-finite atoms: not applied"
    if moved.max() > width:
        i = int(np.argmax(moved))
        return start, (
            f"polishing would move atom {i} by {moved[i]:.3g} rad, off its mass (more than "
            f"{width:.3g}): not applied"
        )
    if closest <= width:
        return (
            start,
            f"polishing would bring two atoms within {closest:.3g} rad of each other: not applied",
        )
    if not res1 <= res0:
        return (
            start,
            f"polishing would raise the residual from {res0:.3g} to {res1:.3g}: not applied",
        )
    return atoms, ""


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
    residual_tol: float | None = None,
    atom_width: float | None = None,
    stray_mass: float = 1e-2,
    backend: str = "auto",
    **kwargs: Any,
) -> StationaryResult:
    r"""A critical point of the free energy by iterated JKO steps with growing :math:`\tau`.

    Steps :math:`\tau_{k+1} = \min(\tau_{\max}, \text{growth}\cdot\tau_k)` from ``tau0`` until the
    measure stops moving, :math:`\|\nu_{k+1}-\nu_k\|_1 \le \text{tol}\cdot\min(1, \tau_k)` (a
    Wasserstein speed below ``tol``), or ``max_steps``.  Large steps keep the descent property of
    JKO (every step decreases the free energy), so the limit is a critical point reached by the
    Wasserstein flow, not an arbitrary one.

    Then it reads the mass groups off the final measure (:func:`atom_groups`: groups separated by
    a valley are never merged, each group's mass is all the mass nearest to it), and decides:

    * ``atomic``: every group's RMS spread is at most ``atom_width`` (default ``3 h``, ``h`` the
      spacing of the support), except wider groups of total mass at most ``stray_mass`` (tails
      still draining: they are kept in ``atoms`` but left out of polishing and of ``residual``);
    * ``polished`` (``polish=True``, atomic limits only): the atoms, masses fixed, are moved off
      the grid to the nearby critical point of the finite-atom flow (damped Newton-like steps),
      so that ``residual`` measures criticality, not the resolution.  The polish is *refused*
      (atoms left on their mass groups, ``polished=False``, the reason in ``message``) when an
      atom would move farther than ``atom_width`` or meet another atom, or when the residual
      would rise;
    * ``converged``: the measure stopped moving, the support residual
      :math:`\sum_j\nu_j|\nabla_S\delta F/\delta\mu(x_j)|` is at most ``residual_tol`` and, for an
      atomic limit, so is the atoms' velocity :math:`\max_k|\nabla_S\delta F/\delta\mu(a_k)|`.
      ``residual_tol`` defaults to :math:`h\max(1, |\mathrm{Hess}|)`, the velocity error of an
      atom misplaced by one spacing.  A run that hit ``max_steps``, or stopped on a measure that
      is not critical, is reported as not converged with the residuals in ``message``.

    Other keywords go to the JKO stepper (``tol`` there is ``step_tol``).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.solvers.jko import stationary
    >>> rho0 = wflow.Density.from_function(wflow.CircleMesh(24), lambda x: np.exp(3 * x[:, 0]))
    >>> s = stationary(wflow.USA(4.0), rho0, backend="numpy")  # collapses to one Dirac at (1, 0)
    >>> s.converged, np.round(s.masses, 6).tolist(), np.round(s.atoms, 4) + 0.0
    (True, [1.0], array([[1., 0.]]))
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
    h = spacing(x, r)
    atom_width = 3.0 * h if atom_width is None else check_positive(atom_width, "atom_width")
    if residual_tol is not None:
        residual_tol = check_positive(residual_tol, "residual_tol")
    eps = default_eps(x, r) if eps is None else check_positive(eps, "eps")
    st = JKOStepper(
        model,
        x,
        r,
        tau=tau,
        eps=eps,
        cost=cost,
        kappa=kappa,
        method=method,
        debias=kwargs.pop("debias", True),
        eps_scaling=check_eps_scaling(kwargs.pop("eps_scaling", None)),
        tol=step_tol,
        max_iter=kwargs.pop("max_iter", 200),
        max_sinkhorn=kwargs.pop("max_sinkhorn", 5000),
        backend=backend,
    )
    if kwargs:
        raise TypeError(f"stationary() got unexpected keyword arguments {sorted(kwargs)}")
    w = a
    hist: dict[str, list] = {"tau": [], "change": [], "free_energy": [], "residual": []}
    stopped = False
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
            stopped = True
            break
        # grow tau while steps stay cheap; a step that needed many re-linearizations (repulsion:
        # proximal weight) is prox-dominated, so a larger tau would only cost more
        if s.iterations >= 30 or not s.converged:
            tau = max(tau0, tau / growth)
            tau_max = min(tau_max, tau)
        else:
            tau = min(tau_max, growth * tau)
    groups = atom_groups(
        x, w, neighbors=None if mesh is None else mesh.cell_neighbors, threshold=threshold
    )
    atoms, masses = groups.atoms, groups.masses
    # groups wider than an atom carrying at most stray_mass in all are strays (tails still draining)
    wide = groups.spread > atom_width
    stray = wide if masses[wide].sum() <= stray_mass else np.zeros_like(wide)
    atomic = not np.any(wide & ~stray) and masses.size < max(2, x.shape[0] // 4)
    notes = (
        [
            f"{int(stray.sum())} stray group(s) of mass {masses[stray].sum():.2g} left out of the atoms' residual"
        ]
        if stray.any()
        else []
    )
    residual_grid = None
    polished = False
    if model is not None and atomic:
        residual_grid = _max_speed(model, atoms, masses, backend, ~stray)
        if polish:
            new, why = _polish(model, atoms, masses, backend, atom_width, ~stray)
            polished = not why
            if why:
                notes.append(why)
            atoms = new
    mu_atoms = Atoms._trusted(atoms, masses)
    hess = _second_order(model, atoms, masses, backend)
    if model is None:
        residual, res_support, gap = 0.0, 0.0, 0.0
    else:
        residual = _max_speed(model, atoms, masses, backend, ~stray if atomic else None)
        v = model.velocity(x, Atoms._trusted(x, w), backend=backend)
        res_support = float(np.dot(w, np.linalg.norm(v, axis=-1)))
        psi_x = model.first_variation(x, mu_atoms, backend=backend)
        psi_a = model.first_variation(atoms, mu_atoms, backend=backend)
        gap = float(psi_x.max() - psi_a.min())
    if residual_tol is None:
        residual_tol = h * max(1.0, float(np.max(np.abs(hess), initial=0.0)))
    converged = stopped and res_support <= residual_tol and (not atomic or residual <= residual_tol)
    if stopped:
        msg = f"stopped moving after {k} steps (tau={tau:g})"
    else:
        msg = f"max_steps={max_steps} reached; last change {hist['change'][-1]:.3g} (tol {tol * min(1.0, tau):.3g})"
    if res_support > residual_tol:
        msg += f"; support residual {res_support:.3g} > residual_tol {residual_tol:.3g}"
    if atomic and residual > residual_tol:
        msg += f"; atoms' velocity {residual:.3g} > residual_tol {residual_tol:.3g}"
    if not atomic:
        msg += f"; not atomic (widest group spread {float(groups.spread.max()):.3g} > atom_width {atom_width:.3g})"
    msg = (
        ("converged: " if converged else "NOT converged: ") + msg + "".join(f"; {n}" for n in notes)
    )
    return StationaryResult(
        weights=w,
        points=x,
        atoms=atoms,
        masses=masses,
        residual=residual,
        residual_support=res_support,
        hessian=hess,
        potential_gap=gap,
        energy=st.energy.F(w),
        steps=k,
        tau=tau,
        converged=converged,
        history=hist,
        mesh=mesh,
        message=msg,
        residual_grid=residual_grid,
        spread=groups.spread,
        atomic=atomic,
        polished=polished,
        stopped=stopped,
        residual_tol=residual_tol,
        separation_threshold=groups.threshold,
    )
