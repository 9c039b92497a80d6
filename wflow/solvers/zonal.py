r"""The zonal solver: the mean-field equation on :math:`S^{d-1}`, any :math:`d \ge 2`, for zonal densities.

A zonal measure :math:`\mu = f(\langle x, e\rangle)\sigma` stays zonal under SA and USA with
:math:`Q = K = I`, :math:`V = \pm I`: a conservation law for the law of :math:`z = \langle x, e\rangle`
on :math:`[-1, 1]` (:mod:`wflow.zonal`, ``docs/zonal.md``), here under the solver contract.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from ..errors import check_int, check_positive, short_repr
from ..zonal import ZonalFV
from .base import Problem, Result, Tracker, get_solver, integrate, register_kind
from .trackers import ProgressBar

__all__ = ["ZonalProblem", "ZonalTrajectory", "solve_zonal", "w2_to_law", "law_quantile"]

logger = logging.getLogger(__name__)

#: what a zonal run's configuration holds of its problem (:meth:`ZonalProblem.config`)
_CONFIG_KEYS = "d n_cells attention beta sign kappa kernel grid kernel_method cfl max_step".split()


class ZonalProblem(Problem):
    r"""The zonal finite-volume scheme as a :class:`~wflow.solvers.base.Problem` (kind ``"zonal"``).

    State: the band masses :math:`m_i = \mu(z_i \le \langle x, e\rangle \le z_{i+1})`, shape ``(M,)``.

    Parameters
    ----------
    d : int
        Ambient dimension, ``>= 2``.
    n_cells : int
        Number of latitude bands ``M``.
    attention, beta, sign, kappa, kernel, grid, kernel_method
        As :class:`~wflow.zonal.ZonalFV`.
    cfl, max_step
        As :func:`solve_zonal`.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.zonal import ZonalProblem
    >>> problem = ZonalProblem(3, 16, beta=2.0)
    >>> masses = np.linspace(1.0, 2.0, 16) / 24.0  # 16 band masses summing to 1
    >>> problem.kind, problem.rhs(0.0, masses).shape, bool(abs(problem.rhs(0.0, masses).sum()) < 1e-15)
    ('zonal', (16,), True)
    """

    kind = "zonal"
    order = 2  # spatial order

    def __init__(
        self,
        d: int,
        n_cells: int,
        *,
        cfl: float = 0.9,
        max_step: float | None = None,
        **fv_options: Any,
    ):
        super().__init__()
        cfl = check_positive(cfl, "cfl")
        if cfl > 1:
            raise ValueError(f"cfl must be in (0, 1] (positivity needs dt <= dt_max), got {cfl}")
        if max_step is not None:
            max_step = check_positive(max_step, "max_step")
        self.fv = ZonalFV(d, n_cells, **fv_options)
        grid = fv_options.get("grid", "angle")
        self.grid = grid if isinstance(grid, str) else [float(z) for z in self.fv.edges]
        self.cfl = float(cfl)
        self.limit_slack = 1.0 / self.cfl  # stages are checked against dt_max itself
        self.max_step = max_step

    # -- the right-hand side -------------------------------------------------------------------------
    def positivity_rhs(self, masses: np.ndarray) -> tuple[np.ndarray, float]:
        """``(dm/dt, dt_max)``: the semi-discrete right-hand side and the positivity limit of forward Euler."""
        self.evaluations += 1
        return self.fv.rhs(masses)

    def rhs_with_limit(self, t: float, masses: np.ndarray) -> tuple[np.ndarray, float]:
        """``(dm/dt, cfl * dt_max)``, capped by ``max_step``."""
        dm, limit = self.positivity_rhs(masses)
        limit *= self.cfl
        if self.max_step is not None:
            limit = min(limit, self.max_step)
        return dm, limit

    def rhs(self, t: float, masses: np.ndarray) -> np.ndarray:
        return self.positivity_rhs(masses)[0]

    def remap_step(
        self, t: float, masses: np.ndarray, dt: float
    ) -> tuple[np.ndarray, np.ndarray] | None:
        r"""One step of the characteristic (semi-Lagrangian) scheme: ``(masses, second-order masses)``, or ``None``
        when characteristics cross within the step.

        The velocity of the polar angle at the start (:math:`u_0`), the end (:math:`u_2`, from second-order
        masses) and the half step (:math:`u_1`, traced in the field linear in time between them); every face
        is traced back by Kutta's third-order rule and the old masses are remapped onto the bands.  Third
        order in time, second in space; four velocity evaluations, no positivity limit.
        """
        if self.fv.inv_kappa:
            raise ValueError(
                "the remap step has no diffusion: kappa must be None (use method='ssprk3' with noise)"
            )
        fv = self.fv
        th = fv.theta_edges
        rec = fv.reconstruction(masses)  # of the old masses, shared by the four remaps below
        self.evaluations += 4
        u0 = fv.theta_velocity(rec[0])
        half = fv.departure(u0, 0.5 * dt)
        if np.any(np.diff(half) < 0):
            return None
        u1 = fv.theta_velocity(fv._remap(rec, half))
        second = fv.departure(u1, dt)
        if np.any(np.diff(second) < 0):
            return None
        m2 = fv._remap(rec, second)
        u2 = fv.theta_velocity(m2)
        # the half step again, traced by the midpoint rule in the field linear in time between u0 and u2
        # (both accurate to O(dt^3)): u1 from these masses is accurate to O(dt^3) as well
        half = fv.departure(0.5 * (u0 + u2), 0.5 * dt, u_mid=0.75 * u0 + 0.25 * u2)
        if np.any(np.diff(half) < 0):
            return None
        u1 = fv.theta_velocity(fv._remap(rec, half))
        # backward in time from t + dt: k1 = u(., t+dt), k2 = u(., t+dt/2), k3 = u(., t)
        k1 = u2
        k2 = np.interp(np.clip(th - 0.5 * dt * k1, 0.0, np.pi), th, u1)
        k3 = np.interp(np.clip(th - dt * (2.0 * k2 - k1), 0.0, np.pi), th, u0)
        dep = np.clip(th - dt * (k1 + 4.0 * k2 + k3) / 6.0, 0.0, np.pi)
        dep[0], dep[-1] = 0.0, np.pi
        if np.any(np.diff(dep) < 0):
            return None
        return fv._remap(rec, dep), m2

    def error_norm(self, err, y0, y1, rtol, atol) -> float:
        r""":math:`\|e\|_1 / (\text{atol} + \text{rtol}\,\|m^{n+1} - m^n\|_1)`: the error per unit of change."""
        return float(np.abs(err).sum() / (atol + rtol * np.abs(y1 - y0).sum()))

    def default_tolerances(self) -> tuple[float, float]:
        return 1e-3, 1e-12

    # -- what is saved ---------------------------------------------------------------------------------
    def snapshot(self, t: float, masses: np.ndarray) -> dict:
        return {
            "masses": (("cell",), np.array(masses, dtype=np.float64, copy=True)),
            "mass": ((), np.float64(masses.sum())),
            "mean_z": ((), np.float64(masses @ self.fv.centers)),
            "energy": ((), np.float64(self.fv.energy(masses))),
        }

    def static(self) -> dict:
        fv = self.fv
        return {
            "edges": (("face",), fv.edges),
            "centers": (("cell",), fv.centers),
            "log_volumes": (("cell",), fv.log_volumes),
        }

    def config(self) -> dict[str, Any]:
        own = {"grid": self.grid, "cfl": self.cfl, "max_step": self.max_step}
        return {"kind": self.kind} | {
            k: own[k] if k in own else getattr(self.fv, k) for k in _CONFIG_KEYS
        }

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ZonalProblem:
        """The problem a run's configuration describes (exactly the same grid and kernel)."""
        return cls(**{k: cfg[k] for k in _CONFIG_KEYS})

    def __repr__(self) -> str:
        return f"ZonalProblem({self.fv!r}, cfl={self.cfl:g})"


