r"""Geometry of the unit sphere :math:`S^{d-1} \subset \mathbb{R}^d`.

Points are arrays of shape ``(..., n, d)``; the last axis holds coordinates and any
leading axes are independent systems.  Tangent vectors at ``x`` have the same shape.

Contents: projections, geodesics, exponential map and retraction, random rotations,
samplers (uniform, von Mises--Fisher, mixtures, a density on the circle) and
quadrature nodes (trapezoid rule on :math:`S^1`, Gauss--Legendre x trapezoid on
:math:`S^2`).  Every random function takes ``seed``: ``None``, an ``int``, a
:class:`numpy.random.SeedSequence` or a :class:`numpy.random.Generator`.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ._typing import ArrayLike, SeedLike
from .errors import as_points, check_int, check_nonnegative, short_repr

__all__ = [
    "as_generator",
    "normalize",
    "project",
    "geodesic_distance",
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
    "circle_nodes",
    "gauss_sphere_nodes",
    "fibonacci_nodes",
]


def as_generator(seed: SeedLike) -> np.random.Generator:
    """Return a :class:`numpy.random.Generator` from a seed-like argument."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or isinstance(seed, (np.random.SeedSequence,)):
        return np.random.default_rng(seed)
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed}")
        return np.random.default_rng(int(seed))
    raise TypeError(f"seed must be None, an int, a SeedSequence or a numpy Generator, got {short_repr(seed)}")


def normalize(x: ArrayLike) -> np.ndarray:
    """Project non-zero vectors radially onto the sphere, ``x / |x|``.

    Raises ``ValueError`` for a zero vector or a non-finite value.
    """
    return as_points(x, "x", normalize=True)


def project(x: np.ndarray, v: np.ndarray) -> np.ndarray:
    r"""Tangent projection :math:`P_x v = v - \langle x, v\rangle x`.

    ``x`` and ``v`` broadcast against each other; no validation (hot path).
    """
    return v - np.sum(x * v, axis=-1, keepdims=True) * x


def geodesic_distance(x: ArrayLike, y: ArrayLike) -> np.ndarray:
    r"""Great-circle distance :math:`\arccos\langle x, y\rangle \in [0, \pi]`.

    Computed as :math:`2\,\mathrm{atan2}(|x-y|, |x+y|)`, accurate to round-off for
    nearby and antipodal points alike (``arccos`` loses half the digits near 0).
    """
    x = np.asarray(x)
    y = np.asarray(y)
    return 2.0 * np.arctan2(np.linalg.norm(x - y, axis=-1), np.linalg.norm(x + y, axis=-1))


def exp_map(x: np.ndarray, v: np.ndarray) -> np.ndarray:
    r"""Riemannian exponential :math:`\exp_x(v) = \cos|v|\,x + \sin|v|\,v/|v|` for tangent ``v``."""
    nv = np.linalg.norm(v, axis=-1, keepdims=True)
    # sin(t)/t is analytic; np.sinc(t/pi) = sin(t)/t handles t = 0 exactly.
    return np.cos(nv) * x + np.sinc(nv / np.pi) * v


