r"""What the stability tools read off a model and a measure, checked once for all of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import special

from ..errors import NotAGradientFlowError, short_repr
from ..measure import Atoms, as_atoms
from ..models import SA, USA, Model, Perceptron


# --------------------------------------------------------------------------- derivatives of sigma
def _drelu(s: np.ndarray) -> np.ndarray:
    return np.heaviside(s, 0.5)


def _dgelu(s: np.ndarray) -> np.ndarray:
    return special.ndtr(s) + s * np.exp(-0.5 * s * s) / np.sqrt(2 * np.pi)


def _dtanh(s: np.ndarray) -> np.ndarray:
    return 1.0 - np.tanh(s) ** 2


#: activation name -> sigma'  (the potential's second derivative is 2 sigma').
DSIGMA: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": _drelu,
    "gelu": _dgelu,
    "tanh": _dtanh,
    "identity": np.ones_like,
}


def conservative_omega(p: Perceptron) -> np.ndarray:
    """The weights of a conservative perceptron (the functions here take only those: checked on entry)."""
    omega = p.omega
    if omega is None:
        raise NotAGradientFlowError(f"{p!r} is not conservative (W != A^T diag(omega))")
    return omega


# --------------------------------------------------------------------------- input checks
def gradient_blocks(model: Any) -> tuple[list[tuple[int, float]], list[Perceptron]]:
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
            if part.activation not in DSIGMA:
                raise ValueError(
                    f"the stability tools need the second derivative of the activation; none is known "
                    f"for activation={part.activation!r}"
                )
            perceptrons.append(part)
        else:
            raise TypeError(f"the stability tools know SA, USA and Perceptron blocks, got {part!r}")
    return attention, perceptrons


def check_atoms(model: Model, mu: Any, name: str = "mu", *, distinct: bool = True) -> Atoms:
    """``mu`` as one atomic measure of the model's dimension: finite, positive masses, distinct atoms."""
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


def tangent_basis(x: np.ndarray) -> np.ndarray:
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
