r"""The Wasserstein Hessian of the energy at an atomic measure, with its splitting blocks."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .._typing import ArrayLike
from ..errors import WflowError
from ..measure import Atoms
from ..models import ACTIVATIONS, REWEIGHTED, Model
from .blocks import DSIGMA, check_atoms, conservative_omega, gradient_blocks, tangent_basis

#: beta above which the Hessian entries (of size e^beta) overflow float64.
_BETA_MAX = 700.0


# --------------------------------------------------------------------------- the Hessian
def _ambient_derivatives(attention, perceptrons, x: np.ndarray, m: np.ndarray):
    """Gradient (k, d) and Hessian (k, d, k, d) of the ambient extension of F in the positions (each
    atom's self-interaction, constant on the sphere, left out of both), and the splitting shift
    ``sum_attention s m_i^2 e^beta`` per atom (the self-attraction of the pieces of a split atom)."""
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
        dsigma = DSIGMA[p.activation](pre)
        if p.activation == "relu":
            active = (conservative_omega(p) != 0) & np.any(
                np.abs(pre) <= 1e-12 * (1.0 + np.abs(p.b)), axis=0
            )
            if np.any(active):
                warnings.warn(
                    f"an atom sits on the kink of a ReLU unit (units {np.flatnonzero(active).tolist()}): the second "
                    "variation does not exist there; the Hessian uses sigma'(0) = 1/2",
                    RuntimeWarning,
                    stacklevel=3,
                )
        # m_i grad U(x_i), grad U = sum_j w_j sigma a_j
        grad += m[:, None] * ((sigma * conservative_omega(p)) @ p.A)
        dU = np.einsum("kj,ja,jb->kab", dsigma * conservative_omega(p), p.A, p.A)
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
    :math:`D^2U = \sum_j\omega_j\sigma'(a_j\cdot x+b_j)a_ja_j^\top`; the last term of :math:`H` is
    the curvature of the sphere.

    **Splitting blocks.**  Tearing atom :math:`i` into pieces of masses :math:`q_k m_i` moving
    along :math:`\bar\xi_i + \delta_{ik}` (:math:`\sum_k q_k\delta_{ik} = 0`) has the second variation

    .. math::

        H(\bar\xi,\bar\xi) + \sum_i\sum_k q_k\,\delta_{ik}^\top S_i\,\delta_{ik},\qquad
        S_i = H_{ii} - \Big(\sum_{\text{attention}} s\,e^{\beta}\Big) m_i^2 I_{d-1},

    :math:`H_{ii}` the diagonal block of the form; ``splitting`` holds :math:`S_i/m_i`.

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
    attention, perceptrons = gradient_blocks(model)
    mu = check_atoms(model, mu)
    x, m = mu.points, mu.weights
    k, d = x.shape
    grad, hess, shift = _ambient_derivatives(attention, perceptrons, x, m)
    basis = tangent_basis(x)
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
