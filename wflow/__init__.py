"""wflow: mean-field dynamics of Transformers on the sphere.

Tokens are particles on :math:`S^{d-1}`, depth is time, self-attention moves each
token toward a softmax-weighted average of the others.  wflow solves the finite-N
particle system and its continuum limit (finite volume, Lagrangian quadrature, JKO
steps), and measures the Wasserstein distance between them.  See the documentation (docs/) for the mathematics and README.md for a tour.

The names below are imported when first used (``wflow.SA`` imports :mod:`wflow.models`),
so that ``import wflow`` and the ``wflow`` command start at once.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from ._version import __version__

#: public name -> the module that defines it
_NAMES = {
    "Atoms": ".measure",
    "SA": ".models",
    "USA": ".models",
    "Perceptron": ".models",
    "Model": ".models",
    "simulate": ".solvers.particles",
    "Trajectory": ".solvers.particles",
    "SaveAt": ".solvers.saveat",
    "StepControl": ".solvers.control",
    "Density": ".density",
    "CircleMesh": ".mesh",
    "SphereMesh": ".mesh",
    "solve_density": ".solvers.eulerian",
    "DensityTrajectory": ".solvers.eulerian",
    "solve_lagrangian": ".solvers.lagrangian",
    "LagrangianSolution": ".solvers.lagrangian",
    "solve_zonal": ".solvers.zonal",
    "ZonalTrajectory": ".solvers.zonal",
    "wasserstein": ".transport",
    "wasserstein_result": ".transport",
    "Result": ".solvers.base",
    "integrate": ".solvers.base",
    "kernel_sums": ".kernels",
    "load": ".solvers.runs",
    "save": ".solvers.runs",
    "resume": ".solvers.runs",
    "WflowError": ".errors",
    "SolverError": ".errors",
    "NotAGradientFlowError": ".errors",
}
#: submodules in the public surface; every other submodule is reachable as an attribute too
_MODULES = ("schemes", "sweep", "sphere", "theory", "plot", "io")

__all__ = [
    "__version__",
    "Atoms",
    "SA",
    "USA",
    "Perceptron",
    "Model",
    "simulate",
    "Trajectory",
    "SaveAt",
    "StepControl",
    "Density",
    "CircleMesh",
    "SphereMesh",
    "solve_density",
    "DensityTrajectory",
    "solve_lagrangian",
    "LagrangianSolution",
    "solve_zonal",
    "ZonalTrajectory",
    "wasserstein",
    "wasserstein_result",
    "Result",
    "integrate",
    "kernel_sums",
    "load",
    "save",
    "resume",
    "WflowError",
    "SolverError",
    "NotAGradientFlowError",
    "schemes",
    "sweep",
    "sphere",
    "theory",
    "plot",
    "io",
]


def _is_submodule(name: str) -> bool:
    return not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name], __name__), name)
    elif name in _MODULES or _is_submodule(name):
        value = importlib.import_module("." + name, __name__)
    else:
        raise AttributeError(f"module 'wflow' has no attribute {name!r}")
    globals()[name] = value  # the next look-up is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what static tools and IDEs see
    from . import io, plot, schemes, sphere, sweep, theory
    from .density import Density
    from .errors import NotAGradientFlowError, SolverError, WflowError
    from .kernels import kernel_sums
    from .measure import Atoms
    from .mesh import CircleMesh, SphereMesh
    from .models import SA, USA, Model, Perceptron
    from .solvers.base import Result, integrate
    from .solvers.control import StepControl
    from .solvers.eulerian import DensityTrajectory, solve_density
    from .solvers.lagrangian import LagrangianSolution, solve_lagrangian
    from .solvers.particles import Trajectory, simulate
    from .solvers.runs import load, resume, save
    from .solvers.saveat import SaveAt
    from .solvers.zonal import ZonalTrajectory, solve_zonal
    from .transport import wasserstein, wasserstein_result
