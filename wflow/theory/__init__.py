r"""Analytic results that the solvers must reproduce (the conventions page of the documentation).

* Funk--Hecke eigenvalues of :math:`e^{\beta\langle x,y\rangle}` on :math:`S^{d-1}` and the
  linear growth rates around the uniform measure (Rigollet 2025, §5): :func:`funk_hecke`,
  :func:`growth_rate`, :func:`most_unstable_mode`, :func:`heat_decay_rate`.
* The equiangular reduction (all pairwise inner products equal :math:`\rho`, all radii
  equal :math:`r`) for every normalization scheme (Rigollet §5,
  Karagodin--Geshkovski--Polyanskiy--Rigollet 2025): :func:`equiangular_scheme_rhs`,
  :func:`equiangular_scheme_solution`, the late-time laws :func:`equiangular_asymptotics` and
  the time to a cosine :func:`equiangular_time`.
* Long context: one attention layer at :math:`\beta = \gamma\log n`
  (:func:`long_context_limit`, :func:`long_context_cosine`).
* Kernel conventions and the Kuramoto form: :func:`rescaled_time`, :func:`plain_time`,
  :func:`rescaled_energy`, :func:`plain_energy`, :func:`kuramoto_velocity`.
"""

from .asymptotics import EquiangularLaw, equiangular_asymptotics
from .checks import SCHEMES
from .conventions import kuramoto_velocity, plain_energy, plain_time, rescaled_energy, rescaled_time
from .equiangular import (
    EquiangularSolution,
    equiangular_configuration,
    equiangular_rhs,
    equiangular_scheme_rhs,
    equiangular_scheme_solution,
    equiangular_solution,
    equiangular_time,
)
from .long_context import long_context_cosine, long_context_gap, long_context_limit
from .spectrum import funk_hecke, growth_rate, heat_decay_rate, most_unstable_mode

__all__ = [
    "funk_hecke",
    "growth_rate",
    "most_unstable_mode",
    "SCHEMES",
    "equiangular_rhs",
    "equiangular_solution",
    "equiangular_scheme_rhs",
    "equiangular_scheme_solution",
    "EquiangularSolution",
    "equiangular_asymptotics",
    "EquiangularLaw",
    "equiangular_time",
    "equiangular_configuration",
    "kuramoto_velocity",
    "long_context_limit",
    "long_context_gap",
    "long_context_cosine",
    "rescaled_time",
    "plain_time",
    "rescaled_energy",
    "plain_energy",
    "heat_decay_rate",
]
