"""What a snapshot records of a state: energy, order parameter, cluster count."""

from __future__ import annotations

import contextlib

import numpy as np

from ..errors import WflowError
from ..measure import Atoms
from .clusters import count_clusters

__all__ = ["order_parameter", "snapshot_diagnostics"]


def order_parameter(mu: Atoms) -> np.ndarray:
    r""":math:`|\sum_i w_i x_i|`, shape ``batch``.

    Examples
    --------
    >>> import wflow
    >>> from wflow.diagnostics import order_parameter
    >>> round(float(order_parameter(wflow.Atoms([[1.0, 0.0], [0.0, 1.0]]))), 6)  # |(1/2, 1/2)| = 1/sqrt(2)
    0.707107
    >>> float(order_parameter(wflow.Atoms([[1.0, 0.0], [1.0, 0.0]])))  # one cluster
    1.0
    """
    return mu.order_parameter()


def snapshot_diagnostics(
    model, mu: Atoms, *, cluster_threshold: float = 0.1, backend: str = "auto"
) -> dict[str, np.ndarray]:
    """Energy (NaN when the model is not a gradient flow), order parameter and cluster count.

    Examples
    --------
    >>> import wflow
    >>> from wflow.diagnostics import snapshot_diagnostics
    >>> mu = wflow.Atoms([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    >>> out = snapshot_diagnostics(wflow.USA(1.0), mu, backend="numpy")
    >>> sorted(out), int(out["n_clusters"]), round(float(out["order_parameter"]), 6)  # |(2, 0, 1)| / 3
    (['energy', 'n_clusters', 'order_parameter'], 2, 0.745356)
    """
    energy = np.full(mu.batch_shape, np.nan)
    if model.is_gradient:
        with contextlib.suppress(WflowError):  # e.g. USA energy beyond float range at large beta
            energy = np.asarray(model.energy(mu, backend=backend), dtype=np.float64)
    return {
        "energy": energy,
        "order_parameter": np.asarray(order_parameter(mu), dtype=np.float64),
        "n_clusters": count_clusters(mu, cluster_threshold),
    }
