"""wflow: mean-field dynamics of Transformers on the sphere."""
from ._version import __version__
from .measure import Atoms
from .kernels import kernel_sums

__all__ = ["__version__", "Atoms", "kernel_sums"]
