r"""The sufficient condition for stability on the circle (:func:`circle_condition`).

On :math:`S^1` the Hessian is a weighted graph Laplacian plus a diagonal; the pair weights
change sign at the separation :func:`circle_threshold`, which gives a condition one reads
off the atoms' positions (:class:`CircleCondition`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from .._typing import ArrayLike
from ..errors import check_nonnegative
from ..measure import Atoms
from ..models import ACTIVATIONS, Model
from .blocks import DSIGMA, conservative_omega, gradient_blocks
from .verdict import stability


def circle_threshold(beta: float) -> float:
    r"""The separation :math:`\Delta_\beta \in (0, \pi/2]` at which a pair's curvature changes sign on :math:`S^1`.

    The pair weight :math:`c_{ij}` of :func:`circle_condition` has the sign of
    :math:`s(\beta\sin^2\Delta - \cos\Delta)`, which vanishes at
    :math:`\cos\Delta_\beta = (\sqrt{1+4\beta^2}-1)/(2\beta)` (:math:`\pi/2` at :math:`\beta = 0`);
    :math:`\Delta_\beta = \beta^{-1/2} + O(\beta^{-3/2})` for large :math:`\beta`.

    Examples
    --------
    >>> from wflow.stability import circle_threshold
    >>> round(circle_threshold(1.0), 6)
    0.904557
    """
    beta = check_nonnegative(beta, "beta")
    if beta == 0:
        return float(np.pi / 2)
    c = 2 * beta / (np.sqrt(1 + 4 * beta * beta) + 1)  # cos, and sin^2 = c / beta
    return float(np.arctan2(np.sqrt(c / beta), c))


@dataclass
class CircleCondition:
    r"""The sufficient condition for stability on :math:`S^1` (see :func:`circle_condition`).

    Attributes
    ----------
    pair_weights : ndarray, shape (k, k)
        :math:`c_{ij}` (zero diagonal).
    curvatures : ndarray, shape (k,)
        :math:`u_i = m_i U''(\theta_i)`.
    critical : bool
        Zero velocity at every atom.
    holds : bool
        Critical, every :math:`c_{ij} \le 0` and every :math:`u_i \le 0`: then the critical
        point is stable.
    strict : bool
        ``holds`` and every connected component of the graph :math:`\{c_{ij} < 0\}` has an
        atom with :math:`u_i < 0` -- or, with ``modulo_rotations``, the graph is connected:
        then it is strictly stable.
    components : list of list of int
        Connected components of the graph :math:`\{c_{ij} < 0\}`.
    modulo_rotations : bool
    message : str

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.stability import circle_condition
    >>> three = wflow.Atoms(wflow.sphere.angles_to_points(2 * np.pi * np.arange(3) / 3))
    >>> c = circle_condition(wflow.USA(1.0, V=-np.eye(2)), three)
    >>> c.holds, c.strict, c.components, c.pair_weights.shape
    (True, True, [[0, 1, 2]], (3, 3))
    """

    pair_weights: np.ndarray
    curvatures: np.ndarray
    critical: bool
    holds: bool
    strict: bool
    components: list
    modulo_rotations: bool
    message: str = ""

    def __bool__(self) -> bool:
        return self.holds


def circle_condition(
    model: Model, mu: Atoms | ArrayLike, *, rtol: float = 1e-8, modulo_rotations: bool | None = None
) -> CircleCondition:
    r"""A sufficient condition for (strict) stability of an atomic critical point on :math:`S^1`.

    On the circle, with angles :math:`\theta_i` and perturbations :math:`\xi_i` (angle
    increments), the second variation of :math:`F` is a weighted graph Laplacian plus a
    diagonal:

    .. math::

        H(\xi,\xi) = \sum_{i<j} c_{ij}(\xi_i-\xi_j)^2 + \sum_i u_i\xi_i^2,\qquad
        c_{ij} = \sum_{\text{attention}} s\,m_im_j\,e^{\beta\cos\Delta_{ij}}(\beta\sin^2\Delta_{ij} - \cos\Delta_{ij}),
        \quad u_i = m_i U''(\theta_i),

    :math:`\Delta_{ij} = \theta_i-\theta_j` (at :math:`\beta = 0` the pair weight is
    :math:`-s\,m_im_j\cos\Delta_{ij}`).  So :math:`H \preceq 0` when every :math:`c_{ij} \le 0`
    and every :math:`u_i \le 0`; and :math:`H(\xi,\xi) = 0` then forces :math:`\xi` to be
    constant on each connected component of the graph :math:`\{c_{ij} < 0\}` and to vanish
    on every component holding an atom with :math:`u_i < 0`.  Hence :math:`H \prec 0` when
    every component has such an atom; for an attention-only energy (no :math:`U`) a
    connected graph gives :math:`H \prec 0` on the complement of the rotation
    :math:`\xi_i \equiv 1`.

    For repulsive attention (:math:`s = -1`) a pair is "good" (:math:`c_{ij} < 0`) iff its
    separation exceeds :func:`circle_threshold` :math:`\Delta_\beta \approx \beta^{-1/2}`; for
    attractive attention iff it is below.  This is our reading of the paper's sufficient
    condition on :math:`S^1` (Álvarez-López, Geshkovski & Ruiz-Balet, ICML 2026), whose
    exact statement we could not consult: it is a proof, above, not a quotation.

    Parameters
    ----------
    model : Model
        A gradient model acting on :math:`d = 2`.
    mu : Atoms or array_like, shape (k, 2)
    rtol : float
        Relative tolerance for the signs and for criticality (as in :func:`stability`).
    modulo_rotations : bool, optional
        Default: ``True`` iff the energy is rotation invariant.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.stability import circle_condition
    >>> three = wflow.Atoms(wflow.sphere.angles_to_points(2 * np.pi * np.arange(3) / 3))
    >>> circle_condition(wflow.USA(1.0, V=-np.eye(2)), three).strict
    True
    """
    st = stability(model, mu, rtol=rtol, modulo_rotations=modulo_rotations)
    H = st.hessian
    if H.points.shape[1] != 2:
        raise ValueError(
            f"circle_condition is for measures on S^1 (d = 2), got points of dimension d={H.points.shape[1]}"
        )
    attention, perceptrons = gradient_blocks(model)
    x, m = H.points, H.masses
    k = len(m)
    theta = np.arctan2(x[:, 1], x[:, 0])
    delta = theta[:, None] - theta[None, :]
    cos, sin2 = np.cos(delta), np.sin(delta) ** 2
    c = np.zeros((k, k))
    for sign, beta in attention:
        c += sign * np.outer(m, m) * np.exp(beta * cos) * (beta * sin2 - cos)
    np.fill_diagonal(c, 0.0)
    u = np.zeros(k)
    t = np.stack([-x[:, 1], x[:, 0]], axis=-1)
    for p in perceptrons:
        pre = x @ p.A.T + p.b
        sig = ACTIVATIONS[p.activation][0](pre) * conservative_omega(p)
        dsig = DSIGMA[p.activation](pre) * conservative_omega(p)
        at = t @ p.A.T  # a_j . t_i
        ax = x @ p.A.T  # a_j . x_i
        u += m * (np.sum(dsig * at**2, axis=1) - np.sum(sig * ax, axis=1))
    scale = max(float(np.abs(c).max()), float(np.abs(u).max()), 1e-300)
    tol = rtol * scale
    iu = np.triu_indices(k, 1)
    holds = st.critical and bool(np.all(c[iu] <= tol)) and bool(np.all(u <= tol))
    # connected components of the graph {c_ij < -tol}, numbered in the order of their first atom
    n_comps, label = connected_components(csr_matrix(c < -tol), directed=False)
    comps = [np.flatnonzero(label == j).tolist() for j in range(n_comps)]
    anchored = all(np.any(u[comp] < -tol) for comp in comps)
    if st.modulo_rotations:
        strict = holds and (len(comps) == 1 or anchored)
    else:
        strict = holds and anchored
    if not st.critical:
        msg = "not a critical point: " + st.message
    elif not holds:
        msg = "the sufficient condition fails (some c_ij > 0 or u_i > 0); the Hessian itself may still be negative"
    elif strict:
        msg = "holds strictly: strictly stable" + (
            " modulo rotations" if st.modulo_rotations else ""
        )
    else:
        msg = "holds: stable; not strictly (a component of the graph c_ij < 0 has no anchoring curvature u_i < 0)"
    return CircleCondition(
        pair_weights=c,
        curvatures=u,
        critical=st.critical,
        holds=holds,
        strict=strict,
        components=comps,
        modulo_rotations=st.modulo_rotations,
        message=msg,
    )