# ------------------------------------------------------------------------------ the law of z
def _cdf_at_edges(masses: np.ndarray) -> np.ndarray:
    """The CDF of the band law at the band edges, shape ``(M+1,)``."""
    c = np.concatenate([[0.0], np.cumsum(masses)])
    return c / c[-1]


def law_quantile(edges: np.ndarray, masses: np.ndarray, s: np.ndarray) -> np.ndarray:
    r"""Quantiles :math:`G^{-1}(s)` of the law of :math:`z` with band masses ``masses`` on ``edges``.

    :math:`G` is the piecewise-linear interpolant of the exact CDF values
    :math:`G(z_i) = \sum_{j<i} m_j` at the band edges (second order where the law is smooth).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.zonal import law_quantile
    >>> edges, masses = np.linspace(-1, 1, 3), np.array([0.5, 0.5])  # uniform on [-1, 1]
    >>> law_quantile(edges, masses, np.array([0.0, 0.25, 0.5, 1.0])).tolist()
    [-1.0, -0.5, 0.0, 1.0]
    """
    c = _cdf_at_edges(masses)
    keep = np.concatenate([[True], np.diff(c) > 0])  # drop empty bands (flat CDF pieces)
    return np.interp(s, c[keep], np.asarray(edges)[keep])


def w2_to_law(z: np.ndarray, edges: np.ndarray, masses: np.ndarray) -> float:
    r"""Exact 1-D :math:`W_2` between the empirical law of ``z`` and the band law (:func:`law_quantile`).

    .. math::

        W_2^2 = \int_0^1 |F_N^{-1}(s) - G^{-1}(s)|^2\,ds ,

    :math:`F_N^{-1}` piecewise constant (the sorted samples), :math:`G^{-1}` piecewise linear: a
    quadratic on every piece, integrated exactly.

    Parameters
    ----------
    z : ndarray, shape (N,)
        Samples of :math:`z = \langle x, e\rangle` (equal weights).
    edges : ndarray, shape (M+1,)
    masses : ndarray, shape (M,)

    Examples
    --------
    >>> import numpy as np
    >>> edges = np.linspace(-1, 1, 3); masses = np.array([0.5, 0.5])      # uniform on [-1, 1]
    >>> round(w2_to_law(np.array([0.0]), edges, masses) ** 2, 12)         # variance of U(-1, 1)
    0.333333333333
    """
    z = np.sort(np.asarray(z, dtype=float).ravel())
    N = z.size
    if N == 0:
        raise ValueError("z must hold at least one sample")
    c = _cdf_at_edges(masses)
    s = np.unique(np.concatenate([c, np.arange(N + 1) / N]))
    g = law_quantile(edges, masses, s)
    mid = 0.5 * (s[1:] + s[:-1])
    a = z[np.minimum((mid * N).astype(int), N - 1)]
    u0, u1 = a - g[:-1], a - g[1:]
    return float(np.sqrt(max(np.sum(np.diff(s) * (u0 * u0 + u0 * u1 + u1 * u1)) / 3.0, 0.0)))


