"""What every method of :mod:`wflow.transport` shares: the result type and the input checks.

:class:`WassersteinResult` is what :func:`wflow.transport.wasserstein_result` returns;
:func:`as_single` turns a measure (atoms, an array of points, a density) into float64
points and weights with zero-weight atoms dropped.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import numbers
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import short_repr
from ..measure import Atoms, as_atoms

__all__ = [
    "COSTS",
    "TWO_PI",
    "WassersteinResult",
    "check_p",
    "check_choice",
    "as_single",
    "import_pot",
]

log = logging.getLogger(__name__)

COSTS = ("geodesic", "chordal")
TWO_PI = 2.0 * np.pi


@dataclass(frozen=True)
class WassersteinResult:
    """A Wasserstein distance with the facts needed to trust it.

    Attributes
    ----------
    value : float
        The distance :math:`W_p` (radians of the unit sphere), not :math:`W_p^p`.
    p : float
        Order of the distance.
    method : str
        The method that ran (``"auto"`` is resolved).
    cost : str
        ``"geodesic"`` or ``"chordal"``.
    exact : bool
        True when ``value`` is the exact :math:`W_p` up to round-off.
    error_bound : float
        Bound on ``|value - W_p|``: ``0.0`` for exact methods, the Sinkhorn bias bound for
        ``"sinkhorn"`` (valid at convergence), ``nan`` where none is known (``"sliced"``).
    info : dict
        Method details: ``reg``, ``n_iter``, ``converged``, ``divergence`` (Sinkhorn),
        ``n_projections`` (sliced), ``lower``/``upper`` (semidiscrete bracket on
        :math:`W_2`, with the solver's ``lo``/``hi`` on :math:`W_2^2`), sizes ``n`` and ``m``.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.transport import wasserstein_result
    >>> r = wasserstein_result(wflow.Atoms([[1.0, 0.0, 0.0]]), wflow.Atoms([[0.0, 1.0, 0.0]]))
    >>> round(r.value, 6), r.method, r.exact, r.error_bound  # two Diracs a quarter circle apart
    (1.570796, 'emd', True, 0.0)
    """

    value: float
    p: float
    method: str
    cost: str
    exact: bool
    error_bound: float
    info: dict = field(default_factory=dict)

    def __float__(self) -> float:
        return self.value


class Distance(float):
    """A Wasserstein distance that is a float and shows how far it can be trusted.

    :func:`~wflow.transport.wasserstein` returns one: it computes like the float ``value``
    and its ``repr`` shows the bracket of a certified method, the bias bound of Sinkhorn, or
    that the value is exact.  The full :class:`WassersteinResult` is ``.result``.

    Examples
    --------
    >>> from wflow.transport import Distance, WassersteinResult
    >>> d = Distance(WassersteinResult(0.25, 2, "multiscale", "geodesic", False, 1e-4))
    >>> d, round(d * 2, 6), d.lower, d.upper
    (0.25 (W_2 in [0.2499, 0.2501], multiscale), 0.5, 0.2499, 0.2501)
    """

    result: WassersteinResult

    def __new__(cls, result: WassersteinResult) -> Distance:
        obj = super().__new__(cls, result.value)
        obj.result = result
        return obj

    def __reduce__(self):
        return (Distance, (self.result,))

    @property
    def lower(self) -> float:
        """Lower end of the interval known to hold :math:`W_p` (``nan`` where none is known)."""
        return float(self.result.info.get("lower", self.result.value - self.result.error_bound))

    @property
    def upper(self) -> float:
        """Upper end of that interval."""
        return float(self.result.info.get("upper", self.result.value + self.result.error_bound))

    @property
    def method(self) -> str:
        return self.result.method

    def __repr__(self) -> str:
        r = self.result
        w = f"W_{r.p:g}"
        if r.exact:
            return f"{r.value!r} ({w} exact, {r.method})"
        if not math.isfinite(r.error_bound):
            return f"{r.value:.6g} ({w} not bounded, {r.method})"
        return f"{r.value:.6g} ({w} in [{self.lower:.6g}, {self.upper:.6g}], {r.method})"


# -- input checks ---------------------------------------------------------------------
#: the smallest residual tolerance of Sinkhorn's potentials, relative to diam^p, that float64 resolves
SINKHORN_RESOLUTION = 2.0**-46


def max_p(cost: str) -> float:
    """The largest order ``p`` whose cost ``diam^p`` is a finite float64: ``log(max float) / log(diam)``,
    ``diam`` = pi (geodesic) or 2 (chordal).

    Examples
    --------
    >>> round(max_p("geodesic"), 2), round(max_p("chordal"), 2)
    (620.04, 1024.0)
    """
    diam = math.pi if cost == "geodesic" else 2.0
    return math.log(float(np.finfo(np.float64).max)) / math.log(diam)


def check_p(p: Any) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"p must be a real number >= 1, got {short_repr(p)}")
    v = float(p)
    if not np.isfinite(v) or v < 1:
        raise ValueError(
            f"p must be a finite number >= 1 (W_p is a distance only for p >= 1), got {p!r}"
        )
    return v


def check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {choices}, got {short_repr(value)}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def as_single(mu: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Points ``(n, d)`` and weights ``(n,)`` in float64, zero-weight atoms dropped."""
    if not isinstance(mu, Atoms) and callable(getattr(mu, "to_atoms", None)):
        converted = mu.to_atoms()
        if not isinstance(converted, Atoms):
            raise TypeError(
                f"{name}.to_atoms() must return a wflow.Atoms, got {short_repr(converted)}"
            )
        mu = converted
    elif not isinstance(mu, Atoms):
        if isinstance(mu, str):
            raise ValueError(
                f"{name} must be a measure; the only string accepted is nu='uniform', got {mu!r}"
            )
        if not isinstance(mu, (np.ndarray, list, tuple)):
            raise TypeError(
                f"{name} must be a wflow.Atoms, an object with a to_atoms() method (a density) or an array of "
                f"points on the sphere, got {short_repr(mu)}"
            )
        mu = as_atoms(mu, name)
    if mu.batch_shape:
        raise ValueError(
            f"{name} is a batch of {mu.batch_shape} systems; wasserstein takes single measures: pass {name}[k]"
        )
    x = np.asarray(mu.points, dtype=np.float64)
    w = np.asarray(mu.weights, dtype=np.float64)
    keep = w > 0
    if not np.all(keep):
        x, w = x[keep], w[keep]
    return x, w / w.sum()


def import_pot() -> Any:
    """The POT module ``ot``, imported with wflow's KeOps settings: where GeomLoss is installed,
    ``import ot`` imports pykeops, which then uses wflow's cache folder
    (:func:`wflow.kernels.keops_backend.keops_cache_dir`) and prints to the debug log."""
    if "ot" in sys.modules:
        return sys.modules["ot"]
    from ..kernels.keops_backend import keops_cache_dir

    os.environ.setdefault("KEOPS_CACHE_FOLDER", str(keops_cache_dir()))
    os.environ.setdefault("PYKEOPS_VERBOSE", "0")
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        import ot
    if sink.getvalue().strip():
        log.debug("importing POT said: %s", sink.getvalue().strip())
    return ot
