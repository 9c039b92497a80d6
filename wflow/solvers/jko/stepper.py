r"""One JKO step: an implicit Wasserstein gradient-flow step on a fixed support, solved with optimal transport.

For a gradient model (USA with :math:`Q = K = I`, :math:`V = \pm I`, conservative perceptrons,
their sums) the Jordan--Kinderlehrer--Otto scheme (1998) takes implicit steps

.. math::

    \mu_{k+1} = \arg\min_\nu \frac{W_2^2(\mu_k, \nu)}{2\tau} - F(\nu) + \kappa^{-1}\int\nu\log\nu

over the measures on a fixed support :math:`x_1..x_n` with reference volumes :math:`r_j`
(:math:`\int\nu\log\nu \approx \sum_j\nu_j\log(\nu_j/r_j)`), ground cost
:math:`C_{ij} = d(x_i, x_j)^2` (geodesic or chordal).  ``method="sinkhorn"``: entropic transport
(regularization :math:`\varepsilon`, debiased to leading order), an outer convex--concave loop and
an inner semi-relaxed Sinkhorn / Newton--CG solve (:mod:`wflow.solvers.jko.transport`), stopped
on the first-order residual; ``docs/jko.md`` ("Algorithm", "Accuracy") explains each part.
``method="emd"``: POT's exact ``ot.emd`` (small supports) and mirror descent on the weights.

The solver of the contract, its result and the front door :func:`~wflow.solvers.jko.jko` are
:mod:`wflow.solvers.jko.step`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...density import Density
from ...errors import (
    NotAGradientFlowError,
    SolverError,
    check_positive,
    real_float_dtype,
    short_repr,
)
from ...measure import Atoms
from ...mesh import Mesh
from ...models import WASSERSTEIN, Model
from ...sphere import cost_matrix
from .sparse import DENSE_MAX_CELLS, SparseCost, sparse_blur_variance
from .transport import TINY, SemiRelaxed, blur_variance

__all__ = [
    "COSTS",
    "METHODS",
    "check_gradient_model",
    "support",
    "spacing",
    "JKOEnergy",
    "WarmStart",
    "StepStats",
    "JKOStepper",
    "check_eps_scaling",
    "default_eps",
    "smallest_eps",
    "check_eps",
    "check_tau",
]

logger = logging.getLogger("wflow.solvers.jko.step")

COSTS = ("geodesic", "chordal")
METHODS = ("sinkhorn", "emd")


# --------------------------------------------------------------------------- inputs
def check_gradient_model(model: Any, d: int, name: str | None = None) -> None:
    """Raise unless ``model`` is ``None`` or a gradient flow in the plain Wasserstein metric.

    Raises
    ------
    TypeError
        ``model`` is not a :class:`~wflow.models.Model`.
    NotAGradientFlowError
        The model has no energy (the message names the failing condition), or it ascends its
        energy in the SA-reweighted metric, which the :math:`W_2` JKO scheme does not solve.

    Examples
    --------
    >>> import wflow
    >>> from wflow.errors import NotAGradientFlowError
    >>> from wflow.solvers.jko.step import check_gradient_model
    >>> check_gradient_model(wflow.USA(1.0), 2)  # plain W2 gradient flow: passes
    >>> try:
    ...     check_gradient_model(wflow.SA(1.0), 2)  # SA: reweighted metric
    ... except NotAGradientFlowError:
    ...     print("not a W2 gradient flow")
    not a W2 gradient flow
    """
    if model is None:
        return
    if not isinstance(model, Model):
        raise TypeError(f"model must be a wflow Model or None, got {short_repr(model)}")
    try:
        model.check_dimension(d)
    except ValueError as err:
        if name is None:
            raise
        raise ValueError(f"{name}: {err}") from None
    why = model.gradient_obstruction()
    if why is not None:
        raise NotAGradientFlowError(
            f"the JKO scheme needs a gradient flow, but {model!r} is not one: {why}"
        )
    if model.metric != WASSERSTEIN:
        raise NotAGradientFlowError(
            f"the JKO scheme solves Wasserstein-2 gradient flows, but {model!r} ascends its energy in the metric "
            f"reweighted by Z_mu (metric={model.metric!r}); use USA (plain W2) or the particle/Eulerian solvers for SA"
        )


def support(rho0: Any, reference: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, Mesh | None]:
    """``(points, masses, reference volumes, mesh)`` from a Density or single Atoms.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow import CircleMesh, Density
    >>> from wflow.solvers.jko.step import support
    >>> mesh = CircleMesh(32)
    >>> x, a, r, m = support(Density.from_function(mesh, lambda x: 1 + 0.5 * x[:, 0]), None)
    >>> x.shape, round(float(a.sum()), 12), bool(np.allclose(r, 2 * np.pi / 32)), m is mesh
    ((32, 2), 1.0, True, True)
    """
    if isinstance(rho0, Density):
        mesh = rho0.mesh
        x, r = mesh.centers.astype(np.float64), mesh.areas.astype(np.float64)
        a = rho0.masses().astype(np.float64)
    elif isinstance(rho0, Atoms):
        if rho0.batch_shape:
            raise ValueError(
                f"rho0 must be a single measure (no batch axes), got batch {rho0.batch_shape}"
            )
        mesh = None
        x, a = rho0.points.astype(np.float64), rho0.weights.astype(np.float64)
        area = 2 * np.pi if rho0.d == 2 else (4 * np.pi if rho0.d == 3 else 1.0)
        r = np.full(rho0.n, area / rho0.n)
    else:
        raise TypeError(
            f"rho0 must be a wflow Density (mesh) or Atoms (point cloud), got {short_repr(rho0)}"
        )
    if reference is not None:
        r = np.asarray(reference)
        real_float_dtype(r.dtype, "reference", integers=True)
        r = r.astype(np.float64, copy=False)
        if r.shape != a.shape or not np.all(np.isfinite(r)) or np.any(r <= 0):
            raise ValueError(
                f"reference must hold {a.shape[0]} positive volumes, got {short_repr(reference)}"
            )
    a = a / a.sum()
    return x, a, r, mesh


def spacing(x: np.ndarray, r: np.ndarray) -> float:
    return float(np.mean(r)) if x.shape[1] == 2 else float(np.sqrt(np.mean(r)))


# --------------------------------------------------------------------------- the energy side
class JKOEnergy:
    r"""The free energy :math:`\Phi(\nu) = -F(\nu) + \text{coef}\,\mathrm{KL}(\nu|r)` on the support."""

    def __init__(self, model: Model | None, x: np.ndarray, r: np.ndarray, backend: str):
        self.model, self.x, self.logr, self.backend = model, x, np.log(r), backend
        self.evaluations = 0
        self.time = 0.0

    def _timed(self, f: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        out = f(*args, backend=self.backend)
        self.evaluations += 1
        self.time += time.perf_counter() - t0
        return out

    def first_variation(self, nu: np.ndarray) -> np.ndarray:
        r""":math:`\delta F/\delta\nu` at the support points, shape ``(n,)``."""
        if self.model is None:
            return np.zeros_like(nu)
        out = self._timed(self.model.first_variation, self.x, Atoms._trusted(self.x, nu))
        return np.asarray(out, dtype=float)

    def F(self, nu: np.ndarray) -> float:
        if self.model is None:
            return 0.0
        return float(self._timed(self.model.energy, Atoms._trusted(self.x, nu)))

    def kl(self, nu: np.ndarray) -> float:
        pos = nu > 0
        return float(np.sum(nu[pos] * (np.log(nu[pos]) - self.logr[pos])))

    def logratio(self, nu: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(nu, TINY)) - self.logr


@dataclass(frozen=True, eq=False)
class WarmStart:
    r"""The inner solver's state after a JKO step: where the next step starts (bit-exact resume).

    Attributes
    ----------
    gbar : ndarray, shape (n,)
        Column potential absorbed into the stabilized kernel.
    v : ndarray, shape (n,)
        Column scaling; the OT potential is :math:`g = \bar g + \varepsilon\log v`.
    L : float
        Proximal weight of the outer loop.
    eps : float
        The regularization they belong to.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow import CircleMesh, Density
    >>> from wflow.solvers.jko import jko
    >>> rho0 = Density.from_function(CircleMesh(32), lambda x: 1 + 0.5 * x[:, 0])
    >>> first = jko(None, rho0, 0.05, 2, kappa=1.0)
    >>> ws = first.warm_start
    >>> ws.gbar.shape, ws.v.shape, bool(ws.eps > 0)
    ((32,), (32,), True)
    >>> rest = jko(None, first.density(), 0.05, 2, kappa=1.0, warm_start=ws)  # continues the run
    >>> rest.status
    0
    """

    gbar: np.ndarray
    v: np.ndarray
    L: float
    eps: float


@dataclass
class StepStats:
    """Statistics of one JKO step.

    Examples
    --------
    >>> from wflow import CircleMesh, Density
    >>> from wflow.solvers.jko import jko
    >>> rho0 = Density.from_function(CircleMesh(32), lambda x: 1 + 0.5 * x[:, 0])
    >>> s = jko(None, rho0, 0.05, 2, kappa=1.0).steps[0]
    >>> type(s).__name__, s.converged, bool(s.residual <= 1e-6)  # below the default tol
    ('StepStats', True, True)
    """

    iterations: int  #: outer (re-linearization) iterations
    sinkhorn: int  #: inner iterations: scalings, Newton-CG kernel products and Newton steps
    residual: float  #: nu-weighted first-order residual, units of dF/dmu
    residual_max: float  #: max over support points with nu_j >= 1e-8 max(nu)
    eps: float  #: regularization at the end of the step (0 for emd)
    L: float  #: final proximal weight
    objective: float  #: J at the solution (transport/2tau + Phi_eps)
    converged: bool
    time_ot: float = 0.0
    time_energy: float = 0.0
    breakdowns: int = 0  #: inner-solver breakdowns handled (zero curvature in CG, non-finite)
    stalled: bool = False  #: emd: no step lowered the objective in float64
    #: the inner solver's state after this step, kept at the saved steps (None elsewhere and for emd)
    warm_start: WarmStart | None = field(default=None, repr=False)
    #: eps below h^2 only: the plan kept the mass in its cells although the flow moves it (why)
    locked: str | None = None


class JKOStepper:
    """The per-run state of the :class:`JKO` solver (support, cost, OT state, energy); takes JKO steps.

    Examples
    --------
    >>> from wflow import CircleMesh, Density
    >>> from wflow.solvers.jko.step import JKO, JKOProblem
    >>> mesh = CircleMesh(32)
    >>> nu0 = Density.from_function(mesh, lambda x: 1 + 0.5 * x[:, 0]).masses()
    >>> stepper = JKO().init(JKOProblem(None, mesh.centers, mesh.areas, mesh=mesh, kappa=1.0), 0.0, nu0)
    >>> stepper.set_tau(0.05)
    >>> nu1, stats = stepper.step(nu0)
    >>> type(stepper).__name__, round(float(nu1.sum()), 12), stats.converged
    ('JKOStepper', 1.0, True)
    """

    def __init__(
        self,
        model,
        x,
        r,
        *,
        tau,
        eps,
        cost,
        kappa,
        method,
        debias,
        eps_scaling,
        tol,
        max_iter,
        max_sinkhorn,
        backend,
        energy: JKOEnergy | None = None,
    ):
        self.x, self.r, self.dim = x, r, x.shape[1] - 1
        self.method = method
        self.tol, self.max_iter, self.max_sinkhorn = tol, max_iter, max_sinkhorn
        self.kappa_inv = 0.0 if kappa is None or np.isinf(kappa) else 1.0 / kappa
        self.energy = energy if energy is not None else JKOEnergy(model, x, r, backend)
        # above DENSE_MAX_CELLS points the kernel keeps its kept pairs only; emd needs every pair
        self.C: np.ndarray | SparseCost = (
            SparseCost(x, cost)
            if method == "sinkhorn" and x.shape[0] > DENSE_MAX_CELLS
            else cost_matrix(x, cost=cost)
        )
        if method == "sinkhorn":
            check_eps(eps, x, r, cost)
        self.eps_target = eps if method == "sinkhorn" else 0.0
        self.eps_scaling = eps_scaling
        self.debias = debias and method == "sinkhorn"
        if not self.debias:
            self.sigma2 = 0.0
        elif isinstance(self.C, SparseCost):
            self.sigma2 = sparse_blur_variance(self.C, r, eps, self.dim)
        else:
            self.sigma2 = blur_variance(self.C, r, eps, self.dim)
        self.c_max = float(self.C.max())  # the potentials' range
        self.h = spacing(x, r)
        self.ot = SemiRelaxed(self.C, r) if method == "sinkhorn" else None
        self.first = True
        self.L = 0.0
        self.set_tau(tau)

    def warm_start(self) -> WarmStart | None:
        if self.ot is None or self.ot.eps is None:
            return None
        return WarmStart(
            gbar=self.ot.gbar.copy(), v=self.ot.v.copy(), L=float(self.L), eps=float(self.ot.eps)
        )

    def restore(self, ws: WarmStart) -> None:
        """Start the next step from ``ws`` (a :meth:`warm_start` of a run on the same support and eps)."""
        if not isinstance(ws, WarmStart):
            raise TypeError(
                f"warm_start must be a WarmStart (JKOResult.warm_start) or None, got {short_repr(ws)}"
            )
        if self.ot is None:
            raise ValueError(
                "warm_start applies to method='sinkhorn'; method='emd' keeps no state between steps"
            )
        n = self.x.shape[0]
        gbar, v = np.asarray(ws.gbar, dtype=float), np.asarray(ws.v, dtype=float)
        if (
            gbar.shape != (n,)
            or v.shape != (n,)
            or not np.all(np.isfinite(gbar))
            or not np.all(v > 0)
        ):
            raise ValueError(
                f"warm_start must hold finite gbar and positive v of shape ({n},), got shapes "
                f"{gbar.shape}, {v.shape}"
            )
        if not np.isclose(ws.eps, self.eps_target, rtol=1e-12, atol=0):
            raise ValueError(
                f"warm_start was taken at eps={ws.eps!r}, this run uses eps={self.eps_target!r}"
            )
        self.ot.eps = self.eps_target
        self.ot.build(gbar)
        self.ot.v = v.copy()
        self.L = float(ws.L)
        self.first = False

    def set_tau(self, tau: float) -> None:
        check_tau(tau, self.c_max, self.tol)
        self.tau = tau
        self.c_blur = self.sigma2 / (2 * tau)
        self.coef = self.kappa_inv - self.c_blur  # entropy weight of the debiased step

    def phi(self, nu: np.ndarray, F: float) -> float:
        return -F + self.coef * self.energy.kl(nu)

    # -- entropic step -------------------------------------------------------------
    def _linear_part(self, nu_m: np.ndarray, dF: np.ndarray, L: float) -> tuple[np.ndarray, float]:
        tau2 = 2 * self.tau
        V = -tau2 * dF
        lam = tau2 * L
        lr = self.energy.logratio(nu_m)
        if self.coef >= 0:
            lam += tau2 * self.coef
        else:
            V = V + tau2 * self.coef * lr
        if L > 0:
            V = V - tau2 * L * lr
        V = V - np.dot(nu_m, V)  # constants do not change the step (mass is fixed)
        return V, lam

    def _residual(self, nu: np.ndarray, g: np.ndarray, dF: np.ndarray) -> tuple[float, float]:
        grad = g / (2 * self.tau) - dF + self.coef * self.energy.logratio(nu)
        grad = grad - np.dot(nu, grad)
        keep = nu >= 1e-8 * nu.max()
        return float(np.dot(nu, np.abs(grad))), float(np.max(np.abs(grad[keep])))

    def _displacement_scale(self, a: np.ndarray, dF: np.ndarray) -> float:
        r"""Mean squared displacement of one step, :math:`\tau^2\sum_i a_i|\nabla_S\psi|^2 + 2(d-1)\tau/\kappa`, capped by the diameter."""
        s2 = 2 * self.dim * self.tau * self.kappa_inv
        model = self.energy.model
        if model is not None:
            v = model.velocity(self.x, Atoms._trusted(self.x, a), backend=self.energy.backend)
            s2 += self.tau**2 * float(np.dot(a, np.sum(v * v, axis=-1)))
        return min(float(self.C.max()), s2)

    def _locked(self, a: np.ndarray) -> str | None:
        r"""Why the plan kept the mass in its cells (below :math:`\varepsilon = h^2`): it moved less than
        half of :math:`\sum_i a_i\min(1, (\tau|v_i| + \sqrt{2\tau/\kappa})/h)`; else ``None``."""
        if self.ot is None or self.eps_target >= self.h**2:
            return None
        step = np.full(a.shape, np.sqrt(2 * self.tau * self.kappa_inv))
        model = self.energy.model
        if model is not None:
            v = model.velocity(self.x, Atoms._trusted(self.x, a), backend=self.energy.backend)
            step += self.tau * np.linalg.norm(v, axis=-1)
        expected = float(np.dot(a, np.minimum(1.0, step / self.h)))
        moved = max(0.0, 1.0 - self.ot.kept(a) / float(a.sum()))
        if expected < 1e-12 or moved >= 0.5 * expected:
            return None
        return (
            f"JKO step locked the mass in its cells: its plan moved {moved:.3g} of it between cells "
            f"where one step of the flow moves about {expected:.3g}; eps={self.eps_target:g} is below "
            f"the support's h^2 = {self.h**2:.4g} (spacing h = {self.h:.4g}); use the default "
            f"eps = 2 h^2 = {2 * self.h**2:.4g}, or a larger tau"
        )

    def step(self, a: np.ndarray) -> tuple[np.ndarray, StepStats]:
        ot, E = self.ot, self.energy
        if ot is None:  # method="emd" keeps no scaling solver
            return self._emd_step(a)
        broke = sum(ot.breakdowns.values())
        t_ot = 0.0
        t0e = E.time
        nu_m = a.copy()
        dF = E.first_variation(nu_m)
        schedule = [self.eps_target]
        if self.first and self.eps_scaling is not None:
            # opt-in eps-scaling on the cold step, from the scale of one step's displacement
            e = self._displacement_scale(a, dF)
            while e > self.eps_target:
                schedule.insert(-1, e)
                e *= self.eps_scaling
        sink = 0
        L = 0.0 if self.L == 0 else self.L / 4
        for eps in schedule:
            t0 = time.perf_counter()
            V, lam = self._linear_part(nu_m, dF, L)
            if ot.eps is None and lam > 0:
                # cold start at the potential whose target marginal q = r e^{-(g+V)/lam} is mu_k
                ot.gbar = -V - lam * E.logratio(a)
            ot.set_eps(eps)
            it, _ = ot.solve(
                a,
                V,
                lam,
                tol=2 * self.tau * self.tol,
                max_iter=20 if eps != self.eps_target else self.max_sinkhorn,
            )
            sink += it
            t_ot += time.perf_counter() - t0
            if eps != self.eps_target:
                nu = ot.nu(a)
                nu_m = nu / nu.sum()
                dF = E.first_variation(nu_m)
        self.first = False
        nu = ot.nu(a)
        nu /= nu.sum()
        F_new = E.F(nu)
        J_m = ot.transport(a, nu) / (2 * self.tau) + self.phi(nu, F_new)
        nu_m = nu
        dF = E.first_variation(nu_m)
        res, res_max = self._residual(nu_m, ot.g, dF)
        outer = 1
        converged = res <= self.tol
        while not converged and outer < self.max_iter:
            outer += 1
            state = ot.save()
            t0 = time.perf_counter()
            V, lam = self._linear_part(nu_m, dF, L)
            it, _ = ot.solve(
                a,
                V,
                lam,
                tol=2 * self.tau * max(0.1 * self.tol, 0.01 * res),
                max_iter=self.max_sinkhorn,
            )
            sink += it
            nu = ot.nu(a)
            nu /= nu.sum()
            t_ot += time.perf_counter() - t0
            F_new = E.F(nu)
            J_new = ot.transport(a, nu) / (2 * self.tau) + self.phi(nu, F_new)
            if J_new > J_m + 1e-12 * max(1.0, abs(J_m)):
                # the linearization was not a majorizer here: restore and add (more) proximal weight
                ot.restore(state)
                L = max(2 * L, 0.25 * float(dF.max() - dF.min()) + 1e-12)
                continue
            J_m, nu_m = J_new, nu
            dF = E.first_variation(nu_m)
            res, res_max = self._residual(nu_m, ot.g, dF)
            converged = res <= self.tol
        self.L = L
        if not converged:
            logger.warning(
                "JKO step: residual %.3g above tol=%.3g after %d iterations", res, self.tol, outer
            )
        return nu_m, StepStats(
            outer,
            sink,
            res,
            res_max,
            float(self.eps_target),  # where the eps schedule ends
            L,
            J_m,
            converged,
            time_ot=t_ot,
            time_energy=E.time - t0e,
            breakdowns=sum(ot.breakdowns.values()) - broke,
            locked=self._locked(a),
        )

    # -- exact step (POT emd) ------------------------------------------------------
    def _emd_step(self, a: np.ndarray) -> tuple[np.ndarray, StepStats]:
        from ...transport._common import import_pot

        pot = import_pot()

        E = self.energy
        t_ot = 0.0
        t0e = E.time
        tau2 = 2 * self.tau
        support = a > 0

        def evaluate(nu):
            nonlocal t_ot
            t0 = time.perf_counter()
            w2, lg = pot.emd2(a, nu, self.C, numItermax=max(10**6, 50 * nu.size**2), log=True)
            t_ot += time.perf_counter() - t0
            if lg.get("result_code", 1) != 1:
                raise SolverError(
                    f"ot.emd did not reach an optimal plan (result_code={lg.get('result_code')}); "
                    f"use method='sinkhorn' for a support of {nu.size} points"
                )
            F = E.F(nu)
            J = w2 / tau2 + self.phi(nu, F)
            dF = E.first_variation(nu)
            grad = np.asarray(lg["v"]) / tau2 - dF + self.coef * E.logratio(nu)
            return J, grad - np.dot(nu, grad)

        nu = np.where(support, a, 0.0) + 1e-12 * (self.kappa_inv > 0)
        nu /= nu.sum()
        J, grad = evaluate(nu)
        s = 1.0 / (float(np.dot(nu, np.abs(grad))) + 1e-300)
        it, res = 0, float(np.dot(nu, np.abs(grad)))
        stalled = False
        while res > self.tol and it < self.max_iter:
            it += 1
            accepted = False
            for _ in range(60):
                z = np.log(np.maximum(nu, TINY)) - s * grad
                trial = np.exp(z - z.max())
                trial /= trial.sum()
                Jt, gt = evaluate(trial)
                if Jt <= J - 1e-4 * float(np.dot(grad, nu - trial)):
                    accepted = True
                    break
                s *= 0.5
            if not (accepted and Jt < J):
                # no step lowers J in float64 (exact transport locks mass while tau |v| < h/2)
                stalled = True
                break
            nu, J, grad = trial, Jt, gt
            s *= 1.5
            res = float(np.dot(nu, np.abs(grad)))
        keep = nu >= 1e-8 * nu.max()
        return nu, StepStats(
            it,
            it,
            res,
            float(np.max(np.abs(grad[keep]))),
            0.0,
            0.0,
            float(J),
            res <= self.tol,
            time_ot=t_ot,
            time_energy=E.time - t0e,
            stalled=stalled and res > self.tol,
        )


def check_eps_scaling(eps_scaling: Any) -> float | None:
    """``eps_scaling`` checked: ``None`` (no epsilon scaling) or a factor in (0, 1).

    Examples
    --------
    >>> from wflow.solvers.jko.step import check_eps_scaling
    >>> check_eps_scaling(None), check_eps_scaling(0.5)
    (None, 0.5)
    >>> check_eps_scaling(2)
    Traceback (most recent call last):
        ...
    ValueError: eps_scaling must be None or in (0, 1), got 2.0
    """
    if eps_scaling is None:
        return None
    eps_scaling = check_positive(eps_scaling, "eps_scaling")
    if eps_scaling >= 1:
        raise ValueError(f"eps_scaling must be None or in (0, 1), got {eps_scaling}")
    return eps_scaling


def default_eps(x: np.ndarray, r: np.ndarray) -> float:
    """The default regularization ``2 h^2``, ``h`` the spacing of the support.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow import CircleMesh
    >>> from wflow.solvers.jko.step import default_eps
    >>> mesh = CircleMesh(32)  # on the circle h is the mean arc length 2 pi / 32
    >>> round(default_eps(mesh.centers, mesh.areas), 6), round(2 * (2 * np.pi / 32) ** 2, 6)
    (0.077106, 0.077106)
    """
    return 2.0 * spacing(x, r) ** 2


#: float64's unit round-off :math:`u = 2^{-53}`: a term below :math:`u` times the largest term of a
#: sum of non-negative numbers does not change the sum's value
UNIT_ROUNDOFF = 2.0**-53


def smallest_eps(x: np.ndarray, cost: str = "geodesic") -> tuple[float, float]:
    r"""``(eps_min, c_nn)``: the smallest :math:`\varepsilon` whose Gibbs kernel can move mass between
    neighbouring support points in float64, and the nearest-neighbour cost it comes from.

    Below :math:`\varepsilon = c_i/(53\log 2)`, :math:`c_i = \min_{j\ne i} C_{ij}`, the kernel's entry
    :math:`e^{-c_i/\varepsilon}` is under the round-off :math:`2^{-53}` of the diagonal: the mass of
    cell ``i`` cannot leave it.  ``eps_min`` is :math:`\max_i c_i/(53\log 2)`.  A floor, not a
    recommendation: below about :math:`h^2` the plan tends to the exact discrete one, which locks
    mass in its cell while :math:`\tau|v| < h/2`; the default is :math:`2h^2`.

    Parameters
    ----------
    x : ndarray, shape (n, d)
        Support points on the sphere.
    cost : {"geodesic", "chordal"}

    Examples
    --------
    >>> import numpy as np
    >>> from wflow import CircleMesh
    >>> eps_min, c_nn = smallest_eps(CircleMesh(32).centers)
    >>> round(c_nn, 6), round((2 * np.pi / 32) ** 2, 6), round(eps_min, 7)
    (0.038553, 0.038553, 0.0010494)
    """
    from scipy.spatial import cKDTree

    x = np.asarray(x, dtype=np.float64)
    if x.shape[0] < 2:
        return 0.0, 0.0
    chord, _ = cKDTree(x).query(x, k=2)
    c = float(np.max(chord[:, 1]))  # the largest nearest-neighbour chord
    if cost == "geodesic":
        c = 2.0 * float(np.arcsin(min(1.0, c / 2.0)))
    c_nn = c * c
    return c_nn / -math.log(UNIT_ROUNDOFF), c_nn


def check_eps(eps: float, x: np.ndarray, r: np.ndarray, cost: str = "geodesic") -> None:
    """Raise ValueError when ``eps`` is below :func:`smallest_eps` (it would lock every cell's mass).

    Examples
    --------
    >>> from wflow import CircleMesh
    >>> mesh = CircleMesh(32)
    >>> check_eps(1e-3, mesh.centers, mesh.areas)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    ValueError: eps=0.001 is below 0.00104944, the smallest eps that can move mass on this support: ...
    """
    eps_min, c_nn = smallest_eps(x, cost)
    if eps < eps_min:
        h2 = spacing(x, r) ** 2
        raise ValueError(
            f"eps={eps!r} is below {eps_min:.6g}, the smallest eps that can move mass on this support: "
            f"the Gibbs kernel's entry between nearest cells, e^(-{c_nn:.4g}/eps), is below float64's "
            f"round-off 2^-53 of the diagonal (eps < {c_nn:.4g}/(53 log 2)), so every step would keep "
            f"the mass in its cells (the mesh's h^2 = {h2:.4g}); use eps >= {eps_min:.3g}, preferably "
            f"about h^2 or more (the default is 2 h^2 = {2 * h2:.4g})"
        )


def check_tau(tau: float, c_max: float, tol: float) -> None:
    r"""Raise ValueError when the step's first-order residual cannot reach ``tol`` in float64.

    The residual holds :math:`g/(2\tau)`, :math:`g` a transport potential rounded to about
    :math:`2^{-53}C_{\max}`: below :math:`\tau = 2^{-53}C_{\max}/(2\,\mathrm{tol})` that alone exceeds ``tol``.

    Examples
    --------
    >>> check_tau(1e-300, float(np.pi) ** 2, 1e-6)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    ValueError: tau=1e-300 is below 5.48e-10: ...
    """
    tau_min = UNIT_ROUNDOFF * c_max / (2.0 * tol)
    if tau < tau_min:
        raise ValueError(
            f"tau={tau!r} is below {tau_min:.3g}: the JKO step's residual holds g/(2 tau), g a transport "
            f"potential of size up to {c_max:.4g} rounded in float64 (2^-53), so tol={tol:g} cannot be "
            f"reached; use tau >= {tau_min:.3g} or a larger tol"
        )
