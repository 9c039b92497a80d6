r"""A cost model of the numba backend's routes for batches of tiny systems, from which ``auto`` picks.

Kernel sums of ``B`` systems of ``n`` query rows and ``m`` sources, logit dimension ``p`` and
value dimension ``q`` (:func:`wflow.kernels.kernel_sums`) can take four routes of the numba
backend when the systems are tiny (``n, m <=`` :data:`~wflow.kernels.small.SMALL_MAX`):

* ``"fused"`` and ``"gemm"``, the two methods of :mod:`wflow.kernels.small` (one compiled pass
  per system; batched GEMMs around one exponential pass);
* ``"direct"`` and ``"blas"``, the routes built for large systems (tiled compiled sums; blocked
  GEMMs in Python tasks).

The time of each is modelled as

.. math::

    t = c_0 + c_1 B + c_2\, B n m + c_3\, B n m (p + q)

-- per call, per system, per pair and per multiply-add -- with non-negative coefficients for
each route and input dtype, fitted to measured times by :func:`fit` and stored in
:data:`COSTS`.  ``python -m benchmarks.small_systems --costs`` measures the four routes on a
grid of shapes and prints the fitted coefficients, to paste here on another machine.

Examples
--------
>>> import numpy as np
>>> from wflow.kernels import cost
>>> t = {r: cost.predict(r, 256, 32, 32, 8, 8, np.float64) for r in cost.ROUTES}
>>> cost.cheapest(256, 32, 32, 8, 8, np.float64) == min(t, key=t.get)
True
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

__all__ = ["ROUTES", "COSTS", "features", "predict", "cheapest", "fit"]

#: The routes the model prices.
ROUTES = ("fused", "gemm", "direct", "blas")

#: Coefficients ``(c0, c1, c2, c3)`` in seconds of the model above, per ``(route, dtype name)``.
COSTS: dict[tuple[str, str], tuple[float, float, float, float]] = {
    ("fused", "float64"): (5.270e-05, 7.600e-07, 3.724e-09, 1.495e-10),
    ("gemm", "float64"): (9.822e-05, 1.601e-06, 5.421e-09, 7.003e-11),
    ("direct", "float64"): (5.257e-04, 2.544e-06, 4.873e-09, 1.782e-10),
    ("blas", "float64"): (1.160e-04, 3.310e-05, 4.079e-09, 1.365e-10),
    ("fused", "float32"): (9.146e-05, 1.333e-06, 3.370e-09, 1.716e-10),
    ("gemm", "float32"): (1.367e-04, 2.585e-06, 5.052e-09, 8.325e-11),
    ("direct", "float32"): (9.283e-04, 1.913e-05, 0.000e00, 2.382e-10),
    ("blas", "float32"): (1.276e-04, 4.116e-05, 2.229e-09, 1.269e-10),
}


def _dtype_name(dtype) -> str:
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in ("float32", "float64"):
        raise ValueError(f"dtype must be float32 or float64, got {name}")
    return name


def _check_sizes(B, n, m, p, q) -> None:
    for name, v in (("B", B), ("n", n), ("m", m), ("p", p), ("q", q)):
        if int(v) != v or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")


def features(B: int, n: int, m: int, p: int, q: int) -> np.ndarray:
    """The model's four terms ``(1, B, B n m, B n m (p + q))`` as float64.

    Examples
    --------
    >>> features(2, 3, 4, 5, 1).tolist()
    [1.0, 2.0, 24.0, 144.0]
    """
    _check_sizes(B, n, m, p, q)
    pairs = float(B) * n * m
    return np.array([1.0, float(B), pairs, pairs * (p + q)])


def _price(c, B, n, m, p, q) -> float:
    """The model's time for coefficients ``c`` (plain floats: it runs for every tiny kernel sum)."""
    pairs = float(B) * n * m
    return c[0] + c[1] * B + c[2] * pairs + c[3] * pairs * (p + q)


def predict(route: str, B: int, n: int, m: int, p: int, q: int, dtype, costs=None) -> float:
    """Predicted seconds of one kernel sum by ``route`` (one of :data:`ROUTES`) for input ``dtype``."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    _check_sizes(B, n, m, p, q)
    return float(
        _price((COSTS if costs is None else costs)[(route, _dtype_name(dtype))], B, n, m, p, q)
    )


def cheapest(
    B: int, n: int, m: int, p: int, q: int, dtype, routes: Iterable[str] = ROUTES, costs=None
) -> str:
    """The route of ``routes`` with the least predicted time (the first of equals, in the order given)."""
    routes = tuple(routes)
    if not routes:
        raise ValueError("routes must name at least one route")
    _check_sizes(B, n, m, p, q)
    table = COSTS if costs is None else costs
    name = _dtype_name(dtype)
    best, best_t = None, math.inf
    for r in routes:
        if r not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}, got {r!r}")
        t = _price(table[(r, name)], B, n, m, p, q)
        if t < best_t:
            best, best_t = r, t
    return best if best is not None else routes[0]


def fit(samples: Iterable[tuple]) -> dict[tuple[str, str], tuple[float, float, float, float]]:
    """Coefficients of the model from measured times: ``samples`` of ``(route, dtype, B, n, m, p, q,
    seconds)``; for each ``(route, dtype)`` the non-negative coefficients minimizing the sum of squared
    *relative* errors (:func:`scipy.optimize.nnls`).

    Examples
    --------
    >>> true = (1e-4, 2e-6, 3e-9, 1e-10)
    >>> shapes = [(B, n, p) for B in (1, 16, 256) for n in (32, 64, 256) for p in (3, 8, 128)]
    >>> samples = [("fused", "float64", B, n, n, p, p, float(features(B, n, n, p, p) @ true)) for B, n, p in shapes]
    >>> got = fit(samples)[("fused", "float64")]
    >>> bool(np.allclose(got, true, rtol=1e-8))
    True
    """
    from scipy.optimize import nnls

    rows: dict[tuple[str, str], list[np.ndarray]] = {}
    for route, dtype, B, n, m, p, q, seconds in samples:
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
        if not (np.isfinite(seconds) and seconds > 0):
            raise ValueError(
                f"a measured time must be finite and positive, got {seconds!r} for {route} B={B} n={n}"
            )
        rows.setdefault((route, _dtype_name(dtype)), []).append(features(B, n, m, p, q) / seconds)
    out: dict[tuple[str, str], tuple[float, float, float, float]] = {}
    for key, feats in rows.items():
        A = np.array(feats)
        scale = np.maximum(A.max(axis=0), 1e-300)  # columns of comparable size for the solver
        c, _ = nnls(A / scale, np.ones(len(A)))
        c0, c1, c2, c3 = (float(v) for v in c / scale)  # the four features
        out[key] = (c0, c1, c2, c3)
    return out
