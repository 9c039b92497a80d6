import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

from wflow import Atoms, sphere
from wflow.diagnostics import cluster_labels, count_clusters


def _all_pairs_components(x, threshold):
    p = cKDTree(x).query_pairs(2 * np.sin(threshold / 2), output_type="ndarray")
    g = coo_matrix((np.ones(len(p)), (p[:, 0], p[:, 1])), shape=(len(x), len(x)))
    return connected_components(g, directed=False)[1]


@pytest.mark.parametrize("d", [2, 3])
def test_fast_single_linkage_equals_all_pairs(d, rng):
    """Angular order (S^1) and Delaunay edges (S^2, n > 2000) give exactly the all-pairs clusters."""
    centres = sphere.uniform(30, d, rng)
    x = np.concatenate([sphere.von_mises_fisher(80, c, 3000.0, rng) for c in centres])
    x = np.concatenate([x, x[:50]])  # exact duplicates (collapsed clusters)
    for threshold in (0.01, 0.03, 0.1, 0.4):
        k, labels = cluster_labels(x, threshold)
        ref = _all_pairs_components(x, threshold)
        # same partition: labels map one-to-one
        pairs = set(zip(labels.tolist(), ref.tolist()))
        assert k == ref.max() + 1 and len(pairs) == k


def test_count_clusters_batched_and_min_mass(rng):
    c = sphere.uniform(3, 3, rng)
    x = np.concatenate([sphere.von_mises_fisher(n, c[i], 1e4, rng) for i, n in enumerate((50, 30, 2))])
    mu = Atoms(np.stack([x, x[::-1]]))
    np.testing.assert_array_equal(count_clusters(mu, 0.2), [3, 3])
    np.testing.assert_array_equal(count_clusters(mu, 0.2, min_mass=0.05), [2, 2])
