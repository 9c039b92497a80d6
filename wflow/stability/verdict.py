r"""Second-order stability of an atomic critical point: :func:`stability`, :func:`is_stable`.

The verdict reads the spectrum of the Wasserstein Hessian, modulo the rotations when the model
is rotation invariant, and with the splitting blocks when asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._typing import ArrayLike
from ..errors import check_nonnegative, check_positive
from ..measure import Atoms
from ..models import ACTIVATIONS, Model
from .blocks import check_atoms, conservative_omega, gradient_blocks
from .hessian import WassersteinHessian, wasserstein_hessian
from .polish import Polished, merge_atoms, polish_atoms

#: polish="auto": particles closer than this (radians) are one atom, and atoms move at most
#: this far to the critical point (defaults of ``merge`` and ``max_move``).
MERGE_RADIUS = 1e-3
MAX_MOVE = 1e-2


def _rotation_modes(H: WassersteinHessian) -> np.ndarray:
    """Orthonormal basis (columns, operator coordinates) of the infinitesimal rotations
    :math:`\\xi_i = \\Omega x_i`, :math:`\\Omega^\\top = -\\Omega`."""
    x = H.points
    k, d = x.shape
    cols = []
    for a in range(d):
        for b in range(a + 1, d):
            xi = np.zeros_like(x)
            xi[:, a] = -x[:, b]
            xi[:, b] = x[:, a]
            c = np.einsum("kpd,kd->kp", H.basis, xi) * np.sqrt(H.metric_weights)[:, None]
            cols.append(c.reshape(-1))
    R = np.stack(cols, axis=1)
    u, sv, _ = np.linalg.svd(R, full_matrices=False)
    rank = int(np.sum(sv > 1e-10 * max(sv.max(), 1e-300)))
    return u[:, :rank]


@dataclass
class Stability:
    r"""Second-order verdict on an atomic measure (see :func:`stability`).

    Attributes
    ----------
    critical : bool
        Every atom has zero velocity, :math:`\max_i|\nabla_S\,\delta F/\delta\mu(x_i)| \le` ``tol_velocity``.
    stable : bool
        Critical and :math:`H \preceq 0` (within ``tol``): the paper's second-order condition
        ("SOPD", positive semi-definite second variation of :math:`\mathsf E = -F`).
    strictly_stable : bool
        Critical and :math:`H \prec 0` (below ``-tol``), on the orthogonal complement of
        the rotations when ``modulo_rotations`` ("strictly SOPD").
    max_eigenvalue : float
        Largest eigenvalue that decides (of the Hessian, restricted to the complement of
        rotations when ``modulo_rotations``; with ``splitting`` also of the splitting blocks).
    eigenvalues : ndarray
        The eigenvalues that decide (restricted operator).
    velocity : float
        :math:`\max_i|\nabla_S\,\delta F/\delta\mu(x_i)|`.
    splitting_max : float or None
        Largest eigenvalue of the splitting blocks :math:`S_i/m_i`, when ``splitting``.
    modulo_rotations, splitting : bool
        The options used.
    tol, tol_velocity : float
        The absolute tolerances used.
    hessian : WassersteinHessian
        The full Hessian.
    message : str
        What decided the verdict (and, first, what the polish did).
    polish : Polished or None
        The merge and polish applied before the verdict (``polish`` of :func:`stability`):
        ``polish.displacement`` is how far each atom moved, in radians.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.stability import stability
    >>> s = stability(wflow.USA(1.0, V=-np.eye(2)), wflow.Atoms([[1.0, 0.0], [-1.0, 0.0]]))
    >>> s.strictly_stable, s.modulo_rotations, round(s.max_eigenvalue, 6)  # -exp(-1)
    (True, True, -0.367879)
    >>> s.message
    'strictly stable: largest eigenvalue -0.367879 < 0'
    """

    critical: bool
    stable: bool
    strictly_stable: bool
    max_eigenvalue: float
    eigenvalues: np.ndarray
    velocity: float
    splitting_max: float | None
    modulo_rotations: bool
    splitting: bool
    tol: float
    tol_velocity: float
    hessian: WassersteinHessian = field(repr=False)
    message: str = ""
    polish: Polished | None = field(default=None, repr=False)

    def __bool__(self) -> bool:
        return self.stable


def _rotation_invariant(model: Model) -> bool:
    attention, perceptrons = gradient_blocks(model)
    return all(p.omega is not None and not np.any(p.omega) for p in perceptrons)


def stability(
    model: Model,
    mu: Atoms | ArrayLike,
    *,
    rtol: float = 1e-8,
    tol_velocity: float | None = None,
    modulo_rotations: bool | None = None,
    splitting: bool = False,
    polish: bool | str = "auto",
    merge: float = MERGE_RADIUS,
    max_move: float = MAX_MOVE,
) -> Stability:
    r"""Is an atomic measure a (strictly) stable critical point of the ascent of :math:`F`?

    In wflow's sign (the paper's SOPD is "negative semi-definite" here): **critical**, zero
    velocity :math:`\nabla_S\,\frac{\delta F}{\delta\mu}(x_i) = 0` at every atom; **stable**,
    critical and :math:`\lambda_{\max}(H) \le 0`; **strictly stable**, critical and
    :math:`\lambda_{\max}(H) < 0`, on the complement of the rotations (zero modes of a rotation
    invariant energy) with ``modulo_rotations``.  With ``splitting=True`` the splitting blocks of
    :func:`wasserstein_hessian` (perturbations that tear an atom apart) must be negative too.

    Parameters
    ----------
    model : Model
        A gradient model.
    mu : Atoms or array_like, shape (k, d)
        Distinct atoms of positive mass.
    rtol : float
        Eigenvalues within ``rtol * scale`` of 0 count as 0, ``scale`` the largest entry of
        the Hessian operator, of the splitting blocks (with ``splitting``) and of the terms
        that make the velocity (below).
    tol_velocity : float, optional
        Absolute tolerance on the velocity; default ``rtol`` times the size of the terms
        that make it (:math:`\sum_{j\ne i} m_j e^{\beta\langle x_i,x_j\rangle} + |\nabla U(x_i)|`).
    modulo_rotations : bool, optional
        Default: ``True`` iff the energy is rotation invariant (no perceptron).
    splitting : bool
        Include perturbations that split atoms.
    polish : {"auto", True, False}
        Accept a state only *near* a critical point (a particle run's final positions): points
        within ``merge`` radians are merged into one atom (:func:`merge_atoms`), the atoms moved
        to the critical point next to them (:func:`polish_atoms`, at most ``max_move`` radians
        each) and judged; ``Stability.polish`` and the message report the displacement.
        ``"auto"`` (default): only when ``mu`` has coinciding points or is not critical as
        given; ``True``: always; ``False``: never.
    merge : float
        Linkage radius of the merge, radians (default 1e-3).
    max_move : float
        Largest distance the polish may move an atom, radians (default 1e-2); beyond it the
        polish is refused and the verdict is on the merged atoms.

    Returns
    -------
    Stability
        True in a boolean context iff ``stable``.

    Examples
    --------
    Two antipodal half-masses: strictly stable for repulsive attention (modulo rotations),
    unstable for attractive attention.

    >>> import numpy as np, wflow
    >>> from wflow.stability import stability
    >>> mu = wflow.Atoms([[1.0, 0.0], [-1.0, 0.0]])
    >>> s = stability(wflow.USA(1.0, V=-np.eye(2)), mu)
    >>> s.critical, s.stable, s.strictly_stable
    (True, True, True)
    >>> stability(wflow.USA(1.0), mu).stable
    False

    Particles that settled near the antipodal pair (a raw particle state): merged, polished, judged.

    >>> x = wflow.sphere.angles_to_points(np.array([0.0, 1e-9, np.pi - 1e-5, np.pi - 1.1e-5]))
    >>> s = stability(wflow.USA(1.0, V=-np.eye(2)), wflow.Atoms(x))
    >>> s.strictly_stable, s.hessian.points.shape, bool(s.polish.displacement.max() < 1e-5)
    (True, (2, 2), True)
    >>> stability(wflow.USA(1.0, V=-np.eye(2)), wflow.Atoms(x[[0, 2]]), polish=False).critical
    False
    """
    if polish not in ("auto", True, False):
        raise ValueError(f"polish must be 'auto', True or False, got {polish!r}")

    def judge(atoms: Atoms | ArrayLike) -> Stability:
        return _verdict(model, atoms, rtol, tol_velocity, modulo_rotations, splitting)

    if polish is False:
        return judge(mu)
    merge = check_positive(merge, "merge")
    max_move = check_positive(max_move, "max_move")
    given = check_atoms(model, mu, distinct=False)
    merged = merge_atoms(given.points, given.weights, merge)
    if polish == "auto" and merged.n == given.n:
        first = judge(merged)
        if first.critical:
            return first
    note = (
        f"{given.n} points merged into {merged.n} atoms (radius {merge:.3g} rad); "
        if merged.n < given.n
        else ""
    )
    p = polish_atoms(model, merged, max_move=max_move, min_gap=merge)
    out = judge(Atoms._trusted(p.points, p.masses))
    if p.applied and not out.critical:
        # the polish lowered the velocity but did not reach a critical point: judge the atoms as merged
        out = judge(merged)
        p.applied = False
        p.message = f"the polish did not reach a critical point (velocity {p.velocity_after:.3g})"
        p.points, p.displacement = merged.points, np.zeros(merged.n)
    out.polish = p
    if p.applied:
        note += (
            f"polished first: atoms moved by at most {p.displacement.max():.3g} rad, "
            f"velocity {p.velocity_before:.3g} -> {p.velocity_after:.3g}; "
        )
    else:
        note += f"polish refused ({p.message}); "
    out.message = note + out.message
    return out


def _verdict(
    model: Model,
    mu: Atoms | ArrayLike,
    rtol: float,
    tol_velocity: float | None,
    modulo_rotations: bool | None,
    splitting: bool,
) -> Stability:
    """The verdict of :func:`stability` on ``mu`` as given."""
    rtol = check_nonnegative(rtol, "rtol")
    H = wasserstein_hessian(model, mu)
    attention, perceptrons = gradient_blocks(model)
    if modulo_rotations is None:
        modulo_rotations = _rotation_invariant(model)
    x, m = H.points, H.masses
    # size of the terms that make the velocity
    size = np.zeros(len(m))
    for sign, beta in attention:
        size += (np.exp(beta * np.clip(x @ x.T, -1, 1)) * (1.0 - np.eye(len(m)))) @ m
    for p in perceptrons:
        size += np.linalg.norm(
            (ACTIVATIONS[p.activation][0](x @ p.A.T + p.b) * conservative_omega(p)) @ p.A, axis=-1
        )
    if tol_velocity is None:
        tol_velocity = rtol * float(size.max())
    else:
        tol_velocity = check_nonnegative(tol_velocity, "tol_velocity")
    velocity = float(np.linalg.norm(H.gradient, axis=-1).max())
    critical = velocity <= tol_velocity
    M = H.matrix
    if modulo_rotations:
        R = _rotation_modes(H)
        if R.shape[1]:
            q, _ = np.linalg.qr(np.concatenate([R, np.eye(M.shape[0])], axis=1))
            N = q[:, R.shape[1] : M.shape[0]]
            M = N.T @ M @ N
    evals = np.linalg.eigvalsh(M) if M.size else np.zeros(0)
    scale = max(float(np.abs(H.matrix).max()) if H.matrix.size else 0.0, float(size.max()))
    split_max = None
    top = float(evals[-1]) if evals.size else -np.inf
    if splitting:
        split_max = float(max(np.linalg.eigvalsh(S)[-1] for S in H.splitting))
        scale = max(scale, float(np.abs(H.splitting).max()))
        top = max(top, split_max)
    tol = rtol * scale
    stable = critical and top <= tol
    strict = critical and top < -tol
    if not critical:
        msg = f"not a critical point: an atom moves with speed {velocity:.3g} > {tol_velocity:.3g}"
    elif strict:
        msg = f"strictly stable: largest eigenvalue {top:.6g} < 0"
    elif stable:
        msg = f"stable, not strictly: largest eigenvalue {top:.3g} within {tol:.3g} of 0"
    else:
        what = "a splitting block" if splitting and split_max == top else "the Hessian"
        msg = f"unstable: {what} has the positive eigenvalue {top:.6g} (the ascent moves away along it)"
    return Stability(
        critical=critical,
        stable=stable,
        strictly_stable=strict,
        max_eigenvalue=top,
        eigenvalues=evals,
        velocity=velocity,
        splitting_max=split_max,
        modulo_rotations=bool(modulo_rotations),
        splitting=bool(splitting),
        tol=tol,
        tol_velocity=float(tol_velocity),
        hessian=H,
        message=msg,
    )


def is_stable(model: Model, mu: Atoms | ArrayLike, *, strict: bool = False, **kwargs: Any) -> bool:
    r"""``True`` iff ``mu`` is a stable (``strict=True``: strictly stable) critical point (:func:`stability`).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.stability import is_stable
    >>> pair = wflow.Atoms([[0.0, 1.0], [0.0, -1.0]])
    >>> is_stable(wflow.USA(10.0, V=-np.eye(2)), pair, strict=True)
    True
    """
    s = stability(model, mu, **kwargs)
    return s.strictly_stable if strict else s.stable
