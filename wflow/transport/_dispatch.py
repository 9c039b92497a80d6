"""The front doors of :mod:`wflow.transport` and the one dispatch on ``method``.

:func:`wasserstein_result` checks what every method shares, resolves ``method="auto"`` and
hands the atoms to the method's runner in :data:`RUNNERS`, which checks its own options and
packs a :class:`~wflow.transport.WassersteinResult`; :func:`wasserstein` and
:func:`sinkhorn_divergence` read one field of that result.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from .._typing import SeedLike
from ..errors import check_int, check_positive, notice, short_repr
from ._circle import circle_wpp, w2_to_uniform_circle
from ._common import (
    COSTS,
    SINKHORN_RESOLUTION,
    Distance,
    WassersteinResult,
    as_single,
    check_choice,
    check_p,
    max_p,
)
from ._emd import emd_wpp
from ._sinkhorn import sinkhorn
from ._sliced import sliced_ssw

__all__ = [
    "METHODS",
    "RUNNERS",
    "auto_method",
    "wasserstein",
    "wasserstein_result",
    "sinkhorn_divergence",
]

#: a method's runner: ``(x, a, y, b, p, cost, info, options) -> WassersteinResult``
Runner = Callable[
    [np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, str, dict, dict], WassersteinResult
]


def _exact(wpp: float, p: float, method: str, cost: str, info: dict) -> WassersteinResult:
    """The result of an exact method from its :math:`W_p^p`."""
    return WassersteinResult(max(wpp, 0.0) ** (1 / p), p, method, cost, True, 0.0, info)


def _warn(message: str) -> None:
    """A ``UserWarning`` shown at the caller of :func:`wasserstein` / :func:`wasserstein_result`."""
    warnings.warn(message, UserWarning, stacklevel=5)


# -- one runner per method: its own checks, the computation, the result ----------------
def _run_circle(x, a, y, b, p, cost, info, opts) -> WassersteinResult:
    d = x.shape[1]
    if d != 2 or cost != "geodesic":
        raise ValueError(
            f"method='circle' needs measures on S^1 (d=2) and cost='geodesic', got d={d}, cost={cost!r}"
        )
    return _exact(circle_wpp(x, a, y, b, p), p, "circle", cost, info)


def _run_emd(x, a, y, b, p, cost, info, opts) -> WassersteinResult:
    n, m, max_emd = x.shape[0], y.shape[0], opts["max_emd"]
    if max(n, m) > max_emd and not opts["allow_large"]:
        raise ValueError(
            f"method='emd' on n={n}, m={m} atoms exceeds max_emd={max_emd} (time grows like N^3, memory like N^2); "
            "pass allow_large=True to run it anyway, or use method='sinkhorn' or 'sliced'"
        )
    wpp, extra = emd_wpp(x, a, y, b, p, cost)
    info.update(extra)
    return _exact(wpp, p, "emd", cost, info)


def _run_semidiscrete(x, a, y, b, p, cost, info, opts) -> WassersteinResult:
    n, m = x.shape[0], y.shape[0]
    if p != 2:
        raise ValueError(f"method='semidiscrete' computes W_2 (p=2) only, got p={p:g}")
    if min(n, m) < 2:
        raise ValueError(
            f"method='semidiscrete' needs at least 2 atoms on each side, got n={n}, m={m}"
        )
    from .semidiscrete import semidiscrete_w2

    coarse, fine = ((x, a), (y, b)) if n <= m else ((y, b), (x, a))
    r = semidiscrete_w2(coarse[0], coarse[1], fine[0], fine[1])
    lo, hi = math.sqrt(max(r["lo"], 0.0)), math.sqrt(max(r["hi"], 0.0))
    if cost == "geodesic":  # theta = 2 arcsin(c/2) <= c 2 arcsin(c_max/2)/c_max on the support
        cm = min(r["chord_max"], 2.0)
        hi *= 2.0 * math.asin(cm / 2.0) / cm if cm > 0 else 1.0
    info.update({k: v for k, v in r.items() if k != "psi"}, lower=lo, upper=hi)
    if not r["converged"]:
        why = (
            f"stalled after {r['failed_line_searches']} failed line searches, {r['newton_steps']} steps"
            if r["stalled"]
            else f"{r['newton_steps']} steps"
        )
        _warn(
            f"semidiscrete: Newton stopped early ({why}; marginal error {r['marginal_error']:.3g}); the "
            f"bracket [{lo:.6g}, {hi:.6g}] is valid but wide"
        )
    return WassersteinResult(0.5 * (lo + hi), p, "semidiscrete", cost, False, 0.5 * (hi - lo), info)


def _run_multiscale(x, a, y, b, p, cost, info, opts) -> WassersteinResult:
    if p != 2:
        raise ValueError(f"method='multiscale' computes W_2 (p=2) only, got p={p:g}")
    from .multiscale import certified_w2

    tol = 1e-3 if opts["tol"] is None else opts["tol"]
    seed = 0 if opts["seed"] is None else opts["seed"]
    r = certified_w2(x, y, a, b, cost=cost, reg=opts["reg"], tol=tol, seed=seed)
    info.update(r)
    if not r["certified"]:
        _warn(
            f"multiscale: bracket [{r['lower']:.6g}, {r['upper']:.6g}] is wider than tol={tol:g} "
            f"(relative width {r['rel_width']:.2g}) after {r['levels']} eps levels; it is still valid"
        )
    half = 0.5 * (r["upper"] - r["lower"])
    return WassersteinResult(r["value"], p, "multiscale", cost, False, half, info)


def _run_sliced(x, a, y, b, p, cost, info, opts) -> WassersteinResult:
    n_projections = check_int(opts["n_projections"], "n_projections")
    if cost != "geodesic":
        raise ValueError(
            f"method='sliced' uses the geodesic cost on great circles, got cost={cost!r}"
        )
    if x.shape[1] == 2:  # the only great circle is the circle itself: exact
        return _exact(circle_wpp(x, a, y, b, p), p, "sliced", cost, info)
    info["n_projections"] = n_projections
    value = sliced_ssw(x, a, y, b, p, n_projections, opts["seed"])
    return WassersteinResult(value, p, "sliced", cost, False, float("nan"), info)


def _run_sinkhorn(x, a, y, b, p, cost, info, opts) -> WassersteinResult:
    reg = check_positive(opts["reg"], "reg")
    scaling = check_positive(opts["scaling"], "scaling")
    if not scaling < 1:
        raise ValueError(f"scaling must be in (0, 1), got {scaling!r}")
    tol = 0.1 * reg if opts["tol"] is None else check_positive(opts["tol"], "tol")
    # potentials of size diam^p carry float64 rounding of about 2^-46 diam^p: a residual below
    # that marks a spurious fixed point of the soft c-transforms, not convergence
    floor = SINKHORN_RESOLUTION * (math.pi if cost == "geodesic" else 2.0) ** p
    if tol < floor:
        what = f"reg={reg!r} (tol = 0.1 reg)" if opts["tol"] is None else f"tol={tol!r}"
        raise ValueError(
            f"sinkhorn cannot resolve {what}: its potentials, of size diam^p, carry float64 rounding "
            f"of about {floor:.1e}, so a residual below that marks no convergence; use reg >= "
            f"{10 * floor:.1e} (and tol >= {floor:.1e}), or method='emd' for the exact value"
        )
    max_iter = check_int(opts["max_iter"], "max_iter", minimum=0)
    backend = check_choice(opts["backend"], "backend", ("auto", "keops", "numpy"))
    div, extra = sinkhorn(x, a, y, b, p, cost, reg, scaling, tol, max_iter, backend)
    info.update(extra)
    if not extra["converged"]:
        _warn(
            f"Sinkhorn did not converge in max_iter={max_iter} passes at reg={reg:g} (residual {extra['residual']:.3g} "
            f"> tol {tol:.3g}); raise max_iter or reg"
        )
    # The bias bound holds for the exact potentials; without convergence none is known.
    bound = extra["bias_bound_pth_power"] ** (1 / p) if extra["converged"] else float("nan")
    return WassersteinResult(max(div, 0.0) ** (1 / p), p, "sinkhorn", cost, False, bound, info)


#: the methods of :func:`wasserstein` (besides ``"auto"``) and their runners
RUNNERS: dict[str, Runner] = {
    "circle": _run_circle,
    "emd": _run_emd,
    "sinkhorn": _run_sinkhorn,
    "sliced": _run_sliced,
    "semidiscrete": _run_semidiscrete,
    "multiscale": _run_multiscale,
}
METHODS = ("auto", *RUNNERS)


#: solves of n x m atoms that take seconds or more announce themselves on stderr (``notice``)
NOTICE_PAIRS = {"emd": 4_000_000, "sinkhorn": 4_000_000, "multiscale": 10**8, "semidiscrete": 10**7}


def auto_method(d: int, n: int, m: int, cost: str, max_emd: int, p: float = 2) -> str:
    """What ``method="auto"`` runs: ``circle`` on S^1 (geodesic cost), ``emd`` up to ``max_emd`` atoms;
    beyond, ``multiscale`` for :math:`W_2` (a certified bracket of relative width 1e-3) and
    ``sinkhorn`` for other ``p``.

    Examples
    --------
    >>> from wflow.transport._dispatch import auto_method
    >>> auto_method(2, 10, 10, "geodesic", 5000), auto_method(3, 10, 10, "geodesic", 5000)
    ('circle', 'emd')
    >>> auto_method(3, 10**4, 10**4, "chordal", 5000), auto_method(3, 10**4, 10**4, "geodesic", 5000, p=1)
    ('multiscale', 'sinkhorn')
    """
    if d == 2 and cost == "geodesic":
        return "circle"
    if max(n, m) <= max_emd:
        return "emd"
    return "multiscale" if p == 2 else "sinkhorn"


def _to_uniform(mu: Any, nu: Any, p: float, method: str, cost: str) -> WassersteinResult:
    """``nu="uniform"`` (or ``mu``): the closed form on the circle."""
    other, which = (mu, nu) if isinstance(nu, str) else (nu, mu)
    if which != "uniform" or isinstance(other, str):
        got = f"mu={mu!r}, nu={nu!r}" if isinstance(other, str) else repr(which)
        raise ValueError(f"the only string accepted as a measure is 'uniform', got {got}")
    if method not in ("auto", "circle"):
        raise ValueError(
            f"nu='uniform' is computed in closed form (method='auto' or 'circle'), got method={method!r}"
        )
    if p != 2 or cost != "geodesic":
        raise ValueError(
            f"W_p to the uniform law has a closed form for p=2 and the geodesic cost only, got p={p:g}, cost={cost!r}; "
            "discretize the uniform law instead (e.g. wflow.sphere.circle_nodes) and use method='circle'"
        )
    value = w2_to_uniform_circle(other)
    return WassersteinResult(
        value, p, "uniform", cost, True, 0.0, {"n": as_single(other, "mu")[0].shape[0]}
    )


# -- front doors ------------------------------------------------------------------------
def wasserstein_result(
    mu: Any,
    nu: Any,
    p: float = 2,
    *,
    method: str = "auto",
    cost: str = "geodesic",
    max_emd: int = 5000,
    allow_large: bool = False,
    reg: float = 1e-2,
    n_projections: int = 50,
    seed: SeedLike = None,
    scaling: float = 0.8,
    tol: float | None = None,
    max_iter: int = 200,
    backend: str = "auto",
) -> WassersteinResult:
    """Like :func:`wasserstein`, returning a :class:`WassersteinResult` (value, method, exactness, error bound).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.transport import wasserstein_result
    >>> x, y = wflow.sphere.uniform(20, 3, seed=0), wflow.sphere.uniform(20, 3, seed=1)
    >>> exact = wasserstein_result(x, y)
    >>> approx = wasserstein_result(x, y, method="sinkhorn", backend="numpy")
    >>> exact.method, exact.exact, approx.method, approx.exact
    ('emd', True, 'sinkhorn', False)
    >>> bool(abs(approx.value - exact.value) <= approx.error_bound)
    True
    """
    p = check_p(p)
    method = check_choice(method, "method", METHODS)
    cost = check_choice(cost, "cost", COSTS)
    if p > max_p(cost):
        raise ValueError(
            f"p={p!r} is above {max_p(cost):.6g}: the {cost} cost d^p of the sphere's diameter "
            f"({'pi' if cost == 'geodesic' else '2'}) overflows float64, so W_p^p is not representable; "
            f"use p <= {max_p(cost):.6g}"
        )
    max_emd = check_int(max_emd, "max_emd")
    if not isinstance(allow_large, (bool, np.bool_)):
        raise TypeError(f"allow_large must be True or False, got {short_repr(allow_large)}")
    if isinstance(nu, str) or isinstance(mu, str):
        return _to_uniform(mu, nu, p, method, cost)

    x, a = as_single(mu, "mu")
    y, b = as_single(nu, "nu")
    if x.shape[1] != y.shape[1]:
        raise ValueError(
            f"mu and nu must live on the same sphere: mu has d={x.shape[1]} (S^{x.shape[1] - 1}), "
            f"nu has d={y.shape[1]} (S^{y.shape[1] - 1})"
        )
    d, n, m = x.shape[1], x.shape[0], y.shape[0]
    if method == "auto":
        method = auto_method(d, n, m, cost, max_emd, p)
    options = {
        "max_emd": max_emd,
        "allow_large": allow_large,
        "reg": reg,
        "n_projections": n_projections,
        "seed": seed,
        "scaling": scaling,
        "tol": tol,
        "max_iter": max_iter,
        "backend": backend,
    }
    if n * m >= NOTICE_PAIRS.get(method, math.inf):
        notice(f"W_{p:g} by {method} between {n} and {m} atoms (seconds or more)")
    return RUNNERS[method](x, a, y, b, p, cost, {"n": n, "m": m}, options)


def wasserstein(
    mu: Any,
    nu: Any,
    p: float = 2,
    *,
    method: str = "auto",
    cost: str = "geodesic",
    max_emd: int = 5000,
    allow_large: bool = False,
    reg: float = 1e-2,
    n_projections: int = 50,
    seed: SeedLike = None,
    scaling: float = 0.8,
    tol: float | None = None,
    max_iter: int = 200,
    backend: str = "auto",
) -> Distance:
    r"""Wasserstein distance :math:`W_p(\mu, \nu)` on :math:`S^{d-1}`, in radians of the unit sphere.

    Parameters
    ----------
    mu, nu : Atoms, array of points ``(n, d)``, or an object with ``to_atoms()``
        Single measures (no batch axes: pass ``mu[k]`` for one system of a batch) on the
        same sphere.  A density (``wflow.Density``) is replaced by its cell-centre atoms:
        the result is then within the largest cell radius of the distance between
        densities.  ``nu="uniform"`` (circle, ``p=2``) gives :func:`w2_to_uniform_circle`.
    p : float, >= 1
        Order of the distance.
    method : {"auto", "circle", "emd", "sinkhorn", "sliced", "semidiscrete", "multiscale"}
        ``"circle"``: exact on :math:`S^1`, O(N log N) (POT ``wasserstein_circle``).
        ``"emd"``: exact linear program (POT ``emd2``), any d and cost; refused above
        ``max_emd`` atoms unless ``allow_large``.
        ``"sinkhorn"``: :math:`\max(S_\varepsilon,0)^{1/p}` from the debiased Sinkhorn
        divergence (:func:`sinkhorn_divergence`), :math:`|S_\varepsilon - W_p^p| \le
        \varepsilon\log N`.
        ``"sliced"``: spherical sliced Wasserstein (Bonet et al., ICLR 2023) over
        ``n_projections`` random great circles: a cheap proxy, *not* :math:`W_p` nor a bound
        on it; on :math:`S^1` the exact circle distance.
        ``"semidiscrete"``: :math:`W_2` between the smaller measure and a much finer one (16
        or more atoms per atom), e.g. a fine quadrature of a continuum
        (:mod:`wflow.transport.semidiscrete`).
        ``"multiscale"``: :math:`W_2` by truncated multiscale Sinkhorn
        (:func:`wflow.transport.multiscale.certified_w2`).
        Both return the midpoint of a certified bracket, ``error_bound`` its half-width.
        ``"auto"``: circle for d = 2 (geodesic), emd up to ``max_emd`` atoms; beyond, multiscale
        for p = 2, sinkhorn for other p.  Between particles and a fine quadrature of a
        density, ``"semidiscrete"`` is the faster certified choice.
    cost : {"geodesic", "chordal"}
        Ground distance :math:`\theta = \arccos\langle x,y\rangle` or :math:`|x-y| = 2\sin(\theta/2)`.
    max_emd : int
        Size limit (atoms in either measure) for ``"emd"`` and for ``"auto"`` to choose it.
    allow_large : bool
        Run ``"emd"`` above ``max_emd`` anyway.
    reg : float
        Sinkhorn :math:`\varepsilon` in units of :math:`c^p` (default 1e-2).
    n_projections, seed
        Sliced method: number of great circles and their random seed.
    scaling, tol, max_iter, backend
        Sinkhorn: :math:`\varepsilon`-scaling factor (on the blur :math:`\varepsilon^{1/p}`),
        residual tolerance (default ``0.1 * reg``; for ``"multiscale"`` the relative
        bracket width, default 1e-3), passes at the final
        :math:`\varepsilon`, and ``"auto"``/``"keops"``/``"numpy"``.

    Returns
    -------
    Distance
        :math:`W_p` (not :math:`W_p^p`), a float whose ``repr`` shows the method and the
        interval known to hold :math:`W_p` (``.lower``, ``.upper``; ``.result`` is the
        :class:`WassersteinResult` of :func:`wasserstein_result`).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow import Atoms
    >>> from wflow.transport import wasserstein
    >>> mu = Atoms([[1.0, 0.0]]); nu = Atoms([[0.0, 1.0]])
    >>> round(wasserstein(mu, nu), 12) == round(np.pi / 2, 12)
    True
    """
    result = wasserstein_result(
        mu,
        nu,
        p,
        method=method,
        cost=cost,
        max_emd=max_emd,
        allow_large=allow_large,
        reg=reg,
        n_projections=n_projections,
        seed=seed,
        scaling=scaling,
        tol=tol,
        max_iter=max_iter,
        backend=backend,
    )
    return Distance(result)


def sinkhorn_divergence(
    mu: Any,
    nu: Any,
    p: float = 2,
    *,
    cost: str = "geodesic",
    reg: float = 1e-2,
    scaling: float = 0.8,
    tol: float | None = None,
    max_iter: int = 200,
    backend: str = "auto",
) -> float:
    r"""Debiased Sinkhorn divergence :math:`S_\varepsilon(\mu, \nu)`, an approximation of :math:`W_p^p`.

    .. math::
        S_\varepsilon(\mu,\nu) = \mathrm{OT}_\varepsilon(\mu,\nu) - \tfrac12\mathrm{OT}_\varepsilon(\mu,\mu)
        - \tfrac12\mathrm{OT}_\varepsilon(\nu,\nu),\quad
        \mathrm{OT}_\varepsilon = \min_\pi \int c^p\,d\pi + \varepsilon\,\mathrm{KL}(\pi\,|\,\mu\otimes\nu)

    with :math:`\varepsilon` = ``reg`` in the units of :math:`c^p` (radians^p for the
    geodesic cost), by the symmetric log-domain :math:`\varepsilon`-scaling loop of GeomLoss
    (Feydy et al., AISTATS 2019): :math:`\varepsilon` runs from :math:`\mathrm{diam}^p` down
    to ``reg`` by factors ``scaling**p``, then passes at ``reg`` until the potentials'
    fixed-point residual is below ``tol`` (default ``0.1 * reg``) or ``max_iter`` passes.
    Each pass is four soft-min reductions, O(N M), streamed by KeOps (``backend="keops"``) or
    by NumPy in row blocks (``"numpy"``); ``"auto"`` takes KeOps when it imports.

    Bias at convergence, for atoms with weight entropies :math:`H(a), H(b)`:
    :math:`-\varepsilon\frac{H(a)+H(b)}2 \le S_\varepsilon - W_p^p \le
    \varepsilon\min(H(a),H(b))`; take ``reg`` well below the :math:`W_p^p` to resolve
    (docs/transport.md).

    Returns
    -------
    float
        :math:`S_\varepsilon` (can be slightly negative); ``wasserstein(..., method="sinkhorn")``
        returns :math:`\max(S_\varepsilon, 0)^{1/p}`.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.transport import sinkhorn_divergence
    >>> a, b = wflow.Atoms([[1.0, 0.0, 0.0]]), wflow.Atoms([[0.0, 1.0, 0.0]])
    >>> bool(np.isclose(sinkhorn_divergence(a, b, backend="numpy"), (np.pi / 2) ** 2))  # Diracs: exactly W_2^2
    True
    """
    return wasserstein_result(
        mu,
        nu,
        p,
        method="sinkhorn",
        cost=cost,
        reg=reg,
        scaling=scaling,
        tol=tol,
        max_iter=max_iter,
        backend=backend,
    ).info["divergence"]
