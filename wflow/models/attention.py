r"""The attention blocks: :class:`SA` (softmax, "Post-LN") and :class:`USA` (unnormalized), the two
normalizations of :class:`Attention`, with their energies, their Kuramoto form on the circle and their
exact Jacobian on the sphere.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import numpy as np

from .._typing import ArrayLike
from ..errors import WflowError, check_nonnegative
from ..kernels import kernel_sums
from ..measure import Atoms, as_atoms
from ..sphere import project
from .base import REWEIGHTED, FusedAttention, Model, as_matrix, register_model

__all__ = ["Attention", "SA", "USA", "KERNELS"]

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


class Attention(Model):
    """The attention block: what SA and USA share (inverse temperature, Q, K, V, the kernel convention, the
    long-context scaling, energies, the Kuramoto form on the circle, the exact Jacobian on the sphere).
    A public base for code that asks ``isinstance(model, Attention)`` (:mod:`wflow.schemes`)."""

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
            self.gamma: float | None = check_nonnegative(gamma, "gamma")
            beta = 0.0
        else:
            self.gamma = None
            if beta is None:
                raise TypeError(
                    "attention needs beta (or gamma for the long-context scaling beta = gamma log n)"
                )
        self.beta = check_nonnegative(beta, "beta")
        self.Q = as_matrix(Q, "Q")
        self.K = as_matrix(K, "K")
        self.V = as_matrix(V, "V")
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
            raise WflowError(USA.too_fast(self.beta, size))
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
        return self.sign * self._interaction(x, mu, backend)

    def _energy(self, mu: Atoms, backend: str) -> np.ndarray:
        if self.beta_for(mu.n) == 0:
            return self.sign * 0.5 * np.sum(mu.mean() ** 2, axis=-1)
        fv = self._interaction(mu.points, mu, backend)
        return self.sign * 0.5 * mu.integrate(fv)

    def plain_attention(self) -> bool:
        """True when :math:`Q = K = V = I` (each omitted or the identity): the fused small-system paths apply."""
        return all(_identity_sign(M) == 1 for M in (self.Q, self.K, self.V))

    def angular_velocity(self, theta: np.ndarray, weights: np.ndarray) -> np.ndarray:
        r"""The velocity on :math:`S^1` in angles (the Kuramoto form), for :math:`Q = K = I`, :math:`V = \pm I`:

        .. math::

            \theta_i' = \pm\frac{\sum_j w_j e^{-2\beta\sin^2(\Delta_{ij}/2) + c}\sin\Delta_{ij}}{[\sum_j w_j
            e^{-2\beta\sin^2(\Delta_{ij}/2)}]_{\mathrm{SA}}}, \qquad \Delta_{ij} = \theta_j - \theta_i,

        with :math:`c = \beta - o` (0 in the rescaled kernel) for USA.  Angle differences keep their
        relative accuracy, so merged tokens contribute exactly nothing and forces far below rounding
        in Cartesian coordinates are resolved (the metastable staircase).
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
            raise WflowError(USA.too_fast(self.beta, c))
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

        with :math:`\bar A_i = \sum_j p_{ij}\theta_j` for SA and :math:`\bar A_i = 0` for USA.  A dense
        Jacobian of :math:`n d` unknowns, for the stiff steps (``method="ros2"``) of small systems.

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
        if self.gradient_obstruction() is not None:
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
        C = np.matmul(theta.T[None, :, :] * p[:, None, :], theta)  # sum_j p_ij theta_j theta_j^T
        dA[idx, idx] += beta * (C - Abar[:, :, None] * Abar[:, None, :])
        dA *= self.sign
        A *= self.sign
        P = eye - theta[:, :, None] * theta[:, None, :]
        dv = np.matmul(P[:, None], dA)
        dv[idx, idx] -= (
            np.einsum("ij,ij->i", theta, A)[:, None, None] * eye + theta[:, :, None] * A[:, None, :]
        )
        return dA, dv

    @abstractmethod
    def _average(self, x: np.ndarray, mu: Atoms, backend: str) -> np.ndarray:
        """:meth:`average` of checked queries ``x`` (SA and USA each define it)."""

    def average(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        r"""The attention output before projection: :math:`A(x) = \int e^{\ell(x,y)}Vy\,d\mu(y) / Z` (SA) or
        :math:`\int e^{\ell(x,y) - o}Vy\,d\mu(y)` (USA), shape ``(..., n, d)``; the velocity is :math:`P_x A(x)`."""
        x = self._check_query(x, mu)
        return self._average(x, mu, backend)

    def velocity(self, x: ArrayLike, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        x = self._check_query(x, mu)
        return project(x, self._average(x, mu, backend))

    def log_energy(self, mu: Atoms, *, backend: str = "auto") -> np.ndarray:
        r""":math:`\log E_\beta(\mu)`, :math:`E_\beta = \frac{1}{2\beta}\iint e^{\beta\langle x,y\rangle}d\mu\,d\mu`, finite at any beta.

        Formed from the kernel sums' log-scale, :math:`\log\sum_i w_i s_i e^{c_i} - \log 2\beta`
        (``energy`` overflows beyond :math:`\beta \approx 709`).  At :math:`\beta = 0`:
        :math:`\log\tfrac12|\int x\,d\mu|^2`.
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
        signed = self.V is not None and self.sign != 0  # V = +-I: said so
        names = ("Q", "K") if signed else ("Q", "K", "V")
        extra = "".join(
            f", {n}=<{M.shape[0]}x{M.shape[1]}>"
            for n in names
            if (M := getattr(self, n)) is not None
        )
        if signed:
            extra += ", V=-I" if self.sign < 0 else ", V=I"
        temp = f"gamma={self.gamma:g}" if self.gamma is not None else f"beta={self.beta:g}"
        kern = ", kernel='rescaled'" if self.kernel == "rescaled" else ""
        return f"{type(self).__name__}({temp}{extra}{kern})"


class SA(Attention):
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
        :math:`e^{\beta\langle Qx,Ky\rangle}` or :math:`e^{\beta(\langle Qx,Ky\rangle - 1)}`: the same
        velocity for SA, the energy times :math:`e^{-\beta}` in the rescaled one.
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


class USA(Attention):
    r"""Unnormalized self-attention: :math:`v[\mu](x) = P_x\big(\int e^{\beta\langle Qx,Ky\rangle} V y\,d\mu(y)\big)`.

    Parameters as in :class:`SA`.  With :math:`Q = K = I`, :math:`V = \pm I` it is the
    Wasserstein-2 gradient ascent of :math:`\pm E_\beta`:
    :math:`v = \nabla_S\,\delta F/\delta\mu`, :math:`dF/dt = \int |v|^2 d\mu`.

    In the plain kernel the velocity is of size :math:`e^{\beta}`: beyond :math:`\beta \approx 300`
    float64 cannot integrate it and a :class:`~wflow.errors.WflowError` says so.  The rescaled
    kernel (``kernel="rescaled"``) is the same flow at the time :math:`t' = e^{\beta}t`, at any beta.

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

    @classmethod
    def too_fast(cls, beta: float, log_size: float) -> str:
        """Why float64 cannot integrate USA whose velocity is of size ``e^log_size`` (the one message)."""
        return (
            f"USA at beta={beta:g}: the velocity is of size e^{log_size:.4g} and moves on the time scale "
            f"e^-beta, beyond what float64 can integrate (e^beta overflows, and its square long before; "
            f"at most e^{cls.MAX_LOG_VELOCITY:g}); use SA (the same clusters, normalized speed), a smaller "
            f"beta, or the rescaled kernel e^(beta(<x,y>-1)) (USA(beta, kernel='rescaled')), a pure time "
            f"change t' = e^beta t"
        )

    @classmethod
    def integrable(cls, beta: float, kernel: str = "plain") -> str | None:
        """``None`` when float64 can integrate USA at ``beta`` in ``kernel``, else why not.

        Examples
        --------
        >>> USA.integrable(400.0, "rescaled") is None, USA.integrable(400.0, "plain")[:18]
        (True, 'USA at beta=400: t')
        """
        if kernel == "plain" and beta > cls.MAX_LOG_VELOCITY:
            return cls.too_fast(beta, beta)
        return None

    def _average(self, x: np.ndarray, mu: Atoms, backend: str) -> np.ndarray:
        s = self._sums(x, mu, backend)
        c = s.log_scale - self.offset(self.beta_for(mu.n))
        if c.size and float(np.max(c)) > self.MAX_LOG_VELOCITY:
            raise WflowError(self.too_fast(self.beta, float(np.max(c))))
        return s.vector * np.exp(c)[..., None]


_ATTENTION_KEYS = {"type", "beta", "Q", "K", "V", "kernel", "gamma"}
register_model(
    "SA", _ATTENTION_KEYS, lambda spec: SA(**{k: v for k, v in spec.items() if k != "type"})
)
register_model(
    "USA", _ATTENTION_KEYS, lambda spec: USA(**{k: v for k, v in spec.items() if k != "type"})
)
