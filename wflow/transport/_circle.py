r"""Exact optimal transport on the circle :math:`S^1` (geodesic cost), through POT.

:func:`circle_wpp` is :math:`W_p^p` between two measures on the circle (POT's
``wasserstein_circle``, O(N log N)); :func:`w2_to_uniform_circle` is the closed form of
:math:`W_2` to the uniform law.  POT works on the circle of length 1; these functions
convert to the unit circle (circumference :math:`2\pi`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..sphere import points_to_angles
from ._common import TWO_PI, as_single, import_pot

__all__ = ["CIRCLE_EPS", "circle_coords", "circle_wpp", "w2_to_uniform_circle"]

CIRCLE_EPS = 1e-12  # bisection tolerance of POT's circle solver (unit-length circle)


def circle_coords(x: np.ndarray) -> np.ndarray:
    """Points on S^1 to coordinates in [0, 1) of the unit-length circle."""
    return np.mod(points_to_angles(x) / TWO_PI, 1.0)


def circle_wpp(x, a, y, b, p: float) -> float:
    r"""Exact :math:`W_p^p` on :math:`S^1` (geodesic cost, circumference :math:`2\pi`).

    POT returns :math:`W_p^p` for the circle of length 1; distances scale by
    :math:`2\pi`, so :math:`W_p^p` scales by :math:`(2\pi)^p`.
    """
    ot = import_pot()

    u, v = circle_coords(x), circle_coords(y)
    # POT divides by zero in a branch whose result it then masks out (its issue #738).
    with np.errstate(divide="ignore", invalid="ignore"):
        wpp = ot.wasserstein_circle(u, v, a, b, p=p, eps=CIRCLE_EPS)
    return float(np.asarray(wpp).reshape(-1)[0]) * TWO_PI**p


def w2_to_uniform_circle(mu: Any) -> float:
    r"""Exact :math:`W_2(\mu, \sigma)` between a measure on :math:`S^1` and the uniform law :math:`\sigma`.

    Closed form of Bonet et al. (2023, Prop. 1), through POT's
    ``semidiscrete_wasserstein2_unif_circle``: with coordinates :math:`u_i \in [0, 1)` sorted
    and masses :math:`\alpha_i`,

    .. math::
        W_2^2 = (2\pi)^2 \Big(\sum_i \alpha_i u_i^2 - \big(\sum_i \alpha_i u_i\big)^2
        + \sum_i \alpha_i u_i \big(1 - \alpha_i - 2\textstyle\sum_{k<i} \alpha_k\big) + \tfrac1{12}\Big),

    the factor :math:`(2\pi)^2` converting the unit-length circle to the unit circle.
    Exact up to round-off; O(N log N).  A Dirac mass is at distance :math:`\pi/\sqrt3`.

    Parameters
    ----------
    mu : Atoms with ``d = 2``, an array of points ``(n, 2)`` or an object with ``to_atoms()``.

    Returns
    -------
    float
        :math:`W_2` in radians (geodesic cost).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.transport import w2_to_uniform_circle
    >>> round(w2_to_uniform_circle(wflow.Atoms([[1.0, 0.0]])), 6), round(float(np.pi / np.sqrt(3)), 6)  # a Dirac
    (1.813799, 1.813799)
    >>> grid = wflow.sphere.angles_to_points(2 * np.pi * np.arange(1000) / 1000)
    >>> round(w2_to_uniform_circle(grid), 6)  # pi / (sqrt(3) N) for N equispaced atoms
    0.001814
    """
    ot = import_pot()

    x, a = as_single(mu, "mu")
    if x.shape[-1] != 2:
        raise ValueError(
            f"w2_to_uniform_circle needs a measure on the circle (d=2), got d={x.shape[-1]}"
        )
    u = circle_coords(x)
    # POT sorts the values but not the weights: sort both here.
    order = np.argsort(u, kind="stable")
    w22 = ot.semidiscrete_wasserstein2_unif_circle(u[order], a[order])
    return float(TWO_PI * math.sqrt(max(float(np.asarray(w22).reshape(-1)[0]), 0.0)))