def log_map(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    r"""Riemannian logarithm: the tangent vector at ``x`` pointing to ``y`` of length ``d(x, y)``.

    Undefined for antipodal points (returns a vector of length ``pi`` in an arbitrary
    direction only up to round-off; avoid).
    """
    u = project(x, y)
    nu = np.linalg.norm(u, axis=-1, keepdims=True)
    theta = geodesic_distance(x, y)[..., None]
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.where(nu > 0, theta / np.where(nu > 0, nu, 1.0), 1.0)
    return scale * u


def retract(x: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Projective retraction :math:`R_x(v) = (x + v)/|x + v|` (second-order agreement with ``exp_map``)."""
    y = x + v
    return y / np.linalg.norm(y, axis=-1, keepdims=True)


def angles_to_points(theta: ArrayLike) -> np.ndarray:
    """Angles on the circle to points ``(cos theta, sin theta)``, shape ``theta.shape + (2,)``."""
    theta = np.asarray(theta, dtype=float)
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


def points_to_angles(x: ArrayLike) -> np.ndarray:
    """Points on :math:`S^1` to angles in ``[0, 2 pi)``."""
    x = np.asarray(x)
    if x.shape[-1] != 2:
        raise ValueError(f"x must be points on the circle (last axis 2), got shape {x.shape}")
    return np.mod(np.arctan2(x[..., 1], x[..., 0]), 2 * np.pi)


def random_rotation(d: int, seed: SeedLike = None) -> np.ndarray:
    """A Haar-random rotation matrix in SO(d) (QR of a Gaussian matrix, sign-corrected)."""
    d = check_int(d, "d", minimum=1)
    rng = as_generator(seed)
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def uniform(n: int, d: int, seed: SeedLike = None, *, batch: Sequence[int] = ()) -> np.ndarray:
    """``n`` i.i.d. points uniform on :math:`S^{d-1}`, shape ``(*batch, n, d)``."""
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

    Wood's (1994) rejection sampler for the component along ``mean``; exact for every
    ``kappa >= 0`` (``kappa = 0`` is uniform).  Shape ``(n, d)``.
    """
    n = check_int(n, "n")
    mu = _as_direction(mean, "mean")
    kappa = check_nonnegative(kappa, "kappa")
    d = mu.shape[0]
    rng = as_generator(seed)
    if kappa == 0:
        return uniform(n, d, rng)
    # Wood (1994): sample w = <mu, x> by rejection from a Beta-based envelope.
    b = (d - 1) / (2 * kappa + np.sqrt(4 * kappa**2 + (d - 1) ** 2))
    x0 = (1 - b) / (1 + b)
    c = kappa * x0 + (d - 1) * np.log(1 - x0**2)
    w = np.empty(n)
    filled = 0
    while filled < n:
        m = max(2 * (n - filled), 16)
        z = rng.beta((d - 1) / 2, (d - 1) / 2, size=m)
        cand = (1 - (1 + b) * z) / (1 - (1 - b) * z)
        u = rng.uniform(size=m)
        ok = kappa * cand + (d - 1) * np.log(1 - x0 * cand) - c >= np.log(u)
        take = cand[ok][: n - filled]
        w[filled : filled + take.size] = take
        filled += take.size
    # a uniform direction orthogonal to mu
    v = rng.standard_normal((n, d))
    v -= (v @ mu)[:, None] * mu
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    x = w[:, None] * mu + np.sqrt(np.clip(1 - w**2, 0, None))[:, None] * v
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
            raise ValueError(f"mix_weights must be {k} non-negative numbers with positive sum, got {short_repr(p)}")
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
        raise ValueError(f"density must give a 1-d array of values on the grid, got shape {np.shape(f)}")
    if not np.all(np.isfinite(f)) or np.any(f < 0) or f.sum() <= 0:
        raise ValueError("density must be finite, non-negative and not identically zero")
    h = 2 * np.pi / m
    f1 = np.roll(f, -1)
    cell_mass = 0.5 * h * (f + f1)
    cdf = np.concatenate([[0.0], np.cumsum(cell_mass)])
    u = rng.uniform(size=n) * cdf[-1]
    k = np.clip(np.searchsorted(cdf, u, side="right") - 1, 0, m - 1)
    r = u - cdf[k]  # mass to cover inside cell k, linear density a + s*(b-a)/h
    a, b = f[k], f1[k]
    slope = (b - a) / h
    with np.errstate(divide="ignore", invalid="ignore"):
        s_lin = np.where(np.abs(slope) > 1e-14 * np.maximum(a, 1e-300),
                         (-a + np.sqrt(np.maximum(a * a + 2 * slope * r, 0))) / np.where(slope == 0, 1, slope),
                         r / np.where(a > 0, a, 1))
    s = np.clip(np.where(np.isfinite(s_lin), s_lin, 0.5 * h), 0, h)
    return angles_to_points(k * h + s)


def circle_nodes(m: int, *, offset: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    r"""Trapezoid rule on :math:`S^1`: ``m`` equispaced nodes and equal weights ``1/m``.

    Spectrally accurate for smooth periodic integrands (normalized measure).
    Returns ``(points (m, 2), weights (m,))``.
    """
    m = check_int(m, "m")
    theta = offset + 2 * np.pi * np.arange(m) / m
    return angles_to_points(theta), np.full(m, 1.0 / m)


def gauss_sphere_nodes(n_lat: int, n_lon: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    r"""Product Gauss--Legendre (in :math:`\cos\vartheta`) x trapezoid (in :math:`\varphi`) rule on :math:`S^2`.

    Exact for spherical harmonics of degree ``<= min(2 n_lat - 1, n_lon - 1)``.  Weights
    are for the normalized surface measure (sum to 1).  Returns ``(points (N, 3),
    weights (N,))`` with ``N = n_lat * n_lon`` (``n_lon`` defaults to ``2 n_lat``).
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
    """``n`` quasi-uniform points on :math:`S^2` on the Fibonacci (golden-angle) spiral, shape ``(n, 3)``."""
    n = check_int(n, "n")
    k = np.arange(n) + 0.5
    z = 1 - 2 * k / n
    phi = np.pi * (1 + np.sqrt(5)) * k
    r = np.sqrt(1 - z**2)
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=-1)
