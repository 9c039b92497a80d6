r"""Zonal densities on :math:`S^{d-1}`: the mean-field equation as a one-dimensional conservation law.

A measure is *zonal* about the axis :math:`e` when it is invariant under the rotations that
fix :math:`e`: :math:`\mu = f(\langle x, e\rangle)\,\sigma` with :math:`\sigma` the normalized
surface measure.  SA and USA with :math:`Q = K = I`, :math:`V = \pm I` map zonal measures to
zonal velocity fields, so the flow keeps them zonal and everything is a function of
:math:`z = \langle x, e\rangle \in [-1, 1]`, in every dimension :math:`d \ge 2`.
The full derivation is in ``docs/zonal.md``; the results used here:

**Law of z.**  Write :math:`x = z e + s u` with :math:`s = \sqrt{1-z^2}`, :math:`u \in S^{d-2}`
(the unit sphere of :math:`e^\perp`).  Then :math:`\sigma = c_d\,\omega(z)\,dz \otimes d\sigma_{d-2}(u)`,

.. math::

    \omega(z) = (1-z^2)^{(d-3)/2}, \qquad c_d = \frac{\Gamma(d/2)}{\sqrt\pi\,\Gamma((d-1)/2)},

and the law of :math:`z` under :math:`\mu` has density :math:`p(z) = c_d f(z)\omega(z)`.

**Kernel.**  With :math:`\nu = (d-3)/2` and the normalized Bessel function
:math:`\Lambda_\nu(a) = \Gamma(\nu+1)(2/a)^\nu I_\nu(a) = {}_0F_1(;\nu+1;a^2/4)`
(the average of :math:`e^{a\langle u, u'\rangle}` over :math:`u' \in S^{d-2}`),

.. math::

    k(z, z') = \int e^{\beta\langle x, y\rangle}\,d\sigma_{d-2}(u')
             = e^{\beta z z'}\,\Lambda_\nu\big(\beta s s'\big),

and, with the Bessel ratio :math:`r_\nu(a) = I_{\nu+1}(a)/I_\nu(a)` (so :math:`\Lambda_\nu' = r_\nu\Lambda_\nu`),
the :math:`e`-component of :math:`P_x\int e^{\beta\langle x,y\rangle} y\,d\sigma_{d-2}(u')` is

.. math::

    K(z, z') = (1-z^2)\,k(z, z')\,h(z, z'), \qquad
    h(z, z') = z' - \beta z (1-z'^2)\,\frac{r_\nu(\beta s s')}{\beta s s'} ,

:math:`r_\nu(a)/a \to 1/(d-1)` as :math:`a \to 0`.  Equivalently
:math:`(1-z^2)\,\partial_z k = \beta K`.  :math:`d = 2` (:math:`\Lambda = \cosh`, :math:`r = \tanh`)
and :math:`d = 3` (:math:`\Lambda = I_0`, :math:`r = I_1/I_0`) are the same formula.

**Velocity.**  The velocity is :math:`v = g(z)\,\nabla_S z` with :math:`\nabla_S z = P_x e`, so the
:math:`z`-velocity is :math:`w = \langle v, e\rangle = (1-z^2) g(z)`, and, for :math:`V = \epsilon I`,

.. math::

    \text{USA: } g(z) = \epsilon\int_{-1}^{1} p(z')\,k(z,z')\,h(z,z')\,dz', \qquad
    \text{SA: } g(z) = \epsilon\,\frac{\int p(z')\,k\,h\,dz'}{\int p(z')\,k\,dz'} .

**Equation.**  :math:`\partial_t\mu + \mathrm{div}_S(\mu v) = \kappa^{-1}\Delta_S\mu` becomes

.. math::

    \partial_t p + \partial_z\big(p\,w\big) = \kappa^{-1}\partial_z\big(c_d(1-z^2)^{(d-1)/2}\,\partial_z f\big),
    \qquad p = c_d\,\omega f,

and :math:`E_\beta(\mu) = \frac{1}{2\beta}\iint k(z,z')\,p(z)p(z')\,dz\,dz'`.

**Discretization** (:class:`ZonalFV`).  Cells :math:`[z_i, z_{i+1}]`, state = cell masses
:math:`m_i = \mu(z_i \le z \le z_{i+1})`, band volumes :math:`V_i = \sigma(\cdot)`, face weights
:math:`\ell_i = c_d(1-z_i^2)^{(d-1)/2}` (zero at the poles), weighted centroids
:math:`\bar z_i = (\ell_i - \ell_{i+1})/((d-1)V_i)` (exact).  Flux of :math:`p` through face
:math:`z_f`: :math:`F_f = \ell_f\big(g_f^+ f_L + g_f^- f_R\big) - \kappa^{-1}\ell_f(\bar f_R - \bar f_L)/(\bar z_R - \bar z_L)`,
with :math:`f_{L,R}` the limited linear reconstructions of :math:`f = m/V` (MC slopes,
face values kept in :math:`[0, 2\bar f]`) and :math:`g_f` the centroid-rule quadrature of the
integrals above against the cell masses.  :math:`dm_i/dt = F_i - F_{i+1}`.
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
