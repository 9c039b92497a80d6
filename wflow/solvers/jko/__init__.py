r"""JKO scheme: implicit Wasserstein gradient-flow steps on a fixed support, solved with optimal transport.

* :mod:`~wflow.solvers.jko.stepper` -- one step (the algorithm): :class:`JKOStepper`;
* :mod:`~wflow.solvers.jko.step` -- the :class:`JKO` solver of the contract, :func:`jko` (the
  front door) and :class:`JKOResult`;
* :mod:`~wflow.solvers.jko.transport` -- the inner semi-relaxed Sinkhorn / Newton--CG solver;
* :mod:`~wflow.solvers.jko.sparse` -- its Gibbs kernel on the kept pairs only (large supports);
* :mod:`~wflow.solvers.jko.stationary_states` -- stationary states by iterated steps, their atoms.

The names below are imported when first used: a JKO run loads no stationary-state analysis.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: the public names of .stationary_states (cost_matrix is wflow.sphere's, the others .step's)
_STATIONARY = ("stationary", "StationaryResult", "model_time_unit", "cluster_atoms", "atom_groups")

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


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    where = ".stationary_states" if name in _STATIONARY else ".step"
    module = importlib.import_module("...sphere" if name == "cost_matrix" else where, __name__)
    value = getattr(module, name)
    globals()[name] = value  # the next look-up is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what static tools and IDEs see
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
