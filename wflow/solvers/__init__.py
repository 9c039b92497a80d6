"""Solvers: one contract (:mod:`~wflow.solvers.base`) under particles, finite volume, Lagrangian nodes and JKO.

Importing this package registers every solver in :data:`~wflow.solvers.base.SOLVERS` and
every result kind in :data:`~wflow.solvers.base.KINDS`.
"""

# the schemes register their model types (a stored run of any model is rebuilt by model_from_dict);
# steppers registers euler, rk4, dopri5, euler-maruyama, ssprk3; each other module its kind and solvers
from .. import schemes  # noqa: F401
from . import eulerian, jko, lagrangian, particles, runs, steppers, zonal  # noqa: F401
from .base import (
    KINDS,
    SOLVERS,
    Problem,
    Result,
    Solver,
    StepResult,
    Tracker,
    get_solver,
    integrate,
)

__all__ = [
    "SOLVERS",
    "KINDS",
    "Problem",
    "Solver",
    "StepResult",
    "Tracker",
    "Result",
    "integrate",
    "get_solver",
]
