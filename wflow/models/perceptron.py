r"""The perceptron (feed-forward) block :math:`u(x) = P_x(W\sigma(Ax + b))` and its energy when conservative."""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import special

from .._typing import ArrayLike
from ..errors import short_repr
from ..measure import Atoms
from ..sphere import project
from .base import Model, as_matrix, register_model

__all__ = ["Perceptron", "ACTIVATIONS"]


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
        W_, A_ = as_matrix(W, "W"), as_matrix(A, "A")
        if W_ is None or A_ is None:
            raise TypeError("Perceptron needs both W and A matrices, got None")
        self.W: np.ndarray = W_
        self.A: np.ndarray = A_
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
        self._check_speed()
        self._omega = self._conservative_weights()

    def _check_speed(self) -> None:
        r"""Refuse weights whose velocity bound :math:`\|W\|_F(\|A\|_F + |b|)` (tanh:
        :math:`\|W\|_F\sqrt m`) has no finite square in float64 (the solvers' norms form squares)."""
        big = float(np.sqrt(np.finfo(np.float64).max))  # 1.34e154
        with np.errstate(over="ignore"):
            w = float(np.linalg.norm(self.W))
            reach = (
                np.sqrt(self.A.shape[0])
                if self.activation == "tanh"
                else (float(np.linalg.norm(self.A)) + float(np.linalg.norm(self.b)))
            )
            bound = w * reach
        if not (np.isfinite(bound) and bound < big):
            raise ValueError(
                f"the perceptron's weights are too large for float64: its velocity can reach "
                f"|W||A| = {bound:.3g} (|W| = {w:.3g}), whose square overflows (it must stay below "
                f"{big:.3g}); scale the weights down (perceptron.scale in a configuration)"
            )

    @classmethod
    def conservative(
        cls, A: ArrayLike, omega: ArrayLike, b: ArrayLike | None = None, activation: str = "relu"
    ) -> Perceptron:
        r"""The conservative perceptron :math:`W = A^\top\mathrm{diag}(\omega)`."""
        A = np.asarray(A, dtype=float)
        omega = np.asarray(omega, dtype=float)
        if A.ndim != 2:
            raise ValueError(f"A must have shape (m, d), got shape {A.shape}")
        if not np.all(np.isfinite(A)):  # checked here, or the error would name W = A^T diag(omega)
            raise ValueError(f"A contains non-finite values: {short_repr(A)}")
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
        scale = max(float(np.linalg.norm(self.W)), 1e-300)
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


register_model(
    "Perceptron",
    {"type", "W", "A", "b", "activation"},
    lambda spec: Perceptron(**{k: v for k, v in spec.items() if k != "type"}),
)
