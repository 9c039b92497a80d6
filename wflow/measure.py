r"""Probability measures on the sphere.

:class:`Atoms` is the empirical / quadrature representation
:math:`\mu = \sum_j w_j \delta_{x_j}` used by the particle solvers and by every kernel
sum.  Leading axes of ``points`` are independent systems (a batch): ``points`` of shape
``(B, n, d)`` with ``weights`` ``(B, n)`` are ``B`` measures evolved together as one
array computation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._typing import ArrayLike
from .errors import as_points, short_repr

__all__ = ["Atoms", "as_atoms"]


class Atoms:
    r"""A finitely atomic probability measure :math:`\sum_j w_j \delta_{x_j}` on :math:`S^{d-1}`.

    Parameters
    ----------
    points : array_like, shape (..., n, d)
        Atom locations on the unit sphere (checked to ``1e-6``; pass
        ``normalize=True`` to project arbitrary non-zero vectors).
    weights : array_like, shape (..., n), optional
        Non-negative masses; normalized to sum to one over the ``n`` axis.  Uniform
        ``1/n`` if omitted.  They broadcast against ``points.shape[:-1]``.
    normalize : bool
        Project ``points`` onto the sphere instead of checking them.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> mu = wflow.Atoms([[1.0, 0.0], [0.0, 1.0]], weights=[3, 1])
    >>> mu.weights
    array([0.75, 0.25])
    """

    __slots__ = ("points", "weights")

    def __init__(
        self, points: ArrayLike, weights: ArrayLike | None = None, *, normalize: bool = False
    ):
        x = as_points(points, "points", normalize=normalize)
        if weights is None:
            w = np.full(x.shape[:-1], 1.0 / x.shape[-2], dtype=x.dtype)
        else:
            w = _as_weights(weights, x.shape[:-1], x.dtype)
        self.points = x
        self.weights = w

    @classmethod
    def _trusted(cls, points: np.ndarray, weights: np.ndarray) -> Atoms:
        """Build without validation (solvers, after checks at the door)."""
        obj = cls.__new__(cls)
        obj.points = points
        obj.weights = weights
        return obj

    # -- shape -----------------------------------------------------------------
    @property
    def d(self) -> int:
        """Ambient dimension (the sphere is :math:`S^{d-1}`)."""
        return int(self.points.shape[-1])

    @property
    def n(self) -> int:
        """Number of atoms per system."""
        return int(self.points.shape[-2])

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Leading axes: independent systems."""
        return tuple(self.points.shape[:-2])

    @property
    def dtype(self) -> np.dtype:
        return self.points.dtype

    # -- functionals -----------------------------------------------------------
    def mean(self) -> np.ndarray:
        r"""Barycentre :math:`\sum_j w_j x_j`, shape ``(..., d)``."""
        return np.einsum("...n,...nd->...d", self.weights, self.points)

    def order_parameter(self) -> np.ndarray:
        r"""Order parameter :math:`|\sum_j w_j x_j| \in [0, 1]` (1 iff a single cluster)."""
        return np.linalg.norm(self.mean(), axis=-1)

    def integrate(self, f: ArrayLike) -> np.ndarray:
        r""":math:`\int f\,d\mu = \sum_j w_j f(x_j)` for values ``f`` of shape ``(..., n)``."""
        return np.einsum("...n,...n->...", self.weights, np.asarray(f))

    # -- transformations -------------------------------------------------------
    def rotate(self, R: ArrayLike) -> Atoms:
        """Image under the orthogonal map ``x -> R x``."""
        R = np.asarray(R, dtype=self.points.dtype)
        return Atoms._trusted(self.points @ R.T, self.weights)

    def astype(self, dtype: Any) -> Atoms:
        return Atoms._trusted(self.points.astype(dtype), self.weights.astype(dtype))

    def __getitem__(self, index: Any) -> Atoms:
        """Select systems along the batch axes (``mu[3]``, ``mu[:10]``)."""
        if not self.batch_shape:
            raise IndexError("these Atoms have no batch axes to index")
        idx = index if isinstance(index, tuple) else (index,)
        if Ellipsis in idx:
            raise IndexError("Atoms indexing selects batch systems; Ellipsis is not supported")
        pts = self.points[idx]
        if pts.ndim < 2:
            raise IndexError(f"index {index!r} removes the point axes")
        return Atoms._trusted(pts, self.weights[idx])

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        b = f", batch={self.batch_shape}" if self.batch_shape else ""
        return f"Atoms(n={self.n}, d={self.d}{b}, dtype={self.dtype})"


def _as_weights(weights: ArrayLike, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    w = np.asarray(weights)
    if w.dtype == object or not np.issubdtype(w.dtype, np.number) or np.iscomplexobj(w):
        raise TypeError(f"weights must be a real numeric array, got {short_repr(weights)}")
    w = w.astype(dtype)
    try:
        w = np.broadcast_to(w, shape).copy()
    except ValueError:
        raise ValueError(
            f"weights must have shape {shape} (one per point), got shape {np.shape(weights)}"
        ) from None
    if not np.all(np.isfinite(w)):
        raise ValueError(f"weights contain non-finite values: {short_repr(w)}")
    if np.any(w < 0):
        raise ValueError(f"weights must be non-negative, got minimum {float(w.min()):.6g}")
    total = w.sum(axis=-1, keepdims=True)
    if np.any(total <= 0):
        raise ValueError(
            "weights must have a positive sum for every system, got a system with total mass 0"
        )
    return w / total


def as_atoms(mu: Any, name: str = "mu") -> Atoms:
    """Accept an :class:`Atoms` or an array of points (uniform weights).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.measure import as_atoms
    >>> as_atoms(np.eye(3)).weights.round(6)  # points get uniform weights
    array([0.333333, 0.333333, 0.333333])
    >>> mu = wflow.Atoms(np.eye(2))
    >>> as_atoms(mu) is mu
    True
    """
    if isinstance(mu, Atoms):
        return mu
    if isinstance(mu, np.ndarray) or isinstance(mu, (list, tuple)):
        try:
            return Atoms(mu)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{name}: {exc}") from None
    raise TypeError(
        f"{name} must be a wflow.Atoms or an array of points on the sphere, got {short_repr(mu)}"
    )
