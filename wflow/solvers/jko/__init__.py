r"""JKO scheme: implicit Wasserstein gradient-flow steps on a fixed support, solved with optimal transport.

* :mod:`~wflow.solvers.jko.stepper` -- one step (the algorithm): :class:`JKOStepper`;
* :mod:`~wflow.solvers.jko.step` -- the :class:`JKO` solver of the contract, :func:`jko` (the
  front door) and :class:`JKOResult`;
* :mod:`~wflow.solvers.jko.transport` -- the inner semi-relaxed Sinkhorn / Newton--CG solver;
* :mod:`~wflow.solvers.jko.sparse` -- its Gibbs kernel on the kept pairs only (large supports);
* :mod:`~wflow.solvers.jko.stationary_states` -- stationary states by iterated steps, their atoms.
"""

from ...sphere import cost_matrix
from .stationary_states import (
    StationaryResult,
    atom_groups,
    cluster_atoms,
    model_time_unit,
    stationary,
)
from .step import (
    JKO,
    JKOProblem,
    JKOResult,
    JKOStepper,
    StepStats,
    WarmStart,
    check_gradient_model,
    jko,
    jko_step,
)

__all__ = [
    "jko",
    "jko_step",
    "JKO",
    "JKOProblem",
    "JKOResult",
    "JKOStepper",
    "StepStats",
    "WarmStart",
    "stationary",
    "StationaryResult",
    "model_time_unit",
    "cost_matrix",
    "cluster_atoms",
    "atom_groups",
    "check_gradient_model",
]
