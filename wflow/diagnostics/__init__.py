r"""Diagnostics of a configuration: energy, order parameter, clusters, pair fractions.

What trackers record along a run; they know nothing about solvers.  The default cluster measure
is the effective number of clusters :math:`N_{\mathrm{eff}}` (:func:`effective_clusters`).
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
