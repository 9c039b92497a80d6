r"""Kernel sums, the cost centre of every wflow solver.

For query points :math:`x_i`, sources :math:`y_j` with weights :math:`w_j` and logits
:math:`\ell_{ij} = \beta\langle Q x_i, K y_j\rangle`, :func:`kernel_sums` returns

.. math::

    s^0_i = \sum_j w_j e^{\ell_{ij} - c_i}, \qquad
    s^1_i = \sum_j w_j e^{\ell_{ij} - c_i}\, V y_j, \qquad
    c_i = \max_j (\ell_{ij} + \log w_j),

so the true sums are :math:`e^{c_i} s^0_i` and :math:`e^{c_i} s^1_i`.  Carrying the
shift :math:`c_i` as a log-scale keeps every backend finite for :math:`\beta` up to
:math:`10^3` and beyond: the largest term is exactly 1 and exponents are clamped
below (at -80 in float32, -700 in float64) so that no subnormal numbers appear; the
clamped terms are below :math:`e^{-80}` relative to the largest.  The softmax (SA)
velocity is :math:`s^1/s^0`; the unnormalized (USA) one is :math:`e^{c} s^1`.

Kernel sums know nothing about models.  Backends are looked up by name in
:data:`BACKENDS`; each is a :class:`Backend` with an ``available()`` check and a
``__call__(problem) -> KernelSums``.  ``"auto"`` asks each backend in
:data:`AUTO_ORDER` whether it takes the problem.

Modules: :mod:`~wflow.kernels.sums` (the contract, re-exported here), the backends
(``numpy_backend``, ``numba_backend``, ``keops_backend``, ``torch_backend``, ``spectral``), the
numba backend's tiny-systems route (``small``, ``cost``) and the compiled building blocks shared
with the fused step (``jit``, ``threads``, ``precision``, ``dense``, ``numba_passes``).  Nothing
here imports a model, a solver or a diagnostic.
"""

from __future__ import annotations

from .sums import (
    AUTO_ORDER,
    BACKENDS,
    Backend,
    KernelProblem,
    KernelSums,
    available_backends,
    exp_floor,
    kernel_sums,
    register_backend,
)

__all__ = [
    "KernelProblem",
    "KernelSums",
    "Backend",
    "BACKENDS",
    "AUTO_ORDER",
    "kernel_sums",
    "register_backend",
    "available_backends",
    "exp_floor",
]

from . import keops_backend as _keops_backend  # noqa: F401  (registers "keops")
from . import numba_backend as _numba_backend  # noqa: F401  (registers "numba")
from . import numpy_backend as _numpy_backend  # noqa: F401  (registers "numpy")
from . import spectral as _spectral  # noqa: F401  (registers "spectral")
from . import torch_backend as _torch_backend  # noqa: F401  (registers "torch"; imports no torch)

# What "auto" tries, in order (each backend's accepts_auto says when).
AUTO_ORDER[:] = [
    name for name in ("keops", "torch", "spectral", "numba", "numpy") if name in BACKENDS
]
