r"""JKO scheme: the :class:`JKO` solver of the contract, its problem and result, and the front door :func:`jko`.

One step is :mod:`wflow.solvers.jko.stepper` (its names are importable from here too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from ...density import Density
from ...errors import SolverError, check_int, check_positive, short_repr
from ...measure import Atoms
from ...mesh import Mesh, mesh_from_dict
from ...models import Model, model_from_dict
from ...sphere import cost_matrix as cost_matrix
from ..base import (
    Problem,
    Result,
    Solver,
    StepResult,
    Tracker,
    integrate,
    register_kind,
    register_solver,
)
from ..trackers import ProgressBar
from .stepper import COSTS as COSTS
from .stepper import METHODS as METHODS
from .stepper import JKOEnergy as JKOEnergy
from .stepper import JKOStepper as JKOStepper
from .stepper import StepStats as StepStats
from .stepper import WarmStart as WarmStart
from .stepper import check_eps_scaling as check_eps_scaling
from .stepper import check_gradient_model as check_gradient_model
from .stepper import default_eps as default_eps
from .stepper import spacing as spacing
from .stepper import support as support

# No __all__: the names above are re-exported and documented where they live.


class JKOProblem(Problem):
    r"""A measure on a fixed support moved by the Wasserstein gradient flow of :math:`-F + \kappa^{-1}\int\nu\log\nu`.

    The state is the weight vector :math:`\nu` (sum 1) on the support ``x`` with volumes ``r``.

    Examples
    --------
    >>> from wflow import CircleMesh, Density
    >>> from wflow.solvers.base import integrate
    >>> from wflow.solvers.jko.step import JKO, JKOProblem
    >>> mesh = CircleMesh(32)
    >>> nu0 = Density.from_function(mesh, lambda x: 1 + 0.5 * x[:, 0]).masses()
    >>> problem = JKOProblem(None, mesh.centers, mesh.areas, mesh=mesh, kappa=1.0)  # heat flow
    >>> res = integrate(problem, JKO(), nu0, 0.0, 0.2, dt=0.05)
    >>> problem.kind, res["weights"].shape, int(res.stats["steps"][-1])
    ('jko', (5, 32), 4)
    """

    kind = "jko"

    def __init__(
        self,
        model: Model | None,
        x: np.ndarray,
        r: np.ndarray,
        *,
        mesh: Mesh | None = None,
        kappa: float | None = None,
        backend: str = "auto",
    ):
        super().__init__()
        check_gradient_model(model, x.shape[1])
        self.model, self.x, self.r, self.mesh, self.backend = model, x, r, mesh, backend
        self.kappa = None if kappa is None or np.isinf(kappa) else kappa
        self.kappa_inv = 0.0 if self.kappa is None else 1.0 / self.kappa
        self.energy = JKOEnergy(model, x, r, backend)

    def breakpoints(self, t0: float, t_end: float) -> np.ndarray:
        return np.empty(0) if self.model is None else self.model.breakpoints(t0, t_end)

    def snapshot(self, t: float, w: np.ndarray) -> dict:
        if self.model is not None and self.model.time_dependent:
            self.energy.model = self.model.at(t)
        F = self.energy.F(w)
        return {
            "weights": (("cell",), np.array(w, copy=True)),
            "energy": ((), np.float64(F)),
            "free_energy": ((), np.float64(-F + self.kappa_inv * self.energy.kl(w))),
        }

    def static(self) -> dict:
        return {"points": (("cell", "coord"), self.x), "reference": (("cell",), self.r)}

    def config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "model": None if self.model is None else self.model.to_dict(),
            "mesh": None if self.mesh is None else self.mesh.to_dict(),
            "kappa": self.kappa,
            "backend": self.backend,
        }

    @property
    def evaluations(self) -> int:  # energy and first-variation evaluations
        return self.energy.evaluations if hasattr(self, "energy") else 0

    @evaluations.setter
    def evaluations(self, value: int) -> None:
        if hasattr(self, "energy"):
            self.energy.evaluations = value


@register_solver
class JKO(Solver):
    """Implicit JKO steps (:mod:`~wflow.solvers.jko.stepper`) as a solver of the contract: order 1, fixed step ``dt = tau``.

    A step that misses ``tol`` after ``max_iter`` outer iterations is a failure; the inner
    solver's state (:class:`WarmStart`) is saved with every snapshot for a bit-exact resume.

    Examples
    --------
    >>> from wflow.solvers.base import get_solver
    >>> from wflow.solvers.jko.step import JKO
    >>> solver = JKO(method="sinkhorn", tol=1e-6)
    >>> solver.name, solver.order, solver.adaptive, isinstance(get_solver("jko"), JKO)
    ('jko', 1, False, True)
    """

    name = "jko"
    order = 1

    def __init__(
        self,
        *,
        eps: float | None = None,
        cost: str = "geodesic",
        method: str = "sinkhorn",
        debias: bool = True,
        eps_scaling: float | None = None,
        tol: float = 1e-6,
        max_iter: int = 200,
        max_sinkhorn: int = 5000,
        warm_start: WarmStart | None = None,
    ):
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if cost not in COSTS:
            raise ValueError(f"cost must be one of {COSTS}, got {cost!r}")
        self.eps = None if eps is None else check_positive(eps, "eps")
        self.cost, self.method, self.debias = cost, method, bool(debias)
        self.eps_scaling = check_eps_scaling(eps_scaling)
        self.tol = check_positive(tol, "tol")
        self.max_iter = check_int(max_iter, "max_iter")
        self.max_sinkhorn = check_int(max_sinkhorn, "max_sinkhorn")
        if warm_start is not None and not isinstance(warm_start, WarmStart):
            raise TypeError(
                f"warm_start must be a WarmStart (JKOResult.warm_start) or None, got "
                f"{short_repr(warm_start)}"
            )
        self.warm_start = warm_start

    def options(self) -> dict[str, Any]:
        return {
            "eps": self.eps,
            "cost": self.cost,
            "method": self.method,
            "debias": self.debias,
            "eps_scaling": self.eps_scaling,
            "tol": self.tol,
            "max_iter": self.max_iter,
            "max_sinkhorn": self.max_sinkhorn,
        }

    def init(self, problem: Problem, t0: float, y0: np.ndarray) -> JKOStepper:
        if not isinstance(problem, JKOProblem):
            raise TypeError(f"the jko solver steps a JKOProblem, got {short_repr(problem)}")
        eps = default_eps(problem.x, problem.r) if self.eps is None else self.eps
        st = JKOStepper(
            problem.model,
            problem.x,
            problem.r,
            tau=1.0,
            eps=eps,
            cost=self.cost,
            kappa=problem.kappa,
            method=self.method,
            debias=self.debias,
            eps_scaling=self.eps_scaling,
            tol=self.tol,
            max_iter=self.max_iter,
            max_sinkhorn=self.max_sinkhorn,
            backend=problem.backend,
            energy=problem.energy,
        )
        if self.warm_start is not None:
            st.restore(self.warm_start)
        return st

    def step(self, problem, t, y, dt, state: JKOStepper, **_):
        if problem.model is not None and problem.model.time_dependent:
            # implicit: the energy at the step's end, of the layer the step lies in
            problem.energy.model = problem.model.at(t + dt, piece=t + 0.5 * dt)
        state.set_tau(dt)
        w, s = state.step(y)
        if not np.all(np.isfinite(w)):
            raise SolverError(
                f"non-finite weights in the JKO step from t={t:.6g}; try a larger eps or a smaller tau"
            )
        info = {k: getattr(s, k) for k in _STEP_FIELDS}
        failure = s.locked
        if s.stalled:
            failure = (
                f"JKO step (method='emd') stalled at first-order residual {s.residual:.3g} > tol={self.tol:g} "
                f"after {s.iterations} iterations: no mirror-descent step lowers the objective in float64, "
                f"so a larger max_iter would not help; use method='sinkhorn' or a larger tol"
            )
        elif not s.converged:
            failure = (
                f"JKO step missed its tolerance: first-order residual {s.residual:.3g} > tol={self.tol:g} "
                f"after {s.iterations} outer iterations; raise max_iter, or use a smaller tau or a larger eps"
            )
        return StepResult(w, info=info, failure=failure), state

    def checkpoint(self, state: JKOStepper) -> dict:
        if state.ot is None:  # emd keeps no state between steps
            return {}
        ws = state.warm_start()
        if ws is None:  # before the first step: NaN marks "no warm start"
            n = state.x.shape[0]
            ws = WarmStart(np.full(n, np.nan), np.full(n, np.nan), np.nan, np.nan)
        return {
            "gbar": (("cell",), ws.gbar),
            "v": (("cell",), ws.v),
            "L": ((), np.float64(ws.L)),
            "eps": ((), np.float64(ws.eps)),
        }

    def restore(self, problem, t, y, saved) -> JKOStepper:
        st = self.init(problem, t, y)
        if saved and np.all(np.isfinite(saved.get("gbar", [np.nan]))):
            st.restore(
                WarmStart(
                    np.asarray(saved["gbar"]),
                    np.asarray(saved["v"]),
                    float(saved["L"]),
                    float(saved["eps"]),
                )
            )
        return st


class JKOResult(Result):
    """Result of :func:`jko` (a :class:`~wflow.solvers.base.Result` of kind ``jko``).

    Attributes
    ----------
    times : ndarray, shape (n_saves,)
        :math:`k\\tau` at the saved steps.
    weights : ndarray, shape (n_saves, n)
        Masses :math:`\\nu_j` on the support (sum 1, non-negative).
    points : ndarray, shape (n, d)
        The support.
    reference : ndarray, shape (n,)
        Reference volumes :math:`r_j` (cell areas) of the entropy.
    energy : ndarray, shape (n_saves,)
        :math:`F` (``model.energy``, ascended); zeros when ``model`` is None.
    free_energy : ndarray, shape (n_saves,)
        :math:`\\Phi = -F + \\kappa^{-1}\\sum_j\\nu_j\\log(\\nu_j/r_j)`, non-increasing for the exact scheme.
    steps : list of StepStats
        One per step taken.
    mesh : Mesh or None

    Examples
    --------
    >>> import numpy as np
    >>> from wflow import CircleMesh, Density
    >>> from wflow.solvers.jko import jko
    >>> rho0 = Density.from_function(CircleMesh(32), lambda x: 1 + 0.5 * x[:, 0])
    >>> r = jko(None, rho0, 0.05, 4, kappa=1.0)  # pure diffusion
    >>> r.weights.shape, r.points.shape, r.tau, len(r.steps)
    ((5, 32), (32, 2), 0.05, 4)
    >>> bool(np.all(np.diff(r.free_energy) <= 0))  # JKO descends the free energy
    True
    """

    _mesh: Mesh | None = None

    @property
    def weights(self) -> np.ndarray:
        return self.data["weights"][1]

    @property
    def points(self) -> np.ndarray:
        return self.static["points"][1]

    @property
    def reference(self) -> np.ndarray:
        return self.static["reference"][1]

    @property
    def energy(self) -> np.ndarray:
        return self.data["energy"][1]

    @property
    def free_energy(self) -> np.ndarray:
        return self.data["free_energy"][1]

    @property
    def mesh(self) -> Mesh | None:
        if self._mesh is None and self.config.get("mesh") is not None:
            self._mesh = mesh_from_dict(self.config["mesh"])
        return self._mesh

    @property
    def tau(self) -> float:
        return float(self.config["dt"])

    @property
    def eps(self) -> float:
        eps = self.config["solver_options"]["eps"]
        return float(eps) if eps is not None else default_eps(self.points, self.reference)

    @property
    def method(self) -> str:
        return self.config["solver_options"]["method"]

    @property
    def steps(self) -> list[StepStats]:
        """Statistics of each step taken in this call (not stored: empty after :func:`wflow.load`)."""
        return [StepStats(**{k: s[k] for k in _STEP_FIELDS}) for s in self.step_info]

    def stat(self, name: str) -> np.ndarray:
        """One statistic over the steps, e.g. ``stat("residual")``."""
        return np.array([s[name] for s in self.step_info])

    @property
    def warm_start(self) -> WarmStart | None:
        """The inner solver's state at the last save: ``jko(..., warm_start=r.warm_start)`` continues the run."""
        c = self.checkpoint
        if not c or not np.all(np.isfinite(c["gbar"][1])):
            return None
        return WarmStart(c["gbar"][1], c["v"][1], float(c["L"][1]), float(c["eps"][1]))

    @property
    def values(self) -> np.ndarray:
        """Densities (weights / reference volumes), shape ``(n_saves, n)``."""
        return self.weights / self.reference

    def density(self, i: int = -1) -> Density:
        if self.mesh is None:
            raise ValueError("this JKO run was on a point cloud, not a mesh: use atoms(i)")
        return Density._trusted(self.mesh, self.weights[i] / self.mesh.areas)

    def atoms(self, i: int = -1) -> Atoms:
        return Atoms._trusted(self.points, self.weights[i])


