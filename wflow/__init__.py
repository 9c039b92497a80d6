"""wflow: mean-field dynamics of Transformers on the sphere.

Tokens are particles on :math:`S^{d-1}`, depth is time, self-attention moves each
token toward a softmax-weighted average of the others.  wflow solves the finite-N
particle system and its continuum limit (finite volume, Lagrangian quadrature, JKO
steps), and measures the Wasserstein distance between them.  See the documentation (docs/) for the mathematics and README.md for a tour.
"""

from . import io, plot, schemes, sphere, sweep, theory
from ._version import __version__
from .density import Density
from .errors import NotAGradientFlowError, SolverError, WflowError
from .kernels import kernel_sums
from .measure import Atoms
from .mesh import CircleMesh, SphereMesh
from .models import SA, USA, Model, Perceptron
from .solvers.base import Result, integrate
from .solvers.eulerian import DensityTrajectory, solve_density
from .solvers.lagrangian import LagrangianSolution, solve_lagrangian
from .solvers.particles import Trajectory, simulate
from .solvers.runs import load, resume, save
from .solvers.zonal import ZonalTrajectory, solve_zonal
from .transport import wasserstein, wasserstein_result

__all__ = [
    "__version__",
    "Atoms",
    "SA",
    "USA",
    "Perceptron",
    "Model",
    "simulate",
    "Density",
    "CircleMesh",
    "SphereMesh",
    "solve_density",
    "DensityTrajectory",
    "solve_lagrangian",
    "solve_zonal",
    "ZonalTrajectory",
    "schemes",
    "sweep",
    "LagrangianSolution",
    "wasserstein",
    "wasserstein_result",
    "Trajectory",
    "Result",
    "integrate",
    "kernel_sums",
    "load",
    "save",
    "resume",
    "sphere",
    "theory",
    "plot",
    "io",
    "WflowError",
    "SolverError",
    "NotAGradientFlowError",
]
