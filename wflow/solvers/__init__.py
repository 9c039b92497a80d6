"""Solvers: one contract (:mod:`~wflow.solvers.base`) under particles, finite volume, Lagrangian nodes and JKO.

:data:`~wflow.solvers.base.SOLVERS` and :data:`~wflow.solvers.base.KINDS` name every solver and
every kind of result from the start; the module that defines one is imported when it is first
looked up (``get_solver("jko")`` imports :mod:`wflow.solvers.jko`), and a submodule when it is
first read as an attribute (``wflow.solvers.zonal``).  Importing this package loads the contract
and the driver only.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

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


def __getattr__(name: str) -> Any:
    if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return importlib.import_module(f".{name}", __name__)
