r"""Stationary states by iterated JKO steps with growing :math:`\tau`, and their atoms
(:func:`stationary`, :func:`atom_groups`; ``docs/jko.md``, "Accuracy")."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...density import Density
from ...diagnostics import check_points_weights
from ...diagnostics.clusters import mass_components
from ...errors import WflowError, check_int, check_nonnegative, check_positive
from ...measure import Atoms
from ...mesh import Mesh
from ...models import SA, USA, Model
from ...sphere import exp_map, tangent_frame
from ...stability import polish_atoms, stability, wasserstein_hessian
from .stepper import (
    JKOStepper,
    check_eps_scaling,
    check_gradient_model,
    default_eps,
    spacing,
    support,
)

__all__ = [
    "stationary",
    "StationaryResult",
    "cluster_atoms",
    "atom_groups",
    "AtomGroups",
    "model_time_unit",
]


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

    The components of the points above a threshold (:func:`wflow.diagnostics.mass_clusters`)
    are followed up a geometric ladder of ``levels`` thresholds from ``threshold`` to ``top``
    (relative to the largest weight): a component that splits is several groups, one that
    vanishes a group of its own.  Each atom is the normalized barycentre of its group's last
    core; every point's mass goes to its nearest atom, so the masses sum to 1.

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
    ws = w / w.max()
    comps = []  # at each threshold, the members of each component, by decreasing mass
    for t in ladder:
        keep, k, label = mass_components(x, ws, neighbors, radius, float(t))
        mass = np.bincount(label, weights=ws[keep], minlength=k)
        comps.append([keep[label == j] for j in np.argsort(-mass, kind="stable")])
    counts = {float(t): len(c) for t, c in zip(ladder, comps)}
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
    bary = np.stack([ws[c] @ x[c] for c in cores])
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
        Its atoms (:func:`atom_groups`, polished when ``polished``) and their masses, sorted by
        decreasing mass; they sum to ``1 - residual_mass``.
    residual_mass : float
        Mass of the groups wider than an atom, at most ``stray_mass`` in all (tails still draining).
    spread : ndarray, shape (k,)
        RMS distance of each atom's mass to it.
    atomic : bool
        Every group (strays aside) is concentrated within ``atom_width``: a sum of Diracs.
    residual : float
        Largest velocity of the atoms in the finite-atom flow,
        :math:`\\max_k|\\nabla_S\\,\\delta F/\\delta\\mu(a_k)|`; 0 at a critical point.
    residual_support : float
        :math:`\\sum_j\\nu_j|\\nabla_S\\,\\delta F/\\delta\\mu(x_j)|` on the (blurred) support measure.
    residual_tol : float
        The tolerance of ``test``: for atomic limits :math:`h\\max_i\\sum_j|H_{ij}|/m_i` (atoms each
        misplaced by one spacing :math:`h`, :math:`H` the Wasserstein Hessian of
        :mod:`wflow.stability`), otherwise :math:`0.01\\,h/T`.
    test : str
        ``"atoms"`` (the atoms' velocity) or ``"support"`` (the largest speed on the support
        points holding at least 1e-3 of the largest weight).
    residual_grid : float or None
        The atoms' velocity before polishing.
    polished : bool
        The atoms were moved off the grid to the nearby critical point of the finite-atom flow
        (:func:`wflow.stability.polish_atoms`; when refused, ``message`` says why).
    hessian : ndarray, shape (k, d-1)
        Eigenvalues of the tangential Hessian of :math:`\\delta F/\\delta\\mu[\\text{atoms}]` at each
        atom, the atom's own term included (finite differences).
    stability : wflow.stability.Stability or None
        The second-order verdict on the atoms (atomic limits that converged).
    perturbations : list of str
        Each restart off a critical point that was not stable.
    potential_gap : float
        :math:`\\max_j \\psi(x_j) - \\min_k \\psi(a_k)`, :math:`\\psi = \\delta F/\\delta\\mu[\\text{atoms}]`.
    resolved : bool
        The spacing ``h`` is at most :math:`1/\\sqrt\\beta` and a third of the closest two atoms'
        distance, and no group is wider than an atom yet narrower than
        :math:`\\min(2/\\sqrt\\beta, \\pi/4)`.  ``converged`` needs it.
    time_unit : float
        The time unit ``T`` of ``tau0``, ``tau_max`` and the stopping rule (:func:`model_time_unit`).
    stopped : bool
        The measure stopped moving (``change <= tol``) at ``tau_max``.
    converged : bool
        ``stopped``, ``resolved``, and the residual of ``test`` at most ``residual_tol``.
    breakdowns : int
        Inner-solver breakdowns handled (zero curvature in CG, non-finite iterates).
    t : float
        Model time the steps covered, :math:`\\sum_k \\tau_k` (``t / time_unit`` in units of ``T``).
    t_max : float
        The budget of model time in units of ``T`` (:func:`stationary`).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.solvers.jko import stationary
    >>> rho0 = wflow.Density.from_function(wflow.CircleMesh(64), lambda x: np.exp(3 * x[:, 0]))
    >>> s = stationary(wflow.USA(4.0), rho0, backend="numpy")
    >>> s.converged, s.atomic, s.test, s.hessian.shape
    (True, True, 'atoms', (1, 1))
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
    t: float = 0.0
    t_max: float = 0.0
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
    residual_mass: float = 0.0
    test: str = "support"
    resolved: bool = True
    time_unit: float = 1.0
    stability: Any = None
    perturbations: list[str] = field(default_factory=list)
    breakdowns: int = 0

    def __repr__(self) -> str:
        return (
            f"StationaryResult(atoms={self.atoms.shape[0]}, atomic={self.atomic}, residual={self.residual:.3g}, "
            f"residual_support={self.residual_support:.3g}, steps={self.steps}, converged={self.converged})"
        )


def model_time_unit(model: Model | None) -> float:
    r"""The model's own time unit :math:`T`: one over the curvature scale of its velocity field.

    :math:`1/T = \sum` over the blocks of :math:`|V|\,e^{\beta - o}` for USA (:math:`o` the
    kernel's log-scale: 0 plain, :math:`\beta` rescaled), :math:`|V|` for SA, ``rate_bound()``
    otherwise.  ``1.0`` for ``None`` (pure diffusion) or a model whose scale is 0.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> bool(np.isclose(model_time_unit(wflow.USA(5.0)), np.exp(-5.0)))
    True
    >>> model_time_unit(wflow.USA(5.0, kernel="rescaled"))
    1.0
    """
    if model is None:
        return 1.0
    rate = 0.0
    for part in model.parts:
        if isinstance(part, (SA, USA)):
            V = 1.0 if part.V is None else float(np.linalg.norm(part.V, 2))
            beta = part.beta_for(2)
            rate += V * float(np.exp(beta - part.offset(beta))) if isinstance(part, USA) else V
        else:
            rate += float(part.rate_bound())
    return 1.0 / rate if rate > 0 and np.isfinite(rate) else 1.0


def _second_order(
    model: Model | None, atoms: np.ndarray, masses: np.ndarray, backend: str, h: float = 1e-3
) -> np.ndarray:
    k, d = atoms.shape
    if model is None:
        return np.zeros((k, d - 1))
    mu = _normalized(atoms, masses)
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
    mu = _normalized(atoms, masses)
    speed = np.linalg.norm(model.velocity(atoms, mu, backend=backend), axis=-1)
    return float(np.max(speed if which is None else speed[which], initial=0.0))


def _normalized(atoms: np.ndarray, masses: np.ndarray) -> Atoms:
    return Atoms._trusted(atoms, masses / masses.sum())


def _max_beta(model: Model | None) -> float:
    if model is None:
        return 0.0
    return max((float(p.beta_for(2)) for p in model.parts if isinstance(p, (SA, USA))), default=0.0)


def _atoms_tolerance(model: Model, atoms: np.ndarray, masses: np.ndarray, h: float) -> float:
    r""":math:`h\max_i\sum_j|H_{ij}|/m_i`, :math:`H` of :func:`wflow.stability.wasserstein_hessian`."""
    try:
        H = wasserstein_hessian(model, _normalized(atoms, masses))
    except (ValueError, WflowError):
        return float("nan")
    k, dm1 = atoms.shape[0], atoms.shape[1] - 1
    rows = np.abs(H.form).sum(axis=1) / np.repeat(H.masses, dm1)
    return h * float(rows.max(initial=0.0)) if k else 0.0


def _perturb(
    x: np.ndarray, w: np.ndarray, atoms: np.ndarray, mode: np.ndarray, delta: float
) -> np.ndarray:
    """The support measure with each atom's mass (every point's mass to its nearest atom) moved by
    ``delta * mode`` (a tangent field at the atoms, largest vector of length 1), onto the nearest
    support points."""
    from scipy.spatial import cKDTree

    owner = np.argmax(x @ atoms.T, axis=1)
    scale = float(np.linalg.norm(mode, axis=1).max())
    u = delta * mode[owner] / max(scale, 1e-300)
    u = u - np.sum(u * x, axis=1, keepdims=True) * x  # tangent at each support point
    y = exp_map(x, u)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    j = cKDTree(x).query(y)[1]
    out = np.bincount(j, weights=w, minlength=x.shape[0])
    return out / out.sum()


def stationary(
    model: Model | None,
    rho0: Density | Atoms,
    *,
    tau0: float = 0.1,
    growth: float = 1.5,
    tau_max: float = 1.0,
    time_unit: float | None = None,
    kappa: float | None = None,
    eps: float | None = None,
    cost: str = "geodesic",
    method: str = "sinkhorn",
    tol: float = 1e-3,
    t_max: float | None = None,
    max_steps: int | None = None,
    threshold: float = 1e-3,
    step_tol: float = 1e-5,
    polish: bool = True,
    residual_tol: float | None = None,
    atom_width: float | None = None,
    stray_mass: float = 1e-2,
    perturb: bool = True,
    max_restarts: int = 3,
    backend: str = "auto",
    **kwargs: Any,
) -> StationaryResult:
    r"""A stable critical point of the free energy by iterated JKO steps with growing :math:`\tau`.

    Steps and budget are in the model's time unit ``T`` (:func:`model_time_unit`):
    :math:`\tau_{k+1} = \min(\tau_{\max}, \text{growth}\cdot\tau_k)\,T` from ``tau0 T`` until
    :math:`\|\nu_{k+1}-\nu_k\|_1 \le \text{tol}\cdot\min(1, \tau_k/T)`, within ``t_max`` units of
    ``T`` (restarts included).  The mass groups of the final measure (:func:`atom_groups`) are
    then judged as :class:`StationaryResult` says (``docs/jko.md``, "Accuracy").

    Parameters
    ----------
    atom_width : float, optional
        Largest RMS spread of an atom; default ``3 h``, ``h`` the spacing of the support.
    stray_mass : float
        Wider groups of at most this mass in all are tails still draining (``residual_mass``).
    polish : bool
        Move the atoms (masses fixed) to the nearby critical point of the finite-atom flow.
    residual_tol : float, optional
        Overrides the tolerance of the convergence test.
    perturb, max_restarts
        At a critical point that is not stable (a symmetric start can stop on a saddle), move
        each atom's mass by ``atom_width`` along the unstable mode and resume, at most
        ``max_restarts`` times (``perturbations``).
    t_max : float, optional
        Budget of model time in units of ``T``; default :math:`100\pi/(e h)`, the longest time a
        linear mode needs to slow below the test's speed :math:`0.01\,h/T`.
    max_steps : int, optional
        Cap on the number of steps; none by default.

    Other keywords go to the JKO stepper (``tol`` there is ``step_tol``).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.solvers.jko import stationary
    >>> rho0 = wflow.Density.from_function(wflow.CircleMesh(64), lambda x: np.exp(3 * x[:, 0]))
    >>> s = stationary(wflow.USA(4.0), rho0, backend="numpy")  # collapses to one Dirac at (1, 0)
    >>> s.converged, np.round(s.masses, 6).tolist(), np.round(s.atoms, 4) + 0.0
    (True, [1.0], array([[1., 0.]]))
    >>> s.message.split(";")[0]
    'converged (test: atoms) after 87 steps, t=83.08 T (tau=1 T, T=0.0183)'
    """
    x, a, r, mesh = support(rho0, kwargs.pop("reference", None))
    check_gradient_model(model, x.shape[1], name="rho0")
    unit = model_time_unit(model) if time_unit is None else check_positive(time_unit, "time_unit")
    tau0 = check_positive(tau0, "tau0")
    tau_max = check_positive(tau_max, "tau_max")
    growth = check_positive(growth, "growth")
    if growth < 1:
        raise ValueError(f"growth must be >= 1, got {growth}")
    if model is None and (kappa is None or np.isinf(kappa)):
        raise ValueError("model=None (pure diffusion) needs a finite kappa")
    if kappa is not None:
        kappa = check_positive(kappa, "kappa", allow_inf=True)
    cap_steps = sys.maxsize if max_steps is None else check_int(max_steps, "max_steps")
    max_restarts = check_int(max_restarts, "max_restarts", minimum=0)
    stray_mass = check_nonnegative(stray_mass, "stray_mass")
    h = spacing(x, r)
    atom_width = 3.0 * h if atom_width is None else check_positive(atom_width, "atom_width")
    if residual_tol is not None:
        residual_tol = check_positive(residual_tol, "residual_tol")
    # the default budget: the longest time a linear mode needs to fall below the test's speed
    speed_tol = 0.01 * h / unit if residual_tol is None else residual_tol
    t_max = (
        math.pi / (math.e * speed_tol) / unit if t_max is None else check_positive(t_max, "t_max")
    )
    eps = default_eps(x, r) if eps is None else check_positive(eps, "eps")
    st = JKOStepper(
        model,
        x,
        r,
        tau=tau0 * unit,
        eps=eps,
        cost=cost,
        kappa=kappa,
        method=method,
        debias=kwargs.pop("debias", True),
        eps_scaling=check_eps_scaling(kwargs.pop("eps_scaling", None)),
        tol=step_tol / unit,  # the step's residual is in units of dF/dmu: rad / T
        max_iter=kwargs.pop("max_iter", 200),
        max_sinkhorn=kwargs.pop("max_sinkhorn", 5000),
        backend=backend,
    )
    if kwargs:
        raise TypeError(f"stationary() got unexpected keyword arguments {sorted(kwargs)}")
    setting = _Setting(
        model, x, mesh, h, unit, atom_width, stray_mass, threshold, polish, residual_tol, backend
    )
    hist: dict[str, list] = {"tau": [], "change": [], "free_energy": [], "residual": []}
    perturbations: list[str] = []
    w = a
    steps, raised, restarts = 0, 0, 0
    cap, start = tau_max * unit, tau0 * unit
    budget = (t_max * unit, cap_steps)  # model time and steps, for all the steps of the run
    safe = cap  # a step that fails comes back to at most this
    tol_now = tol
    while True:
        w, stopped, tau, k, failed = _iterate(
            st, w, start, tau0 * unit, cap, safe, growth, tol_now, unit, budget, hist
        )
        steps += k
        spent = steps >= cap_steps or sum(hist["tau"]) >= budget[0]
        start = tau0 * unit
        out = _analyse(setting, w, stopped)
        verdict = out.fields["stability"]
        if (
            stopped
            and not failed
            and not out.fields["converged"]
            and not out.coarse
            and raised < 3
            and not spent
        ):
            # stopped off a critical point (far mass drifts slowly): same steps, stricter rule
            raised += 1
            tol_now /= 10.0
            start = tau
            perturbations.append(f"stopped off a critical point: tol tightened to {tol_now:.3g}")
            continue
        if (
            not perturb
            or not out.fields["converged"]
            or verdict is None
            or verdict.stable
            or restarts >= max_restarts
            or spent
        ):
            break
        H = verdict.hessian
        mode = H.mode(int(np.argmax(H.eigenvalues)))
        restarts += 1
        perturbations.append(
            f"restart {restarts}: {len(out.fields['masses'])} atoms critical but unstable "
            f"(eigenvalue {verdict.max_eigenvalue:.3g}); mass moved by {atom_width:.3g} rad along its mode"
        )
        w = _perturb(x, w, H.points, mode, atom_width)
        st.first = True
    breakdowns = sum(st.ot.breakdowns.values()) if st.ot is not None else 0
    t = float(sum(hist["tau"]))
    end = (
        f" after {steps} steps, t={t / unit:.4g} T (tau={tau / unit:.3g} T, T={unit:.3g})"
        if stopped
        else _budget_note(
            steps, max_steps, t / unit, t_max, hist["change"][-1], tol_now, tau / unit
        )
    )
    return StationaryResult(
        message=_message(out, end, perturbations, restarts > 0, breakdowns),
        weights=w,
        points=x,
        energy=st.energy.F(w),
        steps=steps,
        tau=tau,
        t=t,
        t_max=t_max,
        history=hist,
        mesh=mesh,
        stopped=stopped,
        time_unit=unit,
        perturbations=perturbations,
        breakdowns=breakdowns,
        **out.fields,
    )


def _budget_note(
    steps: int, max_steps: int | None, t: float, t_max: float, change: float, tol: float, tau: float
) -> str:
    """How a run that did not stop moving ended (times in units of ``T``)."""
    why = (
        "budget spent"
        if max_steps is None or steps < max_steps
        else f"max_steps={max_steps} reached"
    )
    return (
        f": {why} at t={t:.4g} T of t_max={t_max:.4g} T ({steps} steps) with the measure still "
        f"moving: last change {change:.3g} (tol {tol * min(1.0, tau):.3g})"
    )


def _message(
    out: _Analysis, stop: str, perturbations: list[str], restarted: bool, breakdowns: int
) -> str:
    """The message of :func:`stationary`: the verdict, how the steps stopped, then the notes."""
    msg = "converged" if out.fields["converged"] else "NOT converged"
    msg += f" (test: {out.fields['test']})"
    msg += stop
    msg += out.note
    notes = out.notes
    if perturbations:
        notes = [*perturbations, *notes]
        verdict = out.fields["stability"]
        if restarted and verdict is not None and verdict.stable:
            notes.append("the state reached is stable")
    if breakdowns:
        notes.append(
            f"{breakdowns} inner-solver breakdown(s) handled (zero curvature or non-finite iterates)"
        )
    return msg + "".join(f"; {n}" for n in notes)


def _iterate(
    st: JKOStepper,
    w: np.ndarray,
    tau: float,
    tau0: float,
    tau_max: float,
    safe: float,
    growth: float,
    tol: float,
    unit: float,
    budget: tuple[float, int],
    hist: dict[str, list],
) -> tuple[np.ndarray, bool, float, int, int]:
    """JKO steps with growing tau until the measure stops moving or the ``budget`` (model time,
    steps) is spent; ``(w, stopped, tau, steps, failed)``.  A failed step brings tau to ``safe``."""
    stopped, k, failed = False, 0, 0
    t, steps = float(sum(hist["tau"])), len(hist["tau"])
    while t < budget[0] and steps + k < budget[1]:
        k += 1
        st.set_tau(tau)
        w_new, s = st.step(w)
        change = float(np.abs(w_new - w).sum())
        w = w_new
        hist["tau"].append(tau)
        t += tau
        hist["change"].append(change)
        hist["free_energy"].append(-st.energy.F(w) + st.kappa_inv * st.energy.kl(w))
        hist["residual"].append(s.residual)
        if change <= tol * min(1.0, tau / unit) and tau >= tau_max:
            stopped = True
            break
        # grow tau while steps stay cheap (many re-linearizations: prox-dominated)
        if s.iterations >= 30 or not s.converged:
            failed += 1
            tau = max(tau0, min(tau / growth, safe))
            tau_max = min(tau_max, tau)
        else:
            tau = min(tau_max, growth * tau)
    return w, stopped, tau, k, failed


@dataclass(frozen=True)
class _Setting:
    """What :func:`_analyse` needs of a :func:`stationary` call besides the measure."""

    model: Model | None
    x: np.ndarray
    mesh: Mesh | None
    h: float
    unit: float
    atom_width: float
    stray_mass: float
    threshold: float
    polish: bool
    residual_tol: float | None
    backend: str


@dataclass
class _Analysis:
    """What :func:`_analyse` read off a settled measure: ``fields`` are :class:`StationaryResult`'s."""

    fields: dict[str, Any]
    coarse: bool
    notes: list[str]
    note: str


