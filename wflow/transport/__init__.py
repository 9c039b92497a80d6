r"""Wasserstein distances between measures on the sphere :math:`S^{d-1}`.

.. math::
    W_p(\mu, \nu) = \Big(\min_{\pi \in \Pi(\mu, \nu)} \iint c(x, y)^p \, d\pi(x, y)\Big)^{1/p},
    \qquad c(x, y) = \theta(x, y) = \arccos\langle x, y\rangle \ \text{(geodesic)}
    \ \text{or}\ |x - y| = 2\sin(\theta/2) \ \text{(chordal)}.

Distances are in radians of the unit sphere (the circle's circumference is :math:`2\pi`);
since :math:`2\theta/\pi \le 2\sin(\theta/2) \le \theta`, the two costs agree within a factor
:math:`\pi/2`, and within :math:`1 - O(\theta^2/24)` for small moves.

:func:`wasserstein` returns :math:`W_p` (not :math:`W_p^p`) as a :class:`Distance`, a float
whose ``repr`` shows the interval known to hold it; :func:`wasserstein_result` returns a
:class:`WassersteinResult` that also says which method ran, whether the value is exact and a
bound on its error.  Methods (``METHODS``; the table with accuracy and limits is in
docs/transport.md): ``circle`` (exact on :math:`S^1`), ``emd`` (exact LP), ``sinkhorn``
(debiased divergence), ``sliced`` (a cheap proxy, not a bound), ``semidiscrete`` and
``multiscale`` (certified brackets on :math:`W_2`), and ``nu="uniform"`` on :math:`S^1`.

A density (any object with ``to_atoms()``, e.g. ``wflow.Density``) is replaced by its cell
masses at cell centres, which moves each cell's mass by at most the cell radius :math:`h`:
the distance computed is within :math:`h` of the distance between the densities.

This module only re-exports: the front doors and the dispatch on ``method`` live in
``_dispatch.py``, each method in its own module, the result type and checks in ``_common.py``.
"""

from ._circle import w2_to_uniform_circle
from ._common import COSTS, Distance, WassersteinResult
from ._dispatch import METHODS, sinkhorn_divergence, wasserstein, wasserstein_result

__all__ = [
    "METHODS",
    "COSTS",
    "WassersteinResult",
    "Distance",
    "wasserstein",
    "wasserstein_result",
    "sinkhorn_divergence",
    "w2_to_uniform_circle",
]
