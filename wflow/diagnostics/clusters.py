r"""Single-linkage clusters: of many small systems at once, of one large system, and of a measure's mass."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

from ..errors import check_positive
from ..kernels import small
from ..kernels.jit import prefer_wide_vectors
from ..kernels.threads import chunk_bounds, num_threads, run_chunks
from ..linkage import link_bounds, linked
from ..measure import Atoms
from .batch import as_batch

__all__ = [
    "cluster_labels",
    "batched_cluster_labels",
    "count_clusters",
    "check_points_weights",
    "mass_clusters",
    "BATCHED_MAX_N",
]

#: Systems with at most this many points are clustered by :func:`batched_cluster_labels`
#: (all :math:`n^2` pairs of a system); larger ones one by one by :func:`cluster_labels`.
BATCHED_MAX_N = 512


def batched_cluster_labels(points, threshold: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    r"""Single-linkage clusters of many small systems at once (no loop over systems).

    Points closer than ``threshold`` (geodesic, radians) are linked; the clusters are the
    connected components (the graph of :func:`cluster_labels`).  One compiled union--find pass per
    system, no ``(B, n, n)`` array; meant for ``n <=`` :data:`BATCHED_MAX_N`.

    Parameters
    ----------
    points : array_like, shape (..., n, d)
    threshold : float
        Geodesic linking distance in radians.

    Returns
    -------
    k : ndarray of int64, shape (...)
        Number of clusters of each system.
    labels : ndarray of int64, shape (..., n)
        Cluster of each point, ``0..k-1`` numbered in order of first appearance.

    Examples
    --------
    >>> x = np.array([[[1.0, 0.0], [1.0, 0.01], [0.0, 1.0]],
    ...               [[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]])
    >>> k, labels = batched_cluster_labels(x / np.linalg.norm(x, axis=-1, keepdims=True), 0.1)
    >>> k.tolist(), labels.tolist()
    ([2, 3], [[0, 0, 1], [0, 1, 2]])
    """
    x = as_batch(points)
    batch, n = x.shape[:-2], x.shape[-2]
    roots = _batched_roots(x, threshold)
    is_root = roots == np.arange(n)
    k = is_root.sum(axis=-1)
    # number the roots 0..k-1 in order of appearance: a root's label is how many roots precede it
    rank = np.cumsum(is_root, axis=-1) - 1
    labels = np.take_along_axis(rank, roots, axis=-1)
    return k.reshape(batch).astype(np.int64), labels.reshape(*batch, n)


def _batched_roots(x: np.ndarray, threshold: float) -> np.ndarray:
    """The root (least point) of each point's cluster, ``(B, n)`` for the checked points ``x`` (..., n, d)."""
    chord, lo, hi = link_bounds(threshold)
    n, d = x.shape[-2:]
    xf = x.reshape(-1, n, d)
    roots = np.empty(xf.shape[:2], dtype=np.int64)
    B = xf.shape[0]
    threads = num_threads() if B * n * n * d >= small.SERIAL_MAX_FLOPS else 1
    chunks = chunk_bounds(B, n * n * d, threads, small.CHUNK_PAIRS * 8)
    xc = np.ascontiguousarray(xf)

    def work(t: int) -> None:
        for b0, b1 in chunks[t::threads]:
            _cluster_roots(xc, chord, lo, hi, b0, b1, roots)

    run_chunks(work, threads, len(chunks))
    return roots


def cluster_labels(points: np.ndarray, threshold: float = 0.1) -> tuple[int, np.ndarray]:
    r"""Single-linkage clusters of one system: points closer than ``threshold`` (geodesic, radians) are linked.

    The connected components of the graph of pairs at chordal distance below
    :math:`r = 2\sin(\theta/2)`: neighbours in angular order on :math:`S^1`; on :math:`S^2` above
    :data:`BATCHED_MAX_N` points a union--find over a grid of cubes of side :math:`r/\sqrt 3`
    (about :math:`O(n\log n)`); otherwise the pairs of a k-d tree (:math:`O(n^2)` in dense clusters).

    Returns ``(k, labels)`` with ``labels`` of shape ``(n,)`` in ``0..k-1``.

    Examples
    --------
    >>> x = np.array([[1.0, 0.0, 0.0], [0.999, 0.0447, 0.0], [0.0, 0.0, 1.0]])
    >>> k, labels = cluster_labels(x / np.linalg.norm(x, axis=1, keepdims=True), 0.1)
    >>> k, labels.tolist()
    (2, [0, 0, 1])
    """
    threshold = check_positive(threshold, "threshold")
    x = np.asarray(points, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"points must have shape (n, d) (one system), got {x.shape}")
    n, d = x.shape
    chord = 2 * np.sin(min(threshold, np.pi) / 2)
    # (the grid's packed int64 cube keys need (2 sqrt(3)/r + 6)^3 < 2^62: r > 3e-6)
    if d == 3 and n > BATCHED_MAX_N and (2 * math.sqrt(3) / chord + 6) ** 3 < 2.0**62:
        return _grid_components(x, chord)
    if d == 2 and n > 1:
        theta = np.arctan2(x[:, 1], x[:, 0])
        order = np.argsort(theta)
        pairs = np.stack([order, np.roll(order, -1)], axis=1)
        keep = np.linalg.norm(x[pairs[:, 0]] - x[pairs[:, 1]], axis=1) < chord
        pairs = pairs[keep]
    else:
        pairs = cKDTree(x).query_pairs(chord, output_type="ndarray")
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    k, labels = connected_components(graph, directed=False)
    return int(k), labels


def _grid_components(x: np.ndarray, chord: float) -> tuple[int, np.ndarray]:
    """Components on a grid of cubes (see :func:`cluster_labels`), labels numbered by first appearance."""
    # side r/sqrt(3), shrunk so that rounding cannot put two points of one cube r apart
    h = chord / math.sqrt(3.0) * (1.0 - 1e-9)
    key, stride = _cell_keys(x, h)
    order = np.argsort(key)
    labels = np.empty(len(x), dtype=np.int64)
    k = _grid(x, key, order, stride, chord * chord, labels)
    return int(k), labels


@njit(cache=True, inline="always")
def _find(parent, i):  # pragma: no cover - compiled
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


@njit(cache=True, nogil=True, fastmath={"nnan", "ninf", "nsz"})
def _cluster_roots(x, chord, lo, hi, k0, k1, roots):  # pragma: no cover - compiled
    """roots[b, i] = the least point of i's cluster, for the systems k0 <= b < k1 of x (B, n, d): i, j
    linked when |x_i - x_j| < chord (squared differences in float64, ties by :func:`wflow.linkage.linked`,
    no Gram matrix), the components by union-find keeping the lesser root."""
    prefer_wide_vectors()
    B, n, d = x.shape
    parent = np.empty(n, np.int64)
    XT = np.empty((d, n))
    dist = np.empty(n)
    for b in range(k0, k1):
        xb = x[b]
        for i in range(n):
            parent[i] = i
            for a in range(d):
                XT[a, i] = np.float64(xb[i, a])
        left = n  # components so far: once one is left, no pair can join two
        for i in range(n - 1):
            if left == 1:
                break
            for j in range(n):
                dist[j] = 0.0
            for a in range(d):
                xia = XT[a, i]
                Xa = XT[a]
                for j in range(n):
                    t = xia - Xa[j]
                    dist[j] += t * t
            ri = _find(parent, i)  # i's root, kept current as i's component merges
            for j in range(i + 1, n):
                dj = dist[j]
                if linked(dj, chord, lo, hi):
                    rj = _find(parent, j)
                    if ri < rj:
                        parent[rj] = ri
                        left -= 1
                    elif rj < ri:
                        parent[ri] = rj
                        ri = rj
                        left -= 1
        for i in range(n):
            roots[b, i] = _find(parent, i)


@njit(cache=True)
def _cell_keys(x, h):  # pragma: no cover - compiled
    """Integer cube index of each point, packed into one int64 key, and the key strides."""
    n = x.shape[0]
    lo = np.empty(3)
    span = np.zeros(3, dtype=np.int64)
    for a in range(3):
        lo[a] = np.inf
        for i in range(n):
            lo[a] = min(lo[a], x[i, a])
    cells = np.empty((n, 3), dtype=np.int64)
    for i in range(n):
        for a in range(3):
            c = np.int64(np.floor((x[i, a] - lo[a]) / h)) + 2  # room for neighbour offsets -2..+2
            cells[i, a] = c
            span[a] = max(span[a], c + 3)
    stride = np.array([span[1] * span[2], span[2], 1], dtype=np.int64)
    key = np.empty(n, dtype=np.int64)
    for i in range(n):
        key[i] = cells[i, 0] * stride[0] + cells[i, 1] * stride[1] + cells[i, 2]
    return key, stride


@njit(cache=True)
def _grid(x, key, order, stride, r2, labels):  # pragma: no cover  # noqa: C901, PLR0912, PLR0915 - one compiled kernel
    """Union-find over the non-empty cubes; writes labels numbered by first appearance, returns k."""
    n = x.shape[0]
    xs = np.empty((n, 3))
    n_cells = 0
    for t in range(n):
        for a in range(3):
            xs[t, a] = x[order[t], a]
        if t == 0 or key[order[t]] != key[order[t - 1]]:
            n_cells += 1
    ukeys = np.empty(n_cells, dtype=np.int64)
    bounds = np.empty(n_cells + 1, dtype=np.int64)
    c = -1
    for t in range(n):
        if t == 0 or key[order[t]] != key[order[t - 1]]:
            c += 1
            ukeys[c] = key[order[t]]
            bounds[c] = t
    bounds[n_cells] = n
    C = ukeys.shape[0]
    parent = np.empty(C, dtype=np.int64)
    for c in range(C):
        parent[c] = c
    lo = np.empty((C, 3))
    hi = np.empty((C, 3))
    for c in range(C):
        for a in range(3):
            lo[c, a] = np.inf
            hi[c, a] = -np.inf
        for p in range(bounds[c], bounds[c + 1]):
            for a in range(3):
                v = xs[p, a]
                lo[c, a] = min(lo[c, a], v)
                hi[c, a] = max(hi[c, a], v)
    tight = r2 * (1.0 - 1e-12)
    loose = r2 * (1.0 + 1e-12)
    # a linked pair is at most two cubes apart per axis: the forward half of the 5x5x5
    # neighbourhood as 13 rows (ox, oy) of consecutive keys, (0, 0) with oz = 1..2, (0, 1..2) and
    # (1..2, -2..2) with oz = -2..2; one forward-moving pointer per row (the keys are sorted)
    offset = np.empty(13, dtype=np.int64)
    z0 = np.empty(13, dtype=np.int64)
    for row in range(13):
        if row == 0:
            ox, oy, zz = 0, 0, 1
        elif row < 3:
            ox, oy, zz = 0, row, -2
        else:
            ox, oy, zz = 1 + (row - 3) // 5, (row - 3) % 5 - 2, -2
        z0[row] = zz
        offset[row] = ox * stride[0] + oy * stride[1]
    ptr = np.zeros(13, dtype=np.int64)
    for c in range(C):
        for row in range(13):
            base = ukeys[c] + offset[row]
            e = ptr[row]
            while e < C and ukeys[e] < base + z0[row]:
                e += 1
            ptr[row] = e
            while e < C and ukeys[e] <= base + 2:
                _join(c, e, parent, xs, bounds, lo, hi, r2, tight, loose)
                e += 1
    cell_of = np.empty(n, dtype=np.int64)
    for c in range(C):
        for t in range(bounds[c], bounds[c + 1]):
            cell_of[order[t]] = c
    name = np.full(C, -1, dtype=np.int64)
    k = 0
    for i in range(n):
        r = _find(parent, cell_of[i])
        if name[r] < 0:
            name[r] = k
            k += 1
        labels[i] = name[r]
    return k


@njit(cache=True)
def _join(c, e, parent, xs, bounds, lo, hi, r2, tight, loose):  # pragma: no cover - compiled
    """Union cubes c and e if some pair of their points is closer than r (r2 = r^2)."""
    rc = _find(parent, c)
    re = _find(parent, e)
    if rc == re:
        return
    near = 0.0  # squared distance between the bounding boxes, and between their farthest corners
    far = 0.0
    for a in range(3):
        g = max(lo[e, a] - hi[c, a], lo[c, a] - hi[e, a], 0.0)
        near += g * g
        f = max(hi[e, a] - lo[c, a], hi[c, a] - lo[e, a])
        far += f * f
    if near >= loose:
        return
    linked = far < tight
    if not linked:
        for p in range(bounds[c], bounds[c + 1]):
            g2 = 0.0  # point p to box e
            for a in range(3):
                g = max(lo[e, a] - xs[p, a], xs[p, a] - hi[e, a], 0.0)
                g2 += g * g
            if g2 >= loose:
                continue
            for q in range(bounds[e], bounds[e + 1]):
                s = 0.0
                for a in range(3):
                    t = xs[p, a] - xs[q, a]
                    s += t * t
                if s < r2:
                    linked = True
                    break
            if linked:
                break
    if linked:
        if rc < re:
            parent[re] = rc
        else:
            parent[rc] = re


def count_clusters(mu: Atoms, threshold: float = 0.1, *, min_mass: float = 0.0) -> np.ndarray:
    """Number of clusters per system (see :func:`cluster_labels`) holding mass ``> min_mass``; shape ``batch``.


    Examples
    --------
    >>> x = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    >>> count_clusters(Atoms(x), 0.1).tolist(), count_clusters(Atoms(x), 0.1, min_mass=0.5).tolist()
    (2, 1)
    """
    if mu.n == 1:
        return np.ones(mu.batch_shape, dtype=np.int64)
    pts = mu.points.reshape(-1, mu.n, mu.d)
    w = mu.weights.reshape(-1, mu.n)
    if mu.n <= BATCHED_MAX_N:
        if min_mass <= 0:  # the roots suffice: one per cluster
            roots = _batched_roots(pts, threshold)
            return (roots == np.arange(mu.n)).sum(axis=-1).astype(np.int64).reshape(mu.batch_shape)
        _, labels = batched_cluster_labels(pts, threshold)  # clusters with mass: labels needed
        B, n = labels.shape
        masses = np.bincount(
            (labels + n * np.arange(B)[:, None]).ravel(), weights=w.ravel(), minlength=B * n
        )
        k = np.count_nonzero(masses.reshape(B, n) > min_mass, axis=-1)
        return k.astype(np.int64).reshape(mu.batch_shape)
    out = np.empty(pts.shape[0], dtype=np.int64)
    for b in range(pts.shape[0]):
        k, labels = cluster_labels(pts[b], threshold)
        if min_mass > 0:
            masses = np.bincount(labels, weights=w[b], minlength=k)
            k = int(np.sum(masses > min_mass))
        out[b] = k
    return out.reshape(mu.batch_shape)


def check_points_weights(points: Any, weights: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(x, w)`` as float64: one system of points ``(n, d)``, finite non-negative weights ``(n,)`` not all zero."""
    x = np.asarray(points, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if x.ndim != 2 or w.shape != x.shape[:1]:
        raise ValueError(
            f"points must have shape (n, d) and weights (n,), got {x.shape} and {w.shape}"
        )
    if not np.all(np.isfinite(w)) or np.any(w < 0) or not w.max(initial=0.0) > 0:
        raise ValueError("weights must be finite, non-negative and not all zero")
    return x, w


def mass_clusters(
    points, weights, *, neighbors=None, radius: float | None = None, threshold: float = 1e-3
) -> tuple[np.ndarray, np.ndarray]:
    r"""Group the points of a measure that carry mass into atoms.

    Points with :math:`w_i \ge \text{threshold}\cdot\max_j w_j` are kept; two kept points are
    linked when they are mesh neighbours (``neighbors``) or, on a point cloud, closer than
    ``radius`` (chordal); each connected component :math:`S` becomes one atom at its
    normalized barycentre with its mass,

    .. math::

        a_S = \frac{\sum_{i\in S} w_i x_i}{|\sum_{i\in S} w_i x_i|}, \qquad m_S = \sum_{i\in S} w_i .

    Parameters
    ----------
    points : ndarray, shape (n, d)
        Support points (mesh cell centres or particles).
    weights : ndarray, shape (n,)
        Their masses (non-negative).
    neighbors : ndarray of int, shape (n, k), optional
        Neighbours of each point, padded with ``-1`` (or with the point itself, as
        :attr:`wflow.mesh.Mesh.cell_neighbors` does).
    radius : float, optional
        Linking distance on a point cloud (without ``neighbors``); default 2.5 x the
        spacing, :math:`2\pi/n` on :math:`S^1` and :math:`\sqrt{4\pi/n}` otherwise.
    threshold : float
        Relative mass below which a point is ignored.

    Returns
    -------
    atoms : ndarray, shape (k, d)
    masses : ndarray, shape (k,)
        Sorted by decreasing mass; they sum to the mass of the kept points.

    Examples
    --------
    >>> th = np.linspace(0, 2 * np.pi, 8, endpoint=False)
    >>> x = np.stack([np.cos(th), np.sin(th)], axis=1)
    >>> w = np.array([0.3, 0.2, 0, 0, 0.25, 0.25, 0, 0])
    >>> nb = np.stack([np.roll(np.arange(8), 1), np.roll(np.arange(8), -1)], axis=1)
    >>> atoms, masses = mass_clusters(x, w, neighbors=nb)
    >>> masses.tolist(), np.round(atoms, 3).tolist()
    ([0.5, 0.5], [[0.952, 0.305], [-0.924, -0.383]])
    """
    x, w = check_points_weights(points, weights)
    keep, k, label = mass_components(x, w, neighbors, radius, threshold)
    masses = np.bincount(label, weights=w[keep], minlength=k)
    bary = np.stack(
        [np.bincount(label, weights=w[keep] * x[keep, c], minlength=k) for c in range(x.shape[1])],
        axis=1,
    )
    atoms = bary / np.linalg.norm(bary, axis=1, keepdims=True)
    order = np.argsort(-masses, kind="stable")
    return atoms[order], masses[order]


def mass_components(
    x: np.ndarray, w: np.ndarray, neighbors: Any, radius: float | None, threshold: float
) -> tuple[np.ndarray, int, np.ndarray]:
    """The components of :func:`mass_clusters` (``x`` (n, d), ``w`` (n,) checked):
    ``(keep, k, label)``, ``keep`` the indices of the points with ``w >= threshold max(w)``,
    ``label[i]`` in ``0..k-1`` the component of point ``keep[i]``."""
    n, d = x.shape
    keep = np.flatnonzero(w >= threshold * w.max())
    idx = -np.ones(n, dtype=np.intp)
    idx[keep] = np.arange(keep.size)
    if neighbors is not None:
        nb = np.asarray(neighbors)
        if nb.ndim != 2 or nb.shape[0] != n or not np.issubdtype(nb.dtype, np.integer):
            raise ValueError(
                f"neighbors must be an integer array of shape ({n}, k), got {nb.dtype} {nb.shape}"
            )
        nb = nb[keep]
        rows = np.repeat(np.arange(keep.size), nb.shape[1])
        flat = nb.reshape(-1)
        cols = np.where(flat >= 0, idx[np.maximum(flat, 0)], -1)
    else:
        if radius is None:
            radius = 2.5 * (2 * np.pi / n if d == 2 else np.sqrt(4 * np.pi / n))
        radius = check_positive(radius, "radius")
        pairs = cKDTree(x[keep]).query_pairs(radius, output_type="ndarray")
        rows, cols = pairs[:, 0], pairs[:, 1]
    ok = cols >= 0
    G = coo_matrix((np.ones(int(ok.sum())), (rows[ok], cols[ok])), shape=(keep.size, keep.size))
    k, label = connected_components(G, directed=False)
    return keep, int(k), label
