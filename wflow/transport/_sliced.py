r"""Spherical sliced Wasserstein :math:`SSW_p` (Bonet et al., ICLR 2023), through POT.

A cheap proxy for :math:`W_p`: the mean over random great circles of the circle distance
between the projected measures.  It is a different distance, not a bound on :math:`W_p`.
"""

from __future__ import annotations

import numpy as np

from .._typing import SeedLike
from ..sphere import as_generator
from ._common import TWO_PI, import_pot

__all__ = ["sliced_ssw"]


def sliced_ssw(x, a, y, b, p: float, n_projections: int, seed: SeedLike) -> float:
    r"""Spherical sliced :math:`SSW_p` in radians (POT returns it on the unit-length circle)."""
    ot = import_pot()

    d = x.shape[1]
    rng = as_generator(seed)
    # Great circles spanned by Haar-random orthonormal 2-frames (n_projections, d, 2).
    q, r = np.linalg.qr(rng.standard_normal((n_projections, d, 2)))
    q = q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]
    with np.errstate(divide="ignore", invalid="ignore"):  # as in circle_wpp
        ssw = ot.sliced_wasserstein_sphere(
            x, y, a, b, n_projections=n_projections, p=p, projections=q
        )
    return float(ssw) * TWO_PI