# ------------------------------------------------------------------------------ the result
class ZonalTrajectory(Result):
    r"""Result of :func:`solve_zonal` (a :class:`~wflow.solvers.base.Result` of kind ``zonal``).

    Attributes
    ----------
    times : ndarray, shape (n_saves,)
    masses : ndarray, shape (n_saves, M)
        Band masses (the law of :math:`z` on the bands).
    values : ndarray, shape (n_saves, M)
        Cell averages :math:`m_i/(|S^{d-1}|\,V_i)` of the probability density w.r.t. the surface
        measure; ``inf`` where that overflows float64 (from ``d`` near 340): read :attr:`masses` there.
    mass, energy, mean_z : ndarray, shape (n_saves,)
        Total mass, :math:`\pm E_\beta` (the functional the flow ascends), :math:`\int z\,d\mu`.
    edges : ndarray, shape (M+1,)
    centers : ndarray, shape (M,)
        Weighted band centroids :math:`\bar z_i`.
    volumes : ndarray, shape (M,)
        :math:`V_i = \sigma(\text{band } i)`.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> r = wflow.solve_zonal(wflow.SA(beta=2.0), lambda z: np.exp(z), 1.0, d=3, n_cells=16, save_at=[0.0, 0.5, 1.0])
    >>> r.masses.shape, r.edges.shape, r.centers.shape, round(float(r.volumes.sum()), 12)
    ((3, 16), (17,), (16,), 1.0)
    >>> bool(np.allclose(r.mass, 1.0)), bool(np.all(np.diff(r.mean_z) > 0))  # mass kept, drift to the pole
    (True, True)
    """

    @property
    def d(self) -> int:
        return int(self.config["d"])

    @property
    def masses(self) -> np.ndarray:
        return self.data["masses"][1]

    @property
    def mass(self) -> np.ndarray:
        return self.data["mass"][1]

    @property
    def energy(self) -> np.ndarray:
        return self.data["energy"][1]

    @property
    def mean_z(self) -> np.ndarray:
        return self.data["mean_z"][1]

    @property
    def edges(self) -> np.ndarray:
        return self.static["edges"][1]

    @property
    def centers(self) -> np.ndarray:
        return self.static["centers"][1]

    @property
    def log_volumes(self) -> np.ndarray:
        return self.static["log_volumes"][1]

    @property
    def volumes(self) -> np.ndarray:
        with np.errstate(under="ignore"):
            return np.exp(self.log_volumes)

    @property
    def values(self) -> np.ndarray:
        with np.errstate(divide="ignore", over="ignore", under="ignore"):
            return np.exp(np.log(self.masses) - self.log_volumes - log_sphere_area(self.d))

    def density(self, i: int = -1, *, t: float | None = None) -> np.ndarray:
        r"""Cell averages of saved density number ``i`` (or of the one saved at time ``t``,
        :meth:`save_index`), w.r.t. the surface measure (:attr:`values`)."""
        return self.values[i if t is None else self.save_index(t)]

    def law_density(self, i: int = -1) -> np.ndarray:
        r"""The density of the law of :math:`z` on the bands, :math:`m_j/(z_{j+1} - z_j)`, shape ``(M,)``."""
        return self.masses[i] / np.diff(self.edges)

    def cdf(self, z: np.ndarray, i: int = -1) -> np.ndarray:
        """The CDF of the law of z at saved time ``i`` (piecewise linear between the exact edge values)."""
        return np.interp(z, self.edges, _cdf_at_edges(self.masses[i]))

    def quantile(self, s: np.ndarray, i: int = -1) -> np.ndarray:
        """Quantiles of the law of z at saved time ``i`` (:func:`law_quantile`)."""
        return law_quantile(self.edges, self.masses[i], s)

    def w2(self, z: np.ndarray, i: int = -1) -> float:
        """Exact 1-D W2 between samples ``z`` of :math:`\\langle x, e\\rangle` and the law at saved time ``i``."""
        return w2_to_law(z, self.edges, self.masses[i])


