r"""Second-order stability of atomic critical points, and the supremum of the energy.

For a gradient model with energy :math:`F` -- the functional the flow *ascends*
(``model.energy``) -- and an atomic measure :math:`\mu = \sum_i m_i\delta_{x_i}` on
:math:`S^{d-1}`: the Wasserstein Hessian along Monge perturbations, exactly, with the splitting
blocks of perturbations that tear atoms apart (:func:`wasserstein_hessian`); the verdict on a
critical point (:func:`stability`, :func:`is_stable`) and the sufficient condition on the circle
(:func:`circle_condition`); the supremum of :math:`F` and its Dirac maximizers
(:func:`energy_supremum`).  The perceptron paper (Álvarez-López, Geshkovski & Ruiz-Balet, ICML
2026) descends :math:`\mathsf E = -F`: its "positive (semi-)definite" is "negative
(semi-)definite" here (docs/stability.md).

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
