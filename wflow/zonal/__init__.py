r"""Zonal densities on :math:`S^{d-1}`: the mean-field equation as a one-dimensional conservation law.

A measure :math:`\mu = f(\langle x, e\rangle)\,\sigma` (:math:`\sigma` the normalized surface
measure) stays zonal under SA and USA with :math:`Q = K = I`, :math:`V = \pm I`; with
:math:`p(z) = c_d f(z)(1-z^2)^{(d-3)/2}` the law of :math:`z = \langle x, e\rangle`, the equation becomes

.. math::

    \partial_t p + \partial_z\big(p\,(1-z^2)\,g(z)\big)
    = \kappa^{-1}\partial_z\big(c_d(1-z^2)^{(d-1)/2}\,\partial_z f\big),

with :math:`g` an integral of :math:`p` against the kernel :func:`zonal_kernel`.  The derivation
and the finite-volume scheme (:class:`ZonalFV`) are in ``docs/zonal.md``.
"""

from .kernel import bessel_ratio, log_cap_volume, log_normalized_bessel, zonal_kernel, zonal_weight
from .scheme import ZonalFV

__all__ = [
    "log_normalized_bessel",
    "bessel_ratio",
    "zonal_kernel",
    "zonal_weight",
    "log_cap_volume",
    "ZonalFV",
]
