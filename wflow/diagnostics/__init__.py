r"""Diagnostics of a configuration: energy, order parameter, clusters, pair fractions.

The default cluster measure is the effective number of clusters
:math:`N_{\mathrm{eff}} = 1/\iint e^{\beta(\langle x,y\rangle-1)}d\mu\,d\mu` at the model's
:math:`\beta` (:func:`effective_clusters`): :math:`k` for :math:`k` separated equal clusters,
:math:`2\beta/(1-e^{-2\beta})` for the uniform measure on :math:`S^2`, whatever the number of points.

These are what trackers record along a run; they know nothing about solvers.

Two regimes, two algorithms for single-linkage clusters (connected components of the
graph linking points closer than a geodesic threshold :math:`\theta`, i.e. at chordal
distance below :math:`r = 2\sin(\theta/2)`):

* **many small systems** (``n <=`` :data:`BATCHED_MAX_N`, the phase-diagram regime):
  :func:`batched_cluster_labels` builds every system's adjacency matrix from one batched
  GEMM and finds the components of all systems at once by min-label propagation with
  pointer jumping -- no Python loop over systems;
* **one large system**: :func:`cluster_labels` (angular order on :math:`S^1`, a grid of
  cells of side :math:`r/\sqrt 3` with a union--find over cells on :math:`S^2`, a k-d tree
  otherwise).

:func:`pair_fraction` is the observable of the phase diagram of Geshkovski, Letrouit,
Polyanskiy and Rigollet (the fraction of token pairs with :math:`\langle x_i, x_j\rangle`
above a cosine), batched the same way (:func:`pair_counts`: one compiled pass per system).  :func:`mass_clusters` groups the mass-carrying
points of a measure on a mesh or a point cloud into atoms (JKO's stationary states).
"""

from __future__ import annotations

from .clusters import (
    BATCHED_MAX_N,
    batched_cluster_labels,
    check_points_weights,
    cluster_labels,
    count_clusters,
    mass_clusters,
)
from .effective import (
    effective_clusters,
    effective_clusters_from_log_sums,
    kernel_beta,
    uniform_effective_clusters,
)
from .pairs import PAIR_COUNTS_FUSED_MAX_DIM, pair_counts, pair_fraction
from .snapshot import order_parameter, snapshot_diagnostics

__all__ = [
    "order_parameter",
    "effective_clusters",
    "effective_clusters_from_log_sums",
    "uniform_effective_clusters",
    "kernel_beta",
    "pair_fraction",
    "pair_counts",
    "cluster_labels",
    "batched_cluster_labels",
    "count_clusters",
    "check_points_weights",
    "mass_clusters",
    "snapshot_diagnostics",
    "BATCHED_MAX_N",
    "PAIR_COUNTS_FUSED_MAX_DIM",
]