def _analyse(setting: _Setting, w: np.ndarray, stopped: bool) -> _Analysis:
    """Atoms, residuals, resolution and the verdict of a settled support measure."""
    model, h, unit = setting.model, setting.h, setting.unit
    atom_width, residual_tol = setting.atom_width, setting.residual_tol
    groups, atomic, keep, residual_mass, notes = _split_groups(setting, w)
    atoms, masses, spread = groups.atoms[keep], groups.masses[keep], groups.spread[keep]
    residual_grid = None
    polished = False
    if model is not None and atomic:
        residual_grid = _max_speed(model, atoms, masses, setting.backend)
        if setting.polish:
            mu = _normalized(atoms, masses)
            p = polish_atoms(model, mu, max_move=min(atom_width, 2.0 * h), backend=setting.backend)
            polished = p.applied
            if not p.applied:
                notes.append(p.message)
            atoms = p.points
    hess = _second_order(model, atoms, masses, setting.backend)
    residual, res_support, speed_max, gap = _residuals(setting, w, atoms, masses)
    test = "atoms" if atomic and model is not None else "support"
    if residual_tol is None:
        if model is not None and test == "atoms":
            tol_atoms = _atoms_tolerance(model, atoms, masses, h)
            residual_tol = max(tol_atoms, 1e-9 * h / unit) if np.isfinite(tol_atoms) else 0.0
        else:
            residual_tol = 0.01 * h / unit
    value = residual if test == "atoms" else speed_max
    width, resolved, why = _resolution(setting, groups, atoms, atomic)
    converged = bool(stopped and resolved and value <= residual_tol)
    note = ""
    if not resolved:
        note += (
            f"; resolved=False: the support is too coarse for the clusters ({why}); refine the mesh"
        )
    name = "atoms' velocity" if test == "atoms" else "largest speed on the support"
    rel = "<=" if value <= residual_tol else ">"
    note += f"; {name} {value:.3g} {rel} residual_tol {residual_tol:.3g}"
    if not atomic:
        note += f"; not atomic (widest group spread {float(groups.spread.max()):.3g} > atom_width {atom_width:.3g})"
    verdict = None
    if converged and atomic and model is not None and atoms.shape[0] >= 1:
        try:
            tol_velocity = max(residual_tol, residual)
            mu = _normalized(atoms, masses)
            verdict = stability(model, mu, tol_velocity=tol_velocity, polish=False)
            note += f"; stability: {verdict.message}"
        except (ValueError, WflowError) as err:
            note += f"; stability not judged ({err})"
    fields = dict(
        atoms=atoms,
        masses=masses,
        spread=spread,
        atomic=atomic,
        residual_mass=residual_mass,
        residual_grid=residual_grid,
        polished=polished,
        hessian=hess,
        residual=residual,
        residual_support=res_support,
        potential_gap=gap,
        test=test,
        residual_tol=float(residual_tol),
        resolved=resolved,
        converged=converged,
        stability=verdict,
        separation_threshold=groups.threshold,
    )
    return _Analysis(fields, coarse=h > width, notes=notes, note=note)


