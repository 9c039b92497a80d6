r"""Second-order stability of atomic critical points, and the supremum of the energy.

For a gradient model with energy :math:`F` -- the functional the flow
*ascends* (``model.energy``) -- and an atomic measure
:math:`\mu = \sum_i m_i\delta_{x_i}` on :math:`S^{d-1}`, this module computes

* the **Wasserstein Hessian**: the second variation of :math:`F` along Monge
  perturbations :math:`x \mapsto \exp_x(t\xi(x))`,
  :math:`H_\mu(\xi,\xi) = \frac{d^2}{dt^2}F\big((\exp(t\xi))_\#\mu\big)\big|_{t=0}`,
  exactly, on the product of the tangent spaces at the atoms (:func:`wasserstein_hessian`);
* the **splitting blocks**: the extra second-order terms of perturbations that tear an
  atom into pieces moving apart (transport plans instead of maps);
* **stability** of a critical point (:func:`stability`, :func:`is_stable`), the
  sufficient condition on the circle (:func:`circle_condition`);
* the **supremum** of :math:`F` over probability measures for gradient *ascent* and its
  maximizers, Diracs at the argmax of the perceptron potential (:func:`energy_supremum`).

Energies (wflow's sign, ascended): attention with :math:`Q=K=I`, :math:`V=sI`,
:math:`s=\pm1`, contributes :math:`\frac{s}{2\beta}\iint e^{\beta\langle x,y\rangle}d\mu\,d\mu`
(:math:`\frac s2|\int x\,d\mu|^2` at :math:`\beta=0`); a conservative perceptron
contributes :math:`\int U\,d\mu` with :math:`U = \tfrac12 v_\omega`,
:math:`v_\omega(x)=\sum_j\omega_j\varphi(a_j\cdot x+b_j)`, :math:`\varphi'=2\sigma`.
The paper (Álvarez-López, Geshkovski & Ruiz-Balet, "Perceptrons and localization of
attention's mean-field landscape", ICML 2026) writes the same dynamics as the
*descent* of :math:`\mathsf E = -F`; every "positive (semi-)definite" of the paper is a
"negative (semi-)definite" here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import optimize, special

from ._typing import ArrayLike, SeedLike
from .errors import NotAGradientFlowError, WflowError, check_int, check_nonnegative, short_repr
from .measure import Atoms, as_atoms
from .models import ACTIVATIONS, REWEIGHTED, SA, USA, Model, Perceptron
from .sphere import as_generator

__all__ = [
    "WassersteinHessian",
    "wasserstein_hessian",
    "Stability",
    "stability",
    "is_stable",
    "CircleCondition",
    "circle_condition",
    "circle_threshold",
    "PotentialMaximum",
    "EnergySupremum",
    "energy_supremum",
    "potential_maximum",
    "anticoncentration_bound",
    "ANTICONCENTRATION_LIMIT",
]

#: beta above which the Hessian entries (of size e^beta) overflow float64.
_BETA_MAX = 700.0


# --------------------------------------------------------------------------- derivatives of sigma
def _drelu(s: np.ndarray) -> np.ndarray:
    return np.heaviside(s, 0.5)


def _dgelu(s: np.ndarray) -> np.ndarray:
    return special.ndtr(s) + s * np.exp(-0.5 * s * s) / np.sqrt(2 * np.pi)


def _dtanh(s: np.ndarray) -> np.ndarray:
    return 1.0 - np.tanh(s) ** 2


#: activation name -> sigma'  (the potential's second derivative is 2 sigma').
_DSIGMA: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": _drelu,
    "gelu": _dgelu,
    "tanh": _dtanh,
    "identity": np.ones_like,
}


def _omega(p: Perceptron) -> np.ndarray:
    """The weights of a conservative perceptron (the functions here take only those: checked on entry)."""
    omega = p.omega
    if omega is None:
        raise NotAGradientFlowError(f"{p!r} is not conservative (W != A^T diag(omega))")
    return omega


# --------------------------------------------------------------------------- input checks
def _blocks(model: Any) -> tuple[list[tuple[int, float]], list[Perceptron]]:
    """Split a gradient model into attention blocks (sign, beta) and perceptrons."""
    if not isinstance(model, Model):
        raise TypeError(
            f"model must be a wflow Model (SA, USA, Perceptron or a sum), got {short_repr(model)}"
        )
    why = model.gradient_obstruction()
    if why is not None:
        raise NotAGradientFlowError(
            f"{model!r} is not a gradient flow, so it has no energy and no Hessian: {why}"
        )
    attention: list[tuple[int, float]] = []
    perceptrons: list[Perceptron] = []
    for part in model.parts:
        if isinstance(part, (SA, USA)):
            sign = 1 if part.V is None else int(round(part.V[0, 0]))  # V = +-I (checked above)
            attention.append((sign, part.beta))
        elif isinstance(part, Perceptron):
            if part.activation not in _DSIGMA:
                raise ValueError(
                    f"the stability tools need the second derivative of the activation; none is known "
                    f"for activation={part.activation!r}"
                )
            perceptrons.append(part)
        else:
            raise TypeError(f"the stability tools know SA, USA and Perceptron blocks, got {part!r}")
    return attention, perceptrons


def _check_atoms(model: Model, mu: Any, name: str = "mu", *, distinct: bool = True) -> Atoms:
    if not isinstance(mu, (Atoms, np.ndarray, list, tuple)):
        raise TypeError(
            f"{name} must be an atomic measure (wflow.Atoms or an array of points): the Wasserstein Hessian "
            f"is computed for atomic measures only, got {short_repr(mu)}"
        )
    mu = as_atoms(mu, name)
    if mu.batch_shape:
        raise ValueError(
            f"{name} must be a single measure (points of shape (n, d)), got a batch of shape "
            f"{mu.batch_shape}; select one system with {name}[i]"
        )
    model.check_dimension(mu.d)
    x = np.asarray(mu.points, dtype=np.float64)
    m = np.asarray(mu.weights, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name}.points contains non-finite values: {short_repr(x)}")
    if not np.all(np.isfinite(m)):
        raise ValueError(f"{name}.weights contains non-finite values: {short_repr(m)}")
    if np.any(m <= 0):
        i = int(np.argmin(m))
        raise ValueError(
            f"{name}.weights must be positive (an atom of mass 0 is not in the support): "
            f"atom {i} has mass {m[i]:.6g}; drop it first"
        )
    if distinct and mu.n > 1:
        gap = np.linalg.norm(x[:, None, :] - x[None, :, :], axis=-1)
        gap[np.diag_indices(mu.n)] = np.inf
        i, j = (int(v) for v in np.unravel_index(int(np.argmin(gap)), gap.shape))
        if gap[i, j] <= 1e-12:
            raise ValueError(
                f"{name} must have distinct atoms, but atoms {i} and {j} coincide (|x_i - x_j| = {gap[i, j]:.3g}): "
                f"merge them into one atom (a Monge map cannot split an atom; the splitting blocks of the "
                f"Hessian cover perturbations that do)"
            )
    return Atoms._trusted(x, m / m.sum())


def _tangent_basis(x: np.ndarray) -> np.ndarray:
    """Orthonormal bases of the tangent spaces, shape ``(k, d-1, d)`` (rows).

    On the circle the basis vector is :math:`(-\\sin\\theta, \\cos\\theta)`, so coordinates are
    angle increments.  Otherwise the last ``d-1`` columns of the Householder reflection
    that maps :math:`e_1` to :math:`\\pm x`.
    """
    k, d = x.shape
    if d == 2:
        return np.stack([-x[:, 1], x[:, 0]], axis=-1)[:, None, :]
    sgn = np.where(x[:, 0] >= 0, 1.0, -1.0)
    u = x.copy()
    u[:, 0] += sgn
    u /= np.linalg.norm(u, axis=-1, keepdims=True)
    refl = np.eye(d)[None] - 2 * u[:, :, None] * u[:, None, :]  # symmetric; column 0 is -sgn x
    return refl[:, 1:, :]


# --------------------------------------------------------------------------- the Hessian
def _ambient_derivatives(attention, perceptrons, x: np.ndarray, m: np.ndarray):
    """Gradient (k, d) and Hessian (k, d, k, d) of the ambient extension of F in the positions.

    The self-interaction of each atom, constant on the sphere, is left out (it changes
    neither the gradient's tangent part nor the second variation along geodesics, as long as
    gradient and Hessian leave it out together).  Also returns the splitting shift
    ``sum_attention s m_i^2 e^beta`` per atom (the self-attraction of the pieces of a split atom).
    """
    k, d = x.shape
    grad = np.zeros((k, d))
    hess = np.zeros((k, d, k, d))
    shift = np.zeros(k)
    eye = np.eye(d)
    off = 1.0 - np.eye(k)
    for sign, beta in attention:
        if beta > _BETA_MAX:
            raise WflowError(
                f"beta = {beta:g}: the Hessian's entries are of size e^beta and overflow float64 "
                f"beyond beta = {_BETA_MAX:g}"
            )
        gram = np.clip(x @ x.T, -1.0, 1.0)
        ker = np.exp(beta * gram) * off  # e^{beta <x_i, x_j>}, j != i
        mm = sign * m[:, None] * m[None, :] * ker  # s m_i m_j e^{..}
        grad += mm @ x
        # block (i, j), j != i:  s m_i m_j e^{..} (I + beta x_j x_i^T), i.e. [a, b] = delta_ab + beta x_j[a] x_i[b]
        hess += mm[:, None, :, None] * eye[None, :, None, :]
        hess += beta * mm[:, None, :, None] * x.T[None, :, :, None] * x[:, None, None, :]
        # block (i, i): s m_i sum_j m_j beta e^{..} x_j x_j^T
        diag = beta * np.einsum("ij,ja,jb->iab", mm, x, x)
        hess[np.arange(k), :, np.arange(k), :] += diag
        shift += sign * m**2 * np.exp(beta)
    for p in perceptrons:
        pre = x @ p.A.T + p.b  # (k, m)
        sigma = ACTIVATIONS[p.activation][0](pre)
        dsigma = _DSIGMA[p.activation](pre)
        if p.activation == "relu":
            active = (_omega(p) != 0) & np.any(np.abs(pre) <= 1e-12 * (1.0 + np.abs(p.b)), axis=0)
            if np.any(active):
                warnings.warn(
                    f"an atom sits on the kink of a ReLU unit (units {np.flatnonzero(active).tolist()}): the second "
                    "variation does not exist there; the Hessian uses sigma'(0) = 1/2",
                    RuntimeWarning,
                    stacklevel=3,
                )
        grad += m[:, None] * (
            (sigma * _omega(p)) @ p.A
        )  # m_i grad U(x_i), grad U = sum_j w_j sigma a_j
        dU = np.einsum("kj,ja,jb->kab", dsigma * _omega(p), p.A, p.A)
        hess[np.arange(k), :, np.arange(k), :] += m[:, None, None] * dU
    return grad, hess, shift


@dataclass
class WassersteinHessian:
    r"""The Wasserstein Hessian of :math:`F` at an atomic measure (see :func:`wasserstein_hessian`).

    Attributes
    ----------
    points : ndarray, shape (k, d)
        The atoms :math:`x_i`.
    masses : ndarray, shape (k,)
        Their masses :math:`m_i`.
    basis : ndarray, shape (k, d-1, d)
        Orthonormal tangent basis at each atom (rows); on :math:`S^1` the vector
        :math:`(-\sin\theta_i, \cos\theta_i)`.
    form : ndarray, shape (K, K), K = k (d-1)
        The quadratic form :math:`H(\xi,\xi) = c^\top\,\mathrm{form}\,c` for
        :math:`\xi_i = \sum_p c_{ip}\,\mathrm{basis}_{ip}` (coordinates ``c`` flattened
        atom-major).
    metric_weights : ndarray, shape (k,)
        :math:`w_i` of the metric :math:`\|\xi\|^2 = \sum_i w_i|\xi_i|^2`: the masses for
        the Wasserstein metric, :math:`m_i Z_\mu(x_i)` for SA's reweighted metric.
    matrix : ndarray, shape (K, K)
        The Hessian operator in a metric-orthonormal basis,
        :math:`W^{-1/2}\,\mathrm{form}\,W^{-1/2}`.
    eigenvalues, eigenvectors : ndarray
        Of ``matrix`` (ascending; eigenvectors as columns, in the coordinates of ``matrix``).
    splitting : ndarray, shape (k, d-1, d-1)
        Per-atom splitting blocks :math:`S_i/m_i` (form per unit mass, see
        :func:`wasserstein_hessian`).
    gradient : ndarray, shape (k, d)
        The Wasserstein gradient :math:`\nabla_S\,\delta F/\delta\mu(x_i)` (USA's velocity;
        SA's velocity is this divided by :math:`Z_\mu`).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.stability import wasserstein_hessian
    >>> H = wasserstein_hessian(wflow.USA(1.0, V=-np.eye(2)), wflow.Atoms([[1.0, 0.0], [-1.0, 0.0]]))
    >>> H.form.shape, H.basis.shape, H.masses.tolist()  # K = k (d - 1) = 2
    ((2, 2), (2, 1, 2), [0.5, 0.5])
    >>> bool(np.allclose(H.gradient, 0.0))  # antipodal atoms are a critical point
    True
    """

    points: np.ndarray
    masses: np.ndarray
    basis: np.ndarray
    form: np.ndarray
    metric_weights: np.ndarray
    matrix: np.ndarray
    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    splitting: np.ndarray
    gradient: np.ndarray

    @property
    def min_eigenvalue(self) -> float:
        """Smallest eigenvalue of the Hessian operator."""
        return float(self.eigenvalues[0])

    @property
    def max_eigenvalue(self) -> float:
        """Largest eigenvalue (a critical point of the ascent is stable iff it is <= 0)."""
        return float(self.eigenvalues[-1])

    def coordinates(self, xi: ArrayLike) -> np.ndarray:
        """Flattened tangent coordinates ``c`` (shape ``(K,)``) of a field ``xi`` of shape ``(k, d)``.

        The normal part of ``xi`` at each atom is dropped.
        """
        xi = np.asarray(xi, dtype=float)
        if xi.shape != self.points.shape:
            raise ValueError(
                f"xi must have shape {self.points.shape} (one vector per atom), got {xi.shape}"
            )
        return np.einsum("kpd,kd->kp", self.basis, xi).reshape(-1)

    def field(self, c: ArrayLike) -> np.ndarray:
        """Tangent field ``(k, d)`` from flattened coordinates ``c`` (shape ``(K,)``)."""
        c = np.asarray(c, dtype=float).reshape(self.basis.shape[:2])
        return np.einsum("kp,kpd->kd", c, self.basis)

    def mode(self, index: int) -> np.ndarray:
        """Eigenvector ``index`` as a tangent field ``(k, d)``, unit in the metric."""
        y = self.eigenvectors[:, index].reshape(self.basis.shape[:2])
        return self.field(y / np.sqrt(self.metric_weights)[:, None])

    def quadratic_form(self, xi: ArrayLike) -> float:
        r""":math:`H(\xi,\xi) = \frac{d^2}{dt^2}F((\exp(t\xi))_\#\mu)|_{t=0}` for a tangent field ``xi`` ``(k, d)``."""
        c = self.coordinates(xi)
        return float(c @ self.form @ c)


def wasserstein_hessian(model: Model, mu: Atoms | ArrayLike) -> WassersteinHessian:
    r"""The Wasserstein Hessian of the energy at an atomic measure, in closed form.

    For :math:`\mu = \sum_i m_i\delta_{x_i}` (distinct atoms, positive masses) and tangent
    vectors :math:`\xi_i \in T_{x_i}S^{d-1}`, the Monge perturbation
    :math:`x_i(t) = \exp_{x_i}(t\xi_i)` has :math:`\dot x_i = \xi_i` and, on the sphere,
    :math:`\ddot x_i = -|\xi_i|^2 x_i`.  Writing :math:`F(\mu) = f(x_1,\dots,x_k)` with the
    ambient extension (self-interaction, constant on the sphere, left out)

    .. math::

        f = \sum_{\text{attention}} \frac{s}{2\beta}\sum_{i\neq j} m_i m_j e^{\beta\langle x_i,x_j\rangle}
            + \sum_i m_i U(x_i), \qquad U = \tfrac12 v_\omega,

    the second variation is

    .. math::

        H(\xi,\xi) = \frac{d^2}{dt^2}F\big((\exp(t\xi))_\#\mu\big)\Big|_{t=0}
          = \sum_{i,j}\xi_i^\top D^2_{ij}f\,\xi_j - \sum_i |\xi_i|^2\langle\nabla_i f, x_i\rangle,

    with, for each attention block, :math:`\nabla_i f = s\,m_i\sum_{j\ne i} m_j e^{\beta\langle x_i,x_j\rangle}x_j`,
    :math:`D^2_{ij}f = s\,m_i m_j e^{\beta\langle x_i,x_j\rangle}(I + \beta x_j x_i^\top)` for
    :math:`i\ne j`, :math:`D^2_{ii}f = s\,m_i\sum_{j\ne i}\beta m_j e^{\beta\langle x_i,x_j\rangle}x_jx_j^\top`,
    and for each perceptron :math:`\nabla U = \sum_j\omega_j\sigma(a_j\cdot x+b_j)a_j`,
    :math:`D^2U = \sum_j\omega_j\sigma'(a_j\cdot x+b_j)a_ja_j^\top`.  The last term is the
    curvature of the sphere: the first-order term :math:`\langle\nabla f,\dot x\rangle` seen
    through the geodesic's acceleration.  At :math:`\beta = 0` the kernel is
    :math:`\langle x,y\rangle` (set :math:`\beta = 0` in the formulas).

    **Splitting blocks.**  Perturbations by transport plans may tear atom :math:`i` into pieces
    of masses :math:`q_k m_i` moving along :math:`\xi_{ik} = \bar\xi_i + \delta_{ik}`
    (:math:`\sum_k q_k\delta_{ik} = 0`).  Their second variation is exactly

    .. math::

        H(\bar\xi,\bar\xi) + \sum_i\sum_k q_k\,\delta_{ik}^\top S_i\,\delta_{ik},\qquad
        S_i = H_{ii} - \Big(\sum_{\text{attention}} s\,e^{\beta}\Big) m_i^2 I_{d-1},

    where :math:`H_{ii}` is the diagonal block of the form: the pieces of one atom attract
    (:math:`s = 1`) or repel (:math:`s = -1`) each other with strength :math:`e^\beta`.
    ``splitting`` holds :math:`S_i/m_i`, the form per unit mass.

    Parameters
    ----------
    model : Model
        A gradient model: USA or SA with :math:`Q=K=I`, :math:`V=\pm I`, conservative
        perceptrons, or a sum of USA and perceptrons (:class:`~wflow.errors.NotAGradientFlowError`
        otherwise).
    mu : Atoms or array_like, shape (k, d)
        The atomic measure; atoms must be distinct and of positive mass.

    Returns
    -------
    WassersteinHessian
        The form, the operator in a metric-orthonormal basis (Wasserstein metric
        :math:`\sum_i m_i|\xi_i|^2`, or :math:`\sum_i m_i Z_\mu(x_i)|\xi_i|^2` for SA), its
        eigenvalues, the splitting blocks and the Wasserstein gradient at the atoms.

    Notes
    -----
    The paper (Álvarez-López, Geshkovski & Ruiz-Balet, ICML 2026) studies the descent of
    :math:`\mathsf E = -F`; its Hessian is minus this one.

    Examples
    --------
    Two antipodal half-masses under repulsive attention (descent of :math:`E_\beta`): the
    rotation is a zero mode; moving both atoms the same way brings them closer, at the rate
    :math:`-e^{-\beta}` (four times the pair weight :math:`c_{12}` of :func:`circle_condition`).

    >>> import numpy as np, wflow
    >>> from wflow.stability import wasserstein_hessian
    >>> mu = wflow.Atoms([[1.0, 0.0], [-1.0, 0.0]])
    >>> H = wasserstein_hessian(wflow.USA(1.0, V=-np.eye(2)), mu)
    >>> np.round(H.eigenvalues, 6) + 0.0
    array([-0.367879,  0.      ])
    >>> bool(np.isclose(H.min_eigenvalue, -np.exp(-1.0)))
    True
    """
    attention, perceptrons = _blocks(model)
    mu = _check_atoms(model, mu)
    x, m = mu.points, mu.weights
    k, d = x.shape
    grad, hess, shift = _ambient_derivatives(attention, perceptrons, x, m)
    basis = _tangent_basis(x)
    normal = np.einsum("kd,kd->k", grad, x)  # <grad_i f, x_i>
    form = np.einsum("ipa,iajb,jqb->ipjq", basis, hess, basis)
    form[np.arange(k), :, np.arange(k), :] -= normal[:, None, None] * np.eye(d - 1)
    split = form[np.arange(k), :, np.arange(k), :] - shift[:, None, None] * np.eye(d - 1)
    K = k * (d - 1)
    form = form.reshape(K, K)
    form = 0.5 * (form + form.T)
    if model.metric == REWEIGHTED:
        beta = attention[0][1]
        Z = np.exp(beta * np.clip(x @ x.T, -1, 1)) @ m
        w = m * Z
    else:
        w = m.copy()
    scale = 1.0 / np.sqrt(np.repeat(w, d - 1))
    matrix = form * scale[:, None] * scale[None, :]
    evals, evecs = np.linalg.eigh(matrix)
    gradient = (grad - normal[:, None] * x) / m[:, None]
    if not (np.all(np.isfinite(form)) and np.all(np.isfinite(gradient))):
        raise WflowError(f"the Hessian of {model!r} at these atoms is not finite (overflow?)")
    return WassersteinHessian(
        points=x,
        masses=m,
        basis=basis,
        form=form,
        metric_weights=w,
        matrix=matrix,
        eigenvalues=evals,
        eigenvectors=evecs,
        splitting=split / m[:, None, None],
        gradient=gradient,
    )


# --------------------------------------------------------------------------- stability
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
        What decided the verdict.

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

    def __bool__(self) -> bool:
        return self.stable


def _rotation_invariant(model: Model) -> bool:
    attention, perceptrons = _blocks(model)
    return all(p.omega is not None and not np.any(p.omega) for p in perceptrons)


def stability(
    model: Model,
    mu: Atoms | ArrayLike,
    *,
    rtol: float = 1e-8,
    tol_velocity: float | None = None,
    modulo_rotations: bool | None = None,
    splitting: bool = False,
) -> Stability:
    r"""Is an atomic measure a (strictly) stable critical point of the ascent of :math:`F`?

    Conditions (wflow's sign: the flow ascends :math:`F`; the paper descends
    :math:`\mathsf E = -F`, so its "second variation positive semi-definite" -- SOPD -- is
    "negative semi-definite" here):

    * **critical**: :math:`\nabla_S\,\frac{\delta F}{\delta\mu}(x_i) = 0` at every atom (zero
      velocity; for SA the velocity is this divided by :math:`Z_\mu`);
    * **stable** (SOPD): critical and
      :math:`\frac{d^2}{dt^2}F((\exp(t\xi))_\#\mu)|_{t=0} \le 0` for every tangent field
      :math:`\xi`, i.e. :math:`\lambda_{\max}(H) \le 0`;
    * **strictly stable** (strictly SOPD): critical and :math:`\lambda_{\max}(H) < 0`.  When the
      energy is invariant under rotations (attention only) every rotation
      :math:`\xi_i = \Omega x_i` is a zero mode, so strictness is asked on the
      metric-orthogonal complement of the rotations (``modulo_rotations``, on by default
      for attention-only models).

    With ``splitting=True`` the perturbations are transport plans, which may tear an atom
    apart: the splitting blocks :math:`S_i` of :func:`wasserstein_hessian` must be
    negative (semi-)definite too.  Monge maps (the default) cannot split atoms; a heavy
    atom under repulsive attention is Monge-stable but splitting-unstable unless the
    perceptron pins it (the anti-concentration theorem of the paper is about the latter).

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
    """
    rtol = check_nonnegative(rtol, "rtol")
    H = wasserstein_hessian(model, mu)
    attention, perceptrons = _blocks(model)
    if modulo_rotations is None:
        modulo_rotations = _rotation_invariant(model)
    x, m = H.points, H.masses
    # size of the terms that make the velocity
    size = np.zeros(len(m))
    for sign, beta in attention:
        size += (np.exp(beta * np.clip(x @ x.T, -1, 1)) * (1.0 - np.eye(len(m)))) @ m
    for p in perceptrons:
        size += np.linalg.norm(
            (ACTIVATIONS[p.activation][0](x @ p.A.T + p.b) * _omega(p)) @ p.A, axis=-1
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
        what = (
            "a splitting block"
            if splitting and split_max is not None and split_max == top
            else "the Hessian"
        )
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
    r"""``True`` iff ``mu`` is a stable (``strict=True``: strictly stable) critical point.

    The paper's SOPD / strictly SOPD conditions read in wflow's sign (the flow ascends
    :math:`F`); see :func:`stability` for the definitions and the keyword arguments.

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


# --------------------------------------------------------------------------- the circle
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
    attention, perceptrons = _blocks(model)
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
        sig = ACTIVATIONS[p.activation][0](pre) * _omega(p)
        dsig = _DSIGMA[p.activation](pre) * _omega(p)
        at = t @ p.A.T  # a_j . t_i
        ax = x @ p.A.T  # a_j . x_i
        u += m * (np.sum(dsig * at**2, axis=1) - np.sum(sig * ax, axis=1))
    scale = max(float(np.abs(c).max()), float(np.abs(u).max()), 1e-300)
    tol = rtol * scale
    iu = np.triu_indices(k, 1)
    holds = st.critical and bool(np.all(c[iu] <= tol)) and bool(np.all(u <= tol))
    # connected components of {c_ij < -tol}
    adj = c < -tol
    label = -np.ones(k, dtype=int)
    comps: list[list[int]] = []
    for s0 in range(k):
        if label[s0] >= 0:
            continue
        stack, comp = [s0], []
        label[s0] = len(comps)
        while stack:
            i = stack.pop()
            comp.append(i)
            for j in np.flatnonzero(adj[i] & (label < 0)):
                label[j] = len(comps)
                stack.append(int(j))
        comps.append(sorted(comp))
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


# --------------------------------------------------------------------------- supremum of the energy
def _potential(perceptrons: list[Perceptron], x: np.ndarray) -> np.ndarray:
    """:math:`v(x) = \\sum_p v_{\\omega,p}(x)`, shape ``x.shape[:-1]``."""
    out = np.zeros(x.shape[:-1])
    for p in perceptrons:
        out = out + p.potential(x)
    return out


def _potential_grad(perceptrons: list[Perceptron], x: np.ndarray) -> np.ndarray:
    """Ambient gradient :math:`\\nabla v = 2\\sum_j\\omega_j\\sigma(a_j\\cdot x+b_j)a_j`."""
    out = np.zeros(x.shape)
    for p in perceptrons:
        out = out + 2.0 * (ACTIVATIONS[p.activation][0](x @ p.A.T + p.b) * _omega(p)) @ p.A
    return out


def _local_max(perceptrons: list[Perceptron], y: np.ndarray, iters: int = 200) -> np.ndarray:
    """Riemannian ascent of v from ``y``: Armijo gradient steps, Newton steps where the Hessian is negative."""
    d = y.shape[0]
    y = y / np.linalg.norm(y)
    val = float(_potential(perceptrons, y[None])[0])
    for _ in range(iters):
        g_amb = _potential_grad(perceptrons, y[None])[0]
        B = _tangent_basis(y[None])[0]  # (d-1, d)
        g = B @ g_amb
        if np.linalg.norm(g) <= 1e-12 * max(1.0, float(np.linalg.norm(g_amb))):
            break
        D2 = np.zeros((d, d))
        for p in perceptrons:
            dsig = _DSIGMA[p.activation](p.A @ y + p.b) * _omega(p)
            D2 = D2 + 2.0 * np.einsum("j,ja,jb->ab", dsig, p.A, p.A)
        Hr = B @ D2 @ B.T - np.dot(g_amb, y) * np.eye(d - 1)
        ev = np.linalg.eigvalsh(Hr)
        step = -np.linalg.solve(Hr, g) if ev[-1] < 0 else g / max(float(np.abs(ev).max()), 1e-12)
        t, accepted = 1.0, False
        while t > 1e-10 and not accepted:
            v = t * (step @ B)
            cand = y * np.cos(np.linalg.norm(v)) + np.sinc(np.linalg.norm(v) / np.pi) * v
            cand /= np.linalg.norm(cand)
            cval = float(_potential(perceptrons, cand[None])[0])
            accepted = cval > val + 1e-4 * t * float(g @ step)
            t /= 2
        if not accepted:
            break
        y, val = cand, cval
    return y


@dataclass
class PotentialMaximum:
    r"""Global maximum of the perceptron potential :math:`v_\omega` on the sphere.

    Attributes
    ----------
    value : float
        :math:`\max v_\omega` (the best value found).
    maximizers : ndarray, shape (n, d)
        Distinct points where it is attained (to ``tol``).
    upper_bound : float or None
        On :math:`S^1`, a certified bound :math:`\max v_\omega \le` ``upper_bound`` from the
        grid and a bound on :math:`|v_\omega''|`; ``None`` for :math:`d \ge 3` (multi-start
        search, not certified).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.stability import potential_maximum
    >>> r = potential_maximum(wflow.Perceptron.conservative([[0.0, 1.0]], [2.0]))
    >>> round(r.value, 12), bool(r.value <= r.upper_bound), r.maximizers.shape  # 2 |a|^2 on S^1
    (2.0, True, (1, 2))
    """

    value: float
    maximizers: np.ndarray
    upper_bound: float | None


def potential_maximum(
    perceptron: Perceptron | list[Perceptron],
    *,
    n_grid: int | None = None,
    n_starts: int = 256,
    n_local: int = 32,
    seed: SeedLike = 0,
    tol: float = 1e-9,
) -> PotentialMaximum:
    r"""Global maximum of :math:`v_\omega(x) = \sum_j\omega_j\varphi(a_j\cdot x+b_j)` over :math:`S^{d-1}`.

    On :math:`S^1` (``d = 2``): every local maximum of ``v`` on a grid of ``n_grid`` angles
    (default :math:`\max(2^{14}, 256m)`) within reach of the grid's maximum is refined by
    bounded Brent search in its two cells; the result carries the certified bound
    :math:`\max v \le \max_k\max(v_k, v_{k+1}) + C h^2/8`, with :math:`h` the grid step and
    :math:`C \ge |v''|` (:math:`v` is :math:`C^{1,1}` for every activation here).  For
    :math:`d \ge 3`: ``n_starts`` uniform points plus the directions :math:`\pm a_j/|a_j|`;
    the best ``n_local`` are polished by Riemannian gradient and Newton steps (Armijo line search).

    Parameters
    ----------
    perceptron : Perceptron or list of Perceptron
        Conservative perceptron(s) on the same dimension (their potentials add).
    n_grid, n_starts, n_local : int
        Grid size on the circle; random starts and local searches on higher spheres.
    seed : seed-like
        For the random starts.
    tol : float
        Points within ``tol * max(1, |max v|)`` of the maximum value count as maximizers.

    Examples
    --------
    One ReLU unit: :math:`v(x) = 2(a\cdot x)_+^2` is largest, :math:`2|a|^2`, at :math:`a/|a|`.

    >>> import numpy as np, wflow
    >>> from wflow.stability import potential_maximum
    >>> p = wflow.Perceptron.conservative([[0.0, 1.0]], [2.0])
    >>> r = potential_maximum(p)
    >>> round(r.value, 12), np.round(r.maximizers, 8) + 0.0
    (2.0, array([[0., 1.]]))
    """
    perceptrons = list(perceptron) if isinstance(perceptron, (list, tuple)) else [perceptron]
    if not perceptrons:
        raise ValueError("potential_maximum needs at least one perceptron, got an empty list")
    for p in perceptrons:
        if not isinstance(p, Perceptron):
            raise TypeError(f"perceptron must be a wflow Perceptron, got {short_repr(p)}")
        why = p.gradient_obstruction()
        if why is not None:
            raise NotAGradientFlowError(f"{p!r} has no potential: {why}")
    dims = {int(p.A.shape[1]) for p in perceptrons}
    if len(dims) != 1:
        raise ValueError(f"the perceptrons act on different dimensions: {sorted(dims)}")
    d = dims.pop()
    tol = check_nonnegative(tol, "tol")
    rng = as_generator(seed)
    upper = None
    if d == 2:
        m_units = sum(p.A.shape[0] for p in perceptrons)
        n = (
            check_int(n_grid, "n_grid", minimum=16)
            if n_grid is not None
            else max(2**14, 256 * m_units)
        )
        h = 2 * np.pi / n
        theta = h * np.arange(n)
        vals = _potential(perceptrons, np.stack([np.cos(theta), np.sin(theta)], -1))
        # C >= |v''| along the circle: |<D^2 v t, t>| + |<grad v, x>|
        C = 0.0
        for p in perceptrons:
            an = np.linalg.norm(p.A, axis=1)
            reach = an + np.abs(p.b)
            smax = (
                np.ones_like(reach) if p.activation == "tanh" else reach
            )  # |sigma(s)| <= |s| (or 1)
            dmax = 1.13 if p.activation == "gelu" else 1.0  # sup sigma'
            C += float(np.sum(2 * np.abs(_omega(p)) * (dmax * an**2 + an * smax)))
        upper = float(np.max(np.maximum(vals, np.roll(vals, -1)))) + C * h * h / 8
        f = lambda t: -float(_potential(perceptrons, np.array([[np.cos(t), np.sin(t)]]))[0])  # noqa: E731
        is_max = (
            (vals >= np.roll(vals, 1))
            & (vals >= np.roll(vals, -1))
            & (vals >= upper - 2 * C * h * h / 8 - tol)
        )
        idx = np.flatnonzero(is_max)
        if idx.size > 4 * n_local:  # a plateau: keep a spread subset
            idx = idx[np.linspace(0, idx.size - 1, 4 * n_local).astype(int)]
        cands = []
        for k in idx:
            r = optimize.minimize_scalar(
                f, bounds=(theta[k] - h, theta[k] + h), method="bounded", options={"xatol": 1e-13}
            )
            t_best = r.x if -r.fun >= vals[k] else theta[k]
            cands.append(t_best)
        pts = np.stack([np.cos(cands), np.sin(cands)], -1)
    else:
        starts = rng.standard_normal((check_int(n_starts, "n_starts"), d))
        starts /= np.linalg.norm(starts, axis=1, keepdims=True)
        dirs = np.concatenate([p.A[np.linalg.norm(p.A, axis=1) > 0] for p in perceptrons])
        dirs = dirs / np.linalg.norm(dirs, axis=1, keepdims=True)
        starts = np.concatenate([starts, dirs, -dirs])
        order = np.argsort(-_potential(perceptrons, starts))[: check_int(n_local, "n_local")]

        pts = np.array([_local_max(perceptrons, starts[i]) for i in order])
    vals = _potential(perceptrons, pts)
    best = float(vals.max())
    keep = vals >= best - tol * max(1.0, abs(best))
    out: list[np.ndarray] = []
    for y in pts[keep][np.argsort(-vals[keep])]:
        if all(np.linalg.norm(y - z) > 1e-6 for z in out):
            out.append(y)
    if upper is not None:
        upper = max(upper, best)
    return PotentialMaximum(value=best, maximizers=np.array(out), upper_bound=upper)


@dataclass
class EnergySupremum:
    r"""Supremum of :math:`F` over probability measures (see :func:`energy_supremum`).

    Attributes
    ----------
    value : float
        :math:`\sup F = c_\beta + \tfrac12\max v_\omega`.
    interaction : float
        :math:`c_\beta = \sum_{\text{attention}} e^\beta/(2\beta)` (:math:`\tfrac12` at
        :math:`\beta = 0`): the interaction energy of any Dirac.
    potential : PotentialMaximum or None
        The maximum of the perceptron potential (``None`` without a perceptron).
    maximizers : ndarray, shape (n, d) or None
        Points :math:`x` with :math:`F(\delta_x) = \sup F`; ``None`` means every Dirac (no
        perceptron).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.stability import energy_supremum
    >>> s = energy_supremum(wflow.USA(2.0))  # no perceptron: every Dirac, e^beta / (2 beta)
    >>> bool(np.isclose(s.value, np.exp(2.0) / 4)), s.potential, s.maximizers
    (True, None, None)
    """

    value: float
    interaction: float
    potential: PotentialMaximum | None
    maximizers: np.ndarray | None

    def dirac(self, i: int = 0) -> Atoms:
        """The maximizer :math:`\\delta_{x_i}` as :class:`~wflow.Atoms`."""
        if self.maximizers is None:
            raise ValueError("every Dirac is a maximizer here (no perceptron): pick any point")
        return Atoms(self.maximizers[i : i + 1], normalize=True)


def energy_supremum(model: Model, **kwargs: Any) -> EnergySupremum:
    r"""Supremum of :math:`F` (the ascended energy) and its Dirac maximizers.

    For attractive attention (:math:`V = I`) plus conservative perceptrons,

    .. math::

        F(\mu) = \sum_{\text{attention}}\frac1{2\beta}\iint e^{\beta\langle x,y\rangle}d\mu\,d\mu
                 + \frac12\int v_\omega\,d\mu
        \;\le\; \sum_{\text{attention}}\frac{e^\beta}{2\beta} + \frac12\max_{S^{d-1}} v_\omega,

    since :math:`\langle x,y\rangle \le 1` and :math:`\int v_\omega\,d\mu \le \max v_\omega`;
    equality holds exactly at :math:`\mu = \delta_{x^*}`, :math:`x^* \in \arg\max v_\omega`
    (for :math:`\beta > 0`; at :math:`\beta = 0` the interaction is :math:`\tfrac12|\int x\,d\mu|^2 \le \tfrac12`,
    also attained only at Diracs).  Without attention, every measure carried by
    :math:`\arg\max v_\omega` is a maximizer; the Diracs are reported.  This is the
    global maximizer of gradient ascent (Álvarez-López, Geshkovski & Ruiz-Balet, ICML
    2026; their descent energy :math:`\mathsf E = -F` has infimum :math:`-\sup F`).

    Parameters
    ----------
    model : Model
        USA or SA with :math:`V = I` (:math:`Q = K = I`), conservative perceptrons, or a sum.
    **kwargs
        Passed to :func:`potential_maximum` (``n_grid``, ``n_starts``, ``seed``, ...).

    Raises
    ------
    ValueError
        If an attention block is repulsive (:math:`V = -I`): the supremum is then not at a
        Dirac.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.stability import energy_supremum
    >>> model = wflow.USA(1.0) + wflow.Perceptron.conservative([[0.0, 1.0]], [2.0])
    >>> s = energy_supremum(model)
    >>> bool(np.isclose(s.value, np.e / 2 + 1.0)), np.round(s.maximizers, 8) + 0.0
    (True, array([[0., 1.]]))
    >>> bool(np.isclose(model.energy(s.dirac()), s.value))
    True
    """
    attention, perceptrons = _blocks(model)
    for sign, beta in attention:
        if sign < 0:
            raise ValueError(
                f"model {model!r} has a repulsive attention block (V = -I): its energy's supremum is not "
                f"attained at a Dirac; energy_supremum covers attractive attention (V = I) only"
            )
    interaction = float(
        sum(np.exp(beta) / (2 * beta) if beta > 0 else 0.5 for _, beta in attention)
    )
    if not perceptrons:
        return EnergySupremum(
            value=interaction, interaction=interaction, potential=None, maximizers=None
        )
    pm = potential_maximum(perceptrons, **kwargs)
    return EnergySupremum(
        value=interaction + 0.5 * pm.value,
        interaction=interaction,
        potential=pm,
        maximizers=pm.maximizers,
    )


# --------------------------------------------------------------------------- anti-concentration
#: :math:`\lim_{\beta\to\infty}` of :func:`anticoncentration_bound`,
#: :math:`2e^{-3/2}/(2e^{-3/2} + \tfrac38 e^{-1/8}) = 0.5742\ldots`
ANTICONCENTRATION_LIMIT = float(2 * np.exp(-1.5) / (2 * np.exp(-1.5) + 0.375 * np.exp(-0.125)))


def anticoncentration_bound(beta: Any, omega: ArrayLike, A: ArrayLike) -> np.ndarray | float:
    r"""The perceptron paper's bound on the mass of a cluster of a stable critical point (d = 2, descent).

    For repulsive attention ("descent") plus a conservative perceptron with a 1-Lipschitz
    activation, :math:`\sigma(0) = 0`, on :math:`S^1`, the atoms of a stable atomic critical point
    lying in a set of pairwise distances at most :math:`1/(2\sqrt\beta)` carry a total mass

    .. math::

        \sum_{i\in S} m_i \le \frac{2e^{\beta-3/2} + C_\vartheta}{2e^{\beta-3/2} + \tfrac38 e^{\beta-1/8}},
        \qquad C_\vartheta = 2\sum_j|\omega_j|\,\|a_j\|^2,

    in the rescaled kernel :math:`e^{\beta(\langle x,y\rangle-1)}` of the paper's code
    (Álvarez-López, Geshkovski & Ruiz-Balet, ICML 2026, Thm 4).  It tends to
    :data:`ANTICONCENTRATION_LIMIT` :math:`\approx 0.5742` as :math:`\beta\to\infty`; values
    :math:`\ge 1` say nothing.  Computed as
    :math:`(2e^{-3/2} + C_\vartheta e^{-\beta})/(2e^{-3/2} + \tfrac38 e^{-1/8})`, finite at any beta.

    Parameters
    ----------
    beta : float or array_like
        Inverse temperature(s), ``>= 0``.
    omega : array_like, shape (m,)
        The perceptron's output weights (:math:`W = A^\top\mathrm{diag}(\omega)`).
    A : array_like, shape (m, d)
        Its input weights, rows :math:`a_j`.

    Returns
    -------
    float or ndarray
        The bound, shaped like ``beta``.

    Examples
    --------
    >>> round(anticoncentration_bound(10.0, [1.0, -0.5], [[1.0, 0.0], [0.0, 1.0]]), 4)
    0.5744
    >>> round(ANTICONCENTRATION_LIMIT, 4)
    0.5742
    """
    b = np.asarray(beta, dtype=float) if not isinstance(beta, (str, bytes)) else None
    if b is None or b.dtype == object or not np.all(np.isfinite(b)) or np.any(b < 0):
        raise ValueError(f"beta must be finite and >= 0, got {short_repr(beta)}")
    try:
        w = np.asarray(omega, dtype=float)
        a = np.asarray(A, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(
            f"omega and A must be real arrays, got omega={short_repr(omega)}, A={short_repr(A)}"
        ) from None
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"omega must have shape (m,) with m >= 1, got shape {w.shape}")
    if a.ndim != 2 or a.shape[0] != w.size:
        raise ValueError(
            f"A must have shape (m, d) = ({w.size}, d) to match omega, got shape {a.shape}"
        )
    if not np.all(np.isfinite(w)):
        raise ValueError(f"omega contains non-finite values: {short_repr(w)}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"A contains non-finite values: {short_repr(a)}")
    c_theta = 2.0 * float(np.sum(np.abs(w) * np.sum(a * a, axis=1)))
    top = 2 * np.exp(-1.5)
    out = (top + c_theta * np.exp(-b)) / (top + 0.375 * np.exp(-0.125))
    return float(out) if out.ndim == 0 else out