#: the step statistics a step's info and a JKOResult's steps carry (StepStats' fields)
_STEP_FIELDS = tuple(
    "iterations sinkhorn residual residual_max eps L objective converged stalled time_ot "
    "time_energy".split()
)


class _StepCallback(Tracker):
    """``callback(t, weights, stats)`` after every step (a true value stops the run)."""

    name = "callback"

    def __init__(self, f):
        self.f = f

    def step(self, t, dt, step) -> bool:
        return bool(self.f(t, step.y, StepStats(**{k: step.info[k] for k in _STEP_FIELDS})))


def jko(
    model: Model | None,
    rho0: Density | Atoms,
    tau: float,
    n_steps: int,
    *,
    eps: float | None = None,
    cost: str = "geodesic",
    kappa: float | None = None,
    method: str = "sinkhorn",
    debias: bool = True,
    eps_scaling: float | None = None,
    tol: float = 1e-6,
    max_iter: int = 200,
    max_sinkhorn: int = 5000,
    reference: Any = None,
    save_every: int = 1,
    backend: str = "auto",
    callback: Callable[[float, np.ndarray, StepStats], Any] | None = None,
    progress: bool = False,
    warm_start: WarmStart | None = None,
    trackers: Sequence[Tracker] = (),
    keep: bool = True,
    throw: bool = True,
) -> JKOResult:
    r"""Run ``n_steps`` JKO steps :math:`\mu_{k+1} = \arg\min_\nu W_2^2(\mu_k,\nu)/(2\tau) - F(\nu) + \kappa^{-1}\int\nu\log\nu`.

    The :class:`JKO` solver through :func:`wflow.solvers.base.integrate` at the fixed step
    ``tau``; the algorithm and the role of :math:`\varepsilon`: ``docs/jko.md``.

    Parameters
    ----------
    model : Model or None
        A gradient flow in the plain Wasserstein metric (USA with ``Q = K = I``, ``V = ±I``,
        conservative perceptrons, sums of them); ``None`` for pure diffusion (needs ``kappa``).
    rho0 : Density or Atoms
        Initial measure.  A Density runs on its mesh's cell centres (reference volumes = cell
        areas); Atoms run on their points (reference volumes ``|S^{d-1}|/n`` unless ``reference``).
    tau : float
        Time step.
    n_steps : int
        Number of steps; the result holds times ``0, tau, ..., n_steps tau`` (every ``save_every``).
    eps : float, optional
        Entropic regularization (squared distance); default ``2 h^2``, ``h`` the spacing of the
        support.  Smaller than ``h^2`` locks mass in its cell.
    cost : {"geodesic", "chordal"}
        :math:`C = d^2` with the great-circle or the chordal distance.
    kappa : float, optional
        Inverse diffusivity; ``None`` or ``inf``: no noise.
    method : {"sinkhorn", "emd"}
        Entropic semi-relaxed Sinkhorn (any size) or exact ``ot.emd`` mirror descent (small supports).
    debias : bool
        Remove the blur's spurious diffusion to leading order.
    eps_scaling : float, optional
        ``None`` (default): every step is solved at ``eps`` directly.  A factor in ``(0, 1)``: the
        first step runs an eps-scaling schedule from the squared displacement of one step down to ``eps``.
    tol : float
        Stopping tolerance on the step's first-order residual (units of ``dF/dmu``); a step that
        misses it is a failure (``throw``).
    max_iter, max_sinkhorn : int
        Caps on outer iterations per step and on scaling iterations per outer iteration.
    reference : array_like, shape (n,), optional
        Reference volumes of the entropy.
    backend : str
        Kernel-sum backend of ``model.first_variation`` / ``model.energy``.
    callback : callable, optional
        ``callback(t, weights, stats)`` after each step (``stats`` a :class:`StepStats`); a true
        value stops the run.
    progress : bool
        A progress bar over steps.
    warm_start : WarmStart, optional
        Continue a run from ``JKOResult.warm_start`` (with ``rho0`` the measure saved at that
        step: the uninterrupted run's iterations).
    trackers, keep, throw
        See :func:`wflow.solvers.base.integrate`.

    Returns
    -------
    JKOResult

    Raises
    ------
    NotAGradientFlowError
        ``model`` is not a Wasserstein gradient flow (SA, general Q/K/V, non-conservative perceptron).
    SolverError
        With ``throw=True``: a step missed its tolerance, or the weights became non-finite.

    Examples
    --------
    >>> from wflow.mesh import CircleMesh
    >>> from wflow.density import Density
    >>> rho0 = Density.from_function(CircleMesh(64), lambda x: 1 + 0.5 * x[:, 0])
    >>> r = jko(None, rho0, 0.05, 4, kappa=1.0)
    >>> bool(abs(r.weights.sum(axis=1) - 1).max() < 1e-12), r.times.tolist()
    (True, [0.0, 0.05, 0.1, 0.15000000000000002, 0.2])
    """
    x, a, r, mesh = support(rho0, reference)
    tau = check_positive(tau, "tau")
    n_steps = check_int(n_steps, "n_steps")
    save_every = check_int(save_every, "save_every")
    if kappa is not None:
        kappa = check_positive(kappa, "kappa", allow_inf=True)
    if model is None and (kappa is None or np.isinf(kappa)):
        raise ValueError("model=None (pure diffusion) needs a finite kappa")
    problem = JKOProblem(model, x, r, mesh=mesh, kappa=kappa, backend=backend)
    solver = JKO(
        eps=eps,
        cost=cost,
        method=method,
        debias=debias,
        eps_scaling=eps_scaling,
        tol=tol,
        max_iter=max_iter,
        max_sinkhorn=max_sinkhorn,
        warm_start=warm_start,
    )
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {short_repr(callback)}")
    trs = list(trackers)
    if callback is not None:
        trs.append(_StepCallback(callback))
    if progress:
        trs.append(ProgressBar("jko"))
    steps = sorted(set(range(0, n_steps + 1, save_every)) | {n_steps})
    res = integrate(
        problem,
        solver,
        a,
        0.0,
        n_steps * tau,
        dt=tau,
        save_at=[k * tau for k in steps],
        trackers=trs,
        keep=keep,
        throw=throw,
        result_class=JKOResult,
    )
    jres = cast(JKOResult, res)
    jres._mesh = mesh
    return jres


