r"""Diagnostics of a configuration: energy, order parameter, clusters.

These are what trackers record along a run; they know nothing about solvers.
"""
from __future__ import annotations

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

from .errors import WflowError, check_positive
from .measure import Atoms

__all__ = ["order_parameter", "cluster_labels", "count_clusters", "snapshot_diagnostics"]


def order_parameter(mu: Atoms) -> np.ndarray:
    r""":math:`|\sum_i w_i x_i|`, shape ``batch``."""
    return mu.order_parameter()


def cluster_labels(points: np.ndarray, threshold: float = 0.1) -> tuple[int, np.ndarray]:
    r"""Single-linkage clusters of one system: points closer than ``threshold`` (geodesic, radians) are linked.

    The clusters are the connected components of the graph of pairs at distance below the
    threshold.  They depend only on the edges of a minimum spanning tree, so it suffices to
    look at a graph that contains one:

    * on :math:`S^1`, neighbours in angular order (:math:`O(n\log n)`);
    * on :math:`S^2` with many points, the edges of the spherical Delaunay triangulation,
      which is the convex hull of the points (Qhull), plus each point that is not a hull
      vertex (a duplicate) linked to its nearest vertex;
    * otherwise, and if Qhull fails (degenerate input), all pairs within the chordal distance
      :math:`2\sin(\theta/2)` from a k-d tree.

    Returns ``(k, labels)`` with ``labels`` of shape ``(n,)`` in ``0..k-1``.
    """
    threshold = check_positive(threshold, "threshold")
    x = np.asarray(points, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"points must have shape (n, d) (one system), got {x.shape}")
    n, d = x.shape
    chord = 2 * np.sin(min(threshold, np.pi) / 2)
    pairs = None
    if d == 2 and n > 1:
        theta = np.arctan2(x[:, 1], x[:, 0])
        order = np.argsort(theta)
        pairs = np.stack([order, np.roll(order, -1)], axis=1)
    elif d == 3 and n > 2000:
        pairs = _delaunay_pairs(x)
    if pairs is not None:
        keep = np.linalg.norm(x[pairs[:, 0]] - x[pairs[:, 1]], axis=1) < chord
        pairs = pairs[keep]
    else:
        pairs = cKDTree(x).query_pairs(chord, output_type="ndarray")
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    k, labels = connected_components(graph, directed=False)
    return int(k), labels


def _delaunay_pairs(x: np.ndarray) -> np.ndarray | None:
    """Edges of the spherical Delaunay triangulation (convex hull), duplicates joined to their nearest vertex."""
    from scipy.spatial import ConvexHull, QhullError

    try:
        hull = ConvexHull(x)
    except (QhullError, ValueError):
        return None
    s = hull.simplices
    edges = np.concatenate([s[:, [0, 1]], s[:, [1, 2]], s[:, [2, 0]]])
    verts = hull.vertices
    others = np.setdiff1d(np.arange(len(x)), verts, assume_unique=True)
    if others.size:
        _, nearest = cKDTree(x[verts]).query(x[others])
        edges = np.concatenate([edges, np.stack([others, verts[nearest]], axis=1)])
    return edges


def count_clusters(mu: Atoms, threshold: float = 0.1, *, min_mass: float = 0.0) -> np.ndarray:
    """Number of clusters per system (see :func:`cluster_labels`) holding mass ``> min_mass``; shape ``batch``."""
    if mu.n == 1:
        return np.ones(mu.batch_shape, dtype=np.int64)
    pts = mu.points.reshape(-1, mu.n, mu.d)
    w = mu.weights.reshape(-1, mu.n)
    out = np.empty(pts.shape[0], dtype=np.int64)
    for b in range(pts.shape[0]):
        k, labels = cluster_labels(pts[b], threshold)
        if min_mass > 0:
            masses = np.bincount(labels, weights=w[b], minlength=k)
            k = int(np.sum(masses > min_mass))
        out[b] = k
    return out.reshape(mu.batch_shape)


def snapshot_diagnostics(model, mu: Atoms, *, cluster_threshold: float = 0.1, backend: str = "auto") -> dict[str, np.ndarray]:
    """Energy (NaN when the model is not a gradient flow), order parameter and cluster count."""
    if model.is_gradient:
        try:
            energy = np.asarray(model.energy(mu, backend=backend), dtype=np.float64)
        except WflowError:  # e.g. USA energy beyond float range at very large beta
            energy = np.full(mu.batch_shape, np.nan)
    else:
        energy = np.full(mu.batch_shape, np.nan)
    return {
        "energy": energy,
        "order_parameter": np.asarray(order_parameter(mu), dtype=np.float64),
        "n_clusters": count_clusters(mu, cluster_threshold),
    }
