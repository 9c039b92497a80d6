r"""The cluster-link rule: when two points are linked in a single-linkage cluster count.

Points :math:`x_i, x_j` are linked at a geodesic ``threshold`` :math:`\theta` when
:math:`|x_i - x_j| < r = 2\sin(\theta/2)`.  Every batched cluster count decides a pair from its
squared distance (:func:`squared_distance`): below ``lo`` linked, above ``hi`` not, within the
band :math:`r^2(1 \mp` :data:`LINK_BAND` :math:`)` as the square root says (:func:`linked`), so
that :func:`wflow.diagnostics.count_clusters` and the fused step's count (:mod:`wflow.solvers.fused`)
agree exactly.

Examples
--------
>>> from wflow.linkage import link_bounds
>>> chord, lo, hi = link_bounds(0.1)
>>> round(chord, 12), lo < chord**2 < hi
(0.099958338541, True)
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .errors import check_positive

__all__ = ["LINK_BAND", "link_bounds", "linked", "squared_distance"]

#: relative width, about the squared chord, of the band where a pair's squared distance is not trusted to
#: decide the link and the square root does (:func:`link_bounds`)
LINK_BAND = 1e-14


def link_bounds(threshold: float) -> tuple[float, float, float]:
    """``(chord, lo, hi)`` of a geodesic ``threshold`` (checked positive; capped at pi): the chordal distance
    ``2 sin(threshold / 2)`` and the bounds of the band around its square (``chord^2 (1 -+``
    :data:`LINK_BAND` ``)``) of :func:`linked`, the link rule of every batched cluster count."""
    chord = 2 * math.sin(min(check_positive(threshold, "threshold"), math.pi) / 2)
    r2 = chord * chord
    return chord, r2 * (1.0 - LINK_BAND), r2 * (1.0 + LINK_BAND)


@njit(cache=True, inline="always")
def linked(d2, chord, lo, hi):  # pragma: no cover - compiled
    """Whether a pair at squared distance d2 is linked, |x_i - x_j| < chord: below lo, yes; from lo to hi
    (:func:`link_bounds`: within rounding of chord^2), as the square root says; above, no."""
    return d2 < lo or (d2 < hi and np.sqrt(d2) < chord)


@njit(cache=True, fastmath={"nnan", "ninf", "nsz"})
def squared_distance(xk, i, j):  # pragma: no cover - compiled
    """|x_i - x_j|^2 of the rows of xk, summed over the coordinates in order, in float64 without fused
    multiply-adds: the number :func:`wflow.diagnostics.count_clusters` forms for the pair (not inlined,
    so that the caller's fast-math flags do not reach it)."""
    s = 0.0
    for a in range(xk.shape[1]):
        t = np.float64(xk[i, a]) - np.float64(xk[j, a])
        s += t * t
    return s