def _split_groups(
    setting: _Setting, w: np.ndarray
) -> tuple[AtomGroups, bool, np.ndarray, float, list[str]]:
    """The mass groups of ``w`` and which are atoms: ``(groups, atomic, keep, residual_mass, notes)``."""
    x, mesh = setting.x, setting.mesh
    groups = atom_groups(
        x, w, neighbors=None if mesh is None else mesh.cell_neighbors, threshold=setting.threshold
    )
    wide = groups.spread > setting.atom_width
    stray = wide if groups.masses[wide].sum() <= setting.stray_mass else np.zeros_like(wide)
    atomic = not np.any(wide & ~stray) and groups.masses.size < max(2, x.shape[0] // 4)
    notes = []
    if atomic:
        keep = ~stray
        residual_mass = float(groups.masses[stray].sum())
        if stray.any():
            notes.append(
                f"residual_mass {residual_mass:.2g} left outside the atoms ({int(stray.sum())} "
                f"group(s) wider than atom_width)"
            )
    else:
        keep = np.ones_like(stray)
        residual_mass = 0.0
    return groups, atomic, keep, residual_mass, notes


def _residuals(
    setting: _Setting, w: np.ndarray, atoms: np.ndarray, masses: np.ndarray
) -> tuple[float, float, float, float]:
    """``(residual, residual_support, speed_max, potential_gap)`` (:class:`StationaryResult`); zeros without a model."""
    model, x, backend = setting.model, setting.x, setting.backend
    if model is None:
        return 0.0, 0.0, 0.0, 0.0
    residual = _max_speed(model, atoms, masses, backend)
    v = model.velocity(x, Atoms._trusted(x, w), backend=backend)
    speed = np.linalg.norm(v, axis=-1)
    res_support = float(np.dot(w, speed))
    speed_max = float(speed[w >= 1e-3 * w.max()].max())
    mu_atoms = _normalized(atoms, masses)
    psi_x = model.first_variation(x, mu_atoms, backend=backend)
    psi_a = model.first_variation(atoms, mu_atoms, backend=backend)
    gap = float(psi_x.max() - psi_a.min())
    return residual, res_support, speed_max, gap


def _resolution(
    setting: _Setting, groups: AtomGroups, atoms: np.ndarray, atomic: bool
) -> tuple[float, bool, str]:
    """Whether the support resolves the clusters (``StationaryResult.resolved``): ``(width, resolved, why not)``."""
    h, atom_width = setting.h, setting.atom_width
    beta = _max_beta(setting.model)
    width = 1.0 / np.sqrt(beta) if beta > 0 else np.inf
    if atoms.shape[0] > 1:
        gaps = np.arccos(np.clip(atoms @ atoms.T, -1.0, 1.0))
        gaps[np.diag_indices(atoms.shape[0])] = np.inf
        closest = float(gaps.min())
    else:
        closest = np.inf
    wide_groups = groups.spread[groups.spread > atom_width]
    blurred = (
        float(wide_groups.min())
        if not atomic and wide_groups.size and wide_groups.min() <= min(2 * width, np.pi / 4)
        else None
    )
    resolved = bool(h <= width and (not atomic or 3.0 * h <= closest) and blurred is None)
    why = ""
    if h > width:
        why = (
            f"spacing {h:.3g} > 1/sqrt(beta) = {width:.3g}, the width of a cluster at beta={beta:g}"
        )
    elif blurred is not None:
        why = (
            f"a group of spread {blurred:.3g} rad, wider than an atom ({atom_width:.3g}) and "
            f"narrower than a cluster ({min(2 * width, np.pi / 4):.3g}), is not resolved into atoms"
        )
    elif not resolved:
        why = f"two atoms {closest:.3g} rad apart, less than 3 spacings ({3 * h:.3g})"
    return width, resolved, why