# ------------------------------------------------------------------------------ the front door
def _spec(model_or_spec: Any, d: int) -> dict[str, Any]:
    """``attention``, ``beta``, ``sign`` from a wflow SA/USA model or a dict ``{"attention", "beta", "sign"}``."""
    if isinstance(model_or_spec, dict):
        defaults = {"attention": "SA", "beta": 1.0, "sign": 1}
        unknown = set(model_or_spec) - set(defaults)
        if unknown:
            raise ValueError(
                f"model spec has unknown keys {sorted(unknown)}; known: attention, beta, sign"
            )
        return {k: model_or_spec.get(k, v) for k, v in defaults.items()}
    from ..models import Model

    if not isinstance(model_or_spec, Model):
        raise TypeError(
            f"model must be a wflow SA/USA model or a dict {{'attention', 'beta', 'sign'}}, got "
            f"{short_repr(model_or_spec)}"
        )
    fv = ZonalFV.from_model(model_or_spec, d, 4)  # validates Q = K = I, V = +-I and the dimension
    return {"attention": fv.attention, "beta": fv.beta, "sign": fv.sign}


def log_sphere_area(d: int) -> float:
    r""":math:`\log|S^{d-1}| = \log 2 + \tfrac d2\log\pi - \log\Gamma(\tfrac d2)`.

    Examples
    --------
    >>> import math
    >>> from wflow.solvers.zonal import log_sphere_area
    >>> round(math.exp(log_sphere_area(3)) / math.pi, 12), round(log_sphere_area(10_000), 3)
    (4.0, -31858.284)
    """
    return math.log(2.0) + 0.5 * d * math.log(math.pi) - math.lgamma(0.5 * d)


