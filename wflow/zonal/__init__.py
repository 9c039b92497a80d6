r"""Zonal densities on :math:`S^{d-1}`: the mean-field equation as a one-dimensional conservation law.

A measure is *zonal* about the axis :math:`e` when it is invariant under the rotations that
fix :math:`e`: :math:`\mu = f(\langle x, e\rangle)\,\sigma` with :math:`\sigma` the normalized
surface measure.  SA and USA with :math:`Q = K = I`, :math:`V = \pm I` map zonal measures to
zonal velocity fields, so the flow keeps them zonal and everything is a function of
:math:`z = \langle x, e\rangle \in [-1, 1]`, in every dimension :math:`d \ge 2`.

With :math:`p(z) = c_d f(z)(1-z^2)^{(d-3)/2}` the law of :math:`z` under
:math:`\mu = f(\langle x, e\rangle)\,\sigma`, the equation becomes

.. math::

    \partial_t p + \partial_z\big(p\,(1-z^2)\,g(z)\big)
    = \kappa^{-1}\partial_z\big(c_d(1-z^2)^{(d-1)/2}\,\partial_z f\big),

with :math:`g` an integral of :math:`p` against the kernel
:math:`k(z, z') = e^{\beta z z'}\Lambda_\nu(\beta\sqrt{(1-z^2)(1-z'^2)})`, :math:`\nu = (d-3)/2`
and :math:`\Lambda_\nu` the normalized Bessel function (:func:`zonal_kernel`).  The derivation, the kernel's computation up to :math:`\beta = 10^3`,
:math:`d = 10^4` and the finite-volume scheme (:class:`ZonalFV`) are in ``docs/zonal.md``.
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
