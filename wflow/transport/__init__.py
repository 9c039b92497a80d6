r"""Wasserstein distances between measures on the sphere :math:`S^{d-1}`.

.. math::
    W_p(\mu, \nu) = \Big(\min_{\pi \in \Pi(\mu, \nu)} \iint c(x, y)^p \, d\pi(x, y)\Big)^{1/p},
    \qquad c(x, y) = \theta(x, y) = \arccos\langle x, y\rangle \ \text{(geodesic)}
    \ \text{or}\ |x - y| = 2\sin(\theta/2) \ \text{(chordal)}.

Distances are in radians of the unit sphere: on the circle the geodesic distance runs
over :math:`[0, \pi]` and the circumference is :math:`2\pi`.  Since
:math:`2\theta/\pi \le 2\sin(\theta/2) \le \theta`, the two costs give distances within a
factor :math:`\pi/2` of each other, and within a factor :math:`1 - O(\theta^2/24)` when
the mass moves by small angles :math:`\theta`.

:func:`wasserstein` returns the distance :math:`W_p` (not :math:`W_p^p`) as a :class:`Distance`,
a float whose ``repr`` shows the interval known to hold it;
:func:`wasserstein_result` returns a :class:`WassersteinResult` that also says which
method ran, whether the value is exact and a bound on its error.  Methods:

================  ======================================  =====================================
method            what it computes                        accuracy
================  ======================================  =====================================
``circle``        exact :math:`W_p` on :math:`S^1`        exact (POT ``wasserstein_circle``,
                  (geodesic cost), O(N log N)             shift found to 1e-12)
``emd``           exact LP (POT ``emd2``), any d/cost     exact; O(N^3)-ish, size-limited
``sinkhorn``      debiased Sinkhorn divergence, log       approximation, bias
                  domain, memory linear in N (KeOps)      :math:`|S_\varepsilon-W_p^p|\le\varepsilon\log N`
``sliced``        spherical sliced Wasserstein (Bonet     a different distance: a cheap proxy,
                  et al. 2023)                            not a bound in general
``semidiscrete``  W_2 between N atoms and a measure of    certified bracket lo <= W_2 <= hi
                  M >> N atoms (a fine quadrature),       (relative width ~1e-4); geodesic
                  damped Newton on the semi-dual,         within a factor 1 + c_max^2/24
                  exact c-transform by k-d tree           (:mod:`wflow.transport.semidiscrete`)
``multiscale``    W_2 on S^{d-1}, truncated multiscale    certified bracket lo <= W_2 <= hi of
                  Sinkhorn (:mod:`.multiscale`)           relative width ``tol``
``"uniform"``     :math:`W_2` to the uniform law on S^1   exact closed form
================  ======================================  =====================================

``method="auto"`` takes ``circle`` on :math:`S^1` (geodesic cost), ``emd`` while both
measures have at most ``max_emd`` atoms; beyond, the certified ``multiscale`` bracket for
:math:`W_2` and ``sinkhorn`` for other ``p``.

A density (any object with a ``to_atoms()`` method, e.g. ``wflow.Density``) is replaced
by its cell-centre quantization :math:`\sum_k m_k \delta_{c_k}` (cell masses at cell
centres).  That moves each cell's mass by at most the cell radius :math:`h`, so the
distance computed is within :math:`h` of the distance between the densities
(:math:`W_p(\rho, \rho_h) \le h`, triangle inequality).

The package
-----------
This module only re-exports.  The front doors and the one dispatch on ``method`` live in
``_dispatch.py``; each method in its own module: ``_circle.py`` (circle, uniform law),
``_emd.py``, ``_sinkhorn.py``, ``_sliced.py`` and :mod:`wflow.transport.semidiscrete`;
``_common.py`` holds the result type and the input checks.
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
