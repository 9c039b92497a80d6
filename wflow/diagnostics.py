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

    Uses a k-d tree on the chordal distance :math:`2\sin(\theta/2)`, so the cost is
    about :math:`O(n\log n)` for well-separated clusters.

    Returns ``(k, labels)`` with ``labels`` of shape ``(n,)`` in ``0..k-1``.
    """
    threshold = check_positive(threshold, "threshold")
    x = np.asarray(points, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"points must have shape (n, d) (one system), got {x.shape}")
    n = x.shape[0]
    chord = 2 * np.sin(min(threshold, np.pi) / 2)
    pairs = cKDTree(x).query_pairs(chord, output_type="ndarray")
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    k, labels = connected_components(graph, directed=False)
    return int(k), labels


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