def _initial_masses(rho0: Any, fv: ZonalFV, normalize: bool) -> np.ndarray:
    from ..density import Density

    if isinstance(rho0, Density):
        raise TypeError(
            f"rho0 is a Density on a {type(rho0.mesh).__name__} (S^{rho0.mesh.d - 1}): the zonal solver "
            f"takes a zonal density, f(z) of z = <x, e> in [-1, 1], or band masses; use solve_density "
            f"for densities on meshes"
        )
    if callable(rho0):
        probe = np.linspace(-0.9, 0.9, 7)
        try:
            out = np.asarray(rho0(probe), dtype=float)
        except Exception as exc:  # a function of points x, not of z
            raise TypeError(
                f"rho0 must be a function of z = <x, e> (an array of heights in [-1, 1]) returning "
                f"one value per z; calling it on z of shape (7,) failed: {type(exc).__name__}: {exc}"
            ) from None
        if out.shape != probe.shape:
            raise TypeError(
                f"rho0 must be a function of z = <x, e> returning one value per z; for z of shape "
                f"(7,) it returned shape {out.shape} (a function of points x is not zonal)"
            )
        if normalize:
            return fv.masses_from_function(rho0, normalize=True)
        # f is a density w.r.t. the surface measure; the bands' volumes are those of sigma
        area = math.exp(log_sphere_area(fv.d))
        return fv.masses_from_function(
            lambda z: area * np.asarray(rho0(z), dtype=float), normalize=False
        )
    arr = np.asarray(rho0)
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.number):
        raise TypeError(
            f"rho0 must be f(z), a callable, or band masses (an array of shape ({fv.n_cells},)), "
            f"got {short_repr(rho0)}"
        )
    return fv.check_masses(arr, name="rho0")


