r"""From a settled measure to the critical point next to it: :func:`merge_atoms`, :func:`polish_atoms`.

A run ends *near* a critical point, while :func:`stability` asks for one to round-off:
:func:`merge_atoms` turns particles within a radius into one atom, :func:`polish_atoms` moves
the atoms (masses fixed) to the nearby zero of the finite-atom flow's velocity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import check_positive
from ..measure import Atoms
from ..models import Model
from ..sphere import exp_map, tangent_frame

__all__ = ["Polished", "polish_atoms", "merge_atoms"]


def merge_atoms(points: np.ndarray, weights: np.ndarray, radius: float) -> Atoms:
    r"""Atoms from points: points within geodesic distance ``radius`` of each other (single linkage)
    become one atom at their mass-weighted normalized barycentre, with their total mass.

    Parameters
    ----------
    points : ndarray, shape (n, d)
        Unit vectors (a particle run's final positions).
    weights : ndarray, shape (n,)
        Their masses (positive).
    radius : float
        Linkage radius in radians.

    Returns
    -------
    Atoms
        ``k <= n`` distinct atoms, in the order of their first point.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[1.0, 0.0], [1.0, 1e-9], [0.0, 1.0]])
    >>> mu = merge_atoms(x / np.linalg.norm(x, axis=1, keepdims=True), np.full(3, 1 / 3), 1e-6)
    >>> mu.n, np.round(mu.weights, 4).tolist()
    (2, [0.6667, 0.3333])
    """
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree

    radius = check_positive(radius, "radius")
    x = np.asarray(points, dtype=float)
    w = np.asarray(weights, dtype=float)
    chord = 2.0 * np.sin(min(radius, np.pi) / 2.0)
    pairs = cKDTree(x).query_pairs(chord, output_type="ndarray")
    from scipy.sparse import coo_matrix

    n = x.shape[0]
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    k, lab = connected_components(graph, directed=False)
    mass = np.bincount(lab, weights=w, minlength=k)
    bary = np.zeros((k, x.shape[1]))
    np.add.at(bary, lab, w[:, None] * x)
    bary /= np.linalg.norm(bary, axis=1, keepdims=True)
    return Atoms._trusted(bary, mass / mass.sum())


@dataclass
class Polished:
    """Result of :func:`polish_atoms`.

    Attributes
    ----------
    points : ndarray, shape (k, d)
        The polished atoms (the input ones when ``applied`` is false).
    masses : ndarray, shape (k,)
        Unchanged masses (summing to 1).
    displacement : ndarray, shape (k,)
        Geodesic distance each atom moved (radians; zeros when not applied).
    velocity_before, velocity_after : float
        Largest speed of the (free) atoms in the finite-atom flow before and after.
    applied : bool
        The polish was kept (``message`` says why not otherwise).
    message : str
    """

    points: np.ndarray
    masses: np.ndarray
    displacement: np.ndarray
    velocity_before: float
    velocity_after: float
    applied: bool
    message: str = ""


def _speeds(model: Model, atoms: np.ndarray, weights: np.ndarray, backend: str) -> np.ndarray:
    v = model.velocity(atoms, Atoms._trusted(atoms, weights), backend=backend)
    return np.linalg.norm(v, axis=-1)


def polish_atoms(
    model: Model,
    mu: Atoms,
    *,
    max_move: float,
    min_gap: float | None = None,
    free: np.ndarray | None = None,
    backend: str = "auto",
    max_iter: int = 50,
) -> Polished:
    r"""Damped Newton steps on the finite-atom flow (masses fixed): the critical point next to ``mu``.

    The unknowns are the tangent coordinates of the ``free`` atoms, the equations their
    velocities; the whole Jacobian, by forward differences (moving one atom changes the field at
    every other one: a per-atom step cycles).  Each step is cut to ``max_move / 2`` per atom and
    halved until the velocity decreases.

    The polish is *refused* (input returned, ``applied=False``, the reason in ``message``) when
    an atom would move farther than ``max_move``, two atoms would come within ``min_gap``
    (default ``max_move``), the iterates stop being finite, or the velocity would rise.

    Parameters
    ----------
    model : Model
        A model with a velocity field.
    mu : Atoms
        One atomic measure, shape ``(k, d)``.
    max_move : float
        Largest geodesic distance an atom may move (radians).
    min_gap : float, optional
        Smallest distance allowed between two polished atoms.
    free : ndarray of bool, shape (k,), optional
        The atoms that move (default all); the others stay but act on the free ones.
    backend : str
        Kernel-sum backend.
    max_iter : int
        Newton steps at most.

    Examples
    --------
    Two atoms of repulsive attention, 0.1 rad off antipodal: polished onto the antipodal pair.

    >>> import numpy as np, wflow
    >>> x = wflow.sphere.angles_to_points(np.array([0.0, np.pi - 0.1]))
    >>> p = polish_atoms(wflow.USA(1.0, V=-np.eye(2)), wflow.Atoms(x), max_move=0.2)
    >>> p.applied, round(float(p.points[0] @ p.points[1]), 12)  # antipodal
    (True, -1.0)
    >>> np.round(p.displacement, 6).tolist()
    [0.05, 0.05]
    """
    max_move = check_positive(max_move, "max_move")
    min_gap = max_move if min_gap is None else check_positive(min_gap, "min_gap")
    start = np.asarray(mu.points, dtype=float)
    weights = np.asarray(mu.weights, dtype=float)
    weights = weights / weights.sum()
    k_all = start.shape[0]
    free = np.ones(k_all, dtype=bool) if free is None else np.asarray(free, dtype=bool)
    idx = np.flatnonzero(free)
    res0 = float(np.max(_speeds(model, start, weights, backend)[idx], initial=0.0))

    def out(points: np.ndarray, applied: bool, message: str) -> Polished:
        moved = np.arccos(np.clip(np.sum(points * start, axis=-1), -1.0, 1.0))
        res1 = float(np.max(_speeds(model, points, weights, backend)[idx], initial=0.0))
        return Polished(points, weights, moved, res0, res1, applied, message)

    if idx.size == 0:
        return out(start, False, "no free atom to polish")
    atoms = _newton(model, start, weights, idx, max_move, backend, max_iter)
    refused = _refusal(atoms, start, max_move, min_gap)
    if refused is not None:
        return out(start, False, refused)
    polished = out(atoms, True, "")
    res1 = polished.velocity_after
    if not res1 <= res0:
        why = f"polishing would raise the velocity from {res0:.3g} to {res1:.3g}: not applied"
        return out(start, False, why)
    polished.message = f"polished: atoms moved by at most {polished.displacement.max():.3g} rad"
    return polished


def _newton(
    model: Model,
    start: np.ndarray,
    weights: np.ndarray,
    idx: np.ndarray,
    max_move: float,
    backend: str,
    max_iter: int,
) -> np.ndarray:
    """The atoms ``(k, d)`` after damped Newton steps from ``start`` on the velocities of ``idx``."""
    k, d = idx.size, start.shape[1]

    def exp(a: np.ndarray, u: np.ndarray) -> np.ndarray:
        y = exp_map(a, u)
        return y / np.linalg.norm(y, axis=-1, keepdims=True)

    def tangent(a: np.ndarray, frame: np.ndarray) -> np.ndarray:
        v = model.velocity(a, Atoms._trusted(a, weights), backend=backend)
        return np.einsum("kpd,kd->kp", frame, v[idx]).ravel()

    atoms = start
    delta = 1e-6
    for _ in range(max_iter):
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
        if not np.all(np.isfinite(J)):
            break
        # forward differences leave ~delta-relative noise on exact zero modes (rotations): cut them
        c = np.linalg.lstsq(J, -g, rcond=1e-6)[0].reshape(k, d - 1)
        u = np.zeros_like(atoms)
        u[idx] = np.einsum("kp,kpd->kd", c, B)
        nu = np.linalg.norm(u, axis=-1, keepdims=True)
        u = u * np.minimum(1.0, 0.5 * max_move / np.maximum(nu, 1e-300))
        for _ in range(30):  # backtrack until the residual decreases
            trial = exp(atoms, u)
            if np.linalg.norm(tangent(trial, tangent_frame(trial)[idx])) < gn:
                break
            u = 0.5 * u
        else:
            break
        atoms = trial
    return atoms


def _refusal(atoms: np.ndarray, start: np.ndarray, max_move: float, min_gap: float) -> str | None:
    """Why the polished ``atoms`` are refused (non-finite, an atom moved farther than ``max_move``,
    two atoms within ``min_gap``), or None."""
    if not np.all(np.isfinite(atoms)):
        return "polishing produced non-finite atoms: not applied"
    moved = np.arccos(np.clip(np.sum(atoms * start, axis=-1), -1.0, 1.0))
    if moved.max() > max_move:
        i = int(np.argmax(moved))
        return f"polishing would move atom {i} by {moved[i]:.3g} rad (more than {max_move:.3g}): not applied"
    if atoms.shape[0] > 1:
        gap = np.arccos(np.clip(atoms @ atoms.T, -1.0, 1.0))
        gap[np.diag_indices(atoms.shape[0])] = np.inf
        closest = float(gap.min())
        if closest <= min_gap:
            return f"polishing would bring two atoms within {closest:.3g} rad of each other: not applied"
    return None
