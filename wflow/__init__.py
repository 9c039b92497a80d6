"""wflow: mean-field dynamics of Transformers on the sphere.

Tokens are particles on :math:`S^{d-1}`, depth is time, self-attention moves each
token toward a softmax-weighted average of the others.  wflow solves the finite-N
particle system and (as they land) its continuum limit, and measures the distance
between them.  See DESIGN.md for the mathematics and README.md for a tour.
"""
from ._version import __version__
from . import sphere, theory
from .errors import NotAGradientFlowError, SolverError, WflowError
from .io import load, resume, save
from .kernels import kernel_sums
from .measure import Atoms
from .models import SA, USA, Model, Perceptron
from .solvers.particles import Trajectory, simulate

__all__ = [
    "__version__",
    "Atoms",
    "SA",
    "USA",
    "Perceptron",
    "Model",
    "simulate",
    "Trajectory",
    "kernel_sums",
    "load",
    "save",
    "resume",
    "sphere",
    "theory",
    "WflowError",
    "SolverError",
    "NotAGradientFlowError",
]
