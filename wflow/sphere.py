r"""Geometry of the unit sphere :math:`S^{d-1} \subset \mathbb{R}^d`.

Points are arrays of shape ``(..., n, d)``; the last axis holds coordinates and any
leading axes are independent systems.  Tangent vectors at ``x`` have the same shape.

Contents: projections, geodesics, cost matrices, tangent frames, exponential map and
retraction, random rotations, samplers and quadrature nodes.  Every random function takes
``seed``: ``None``, an ``int``, a :class:`numpy.random.SeedSequence` or a
:class:`numpy.random.Generator`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numba import njit

from ._typing import ArrayLike, SeedLike
from .errors import (
    as_points,
    check_int,
    check_nonnegative,
    check_positive,
    real_float_dtype,
    short_repr,
)

__all__ = [
    "as_generator",
    "normalize",
    "project",
    "geodesic_distance",
    "cost_matrix",
    "tangent_frame",
    "exp_map",
    "log_map",
    "retract",
    "angles_to_points",
    "points_to_angles",
    "random_rotation",
    "uniform",
    "von_mises_fisher",
    "vmf_mixture",
    "sample_circle_density",
    "sample_sphere_density",
    "sample_zonal_density",
    "density_quadrature",
    "circle_nodes",
    "gauss_sphere_nodes",
    "fibonacci_nodes",
]


def as_generator(seed: SeedLike) -> np.random.Generator:
    """Return a :class:`numpy.random.Generator` from a seed-like argument.

    Examples
    --------
    >>> rng = as_generator(0)
    >>> type(rng).__name__
    'Generator'
    >>> as_generator(rng) is rng
    True
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or isinstance(seed, (np.random.SeedSequence,)):
        return np.random.default_rng(seed)
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed}")
        return np.random.default_rng(int(seed))
    raise TypeError(
        f"seed must be None, an int, a SeedSequence or a numpy Generator, got {short_repr(seed)}"
    )


#: Arrays with at least this many numbers go through the fused (serial, memory-bound) numba
#: loops of :func:`project`, :func:`normalize` and :func:`retract`; smaller ones through NumPy.
FUSED_MIN_SIZE = 1 << 15


@njit(cache=True, nogil=True, fastmath={"nsz", "contract", "reassoc"})
def _project_rows(x, v, out):  # pragma: no cover - compiled
    R, d = x.shape
    for i in range(R):
        s = 0.0
        for k in range(d):
            s += x[i, k] * v[i, k]
        c = x.dtype.type(s)
        for k in range(d):
            out[i, k] = v[i, k] - c * x[i, k]


@njit(cache=True, nogil=True, fastmath={"nsz", "contract", "reassoc"})
def _project_scaled_rows(x, v, scale, out):  # pragma: no cover - compiled
    R, d = x.shape
    for i in range(R):
        s = 0.0
        for k in range(d):
            s += x[i, k] * v[i, k]
        c = x.dtype.type(s)
        f = x.dtype.type(1.0 / scale[i])
        for k in range(d):
            out[i, k] = (v[i, k] - c * x[i, k]) * f


@njit(cache=True, nogil=True, fastmath={"nsz", "contract", "reassoc"})
def _retract_rows(x, v, step, out):  # pragma: no cover - compiled
    R, d = x.shape
    h = x.dtype.type(step)
    for i in range(R):
        s = 0.0
        for k in range(d):
            y = x[i, k] + h * v[i, k]
            out[i, k] = y
            s += np.float64(y) * np.float64(y)
        c = x.dtype.type(1.0 / np.sqrt(s))
        for k in range(d):
            out[i, k] *= c


@njit(cache=True, nogil=True, fastmath={"nsz", "contract", "reassoc"})
def _normalize_rows(x, out, sq):  # pragma: no cover - compiled
    R, d = x.shape
    for i in range(R):
        s = 0.0
        for k in range(d):
            s += np.float64(x[i, k]) * np.float64(x[i, k])
        sq[i] = s
        c = x.dtype.type(1.0 / np.sqrt(s)) if s > 0.0 else x.dtype.type(0.0)
        for k in range(d):
            out[i, k] = x[i, k] * c


def _fused_ok(*arrays: np.ndarray) -> bool:
    a = arrays[0]
    return (
        a.size >= FUSED_MIN_SIZE
        and a.ndim >= 1
        and a.shape[-1] > 0
        and a.dtype in (np.float32, np.float64)
        and all(b.shape == a.shape and b.dtype == a.dtype and b.flags.c_contiguous for b in arrays)
    )


