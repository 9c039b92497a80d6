r"""Diagnostics of a configuration: energy, order parameter, clusters, pair fractions.

The default cluster measure is the effective number of clusters
:math:`N_{\mathrm{eff}} = 1/\iint e^{\beta(\langle x,y\rangle-1)}d\mu\,d\mu` at the model's
:math:`\beta` (:func:`effective_clusters`): :math:`k` for :math:`k` separated equal clusters,
:math:`2\beta/(1-e^{-2\beta})` for the uniform measure on :math:`S^2`, whatever the number of points.

These are what trackers record along a run; they know nothing about solvers.

Single-linkage clusters (components of the graph of points closer than a geodesic threshold):
:func:`batched_cluster_labels` for many small systems at once (``n <=`` :data:`BATCHED_MAX_N`),
:func:`cluster_labels` for one large system.  :func:`pair_fraction` is the observable of the
phase diagram of Geshkovski, Letrouit, Polyanskiy and Rigollet.  :func:`mass_clusters` groups
the mass-carrying points of a measure on a mesh or a point cloud into atoms.
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
