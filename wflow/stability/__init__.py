r"""Second-order stability of atomic critical points, and the supremum of the energy.

For a gradient model with energy :math:`F` -- the functional the flow
*ascends* (``model.energy``) -- and an atomic measure
:math:`\mu = \sum_i m_i\delta_{x_i}` on :math:`S^{d-1}`, this module computes

* the **Wasserstein Hessian**: the second variation of :math:`F` along Monge
  perturbations :math:`x \mapsto \exp_x(t\xi(x))`,
  :math:`H_\mu(\xi,\xi) = \frac{d^2}{dt^2}F\big((\exp(t\xi))_\#\mu\big)\big|_{t=0}`,
  exactly, on the product of the tangent spaces at the atoms (:func:`wasserstein_hessian`);
* the **splitting blocks**: the extra second-order terms of perturbations that tear an
  atom into pieces moving apart (transport plans instead of maps);
* **stability** of a critical point (:func:`stability`, :func:`is_stable`), the
  sufficient condition on the circle (:func:`circle_condition`);
* the **supremum** of :math:`F` over probability measures for gradient *ascent* and its
  maximizers, Diracs at the argmax of the perceptron potential (:func:`energy_supremum`).

Energies (wflow's sign, ascended): attention with :math:`Q=K=I`, :math:`V=sI`,
:math:`s=\pm1`, contributes :math:`\frac{s}{2\beta}\iint e^{\beta\langle x,y\rangle}d\mu\,d\mu`
(:math:`\frac s2|\int x\,d\mu|^2` at :math:`\beta=0`); a conservative perceptron
contributes :math:`\int U\,d\mu` with :math:`U = \tfrac12 v_\omega`,
:math:`v_\omega(x)=\sum_j\omega_j\varphi(a_j\cdot x+b_j)`, :math:`\varphi'=2\sigma`.
The paper (Álvarez-López, Geshkovski & Ruiz-Balet, "Perceptrons and localization of
attention's mean-field landscape", ICML 2026) writes the same dynamics as the
*descent* of :math:`\mathsf E = -F`; every "positive (semi-)definite" of the paper is a
"negative (semi-)definite" here.

This module re-exports the code of :mod:`~wflow.stability.hessian`, :mod:`~wflow.stability.verdict`,
:mod:`~wflow.stability.circle`, :mod:`~wflow.stability.supremum`, :mod:`~wflow.stability.polish`
(from a run's settled state to the critical point next to it) and
:mod:`~wflow.stability.anticoncentration`; :mod:`~wflow.stability.blocks` holds what they share.
"""

from .anticoncentration import ANTICONCENTRATION_LIMIT, anticoncentration_bound
from .circle import CircleCondition, circle_condition, circle_threshold
from .hessian import WassersteinHessian, wasserstein_hessian
from .polish import Polished, merge_atoms, polish_atoms
from .supremum import EnergySupremum, PotentialMaximum, energy_supremum, potential_maximum
from .verdict import Stability, is_stable, stability

__all__ = [
    "WassersteinHessian",
    "wasserstein_hessian",
    "Stability",
    "stability",
    "is_stable",
    "CircleCondition",
    "circle_condition",
    "circle_threshold",
    "PotentialMaximum",
    "EnergySupremum",
    "energy_supremum",
    "potential_maximum",
    "anticoncentration_bound",
    "ANTICONCENTRATION_LIMIT",
    "Polished",
    "merge_atoms",
    "polish_atoms",
]
