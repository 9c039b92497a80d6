r"""Models: what moves.  A model gives the velocity field :math:`v[\mu](x)` and, when the
dynamics is a gradient flow, the energy it ascends and its first variation.

Blocks (the conventions page of the documentation):

* :class:`SA` -- softmax self-attention ("Post-LN"),
  :math:`v[\mu](x) = P_x\big(\int e^{\beta\langle Qx, Ky\rangle} V y\,d\mu(y) / \int e^{\beta\langle Qx, Ky\rangle}\,d\mu(y)\big)`;
* :class:`USA` -- unnormalized self-attention,
  :math:`v[\mu](x) = P_x\big(\int e^{\beta\langle Qx, Ky\rangle} V y\,d\mu(y)\big)`;
* :class:`Perceptron` -- feed-forward block :math:`u(x) = P_x(W\sigma(Ax + b))`.

Models add: ``SA(beta=4) + Perceptron(W, A)`` has the sum of the velocities.

Energy convention.  ``energy(mu)`` is the functional :math:`F` that the flow *ascends*,
so :math:`dF/dt \ge 0` along every gradient model:

* USA with :math:`Q = K = I`, :math:`V = \pm I`: :math:`F = \pm E_\beta`, with
  :math:`E_\beta(\mu) = \frac{1}{2\beta}\iint e^{\beta\langle x,y\rangle}d\mu\,d\mu`
  and :math:`v = \nabla_S\,\delta F/\delta\mu` (Wasserstein-2 gradient ascent);
* SA with :math:`Q = K = I`, :math:`V = \pm I`: the same :math:`F` in the metric
  reweighted by :math:`Z_\mu(x) = \int e^{\beta\langle x, y\rangle}d\mu(y)`,
  :math:`v = \nabla_S\,\delta F/\delta\mu / Z_\mu`;
* a conservative perceptron :math:`W = A^\top\mathrm{diag}(\omega)`:
  :math:`F = \tfrac12\int v_\omega\,d\mu`, :math:`v_\omega(x) = \sum_j \omega_j\varphi(a_j\cdot x + b_j)`,
  :math:`\varphi' = 2\sigma`.

So for the repulsive choice :math:`V = -I` the interaction energy :math:`E_\beta`
*decreases* and ``energy`` returns :math:`-E_\beta`.  At :math:`\beta = 0` the constant
:math:`1/(2\beta)` is dropped: :math:`E_0(\mu) = \tfrac12|\int x\,d\mu|^2`, the limit of
:math:`E_\beta - 1/(2\beta)`.  A model that is not a gradient flow raises
:class:`~wflow.errors.NotAGradientFlowError` saying which condition fails.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from ._typing import ArrayLike
from .errors import NotAGradientFlowError, WflowError, check_nonnegative, short_repr
from .kernels import kernel_sums
from .measure import Atoms, as_atoms
from .sphere import project

__all__ = [
    "Model",
    "SA",
    "USA",
    "Perceptron",
    "SumModel",
    "FusedAttention",
    "ACTIVATIONS",
    "model_from_dict",
]

#: Kernel conventions: e^{beta<x,y>} and e^{beta(<x,y>-1)}.
KERNELS = ("plain", "rescaled")


def _exp_checked(c: np.ndarray, what: str, beta: float) -> np.ndarray:
    """``exp(c)``, or an error naming the quantity and the convention that would work."""
    if c.size and float(np.max(c)) > np.log(np.finfo(np.float64).max) - 1.0:
        raise WflowError(
            f"{what} at beta={beta:g} is e^{float(np.max(c)):.4g}, beyond float64: use the rescaled kernel "
            f"(kernel='rescaled', a factor e^-beta) or the log-scale (Model.log_energy)"
        )
    return np.exp(c)


#: Metric in which a gradient model ascends its energy.
WASSERSTEIN = "wasserstein"
REWEIGHTED = "sa-reweighted"


@dataclass(frozen=True)
class FusedAttention:
    r"""What a solver needs to fuse a model's step: softmax attention with :math:`Q = K = V = I`,

    .. math::

        v[\mu](x) = P_x\Big(\frac{\int e^{\beta\langle x, y\rangle} y\,d\mu(y)}{\int e^{\beta\langle x, y\rangle}d\mu(y)}\Big),

    at inverse temperature ``beta`` on the ``n`` tokens it was asked for (:meth:`Model.fused_attention`),
    and the log of its kernel's scale ``offset`` (0 for :math:`e^{\beta\langle x,y\rangle}`, ``beta`` for the
    rescaled :math:`e^{\beta(\langle x,y\rangle - 1)}`), which turns the double sums of a fused step into
    the model's energy (:meth:`log_energy`).

    Examples
    --------
    >>> import math, wflow
    >>> spec = wflow.SA(2.0).fused_attention(16)
    >>> spec.beta, spec.offset, math.isclose(spec.log_energy(math.log(4.0)), math.log(4.0 / (2 * 2.0)))
    (2.0, 0.0, True)
    >>> wflow.USA(2.0).fused_attention(16) is None  # only SA's step is fused
    True
    """

    beta: float
    offset: float = 0.0

    def log_energy(self, log_double_sums: Any) -> Any:
        r""":math:`\log E_\beta = \log\sum_i w_i\sum_j w_j e^{\beta\langle x_i, x_j\rangle} - \log 2\beta - o`
        (:meth:`SA.log_energy`'s formula, :math:`o` the offset) from the double sums' logarithm, for
        ``beta > 0``."""
        return log_double_sums - math.log(2 * self.beta) - self.offset


class Model(ABC):
    """Base class: a velocity field on the sphere that depends on a measure.

    Subclasses implement :meth:`velocity` and, for gradient flows, :meth:`energy` and
    :meth:`first_variation`.  :attr:`dim` is the ambient dimension ``d`` the model's
    matrices fix, or ``None`` if it works in any dimension.

    Examples
    --------
    >>> import wflow
    >>> from wflow.models import Model
    >>> isinstance(wflow.SA(1.0), Model), wflow.USA(1.0).is_gradient, wflow.SA(1.0).metric
    (True, True, 'sa-reweighted')
    """

    dim: int | None = None
    #: ``"sphere"``: points on :math:`S^{d-1}`, tangent velocities; ``"free"``: tokens :math:`x = r\theta` in
    #: :math:`\mathbb{R}^d` (normalization schemes with radii, :mod:`wflow.schemes`)
    space: str = "sphere"

    @abstractmethod
    def velocity(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        r"""Velocity :math:`v[\mu](x)` at query points ``x`` of shape ``(..., n, d)``; tangent at ``x``."""

    # -- time ------------------------------------------------------------------
    @property
    def time_dependent(self) -> bool:
        """True when the model changes with time (layers, schedules, time-dependent speeds)."""
        return False

    def at(self, t: float) -> Model:
        """The model acting at time ``t`` (a time-independent one: itself).  Solvers evaluate ``model.at(t)``."""
        return self

    def breakpoints(self, t0: float, t_end: float) -> np.ndarray:
        """Times in ``(t0, t_end)`` where the model jumps (layer boundaries); adaptive steps land on them."""
        return np.empty(0)

    # -- fused steps -------------------------------------------------------------
    def fused_attention(self, n: int) -> FusedAttention | None:
        """Whether and how a solver may fuse this model's step on systems of ``n`` tokens: a
        :class:`FusedAttention` when the velocity is softmax attention with :math:`Q = K = V = I` (SA),
        else ``None`` (the default: the solver evaluates :meth:`velocity`).  A subclass that changes
        the velocity of such a model must return ``None``."""
        return None

    # -- gradient structure ----------------------------------------------------
    def gradient_obstruction(self) -> str | None:
        """``None`` if the model is a gradient flow, else the condition that fails."""
        return f"{type(self).__name__} has no gradient structure"

    @property
    def is_gradient(self) -> bool:
        return self.gradient_obstruction() is None

    @property
    def metric(self) -> str:
        """``"wasserstein"`` (plain W2) or ``"sa-reweighted"`` (W2 weighted by Z_mu)."""
        return WASSERSTEIN

    def _require_gradient(self) -> None:
        why = self.gradient_obstruction()
        if why is not None:
            raise NotAGradientFlowError(
                f"{self!r} is not a gradient flow, so it has no energy: {why}"
            )

    def energy(self, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        r"""The functional :math:`F(\mu)` the flow ascends (module docstring), shape ``batch``."""
        self._require_gradient()
        mu = as_atoms(mu)
        return self._energy(mu, backend)

    def first_variation(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        r""":math:`\delta F/\delta\mu(x)` at points ``x`` of shape ``(..., n, d)``, shape ``(..., n)``."""
        self._require_gradient()
        mu = as_atoms(mu)
        x = self._check_query(x, mu)
        return self._first_variation(x, mu, backend)

    def _energy(
        self, mu: Atoms, backend: str
    ) -> np.ndarray:  # pragma: no cover - abstract in effect
        raise NotAGradientFlowError(f"{self!r} defines no energy")

    def _first_variation(
        self, x: np.ndarray, mu: Atoms, backend: str
    ) -> np.ndarray:  # pragma: no cover
        raise NotAGradientFlowError(f"{self!r} defines no first variation")

    # -- composition and serialisation ----------------------------------------
    def __add__(self, other: Model) -> SumModel:
        if not isinstance(other, Model):
            return NotImplemented
        return SumModel([*_parts(self), *_parts(other)])

    @property
    def parts(self) -> list[Model]:
        return [self]

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable description; :func:`model_from_dict` inverts it."""

    def _check_query(self, x: ArrayLike, mu: Atoms) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim < 2:
            raise ValueError(f"x must have shape (..., n, d), got shape {x.shape}")
        if x.shape[-1] != mu.d:
            raise ValueError(f"x has dimension d={x.shape[-1]} but the measure has d={mu.d}")
        if self.dim is not None and mu.d != self.dim:
            raise ValueError(
                f"{self!r} works in dimension d={self.dim}, but the measure has d={mu.d}"
            )
        return x

    def rate_bound(self) -> float:
        """A rough bound on the Lipschitz constant of the velocity field (sets default fixed steps)."""
        return 1.0

    def check_dimension(self, d: int) -> None:
        """Raise ``ValueError`` if the model cannot act on points of dimension ``d``."""
        if self.dim is not None and d != self.dim:
            raise ValueError(f"{self!r} works in dimension d={self.dim}, but the measure has d={d}")


def _parts(m: Model) -> list[Model]:
    return list(m.parts)


def _matrix(M: Any, name: str) -> np.ndarray | None:
    if M is None:
        return None
    A = np.asarray(M)
    if A.dtype == object or not (np.issubdtype(A.dtype, np.number)) or np.iscomplexobj(A):
        raise TypeError(f"{name} must be a real matrix, got {short_repr(M)}")
    A = A.astype(np.float64)
    if A.ndim != 2:
        raise ValueError(f"{name} must be a 2-d matrix, got shape {A.shape}")
    if not np.all(np.isfinite(A)):
        raise ValueError(f"{name} contains non-finite values: {short_repr(A)}")
    return A


def _identity_sign(M: np.ndarray | None) -> int:
    """+1 if M is None or I, -1 if M = -I, 0 otherwise."""
    if M is None:
        return 1
    if M.shape[0] != M.shape[1]:
        return 0
    eye = np.eye(M.shape[0])
    if np.array_equal(M, eye):
        return 1
    if np.array_equal(M, -eye):
        return -1
    return 0


class _Attention(Model):
    """Shared parts of SA and USA."""

    def __init__(
        self,
        beta: float | None = None,
        Q: ArrayLike | None = None,
        K: ArrayLike | None = None,
        V: ArrayLike | None = None,
        *,
        kernel: str = "plain",
        gamma: float | None = None,
    ):
        if kernel not in KERNELS:
            raise ValueError(
                f"kernel must be one of {KERNELS} (e^(beta<x,y>) or e^(beta(<x,y>-1))), got {kernel!r}"
            )
        self.kernel = kernel
        if gamma is not None:
            if beta is not None:
                raise ValueError(
                    f"give beta or gamma (long context: beta = gamma log n), not both; got beta={beta!r}, "
                    f"gamma={gamma!r}"
                )
            self.gamma = check_nonnegative(gamma, "gamma")
            beta = 0.0
        else:
            self.gamma = None
            if beta is None:
                raise TypeError(
                    "attention needs beta (or gamma for the long-context scaling beta = gamma log n)"
                )
        self.beta = check_nonnegative(beta, "beta")
        self.Q = _matrix(Q, "Q")
        self.K = _matrix(K, "K")
        self.V = _matrix(V, "V")
        dims = {
            name: M.shape[1]
            for name, M in (("Q", self.Q), ("K", self.K), ("V", self.V))
            if M is not None
        }
        if len(set(dims.values())) > 1:
            raise ValueError(f"Q, K, V must act on the same dimension d (columns), got {dims}")
        if self.Q is not None and self.K is not None and self.Q.shape[0] != self.K.shape[0]:
            raise ValueError(
                f"Q and K must have the same number of rows, got shapes {self.Q.shape} and {self.K.shape}"
            )
        for name, M in (("Q", self.Q), ("K", self.K)):
            other = self.K if name == "Q" else self.Q
            if M is not None and other is None and M.shape[0] != M.shape[1]:
                raise ValueError(
                    f"{name} must be square when the other of Q, K is the identity, got shape {M.shape}"
                )
        if self.V is not None and self.V.shape[0] != self.V.shape[1]:
            raise ValueError(f"V must be square (d, d), got shape {self.V.shape}")
        self.dim = next(iter(dims.values())) if dims else None

    def beta_for(self, n: int) -> float:
        """The inverse temperature acting on ``n`` tokens: ``beta``, or ``gamma log n`` (long context)."""
        return self.beta if self.gamma is None else self.gamma * float(np.log(max(n, 1)))

    def offset(self, beta: float) -> float:
        r"""Log of the kernel's scale: 0 (plain :math:`e^{\beta\langle x,y\rangle}`) or ``beta`` (rescaled)."""
        return beta if self.kernel == "rescaled" else 0.0

    def rate_bound(self) -> float:
        """``|V| (1 + b)``, times ``e^(b - offset)`` for USA, with ``b = beta |Q| |K|`` (spectral norms)."""
        norm = lambda M: 1.0 if M is None else float(np.linalg.norm(M, 2))  # noqa: E731
        b = self.beta * norm(self.Q) * norm(self.K)
        if not isinstance(self, USA):
            return norm(self.V) * (1 + b)
        size = b - self.offset(self.beta)
        if size > USA.MAX_LOG_VELOCITY:
            raise WflowError(
                f"USA at beta={self.beta:g}: velocities of size up to e^{size:.4g} move on the time "
                f"scale e^-beta, beyond what float64 can integrate; use SA, a smaller beta, or the "
                f"rescaled kernel e^(beta(<x,y>-1)) (USA(beta, kernel='rescaled'): a time change "
                f"t' = e^beta t, wflow.theory.rescaled_time)"
            )
        return norm(self.V) * (1 + b) * float(np.exp(size))

    def _sums(self, x: np.ndarray, mu: Atoms, backend: str, values: bool = True):
        return kernel_sums(
            x,
            mu.points,
            mu.weights,
            self.beta_for(mu.n),
            Q=self.Q,
            K=self.K,
            V=self.V,
            values=values,
            backend=backend,
        )

    @property
    def sign(self) -> int:
        """+1 (V = I, attraction), -1 (V = -I, repulsion) when Q = K = I; 0 when not a gradient case."""
        return self._sign()

    def _sign(self) -> int:
        """+1 (V = I), -1 (V = -I) when Q = K = I; 0 when not a gradient case."""
        if _identity_sign(self.Q) != 1 or _identity_sign(self.K) != 1:
            return 0
        return _identity_sign(self.V)

    def gradient_obstruction(self) -> str | None:
        if _identity_sign(self.Q) != 1 or _identity_sign(self.K) != 1:
            return "the energy E_beta needs Q = K = I (identity); got a general Q or K"
        if _identity_sign(self.V) == 0:
            return (
                "the energy E_beta needs V = I (attraction) or V = -I (repulsion); got a general V"
            )
        return None

    def _interaction(self, x: np.ndarray, mu: Atoms, backend: str) -> np.ndarray:
        r""":math:`\frac1\beta\int e^{\beta(\langle x,y\rangle - o)}d\mu(y)` (:math:`o` the kernel's offset; at beta = 0:
        :math:`\int\langle x, y\rangle d\mu`)."""
        beta = self.beta_for(mu.n)
        if beta == 0:
            return np.einsum("...nd,...d->...n", x, mu.mean())
        s = kernel_sums(x, mu.points, mu.weights, beta, values=False, backend=backend)
        return s.mass * _exp_checked(s.log_scale - self.offset(beta), "the energy", beta) / beta

    def _first_variation(self, x: np.ndarray, mu: Atoms, backend: str) -> np.ndarray:
        return self._sign() * self._interaction(x, mu, backend)

    def _energy(self, mu: Atoms, backend: str) -> np.ndarray:
        if self.beta_for(mu.n) == 0:
            return self._sign() * 0.5 * np.sum(mu.mean() ** 2, axis=-1)
        fv = self._interaction(mu.points, mu, backend)
        return self._sign() * 0.5 * mu.integrate(fv)

    def plain_attention(self) -> bool:
        """True when :math:`Q = K = V = I` (each omitted or the identity): the fused small-system paths apply."""
        return all(_identity_sign(M) == 1 for M in (self.Q, self.K, self.V))

    def angular_velocity(self, theta: np.ndarray, weights: np.ndarray) -> np.ndarray:
        r"""The velocity on :math:`S^1` in angles (the Kuramoto form), for :math:`Q = K = I`, :math:`V = \pm I`:

        .. math::

            \theta_i' = \pm\frac{\sum_j w_j e^{-2\beta\sin^2(\Delta_{ij}/2) + c}\sin\Delta_{ij}}{[\sum_j w_j
            e^{-2\beta\sin^2(\Delta_{ij}/2)}]_{\mathrm{SA}}}, \qquad \Delta_{ij} = \theta_j - \theta_i,

        with :math:`c = \beta - o` (0 in the rescaled kernel) for USA.  Angle differences of nearby tokens are
        exact (Sterbenz) and :math:`1 - \cos\Delta = 2\sin^2(\Delta/2)` keeps its relative accuracy, so tokens
        that have merged contribute exactly nothing and forces of size :math:`e^{-\beta\Delta^2/2}` far below
        rounding are resolved (the metastable staircase); Cartesian coordinates carry a noise of ~1e-16 there.
        ``theta`` of shape ``(..., n)``, ``weights`` ``(..., n)``; an O(n^2) direct sum.
        """
        why = self.gradient_obstruction()
        if why is not None:
            raise ValueError(f"angular_velocity needs Q = K = I and V = +-I: {why}")
        theta = np.asarray(theta, dtype=np.float64)
        return self.angular_velocity_from_differences(
            theta[..., None, :] - theta[..., :, None], weights
        )

    def angular_velocity_from_differences(self, D: np.ndarray, weights: np.ndarray) -> np.ndarray:
        r""":meth:`angular_velocity` from the matrix of angle differences :math:`D_{ij} = \theta_j - \theta_i`,
        shape ``(..., n, n)``: for callers that hold differences more accurately than the angles (gap
        coordinates, :class:`wflow.solvers.particles.CircleGapProblem`)."""
        beta = self.beta_for(D.shape[-1])
        logk = -2.0 * beta * np.sin(0.5 * D) ** 2
        k = np.exp(logk) * weights[..., None, :]
        num = np.sum(k * np.sin(D), axis=-1)
        if isinstance(self, SA):
            return self.sign * num / np.sum(k, axis=-1)
        c = beta - self.offset(beta)
        if c > USA.MAX_LOG_VELOCITY:
            raise WflowError(
                f"USA at beta={self.beta:g}: velocities of size e^{c:.4g}, beyond float64; use "
                f"kernel='rescaled'"
            )
        return self.sign * num * np.exp(c)

    def angular_jacobian(self, theta: np.ndarray, weights: np.ndarray) -> np.ndarray:
        r"""The exact Jacobian :math:`\partial\theta_i'/\partial\theta_j` of :meth:`angular_velocity`, shape ``(n, n)``
        (one system).  Its rows sum to zero exactly (the diagonal is minus the off-diagonal sum: rotations are
        an exact zero mode), so implicit steps of any length leave the rotation mode alone."""
        theta = np.asarray(theta, dtype=np.float64)
        return self.angular_jacobian_from_differences(theta[None, :] - theta[:, None], weights)

    def angular_jacobian_from_differences(self, D: np.ndarray, weights: np.ndarray) -> np.ndarray:
        r""":meth:`angular_jacobian` from the angle differences :math:`D_{ij} = \theta_j - \theta_i`, shape ``(n, n)``."""
        beta = self.beta_for(D.shape[-1])
        k = np.exp(-2.0 * beta * np.sin(0.5 * D) ** 2) * weights[None, :]
        sD, cD = np.sin(D), np.cos(D)
        dN = k * (cD - beta * sD * sD)  # d/dtheta_j of the numerator's term j
        if isinstance(self, SA):
            N, Z = np.sum(k * sD, axis=-1), np.sum(k, axis=-1)
            dZ = -beta * k * sD
            J = (dN * Z[:, None] - N[:, None] * dZ) / (Z * Z)[:, None]
        else:
            J = dN * np.exp(beta - self.offset(beta))
        np.fill_diagonal(J, 0.0)
        np.fill_diagonal(J, -J.sum(axis=1))
        return self.sign * J

    def sphere_jacobian(
        self, theta: np.ndarray, weights: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        r"""The exact Jacobian of the attention average and of the velocity of tokens on the sphere, for
        :math:`Q = K = I`, :math:`V = \pm I`, one system: ``(dA, dv)``, each of shape ``(n, n, d, d)`` with
        ``dA[i, k]`` :math:`= \partial A_i/\partial\theta_k` and ``dv[i, k]`` :math:`= \partial v_i/\partial\theta_k`,
        :math:`v_i = P_{\theta_i}A_i`, as functions of the tokens :math:`\theta \in (\mathbb{R}^d)^n` (the
        kernel :math:`e^{\beta\langle\theta_i,\theta_j\rangle}` and the projection as written; a caller
        whose field is extended off the sphere by zero-homogeneity multiplies by :math:`P_{\theta_k}` on
        the right).

        With :math:`p_{ij}` the attention weights (SA: softmax of :math:`\beta\langle\theta_i,\theta_j\rangle +
        \log w_j`; USA: :math:`w_j e^{\beta\langle\theta_i,\theta_j\rangle - o}`, not normalized) and
        :math:`C_i = \sum_j p_{ij}\theta_j\theta_j^\top`:

        .. math::

            \frac{\partial A_i}{\partial\theta_k} = \pm\Big(p_{ik}\big[I + \beta(\theta_k - \bar A_i)\theta_i^\top\big]
            + \delta_{ik}\,\beta\big(C_i - \bar A_i\bar A_i^\top\big)\Big), \qquad
            \frac{\partial v_i}{\partial\theta_k} = P_{\theta_i}\frac{\partial A_i}{\partial\theta_k}
            - \delta_{ik}\big(\langle\theta_i, A_i\rangle I + \theta_i A_i^\top\big),

        with :math:`\bar A_i = \sum_j p_{ij}\theta_j` for SA (the derivative of the normalization) and
        :math:`\bar A_i = 0` for USA.  A dense Jacobian of :math:`n d` unknowns: meant for the stiff
        steps (``method="ros2"``) of small systems, e.g. tokens in span coordinates
        (``coordinates="span"``).

        Examples
        --------
        >>> import numpy as np, wflow
        >>> theta = wflow.sphere.uniform(4, 3, seed=0)
        >>> w = np.full(4, 0.25)
        >>> dA, dv = wflow.SA(2.0).sphere_jacobian(theta, w)
        >>> dv.shape
        (4, 4, 3, 3)
        >>> v = lambda th: wflow.SA(2.0).velocity(th, wflow.Atoms(th, w), backend="numpy")
        >>> e = np.zeros((4, 3)); e[1, 2] = 1e-6                      # a centred difference along theta_1[2]
        >>> fd = (v(theta + e) - v(theta - e)) / 2e-6
        >>> bool(np.allclose(fd, dv[:, 1, :, 2], atol=1e-8))
        True
        """
        if any(_identity_sign(M) != 1 for M in (self.Q, self.K)) or _identity_sign(self.V) not in (
            1,
            -1,
        ):
            raise ValueError(f"sphere_jacobian needs Q = K = I and V = +-I, got {self!r}")
        theta = np.asarray(theta, dtype=np.float64)
        w = np.asarray(weights, dtype=np.float64)
        if theta.ndim != 2 or w.shape != theta.shape[:1]:
            raise ValueError(
                f"theta must have shape (n, d) and weights (n,), got {theta.shape} and {w.shape}"
            )
        n, d = theta.shape
        beta = self.beta_for(n)
        with np.errstate(divide="ignore"):
            L = beta * (theta @ theta.T) + np.log(w)[None, :]
        if isinstance(self, SA):
            L -= L.max(axis=1, keepdims=True)
            p = np.exp(L)
            p /= p.sum(axis=1, keepdims=True)
            Abar = p @ theta
        else:
            p = np.exp(L - self.offset(beta))
            Abar = np.zeros_like(theta)
        A = p @ theta
        eye = np.eye(d)
        # p_ik [I + beta (theta_k - Abar_i) theta_i^T], then the diagonal blocks' beta (C_i - Abar_i Abar_i^T)
        dA = p[:, :, None, None] * (
            eye
            + beta * (theta[None, :, :, None] - Abar[:, None, :, None]) * theta[:, None, None, :]
        )
        idx = np.arange(n)
        C = np.matmul(
            theta.T[None, :, :] * p[:, None, :], theta
        )  # C_i = sum_j p_ij theta_j theta_j^T
        dA[idx, idx] += beta * (C - Abar[:, :, None] * Abar[:, None, :])
        dA *= self.sign
        A *= self.sign
        P = eye - theta[:, :, None] * theta[:, None, :]
        dv = np.matmul(P[:, None], dA)
        dv[idx, idx] -= (
            np.einsum("ij,ij->i", theta, A)[:, None, None] * eye + theta[:, :, None] * A[:, None, :]
        )
        return dA, dv

    def average(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        r"""The attention output before projection: :math:`A(x) = \int e^{\ell(x,y)}Vy\,d\mu(y) / Z` (SA) or
        :math:`\int e^{\ell(x,y) - o}Vy\,d\mu(y)` (USA), shape ``(..., n, d)``; the velocity is :math:`P_x A(x)`."""
        x = self._check_query(x, mu)
        return self._average(x, mu, backend)

    def log_energy(self, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        r""":math:`\log E_\beta(\mu)`, :math:`E_\beta = \frac{1}{2\beta}\iint e^{\beta\langle x,y\rangle}d\mu\,d\mu`, finite at any beta.

        ``energy`` is :math:`\pm E_\beta` (the sign of V) and overflows float64 beyond
        :math:`\beta \approx 709`; its logarithm is formed from the kernel sums' log-scale,
        :math:`\log E_\beta = \log\sum_i w_i s_i e^{c_i} - \log 2\beta`, and stays finite.
        At :math:`\beta = 0`: :math:`\log\tfrac12|\int x\,d\mu|^2`.
        """
        self._require_gradient()
        mu = as_atoms(mu, "mu")
        beta = self.beta_for(mu.n)
        if beta == 0:
            with np.errstate(divide="ignore"):
                return np.log(0.5 * np.sum(mu.mean() ** 2, axis=-1))
        s = kernel_sums(mu.points, mu.points, mu.weights, beta, values=False, backend=backend)
        with np.errstate(divide="ignore"):
            terms = np.log(mu.weights) + np.log(s.mass) + s.log_scale
        top = np.max(terms, axis=-1, keepdims=True)
        return (
            (top[..., 0] + np.log(np.sum(np.exp(terms - top), axis=-1)))
            - np.log(2 * beta)
            - self.offset(beta)
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": type(self).__name__, "beta": self.beta}
        if self.gamma is not None:
            out = {"type": type(self).__name__, "gamma": self.gamma}
        for name in ("Q", "K", "V"):
            M = getattr(self, name)
            if M is not None:
                out[name] = M.tolist()
        if self.kernel != "plain":
            out["kernel"] = self.kernel
        return out

    def __repr__(self) -> str:
        extra = "".join(
            f", {n}=<{getattr(self, n).shape[0]}x{getattr(self, n).shape[1]}>"
            for n in ("Q", "K", "V")
            if getattr(self, n) is not None
        )
        if self.V is not None and self._sign() != 0:
            extra = "".join(
                f", {n}=<{getattr(self, n).shape[0]}x{getattr(self, n).shape[1]}>"
                for n in ("Q", "K")
                if getattr(self, n) is not None
            ) + (", V=-I" if self._sign() < 0 else ", V=I")
        temp = f"gamma={self.gamma:g}" if self.gamma is not None else f"beta={self.beta:g}"
        kern = ", kernel='rescaled'" if self.kernel == "rescaled" else ""
        return f"{type(self).__name__}({temp}{extra}{kern})"


class SA(_Attention):
    r"""Softmax self-attention (Post-LN):
    :math:`v[\mu](x) = P_x\Big(\dfrac{\int e^{\beta\langle Qx,Ky\rangle} V y\,d\mu(y)}{\int e^{\beta\langle Qx,Ky\rangle}d\mu(y)}\Big)`.

    Parameters
    ----------
    beta : float
        Inverse temperature, ``>= 0``.
    Q, K : array_like, shape (p, d), optional
        Query and key matrices (identity if omitted).
    V : array_like, shape (d, d), optional
        Value matrix (identity if omitted; ``-I`` is repulsive).
    kernel : {"plain", "rescaled"}
        :math:`e^{\beta\langle Qx,Ky\rangle}` or :math:`e^{\beta(\langle Qx,Ky\rangle - 1)}` (the perceptron
        paper's and the metastability papers' convention).  SA's velocity is the same in both;
        its energy carries the factor :math:`e^{-\beta}` in the rescaled one.
    gamma : float, optional
        Long context: :math:`\beta = \gamma\log n` on a measure of ``n`` atoms (instead of ``beta``).

    Notes
    -----
    With :math:`Q = K = I`, :math:`V = \pm I` the flow ascends :math:`\pm E_\beta` in the
    metric reweighted by :math:`Z_\mu`: :math:`dF/dt = \int |v|^2 Z_\mu\,d\mu \ge 0`
    (Rigollet 2025, §3).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> x = wflow.sphere.uniform(50, 3, seed=0)
    >>> mu = wflow.Atoms(x)
    >>> v_plain = wflow.SA(40.0).velocity(x, mu)
    >>> v_rescaled = wflow.SA(40.0, kernel="rescaled").velocity(x, mu)
    >>> bool(np.allclose(v_plain, v_rescaled, rtol=1e-12, atol=1e-14))
    True
    """

    @property
    def metric(self) -> str:
        return REWEIGHTED

    def _average(self, x: np.ndarray, mu: Atoms, backend: str) -> np.ndarray:
        return self._sums(x, mu, backend).softmax_average()

    def velocity(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        x = self._check_query(x, mu)
        return project(x, self._average(x, mu, backend))

    def fused_attention(self, n: int) -> FusedAttention | None:
        """A :class:`FusedAttention` at ``beta_for(n)`` when :math:`Q = K = V = I` (:meth:`plain_attention`), else
        ``None``: the fused small-system step (:mod:`wflow.solvers.fused`) applies."""
        if not self.plain_attention():
            return None
        beta = self.beta_for(n)
        return FusedAttention(beta, self.offset(beta))

    def normalizer(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        r""":math:`Z_\mu(x) = \int e^{\beta(\langle Qx, Ky\rangle - o)}d\mu(y)` (:math:`o` = 0 or beta), shape ``(..., n)``."""
        x = self._check_query(x, mu)
        s = self._sums(x, mu, backend, values=False)
        beta = self.beta_for(mu.n)
        return s.mass * _exp_checked(s.log_scale - self.offset(beta), "the normalizer Z", beta)


class USA(_Attention):
    r"""Unnormalized self-attention: :math:`v[\mu](x) = P_x\big(\int e^{\beta\langle Qx,Ky\rangle} V y\,d\mu(y)\big)`.

    Parameters as in :class:`SA`.  With :math:`Q = K = I`, :math:`V = \pm I` it is the
    Wasserstein-2 gradient ascent of :math:`\pm E_\beta`:
    :math:`v = \nabla_S\,\delta F/\delta\mu`, :math:`dF/dt = \int |v|^2 d\mu`.

    In the plain kernel the velocity is of size :math:`e^{\beta}` and moves on the time scale
    :math:`e^{-\beta}`: beyond :math:`\beta \approx 300` float64 cannot integrate it and a
    :class:`~wflow.errors.WflowError` says so.  The rescaled kernel
    :math:`e^{\beta(\langle x,y\rangle-1)}` (``kernel="rescaled"``) is the same flow at the time
    :math:`t' = e^{\beta}t` with velocities of size 1; it runs at any beta (the metastability
    studies use :math:`\beta = 500\ldots 4000`).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> x = wflow.sphere.uniform(20, 3, seed=0)
    >>> mu = wflow.Atoms(x)
    >>> ratio = wflow.USA(5.0).velocity(x, mu) / wflow.USA(5.0, kernel="rescaled").velocity(x, mu)
    >>> bool(np.allclose(ratio, np.exp(5.0)))
    True
    """

    #: beyond this log-size of the velocity, float64 cannot integrate USA (error norms square it)
    MAX_LOG_VELOCITY = 300.0

    def _average(self, x: np.ndarray, mu: Atoms, backend: str) -> np.ndarray:
        s = self._sums(x, mu, backend)
        c = s.log_scale - self.offset(self.beta_for(mu.n))
        if c.size and float(np.max(c)) > self.MAX_LOG_VELOCITY:
            raise WflowError(
                f"USA at beta={self.beta:g}: the velocity is of size e^{float(np.max(c)):.4g} and moves on "
                f"the time scale e^-beta, beyond what float64 can integrate (e^beta overflows, and its square long "
                f"before); use SA (the same clusters, normalized speed), a smaller beta, or the rescaled kernel "
                f"e^(beta(<x,y>-1)) (USA(beta, kernel='rescaled')), a pure time change t' = e^beta t"
            )
        return s.vector * np.exp(c)[..., None]

    def velocity(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        x = self._check_query(x, mu)
        return project(x, self._average(x, mu, backend))


# --------------------------------------------------------------------------- perceptron
def _gelu(s: np.ndarray) -> np.ndarray:
    return 0.5 * s * (1.0 + special.erf(s / np.sqrt(2.0)))


def _gelu_potential(s: np.ndarray) -> np.ndarray:
    # phi(s) = 2 * int_0^s t Phi(t) dt = s^2 Phi(s) - Phi(s) + s phi_N(s) + 1/2
    Phi = special.ndtr(s)
    pdf = np.exp(-0.5 * s * s) / np.sqrt(2 * np.pi)
    return s * s * Phi - Phi + s * pdf + 0.5


def _logcosh(s: np.ndarray) -> np.ndarray:
    a = np.abs(s)
    return a + np.log1p(np.exp(-2 * a)) - np.log(2.0)


#: activation name -> (sigma, phi) with phi' = 2 sigma, phi(0) = 0.
ACTIVATIONS: dict[str, tuple[Any, Any]] = {
    "relu": (lambda s: np.maximum(s, 0.0), lambda s: np.maximum(s, 0.0) ** 2),
    "gelu": (_gelu, _gelu_potential),
    "tanh": (np.tanh, lambda s: 2.0 * _logcosh(s)),
    "identity": (lambda s: s, lambda s: s * s),
}


class Perceptron(Model):
    r"""Perceptron (feed-forward) block :math:`u(x) = P_x(W\sigma(Ax + b))`.

    Parameters
    ----------
    W : array_like, shape (d, m)
    A : array_like, shape (m, d)
    b : array_like, shape (m,), optional
        Zero if omitted.
    activation : {"relu", "gelu", "tanh", "identity"}

    Notes
    -----
    It is conservative when :math:`W = A^\top\mathrm{diag}(\omega)` (each column of
    :math:`W` parallel to the matching row of :math:`A`); then
    :math:`W\sigma(Ax+b) = \tfrac12\nabla v_\omega(x)` with
    :math:`v_\omega(x) = \sum_j\omega_j\varphi(a_j\cdot x + b_j)`, :math:`\varphi' = 2\sigma`
    (ReLU: :math:`\varphi(s) = s_+^2`), and the energy is :math:`\tfrac12\int v_\omega\,d\mu`
    (Álvarez-López, Geshkovski & Ruiz-Balet, 2026).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> rng = np.random.default_rng(0)
    >>> A = rng.standard_normal((4, 3))
    >>> block = wflow.Perceptron(A.T * np.array([1.0, -1.0, 0.5, 2.0]), A)  # W = A^T diag(omega)
    >>> block.is_gradient, wflow.Perceptron(rng.standard_normal((3, 4)), A).is_gradient
    (True, False)
    >>> x = wflow.sphere.uniform(5, 3, seed=0)
    >>> v = block.velocity(x, wflow.Atoms(x))
    >>> v.shape, bool(np.allclose((v * x).sum(axis=-1), 0.0))  # tangent to the sphere
    ((5, 3), True)
    """

    def __init__(
        self, W: ArrayLike, A: ArrayLike, b: ArrayLike | None = None, activation: str = "relu"
    ):
        self.W = _matrix(W, "W")
        self.A = _matrix(A, "A")
        if self.W is None or self.A is None:
            raise TypeError("Perceptron needs both W and A matrices, got None")
        m, d = self.A.shape
        if self.W.shape != (d, m):
            raise ValueError(
                f"W must have shape (d, m) = ({d}, {m}) to match A of shape {self.A.shape}, got {self.W.shape}"
            )
        if d < 2:
            raise ValueError(f"A must act on dimension d >= 2, got A of shape {self.A.shape}")
        if b is None:
            self.b = np.zeros(m)
        else:
            bb = np.asarray(b, dtype=float)
            if bb.shape != (m,):
                raise ValueError(f"b must have shape ({m},), got {bb.shape}")
            if not np.all(np.isfinite(bb)):
                raise ValueError(f"b contains non-finite values: {short_repr(bb)}")
            self.b = bb
        if not isinstance(activation, str):
            raise TypeError(f"activation must be a string, got {short_repr(activation)}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.activation = activation
        self.dim = d
        self._omega = self._conservative_weights()

    @classmethod
    def conservative(
        cls, A: ArrayLike, omega: ArrayLike, b: ArrayLike | None = None, activation: str = "relu"
    ) -> Perceptron:
        r"""The conservative perceptron :math:`W = A^\top\mathrm{diag}(\omega)`."""
        A = np.asarray(A, dtype=float)
        omega = np.asarray(omega, dtype=float)
        if omega.shape != (A.shape[0],):
            raise ValueError(f"omega must have shape ({A.shape[0]},) to match A, got {omega.shape}")
        if not np.all(np.isfinite(omega)):
            raise ValueError(f"omega contains non-finite values: {short_repr(omega)}")
        return cls(A.T * omega, A, b, activation)

    def _conservative_weights(self) -> np.ndarray | None:
        """omega with W = A^T diag(omega), or None (relative tolerance 1e-10)."""
        a2 = np.sum(self.A**2, axis=1)
        proj = np.einsum("dj,jd->j", self.W, self.A)
        omega = np.where(a2 > 0, proj / np.where(a2 > 0, a2, 1.0), 0.0)
        resid = np.linalg.norm(self.W - self.A.T * omega)
        scale = max(np.linalg.norm(self.W), 1e-300)
        return omega if resid <= 1e-10 * scale else None

    @property
    def omega(self) -> np.ndarray | None:
        r""":math:`\omega` with :math:`W = A^\top\mathrm{diag}(\omega)`, or ``None`` if not conservative."""
        return self._omega

    def raw(self, x: np.ndarray) -> np.ndarray:
        r""":math:`W\sigma(Ax + b)` before projection, shape ``(..., n, d)``."""
        sigma = ACTIVATIONS[self.activation][0]
        return sigma(x @ self.A.T + self.b) @ self.W.T

    def velocity(
        self, x: ArrayLike, mu: Atoms | None = None, *, backend: str = "auto"
    ) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim < 2 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (..., n, {self.dim}), got {x.shape}")
        return project(x, self.raw(x))

    def rate_bound(self) -> float:
        """``|W| |A|`` (spectral norms; the activations are 1-Lipschitz up to a constant)."""
        return float(np.linalg.norm(self.W, 2) * np.linalg.norm(self.A, 2))

    def potential(self, x: ArrayLike) -> np.ndarray:
        r""":math:`v_\omega(x) = \sum_j \omega_j\varphi(a_j\cdot x + b_j)` (conservative case), shape ``(..., n)``."""
        self._require_gradient()
        phi = ACTIVATIONS[self.activation][1]
        return phi(np.asarray(x) @ self.A.T + self.b) @ self._omega

    def gradient_obstruction(self) -> str | None:
        if self._omega is None:
            return "the perceptron is conservative only when W = A^T diag(omega) (each column of W parallel to the matching row of A)"
        return None

    def _first_variation(self, x: np.ndarray, mu: Atoms, backend: str) -> np.ndarray:
        return 0.5 * self.potential(x)

    def _energy(self, mu: Atoms, backend: str) -> np.ndarray:
        return 0.5 * mu.integrate(self.potential(mu.points))

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "Perceptron",
            "W": self.W.tolist(),
            "A": self.A.tolist(),
            "b": self.b.tolist(),
            "activation": self.activation,
        }

    def __repr__(self) -> str:
        kind = "conservative" if self._omega is not None else "general"
        return (
            f"Perceptron(d={self.dim}, m={self.A.shape[0]}, activation={self.activation!r}, {kind})"
        )


class SumModel(Model):
    """Sum of blocks: the velocity is the sum of the blocks' velocities.

    It is a gradient flow when every block is one in the plain Wasserstein metric
    (USA with V = +-I, conservative perceptrons), or when it has a single block.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> rng = np.random.default_rng(0)
    >>> A = rng.standard_normal((4, 3))
    >>> usa, block = wflow.USA(1.0), wflow.Perceptron(A.T, A)
    >>> model = usa + block  # a SumModel
    >>> type(model).__name__, len(model.parts), model.is_gradient
    ('SumModel', 2, True)
    >>> x = wflow.sphere.uniform(5, 3, seed=0)
    >>> mu = wflow.Atoms(x)
    >>> v = model.velocity(x, mu, backend="numpy")
    >>> bool(np.allclose(v, usa.velocity(x, mu, backend="numpy") + block.velocity(x, mu)))
    True
    """

    def __init__(self, parts: list[Model]):
        if not parts:
            raise ValueError("a SumModel needs at least one block")
        dims = {p.dim for p in parts if p.dim is not None}
        if len(dims) > 1:
            raise ValueError(f"blocks act on different dimensions: {sorted(dims)}")
        if any(p.space != "sphere" for p in parts):
            raise ValueError(
                "blocks of a sum act on the sphere; a scheme with radii (pre-ln, peri-ln, mix-ln) takes its "
                "perceptron as Normalized(attention, scheme, perceptron=...)"
            )
        self._parts = list(parts)
        self.dim = dims.pop() if dims else None

    @property
    def parts(self) -> list[Model]:
        return list(self._parts)

    def rate_bound(self) -> float:
        return float(sum(p.rate_bound() for p in self._parts))

    @property
    def time_dependent(self) -> bool:
        return any(p.time_dependent for p in self._parts)

    def at(self, t: float) -> Model:
        return SumModel([p.at(t) for p in self._parts]) if self.time_dependent else self

    def breakpoints(self, t0: float, t_end: float) -> np.ndarray:
        return np.unique(
            np.concatenate([np.empty(0)] + [p.breakpoints(t0, t_end) for p in self._parts])
        )

    def velocity(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        x = self._check_query(x, mu)
        out = self._parts[0].velocity(x, mu, backend=backend)
        for p in self._parts[1:]:
            out = out + p.velocity(x, mu, backend=backend)
        return out

    def gradient_obstruction(self) -> str | None:
        for p in self._parts:
            why = p.gradient_obstruction()
            if why is not None:
                return f"block {p!r}: {why}"
        if len(self._parts) > 1 and any(p.metric != WASSERSTEIN for p in self._parts):
            return (
                "SA ascends its energy in a metric reweighted by Z_mu, other blocks in the plain Wasserstein "
                "metric: their sum is not the gradient flow of one energy (use USA for a gradient sum)"
            )
        return None

    @property
    def metric(self) -> str:
        return self._parts[0].metric if len(self._parts) == 1 else WASSERSTEIN

    def _energy(self, mu: Atoms, backend: str) -> np.ndarray:
        return sum(p._energy(mu, backend) for p in self._parts)

    def _first_variation(self, x: np.ndarray, mu: Atoms, backend: str) -> np.ndarray:
        return sum(p._first_variation(x, mu, backend) for p in self._parts)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "Sum", "parts": [p.to_dict() for p in self._parts]}

    def __repr__(self) -> str:
        return " + ".join(repr(p) for p in self._parts)


_KEYS = {
    "SA": {"type", "beta", "Q", "K", "V", "kernel", "gamma"},
    "USA": {"type", "beta", "Q", "K", "V", "kernel", "gamma"},
    "Perceptron": {"type", "W", "A", "b", "activation"},
    "Sum": {"type", "parts"},
    "Normalized": {"type", "scheme", "attention", "tau", "alpha", "alpha_times", "perceptron"},
    "Layered": {"type", "period", "t0", "layers"},
}


def model_from_dict(spec: dict[str, Any]) -> Model:
    """Inverse of :meth:`Model.to_dict`; rejects unknown types and keys.

    Examples
    --------
    >>> import wflow
    >>> from wflow.models import model_from_dict
    >>> spec = wflow.SA(2.0).to_dict()
    >>> spec
    {'type': 'SA', 'beta': 2.0}
    >>> model_from_dict(spec)
    SA(beta=2)
    """
    if not isinstance(spec, dict):
        raise TypeError(f"a model description must be a dict, got {short_repr(spec)}")
    kind = spec.get("type")
    if kind not in _KEYS:
        raise ValueError(f"model type must be one of {sorted(_KEYS)}, got {kind!r}")
    unknown = set(spec) - _KEYS[kind]
    if unknown:
        raise ValueError(
            f"unknown keys for a {kind} model: {sorted(unknown)} (allowed: {sorted(_KEYS[kind])})"
        )
    args = {k: v for k, v in spec.items() if k != "type"}
    if kind == "SA":
        return SA(**args)
    if kind == "USA":
        return USA(**args)
    if kind == "Perceptron":
        return Perceptron(**args)
    if kind in ("Normalized", "Layered"):
        from . import schemes

        return getattr(schemes, kind).from_dict(spec)
    return SumModel([model_from_dict(p) for p in spec["parts"]])