def solve_zonal(
    model_or_spec: Any,
    rho0: Callable[[np.ndarray], Any] | np.ndarray,
    t_end: float,
    *,
    d: int,
    n_cells: int = 512,
    save_at: Any = None,
    kappa: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    grid: Any = "angle",
    kernel: str = "plain",
    kernel_method: str = "auto",
    cfl: float = 0.9,
    max_step: float | None = None,
    max_steps: int = 10**7,
    normalize: bool = True,
    method: str = "auto",
    trackers: Sequence[Tracker] = (),
    keep: bool = True,
    throw: bool = True,
    progress: bool = False,
) -> ZonalTrajectory:
    r"""Evolve a zonal density on :math:`S^{d-1}` by the mean-field equation (1-D finite volume in :math:`z`).

    .. math::

        \partial_t p + \partial_z\big(p\,(1-z^2)g[p](z)\big) = \kappa^{-1}\partial_z\big(c_d(1-z^2)^{(d-1)/2}\partial_z f\big),
        \qquad p = c_d(1-z^2)^{(d-3)/2} f ,

    the exact reduction of :math:`\partial_t\mu + \mathrm{div}_S(\mu v[\mu]) = \kappa^{-1}\Delta_S\mu`
    for :math:`\mu = f(\langle x, e\rangle)\sigma` (``docs/zonal.md``).

    Parameters
    ----------
    model_or_spec : SA, USA or dict
        A wflow SA/USA model with :math:`Q = K = I`, :math:`V = \pm I` (anything else is not
        zonal), or ``{"attention": "SA"|"USA", "beta": float, "sign": 1|-1}``.
    rho0 : callable or ndarray
        The initial density :math:`f(z)` of the height :math:`z = \langle x, e\rangle` (normalized to mass
        1 unless ``normalize=False``: then w.r.t. the surface measure), or the band masses, shape
        ``(n_cells,)``, summing to 1.
    t_end : float
        Final time, ``> 0``.
    d : int
        Ambient dimension, ``>= 2`` (``d = 2``: even densities on the circle).
    n_cells : int
        Number of latitude bands.
    save_at : array_like, optional
        Save times (steps land on them); default ``[0, t_end]``.
    kappa : float, optional
        Inverse diffusivity (noise :math:`\sqrt{2/\kappa}\,dW`); ``None``: none.
    rtol, atol : float, optional
        Error per unit of change (``docs/solvers.md``); default 1e-3, 1e-12.
    grid : {"angle", "z"} or array_like
        Bands uniform in the polar angle (default), in :math:`z`, or the edges themselves.
    kernel : {"plain", "rescaled"}
        :math:`e^{\beta\langle x,y\rangle}` or :math:`e^{\beta(\langle x,y\rangle - 1)}` (USA at large :math:`\beta`).
    kernel_method : {"auto", "panel", "dense"}
        Kernel sums by a verified panel Chebyshev factorization or dense matrices.
    cfl, max_step, max_steps
        Fraction of the positivity limit a step may use, in ``(0, 1]``; a cap on the step; attempted
        steps before the run fails.
    normalize : bool
        Rescale a callable ``rho0`` to mass 1 (default).
    method : {"auto", "remap", "ssprk3"}
        Time stepper.  ``"remap"``: characteristics and remap (:meth:`ZonalProblem.remap_step`; no
        positivity limit on the step, no noise).  ``"ssprk3"``: SSP-RK3 stages below the positivity limit
        (noise included).  ``"auto"`` (default): ``"remap"`` without noise, ``"ssprk3"`` with it.
    trackers, keep, throw, progress
        See :func:`wflow.solvers.base.integrate`; ``progress`` adds a progress bar.

    Returns
    -------
    ZonalTrajectory

    Raises
    ------
    ValueError
        ``d < 2``, negative masses, a total mass far from 1, a model that is not zonal, ...
    TypeError
        ``rho0`` that is not zonal (a :class:`~wflow.density.Density`, a function of points).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow import SA
    >>> r = solve_zonal(SA(beta=4.0), lambda z: np.exp(2 * z), 1.0, d=128, n_cells=128)
    >>> bool(abs(r.mass - 1).max() < 1e-13), bool(r.masses.min() >= 0), bool(r.mean_z[-1] > r.mean_z[0])
    (True, True, True)
    """
    d = check_int(d, "d", minimum=2)
    t_end = check_positive(t_end, "t_end")
    spec = _spec(model_or_spec, d)
    if kappa is not None:
        kappa = check_positive(kappa, "kappa", allow_inf=True)
        if np.isinf(kappa):
            kappa = None
    if method == "auto":
        method = "ssprk3" if kappa is not None else "remap"
    if method not in ("remap", "ssprk3"):
        raise ValueError(f"method must be 'auto', 'remap' or 'ssprk3', got {method!r}")
    if method == "remap" and kappa is not None:
        raise ValueError(
            f"method 'remap' has no diffusion: kappa must be None with it, got kappa={kappa!r} "
            f"(use method='ssprk3' or 'auto')"
        )
    solver = get_solver(method)
    problem = ZonalProblem(
        d,
        n_cells,
        **spec,
        kappa=kappa,
        kernel=kernel,
        grid=grid,
        kernel_method=kernel_method,
        cfl=cfl,
        max_step=max_step,
    )
    m0 = _initial_masses(rho0, problem.fv, normalize)
    trs = list(trackers)
    if progress:
        trs.append(ProgressBar(f"zonal d={d} ({solver.name})"))
    r = integrate(
        problem,
        solver,
        m0,
        0.0,
        t_end,
        save_at=[0.0, t_end] if save_at is None else save_at,
        rtol=rtol,
        atol=atol,
        adaptive=solver.adaptive,
        max_steps=max_steps,
        trackers=trs,
        keep=keep,
        throw=throw,
        result_class=ZonalTrajectory,
    )
    logger.debug("solve_zonal: %s", r)
    return cast(ZonalTrajectory, r)  # integrate builds result_class


def _rebuild(cfg: dict[str, Any], stored: dict[str, Any]):
    problem = ZonalProblem.from_config(cfg)
    masses = np.array(stored["data"]["masses"][1][-1], dtype=np.float64)
    return problem, get_solver(cfg["solver"], **cfg["solver_options"]), masses


register_kind("zonal", ZonalTrajectory, _rebuild)