def jko_step(model: Model | None, rho0: Density | Atoms, tau: float, **kwargs: Any) -> JKOResult:
    """One JKO step (:func:`jko` with ``n_steps=1``).

    Examples
    --------
    >>> import wflow
    >>> from wflow.solvers.jko import jko_step
    >>> rho0 = wflow.Density.from_function(wflow.CircleMesh(32), lambda x: 1 + 0.5 * x[:, 0])
    >>> r = jko_step(wflow.USA(1.0), rho0, 0.1, backend="numpy")
    >>> r.times.tolist(), r.steps[0].converged
    ([0.0, 0.1], True)
    """
    return jko(model, rho0, tau, 1, **kwargs)


def _rebuild(cfg: dict[str, Any], stored: dict[str, Any]):
    mesh = None if cfg["mesh"] is None else mesh_from_dict(cfg["mesh"])
    model = None if cfg["model"] is None else model_from_dict(cfg["model"])
    problem = JKOProblem(
        model,
        stored["static"]["points"][1],
        stored["static"]["reference"][1],
        mesh=mesh,
        kappa=cfg["kappa"],
        backend=cfg["backend"],
    )
    return problem, JKO(**cfg["solver_options"]), stored["data"]["weights"][1][-1]


register_kind("jko", JKOResult, _rebuild)