def normalize(x: ArrayLike, *, check: bool = True) -> np.ndarray:
    r"""Project non-zero vectors radially onto the sphere, :math:`x \mapsto x / |x|`.

    Parameters
    ----------
    x : array_like, shape (..., n, d)
        Vectors (float32 stays float32, anything else becomes float64).
    check : bool
        Validate the input (default): ``ValueError`` for a zero vector or a non-finite value,
        ``TypeError`` for a non-numeric array.  ``check=False`` (the solvers' hot path): no
        validation, a zero vector gives zeros.

    Returns
    -------
    ndarray, shape (..., n, d)
        A new array of unit vectors.

    Examples
    --------
    >>> normalize([[3.0, 4.0]])
    array([[0.6, 0.8]])
    """
    arr = np.asarray(x) if isinstance(x, np.ndarray) else None
    if (
        arr is None
        or arr.dtype not in (np.float32, np.float64)
        or arr.ndim < 2
        or arr.shape[-1] < 2
        or arr.shape[-2] < 1
    ):
        return as_points(x, "x", normalize=True)  # converts, or raises
    if _fused_ok(arr):
        out = np.empty_like(arr)
        sq = np.empty(arr.size // arr.shape[-1])
        _normalize_rows(arr.reshape(-1, arr.shape[-1]), out.reshape(-1, arr.shape[-1]), sq)
        if not check or (np.isfinite(sq).all() and (sq > 0).all()):
            return out
        # raises, or rescues squares that over/underflowed
        return as_points(arr, "x", normalize=True)
    sq = np.einsum("...i,...i->...", arr, arr)
    if not check or (np.isfinite(sq).all() and (sq > 0).all()):
        with np.errstate(divide="ignore", invalid="ignore"):
            return arr / np.sqrt(sq)[..., None]
    return as_points(arr, "x", normalize=True)


def project(x: np.ndarray, v: np.ndarray, *, scale: np.ndarray | None = None) -> np.ndarray:
    r"""Tangent projection :math:`P_x v = v - \langle x, v\rangle x` (divided by ``scale`` if given).

    ``x`` and ``v`` broadcast against each other; no validation (hot path).  With ``scale``
    of shape ``(..., n)`` the result is :math:`P_x v / s`, e.g. the SA velocity from the
    shifted kernel sums in one pass: ``project(x, sums.vector, scale=sums.mass)``.

    Examples
    --------
    >>> project(np.array([0.0, 0.0, 1.0]), np.array([1.0, 2.0, 3.0]))
    array([1., 2., 0.])
    >>> project(np.array([[0.0, 1.0]]), np.array([[4.0, 3.0]]), scale=np.array([2.0]))
    array([[2., 0.]])
    """
    if isinstance(x, np.ndarray) and isinstance(v, np.ndarray) and _fused_ok(x, v):
        out = np.empty_like(v)
        d = x.shape[-1]
        if scale is None:
            _project_rows(x.reshape(-1, d), v.reshape(-1, d), out.reshape(-1, d))
            return out
        sc = np.asarray(scale)
        if sc.shape == x.shape[:-1]:
            _project_scaled_rows(
                x.reshape(-1, d),
                v.reshape(-1, d),
                np.ascontiguousarray(sc).reshape(-1),
                out.reshape(-1, d),
            )
            return out
    x = np.asarray(x)
    v = np.asarray(v)
    out = x * np.einsum("...i,...i->...", x, v)[..., None]
    out = np.subtract(
        v,
        out,
        out=out
        if out.shape == np.broadcast_shapes(x.shape, v.shape) and out.dtype == np.result_type(x, v)
        else None,
    )
    if scale is not None:
        out /= np.asarray(scale)[..., None]
    return out


def geodesic_distance(x: ArrayLike, y: ArrayLike) -> np.ndarray:
    r"""Great-circle distance :math:`\arccos\langle x, y\rangle \in [0, \pi]`.

    Computed as :math:`2\,\mathrm{atan2}(|x-y|, |x+y|)`, accurate to round-off for
    nearby and antipodal points alike (``arccos`` loses half the digits near 0).

    Examples
    --------
    >>> round(float(geodesic_distance([1.0, 0.0, 0.0], [0.0, 1.0, 0.0])), 6)  # pi / 2
    1.570796
    >>> round(float(geodesic_distance([1.0, 0.0], [-1.0, 0.0])), 6)  # antipodal: pi
    3.141593
    """
    x = np.asarray(x)
    y = np.asarray(y)
    return 2.0 * np.arctan2(np.linalg.norm(x - y, axis=-1), np.linalg.norm(x + y, axis=-1))


#: Ground costs of :func:`cost_matrix`.
COSTS = ("geodesic", "chordal")
#: Gram entries above this (or below its negative) are recomputed from :math:`|x - y|`
#: (or :math:`|x + y|`): there ``arccos`` of the Gram entry has lost half its digits.
_GRAM_BRANCH = 0.99
#: Entries of one block of :func:`cost_matrix` (bounds its temporaries, 32 MB in float64).
_COST_BLOCK = 1 << 22


def cost_matrix(
    x: ArrayLike, y: ArrayLike | None = None, *, cost: str = "geodesic", p: float = 2
) -> np.ndarray:
    r"""Ground cost :math:`C_{ij} = d(x_i, y_j)^p` between two point sets, geodesic or chordal.

    .. math::

        d_{\mathrm{geo}}(x, y) = \arccos\langle x, y\rangle \in [0, \pi], \qquad
        d_{\mathrm{chord}}(x, y) = |x - y| = \sqrt{2 - 2\langle x, y\rangle}.

    Computed from the Gram matrix :math:`G = x y^\top` in blocks of rows, except where
    ``arccos`` loses digits: for :math:`G > 0.99` from the chord,
    :math:`d = 2\arcsin(|x - y|/2)`, for :math:`G < -0.99` from
    :math:`d = \pi - 2\arcsin(|x + y|/2)`; it agrees with :func:`geodesic_distance` to about
    :math:`10^{-15}` for every pair.

    Parameters
    ----------
    x : array_like, shape (n, d)
        Points on the sphere.
    y : array_like, shape (m, d), optional
        Second point set (default ``x``; then the diagonal is exactly 0).
    cost : {"geodesic", "chordal"}
        Which distance.
    p : float
        Exponent, ``p > 0`` (default 2: the quadratic optimal-transport cost).

    Returns
    -------
    ndarray, shape (n, m)

    Examples
    --------
    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    >>> np.round(cost_matrix(x, p=1) / np.pi, 12)
    array([[0. , 0.5, 1. ],
           [0.5, 0. , 0.5],
           [1. , 0.5, 0. ]])
    """
    if cost not in COSTS:
        raise ValueError(f"cost must be one of {COSTS}, got {cost!r}")
    p = check_positive(p, "p")
    same = y is None
    x = np.asarray(x)
    real_float_dtype(x.dtype, "x", integers=True)  # complex or object: refused
    x = x.astype(np.float64, copy=False)
    if not same:
        y = np.asarray(y)
        real_float_dtype(y.dtype, "y", integers=True)
    y = x if same else np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"x and y must have shapes (n, d) and (m, d), got {x.shape} and {y.shape}")
    n, m = x.shape[0], y.shape[0]
    out = np.empty((n, m))
    rows = max(1, _COST_BLOCK // max(1, m))
    for i in range(0, n, rows):
        xi = x[i : i + rows]
        G = xi @ y.T
        np.clip(G, -1.0, 1.0, out=G)
        near = np.nonzero(G > _GRAM_BRANCH)
        chord_near = np.linalg.norm(xi[near[0]] - y[near[1]], axis=-1)
        if cost == "chordal":
            C = np.sqrt(np.maximum(2.0 - 2.0 * G, 0.0), out=G)
            C[near] = chord_near
        else:
            far = np.nonzero(G < -_GRAM_BRANCH)
            C = np.arccos(G, out=G)
            C[near] = 2.0 * np.arcsin(np.minimum(0.5 * chord_near, 1.0))
            if far[0].size:
                s = np.linalg.norm(xi[far[0]] + y[far[1]], axis=-1)
                C[far] = np.pi - 2.0 * np.arcsin(np.minimum(0.5 * s, 1.0))
        if p == 2:
            np.multiply(C, C, out=out[i : i + rows])
        elif p == 1:
            out[i : i + rows] = C
        else:
            np.power(C, p, out=out[i : i + rows])
    if same:
        np.fill_diagonal(out, 0.0)
    return out


def tangent_frame(x: ArrayLike) -> np.ndarray:
    r"""An orthonormal basis of the tangent space :math:`T_x S^{d-1} = x^\perp` at each point.

    Returns ``e`` of shape ``(..., n, d-1, d)`` with :math:`\langle e_a, e_b\rangle = \delta_{ab}`
    and :math:`\langle e_a, x\rangle = 0`:

    * :math:`d = 2`: :math:`e_1 = (-x_2, x_1)` (counter-clockwise);
    * :math:`d = 3`: :math:`e_1` the normalized projection of the coordinate axis least
      aligned with :math:`x`, :math:`e_2 = x \times e_1` (so :math:`(e_1, e_2, x)` is
      positively oriented);
    * any :math:`d`: the rows :math:`j \ne k` of the Householder reflection
      :math:`H = I - 2uu^\top/|u|^2`, :math:`u = x + \mathrm{sign}(x_k) e_k`,
      :math:`k = \arg\max_j |x_j|` (:math:`H e_k = -\mathrm{sign}(x_k)\, x` and
      :math:`|u|^2 \ge 2`, so no cancellation); cost :math:`O(d^2)` per point.

    The frame is not continuous in :math:`x` (none is on :math:`S^2`).

    Examples
    --------
    >>> tangent_frame(np.array([[0.0, 0.0, 1.0]]))
    array([[[1., 0., 0.],
            [0., 1., 0.]]])
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim < 1 or x.shape[-1] < 2:
        raise ValueError(f"x must have shape (..., d) with d >= 2, got {x.shape}")
    d = x.shape[-1]
    if d == 2:
        return np.stack([-x[..., 1], x[..., 0]], axis=-1)[..., None, :]
    if d == 3:
        axis = np.eye(3)[np.argmin(np.abs(x), axis=-1)]
        e1 = axis - np.sum(axis * x, -1, keepdims=True) * x
        e1 /= np.linalg.norm(e1, axis=-1, keepdims=True)
        return np.stack([e1, np.cross(x, e1)], axis=-2)
    k = np.argmax(np.abs(x), axis=-1)
    sign = np.where(np.take_along_axis(x, k[..., None], -1) < 0, -1.0, 1.0)
    u = x.copy()
    np.put_along_axis(u, k[..., None], np.take_along_axis(u, k[..., None], -1) + sign, -1)
    H = (
        np.eye(d)
        - (2.0 / np.einsum("...i,...i->...", u, u))[..., None, None]
        * u[..., :, None]
        * u[..., None, :]
    )
    keep = np.arange(d)[None, :] != np.reshape(k, (-1, 1))  # (points, d): every row but k
    Hf = H.reshape(-1, d, d)
    return Hf[keep].reshape(*x.shape[:-1], d - 1, d)


def exp_map(x: np.ndarray, v: np.ndarray) -> np.ndarray:
    r"""Riemannian exponential :math:`\exp_x(v) = \cos|v|\,x + \sin|v|\,v/|v|` for tangent ``v``.

    Examples
    --------
    >>> x, v = np.array([1.0, 0.0, 0.0]), np.array([0.0, np.pi / 2, 0.0])
    >>> np.allclose(exp_map(x, v), [0.0, 1.0, 0.0])  # a quarter great circle
    True
    """
    nv = np.linalg.norm(v, axis=-1, keepdims=True)
    # sin(t)/t is analytic; np.sinc(t/pi) = sin(t)/t handles t = 0 exactly.
    return np.cos(nv) * x + np.sinc(nv / np.pi) * v


def log_map(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    r"""Riemannian logarithm: the tangent vector at ``x`` pointing to ``y`` of length ``d(x, y)``.

    Undefined for antipodal points (returns a vector of length ``pi`` in an arbitrary
    direction only up to round-off; avoid).

    Examples
    --------
    >>> x, y = np.array([1.0, 0.0, 0.0]), np.array([0.0, 0.0, 1.0])
    >>> v = log_map(x, y)
    >>> round(float(np.linalg.norm(v)), 6), np.allclose(exp_map(x, v), y)
    (1.570796, True)
    """
    u = project(x, y)
    nu = np.linalg.norm(u, axis=-1, keepdims=True)
    theta = geodesic_distance(x, y)[..., None]
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.where(nu > 0, theta / np.where(nu > 0, nu, 1.0), 1.0)
    return scale * u


def retract(x: np.ndarray, v: np.ndarray, *, step: float = 1.0) -> np.ndarray:
    r"""Projective retraction :math:`R_x(hv) = (x + hv)/|x + hv|` (second-order agreement with ``exp_map``).

    ``step`` is :math:`h`: ``retract(x, v, step=dt)`` is the projected explicit Euler step.
    No validation (hot path).

    Examples
    --------
    >>> retract(np.array([[1.0, 0.0]]), np.array([[0.0, 2.0]]), step=0.5)
    array([[0.70710678, 0.70710678]])
    """
    if isinstance(x, np.ndarray) and isinstance(v, np.ndarray) and _fused_ok(x, v):
        out = np.empty_like(x)
        d = x.shape[-1]
        _retract_rows(x.reshape(-1, d), v.reshape(-1, d), float(step), out.reshape(-1, d))
        return out
    y = x + step * v if step != 1.0 else x + v
    return y / np.linalg.norm(y, axis=-1, keepdims=True)


def angles_to_points(theta: ArrayLike) -> np.ndarray:
    """Angles on the circle to points ``(cos theta, sin theta)``, shape ``theta.shape + (2,)``.

    Examples
    --------
    >>> np.round(angles_to_points([0.0, np.pi / 2]), 6)
    array([[1., 0.],
           [0., 1.]])
    """
    theta = np.asarray(theta, dtype=float)
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


def points_to_angles(x: ArrayLike) -> np.ndarray:
    """Points on :math:`S^1` to angles in ``[0, 2 pi)``.

    Examples
    --------
    >>> np.round(points_to_angles([[1.0, 0.0], [0.0, -1.0]]), 6)  # 0 and 3 pi / 2
    array([0.      , 4.712389])
    """
    x = np.asarray(x)
    if x.shape[-1] != 2:
        raise ValueError(f"x must be points on the circle (last axis 2), got shape {x.shape}")
    return np.mod(np.arctan2(x[..., 1], x[..., 0]), 2 * np.pi)


def random_rotation(d: int, seed: SeedLike = None) -> np.ndarray:
    """A Haar-random rotation matrix in SO(d) (QR of a Gaussian matrix, sign-corrected).

    Examples
    --------
    >>> Q = random_rotation(3, seed=0)
    >>> np.allclose(Q @ Q.T, np.eye(3)), round(float(np.linalg.det(Q)), 6)
    (True, 1.0)
    """
    d = check_int(d, "d", minimum=1)
    rng = as_generator(seed)
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def uniform(n: int, d: int, seed: SeedLike = None, *, batch: Sequence[int] = ()) -> np.ndarray:
    """``n`` i.i.d. points uniform on :math:`S^{d-1}`, shape ``(*batch, n, d)``.

    Examples
    --------
    >>> x = uniform(100, 3, seed=0, batch=(2,))
    >>> x.shape, np.allclose(np.linalg.norm(x, axis=-1), 1.0)
    ((2, 100, 3), True)
    """
    n = check_int(n, "n")
    d = check_int(d, "d", minimum=2)
    rng = as_generator(seed)
    g = rng.standard_normal((*tuple(batch), n, d))
    return g / np.linalg.norm(g, axis=-1, keepdims=True)


def _as_direction(mean: ArrayLike, name: str) -> np.ndarray:
    m = np.asarray(mean, dtype=float)
    if m.ndim != 1 or m.shape[0] < 2:
        raise ValueError(f"{name} must be a vector of length d >= 2, got shape {m.shape}")
    return as_points(m[None], name, normalize=True)[0]


def von_mises_fisher(n: int, mean: ArrayLike, kappa: float, seed: SeedLike = None) -> np.ndarray:
    r"""``n`` samples of the von Mises--Fisher law :math:`\propto e^{\kappa\langle\mu, x\rangle}` on :math:`S^{d-1}`.

    Drawn by :class:`scipy.stats.vonmises_fisher` (Wood 1994) from the generator made of
    ``seed``; ``kappa = 0`` is the uniform law (:func:`uniform`).  Shape ``(n, d)``.

    Examples
    --------
    >>> x = von_mises_fisher(1000, [0.0, 0.0, 1.0], 50.0, seed=0)
    >>> x.shape, bool(abs(x[:, 2].mean() - (1 / np.tanh(50.0) - 1 / 50.0)) < 0.01)
    ((1000, 3), True)
    """
    n = check_int(n, "n")
    mu = _as_direction(mean, "mean")
    kappa = check_nonnegative(kappa, "kappa")
    d = mu.shape[0]
    rng = as_generator(seed)
    if kappa == 0:
        return uniform(n, d, rng)
    from scipy import stats  # (here: importing it costs 1-2 s)

    x = stats.vonmises_fisher(mu, kappa).rvs(n, random_state=rng).reshape(n, d)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def vmf_mixture(
    n: int,
    means: ArrayLike,
    kappas: ArrayLike,
    mix_weights: ArrayLike | None = None,
    seed: SeedLike = None,
) -> np.ndarray:
    """``n`` samples of a mixture of von Mises--Fisher laws, shape ``(n, d)``.

    ``means`` has shape ``(k, d)``, ``kappas`` shape ``(k,)``, ``mix_weights`` (default
    equal) shape ``(k,)`` and is normalized.  Component counts are multinomial.

    Examples
    --------
    >>> x = vmf_mixture(200, means=[[0.0, 0.0, 1.0]], kappas=[50.0], seed=0)
    >>> x.shape, bool(np.mean(x[:, 2]) > 0.9)  # concentrated near the north pole
    ((200, 3), True)
    """
    n = check_int(n, "n")
    means = np.atleast_2d(np.asarray(means, dtype=float))
    kappas = np.atleast_1d(np.asarray(kappas, dtype=float))
    k = means.shape[0]
    if kappas.shape != (k,):
        raise ValueError(f"kappas must have shape ({k},) to match means, got {kappas.shape}")
    if mix_weights is None:
        p = np.full(k, 1.0 / k)
    else:
        p = np.asarray(mix_weights, dtype=float)
        if p.shape != (k,) or np.any(p < 0) or not np.all(np.isfinite(p)) or p.sum() <= 0:
            raise ValueError(
                f"mix_weights must be {k} non-negative numbers with positive sum, got {short_repr(p)}"
            )
        p = p / p.sum()
    rng = as_generator(seed)
    counts = rng.multinomial(n, p)
    parts = [von_mises_fisher(c, means[j], kappas[j], rng) for j, c in enumerate(counts) if c > 0]
    x = np.concatenate(parts, axis=0)
    return x[rng.permutation(n)]


def sample_circle_density(
    density: Callable[[np.ndarray], np.ndarray] | ArrayLike,
    n: int,
    seed: SeedLike = None,
    *,
    resolution: int = 8192,
) -> np.ndarray:
    r"""``n`` i.i.d. samples on :math:`S^1` from a density :math:`f(\theta) \ge 0`.

    ``density`` is a callable of the angle (vectorized) or an array of values on the
    uniform grid :math:`\theta_k = 2\pi k/M`; it need not be normalized.  Sampling is
    by inversion of the CDF of the piecewise-linear interpolant on ``resolution`` (or
    ``M``) cells, exact for that interpolant.  Shape ``(n, 2)``.

    Examples
    --------
    >>> x = sample_circle_density(lambda theta: 1 + np.cos(theta), 1000, seed=0)
    >>> x.shape, bool(np.mean(x[:, 0]) > 0.4)  # E[cos theta] = 1/2 for this law
    ((1000, 2), True)
    """
    n = check_int(n, "n")
    rng = as_generator(seed)
    if callable(density):
        m = check_int(resolution, "resolution", minimum=8)
        grid = 2 * np.pi * np.arange(m) / m
        f = np.asarray(density(grid), dtype=float)
    else:
        f = np.asarray(density, dtype=float)
        m = f.shape[0] if f.ndim == 1 else 0
    if f.ndim != 1 or f.shape[0] != m or m < 2:
        raise ValueError(
            f"density must give a 1-d array of values on the grid, got shape {np.shape(f)}"
        )
    if not np.all(np.isfinite(f)) or np.any(f < 0) or f.sum() <= 0:
        raise ValueError("density must be finite, non-negative and not identically zero")
    h = 2 * np.pi / m
    f1 = np.roll(f, -1)
    cell_mass = 0.5 * h * (f + f1)
    cdf = np.concatenate([[0.0], np.cumsum(cell_mass)])
    u = rng.uniform(size=n) * cdf[-1]
    k = np.clip(np.searchsorted(cdf, u, side="right") - 1, 0, m - 1)
    r = u - cdf[k]  # mass to cover inside cell k (linear density)
    a, b = f[k], f1[k]
    slope = (b - a) / h
    with np.errstate(divide="ignore", invalid="ignore"):
        s_lin = np.where(
            np.abs(slope) > 1e-14 * np.maximum(a, 1e-300),
            (-a + np.sqrt(np.maximum(a * a + 2 * slope * r, 0))) / np.where(slope == 0, 1, slope),
            r / np.where(a > 0, a, 1),
        )
    s = np.clip(np.where(np.isfinite(s_lin), s_lin, 0.5 * h), 0, h)
    return angles_to_points(k * h + s)


def _density_values(
    f: np.ndarray, shape: tuple[int, ...], where: str, name: str = "density"
) -> np.ndarray:
    """Check the values ``name`` returned: real, of ``shape``, finite, >= 0, positive sum."""
    f = np.asarray(f)
    if f.dtype == object or not np.issubdtype(f.dtype, np.number) or np.iscomplexobj(f):
        raise TypeError(f"{name} must give real numbers, got {short_repr(f)}")
    f = f.astype(float, copy=False)
    if f.shape != shape:
        raise ValueError(f"{name} must give values of shape {shape} {where}, got shape {f.shape}")
    bad = np.flatnonzero(~np.isfinite(f) | (f < 0))
    if bad.size:
        raise ValueError(
            f"{name} must be finite and non-negative, got {float(f.flat[bad[0]])!r} {where} "
            f"(entry {int(bad[0])})"
        )
    if not f.sum() > 0:
        raise ValueError(f"{name} must not vanish everywhere, got all zeros {where}")
    return f


def _pick(masses: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` indices drawn with probabilities proportional to ``masses`` (zero masses never)."""
    cdf = np.cumsum(masses)
    return np.minimum(
        np.searchsorted(cdf, rng.uniform(size=n) * cdf[-1], side="right"), cdf.size - 1
    )


def _uniform_in_triangles(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    r"""One uniform point in each spherical triangle ``(a[k], b[k], c[k])``, shape ``(n, 3)``.

    A uniform point ``p`` of the flat triangle, projected radially, has density
    :math:`\propto |p|^3/h` on the sphere (:math:`h \le |p|`: the distance from the origin to
    the triangle's plane); accepting it with probability :math:`(h/|p|)^3` makes it uniform.
    """
    normal = np.cross(b - a, c - a)
    h = np.abs(np.einsum("ij,ij->i", a, normal)) / np.linalg.norm(normal, axis=1)
    out = np.empty_like(a)
    todo = np.arange(a.shape[0])
    while todo.size:
        u, v = rng.uniform(size=(2, todo.size))
        fold = u + v > 1  # reflect the far half of the parallelogram into the triangle
        u, v = np.where(fold, 1 - u, u), np.where(fold, 1 - v, v)
        p = a[todo] + u[:, None] * (b[todo] - a[todo]) + v[:, None] * (c[todo] - a[todo])
        r = np.linalg.norm(p, axis=1)
        ok = rng.uniform(size=todo.size) * r**3 <= h[todo] ** 3
        out[todo[ok]] = p[ok] / r[ok, None]
        todo = todo[~ok]
    return out


def _fan(mesh: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fan of each Voronoi cell of a ``SphereMesh``: (cell, generator, vertex, next vertex)."""
    cell = np.repeat(np.arange(len(mesh.regions)), [len(r) for r in mesh.regions])
    vert = np.concatenate(mesh.regions)
    nxt = np.concatenate([np.roll(r, -1) for r in mesh.regions])
    return cell, mesh.generators[cell], mesh.vertices[vert], mesh.vertices[nxt]


def _sample_mesh_density(density: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    """Exact samples of the piecewise-constant density of a ``wflow.Density``."""
    mesh, values = density.mesh, np.asarray(density.values, dtype=float)
    if mesh.d == 2:  # arcs [edge_angles[i], edge_angles[i] + width]
        k = _pick(values * mesh.areas, n, rng)
        return angles_to_points(mesh.edge_angles[k] + mesh.width * rng.uniform(size=n))
    cell, g, a, b = _fan(mesh)
    k = _pick(values[cell] * _solid_angle(g, a, b), n, rng)
    return _uniform_in_triangles(g[k], a[k], b[k], rng)


def density_quadrature(density: Any, refine: int = 4) -> tuple[np.ndarray, np.ndarray, float]:
    r"""Fine atoms of the piecewise-constant density of a ``Density`` on a ``SphereMesh``.

    Each triangle of the fan of each Voronoi cell (generator, two consecutive vertices) is
    cut into ``refine**2`` triangles; each carries its exact mass at its spherical centroid.

    Parameters
    ----------
    density : Density
        On a :class:`wflow.mesh.SphereMesh`.
    refine : int
        Subdivisions of each side of a fan triangle.

    Returns
    -------
    points : ndarray, shape (Q, 3)
    weights : ndarray, shape (Q,)
        Sum to 1.
    radius : float
        :math:`r = (\sum_T m_T\,E_T|x - c_T|^2)^{1/2}` (:math:`E_T` the mean over the triangle
        :math:`T`, :math:`c_T = \int_T x\,dA / |\int_T x\,dA|` its atom): the cost of moving each
        triangle's mass to its atom, so for any measure :math:`\mu`,
        :math:`|W_2(\mu, \rho) - W_2(\mu, \mathrm{atoms})| \le r` (chordal).

    Examples
    --------
    >>> from wflow import Density, SphereMesh
    >>> rho = Density.from_function(SphereMesh(4), lambda x: np.exp(2 * x[:, 2]))
    >>> y, w, r = density_quadrature(rho, refine=4)
    >>> y.shape, round(float(w.sum()), 12), round(r, 4)
    ((15360, 3), 1.0, 0.0127)
    """
    mesh, values = density.mesh, np.asarray(density.values, dtype=float)
    if getattr(mesh, "d", None) != 3:
        raise ValueError(f"density must live on a SphereMesh, got one on {short_repr(mesh)}")
    k = check_int(refine, "refine")
    cell, g, a, b = _fan(mesh)
    # barycentric corners of the k^2 sub-triangles: k(k+1)/2 upright, k(k-1)/2 upside down
    tri = [((i, j), (i + 1, j), (i, j + 1)) for i in range(k) for j in range(k - i)]
    tri += [
        ((i + 1, j), (i + 1, j + 1), (i, j + 1)) for i in range(k - 1) for j in range(k - 1 - i)
    ]
    lam = np.array(tri, dtype=float) / k  # (k^2, 3 corners, 2): weights of a and b
    corners = (
        g[:, None, None]
        + lam[None, ..., :1] * (a - g)[:, None, None]
        + lam[None, ..., 1:] * (b - g)[:, None, None]
    )
    corners /= np.linalg.norm(corners, axis=-1, keepdims=True)  # (F, k^2, 3, 3)
    c = corners.reshape(-1, 3, 3)
    area = _solid_angle(c[:, 0], c[:, 1], c[:, 2])
    va = _vector_area(c[:, 0], c[:, 1], c[:, 2])
    norm = np.linalg.norm(va, axis=1)
    flat = norm <= 1e-3 * area  # degenerate (zero-area) triangles: the mean of the corners
    centroid = np.where(flat[:, None], c.sum(axis=1), va)
    centroid /= np.linalg.norm(centroid, axis=1, keepdims=True)
    # cost of moving T's uniform mass to c: E|x - c|^2 = 2 - 2<E x, c> = 2 - 2|va|/|T|, at most
    # the largest squared chord to a corner (the bound kept where round-off would dominate)
    reach2 = np.max(np.sum((c - centroid[:, None]) ** 2, axis=-1), axis=1)
    spread = np.where(flat, reach2, 2 - 2 * norm / np.where(flat, 1.0, area))
    mass = np.repeat(values[cell], k * k) * area
    mass /= mass.sum()
    return centroid, mass, float(np.sqrt(mass @ np.clip(spread, 0.0, reach2)))


def _vector_area(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    r""":math:`\int_T x\,dA` over the spherical triangles ``(a, b, c)``: :math:`\tfrac12\sum_e \ell_e \hat n_e`.

    :math:`\ell_e` is the length of edge :math:`e` and :math:`\hat n_e` the unit normal of its
    great circle, oriented towards the triangle (divergence theorem with
    :math:`\mathrm{div}_S(P_x u) = -2\langle u, x\rangle`).  Shape ``(n, 3)``.
    """
    total = np.zeros_like(a)
    for p, q in ((a, b), (b, c), (c, a)):
        cross = np.cross(p, q)
        n = np.linalg.norm(cross, axis=1)
        ell = 2 * np.arcsin(np.minimum(0.5 * np.linalg.norm(p - q, axis=1), 1.0))
        total += (0.5 * ell / np.where(n > 0, n, 1.0))[:, None] * cross
    return total * np.sign(np.einsum("ij,ij->i", total, a + b + c))[:, None]


def _solid_angle(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Area of the spherical triangles ``(a, b, c)`` (Van Oosterom & Strackee 1983), shape ``(n,)``."""
    num = np.abs(np.einsum("ij,ij->i", a, np.cross(b, c)))
    den = (
        1 + np.einsum("ij,ij->i", a, b) + np.einsum("ij,ij->i", b, c) + np.einsum("ij,ij->i", c, a)
    )
    return 2 * np.arctan2(num, den)


def sample_sphere_density(
    density: Callable[[np.ndarray], np.ndarray] | Any,
    n: int,
    seed: SeedLike = None,
    *,
    resolution: int = 512,
) -> np.ndarray:
    r"""``n`` i.i.d. samples on :math:`S^2` from a density :math:`\rho \ge 0`, shape ``(n, 3)``.

    Parameters
    ----------
    density : callable or Density
        A callable of points ``(m, 3) -> (m,)`` (need not be normalized), or a
        :class:`wflow.density.Density` (on a ``SphereMesh``, or a ``CircleMesh``: then the
        samples have shape ``(n, 2)``).
    n : int
        Number of samples.
    seed : None, int, SeedSequence or Generator
    resolution : int
        For a callable: the number of polar bands (``2 * resolution`` azimuthal sectors).

    Returns
    -------
    ndarray, shape (n, 3)

    Notes
    -----
    A ``Density`` is sampled exactly: a triangle of the fan of a Voronoi cell (generator, two
    consecutive vertices) with probability its mass, then a uniform point of that spherical
    triangle.  A callable is evaluated at the centres of ``resolution x 2 resolution`` cells
    equispaced in :math:`\vartheta` and :math:`\varphi`, and the piecewise-constant density
    they define is sampled exactly (a cell by its mass, then :math:`z = \cos\vartheta` and
    :math:`\varphi` uniform in it): moments to :math:`O(h^2)`, :math:`h = \pi/\mathrm{resolution}`.

    Examples
    --------
    >>> kappa = 5.0  # von Mises--Fisher about the north pole: E[z] = coth(kappa) - 1/kappa
    >>> x = sample_sphere_density(lambda p: np.exp(kappa * p[:, 2]), 100_000, seed=0)
    >>> x.shape, round(float(x[:, 2].mean()), 2), round(float(1 / np.tanh(kappa) - 1 / kappa), 2)
    ((100000, 3), 0.8, 0.8)
    """
    n = check_int(n, "n")
    rng = as_generator(seed)
    if hasattr(density, "mesh") and hasattr(density, "values"):
        return _sample_mesh_density(density, n, rng)
    if not callable(density):
        raise TypeError(
            f"density must be a callable of points (m, 3) or a wflow.Density, got {short_repr(density)}"
        )
    m = check_int(resolution, "resolution", minimum=2)
    z = np.cos(np.pi * np.arange(m + 1) / m)  # band edges, decreasing from 1 to -1
    phi = 2 * np.pi * np.arange(2 * m + 1) / (2 * m)  # sector edges
    theta_c, phi_c = np.meshgrid(
        np.pi * (np.arange(m) + 0.5) / m, phi[:-1] + np.pi / (2 * m), indexing="ij"
    )
    centres = np.stack(
        [np.sin(theta_c) * np.cos(phi_c), np.sin(theta_c) * np.sin(phi_c), np.cos(theta_c)], axis=-1
    ).reshape(-1, 3)
    f = _density_values(density(centres), (2 * m * m,), f"at {2 * m * m} points of S^2")
    k = _pick(f * np.repeat(z[:-1] - z[1:], 2 * m), n, rng)
    band, sector = np.divmod(k, 2 * m)
    zs = z[band + 1] + (z[band] - z[band + 1]) * rng.uniform(size=n)
    ps = phi[sector] + (np.pi / m) * rng.uniform(size=n)
    r = np.sqrt(np.maximum(1 - zs * zs, 0.0))
    return np.stack([r * np.cos(ps), r * np.sin(ps), zs], axis=-1)


def sample_zonal_density(
    profile: Callable[[np.ndarray], np.ndarray],
    n: int,
    axis: ArrayLike,
    seed: SeedLike = None,
    *,
    resolution: int = 4096,
) -> np.ndarray:
    r"""``n`` i.i.d. samples on :math:`S^{d-1}` from a zonal density :math:`\rho(x) = f(\langle x, e\rangle)`.

    Parameters
    ----------
    profile : callable
        :math:`f(t) \ge 0` for :math:`t \in [-1, 1]` (vectorized; need not be normalized).
    n : int
        Number of samples.
    axis : array_like, shape (d,)
        The axis :math:`e` (normalized here); its length is the dimension ``d >= 2``.
    seed : None, int, SeedSequence or Generator
    resolution : int
        Cells of the grid in :math:`\vartheta = \arccos t` on which the law of
        :math:`\vartheta` is interpolated.

    Returns
    -------
    ndarray, shape (n, d)

    Notes
    -----
    :math:`t = \langle x, e\rangle` has density :math:`\propto f(t)(1-t^2)^{(d-3)/2}` on
    :math:`[-1, 1]`, i.e. :math:`\vartheta = \arccos t` has density
    :math:`\propto f(\cos\vartheta)\sin^{d-2}\vartheta` on :math:`[0, \pi]`; it is sampled by
    inverting the CDF of its piecewise-linear interpolant on ``resolution`` cells (exact for
    that interpolant), and :math:`x = t\,e + \sqrt{1-t^2}\,u` with :math:`u` uniform on the
    unit sphere of :math:`e^\perp`.

    Examples
    --------
    Von Mises--Fisher on :math:`S^4`: :math:`E\langle x, e\rangle = I_{5/2}(\kappa)/I_{3/2}(\kappa)`.

    >>> from scipy.special import iv
    >>> x = sample_zonal_density(lambda t: np.exp(2.0 * t), 100_000, axis=[0, 0, 0, 0, 1], seed=0)
    >>> x.shape, round(float(x[:, 4].mean()), 2), round(float(iv(2.5, 2.0) / iv(1.5, 2.0)), 2)
    ((100000, 5), 0.36, 0.36)
    """
    n = check_int(n, "n")
    e = _as_direction(axis, "axis")
    d = e.shape[0]
    if not callable(profile):
        raise TypeError(f"profile must be a callable of t in [-1, 1], got {short_repr(profile)}")
    m = check_int(resolution, "resolution", minimum=2)
    rng = as_generator(seed)
    theta = np.pi * np.arange(m + 1) / m
    f = _density_values(
        profile(np.cos(theta)), (m + 1,), f"at {m + 1} points of [-1, 1]", "profile"
    )
    sin = np.sin(theta)
    sin[[0, -1]] = 0.0  # exactly (sin(pi) is 1.2e-16); 0**0 = 1 for d = 2
    g = f * sin ** (d - 2)  # the law of theta (Jacobian of the polar angle)
    if not g.sum() > 0:
        raise ValueError(f"profile must not vanish on (-1, 1) in dimension d = {d}, got all zeros")
    cell = 0.5 * (g[:-1] + g[1:])
    k = _pick(cell, n, rng)
    s = _linear_inverse(g[k], g[k + 1], rng.uniform(size=n))
    t = np.cos(theta[k] + s * np.pi / m)
    u = rng.standard_normal((n, d))
    u -= (u @ e)[:, None] * e
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    return t[:, None] * e + np.sqrt(np.maximum(1 - t * t, 0.0))[:, None] * u


def _linear_inverse(a: np.ndarray, b: np.ndarray, r: np.ndarray) -> np.ndarray:
    r"""Quantile ``s`` in [0, 1] of level ``r`` of the law with linear density :math:`a + (b-a)s`.

    Solves :math:`as + (b-a)s^2/2 = r(a+b)/2` in the form without cancellation,
    :math:`s = r(a+b) / (a + \sqrt{a^2 + r(b^2-a^2)})`.
    """
    den = a + np.sqrt(np.maximum(a * a + r * (b * b - a * a), 0.0))
    return np.clip(r * (a + b) / np.where(den > 0, den, 1.0), 0.0, 1.0)


def circle_nodes(m: int, *, offset: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    r"""Trapezoid rule on :math:`S^1`: ``m`` equispaced nodes and equal weights ``1/m``.

    Returns ``(points (m, 2), weights (m,))``.

    Examples
    --------
    >>> pts, w = circle_nodes(8)
    >>> pts.shape, round(float(w.sum()), 12), round(float(w @ pts[:, 0] ** 2), 12)  # mean of cos^2 = 1/2
    ((8, 2), 1.0, 0.5)
    """
    m = check_int(m, "m")
    theta = offset + 2 * np.pi * np.arange(m) / m
    return angles_to_points(theta), np.full(m, 1.0 / m)


def gauss_sphere_nodes(n_lat: int, n_lon: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    r"""Product Gauss--Legendre (in :math:`\cos\vartheta`) x trapezoid (in :math:`\varphi`) rule on :math:`S^2`.

    Exact for spherical harmonics of degree ``<= min(2 n_lat - 1, n_lon - 1)``.  Weights
    are for the normalized surface measure (sum to 1).  Returns ``(points (N, 3),
    weights (N,))`` with ``N = n_lat * n_lon`` (``n_lon`` defaults to ``2 n_lat``).

    Examples
    --------
    >>> pts, w = gauss_sphere_nodes(4)
    >>> pts.shape, round(float(w.sum()), 12), round(float(w @ pts[:, 2] ** 2), 12)  # mean of z^2 = 1/3
    ((32, 3), 1.0, 0.333333333333)
    """
    n_lat = check_int(n_lat, "n_lat")
    n_lon = 2 * n_lat if n_lon is None else check_int(n_lon, "n_lon")
    z, wz = np.polynomial.legendre.leggauss(n_lat)
    phi = 2 * np.pi * (np.arange(n_lon) + 0.5) / n_lon
    zz, pp = np.meshgrid(z, phi, indexing="ij")
    r = np.sqrt(1 - zz**2)
    pts = np.stack([r * np.cos(pp), r * np.sin(pp), zz], axis=-1).reshape(-1, 3)
    w = (wz[:, None] / 2 * np.full(n_lon, 1.0 / n_lon)[None, :]).reshape(-1)
    return pts, w


def fibonacci_nodes(n: int) -> np.ndarray:
    """``n`` quasi-uniform points on :math:`S^2` on the Fibonacci (golden-angle) spiral, shape ``(n, 3)``.

    Examples
    --------
    >>> x = fibonacci_nodes(500)
    >>> x.shape, np.allclose(np.linalg.norm(x, axis=1), 1.0), bool(abs(x.mean(axis=0)).max() < 0.01)
    ((500, 3), True, True)
    """
    n = check_int(n, "n")
    k = np.arange(n) + 0.5
    z = 1 - 2 * k / n
    phi = np.pi * (1 + np.sqrt(5)) * k
    r = np.sqrt(1 - z**2)
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=-1)
