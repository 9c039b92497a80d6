r"""Time steppers of the solver contract (:mod:`wflow.solvers.base`): the *how*.

Each stepper takes one step of :math:`\dot y = f(t, y)` for any :class:`~wflow.solvers.base.Problem`
and hands the result to ``problem.retract`` (:math:`x \mapsto x/|x|` on the sphere), which keeps the
order of the Runge--Kutta method (Hairer, Lubich & Wanner, *Geometric Numerical Integration*, §IV.4).
All are registered in :data:`wflow.solvers.base.SOLVERS` (``docs/solvers.md`` tabulates them).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import numpy as np

from ..kernels.threads import blas_threads
from .base import Problem, Solver, StepResult, register_solver

__all__ = [
    "Euler",
    "EulerAverage",
    "RK4",
    "DormandPrince",
    "EulerMaruyama",
    "SSPRK3",
    "ROS2",
    "Remap",
    "project_to_sphere",
]


def project_to_sphere(x: np.ndarray) -> np.ndarray:
    """Radial projection ``x / |x|`` (the retraction on the sphere); a point at the origin becomes NaN.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.steppers import project_to_sphere
    >>> project_to_sphere(np.array([[3.0, 4.0], [0.0, -2.0]]))
    array([[ 0.6,  0.8],
           [ 0. , -1. ]])
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        return x / np.sqrt(np.einsum("...i,...i->...", x, x))[..., None]


@register_solver
class Euler(Solver):
    """Explicit Euler, :math:`y \\mapsto R(y + h f(t, y))` (order 1); fused for many tiny SA systems
    (:class:`~wflow.solvers.fused.FusedEuler`).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem
    >>> class Decay(Problem):  # y' = -y
    ...     def rhs(self, t, y):
    ...         return -y
    >>> y, _ = Euler().step(Decay(), 0.0, np.array([1.0]), 0.1, None)
    >>> round(float(y.y[0]), 6), round(float(np.exp(-0.1)), 6)  # 1 - h against exp(-h)
    (0.9, 0.904837)
    """

    name = "euler"
    order = 1

    def step(self, problem, t, y, dt, state, **_):
        return StepResult(problem.retract(y + dt * problem.rhs(t, y))), state


@register_solver
class EulerAverage(Solver):
    r"""The discrete scheme of the GLPR phase diagram: :math:`x \mapsto (x + h A x)/|x + h A x|` (order 1).

    :math:`A x` is the attention average itself (``problem.average``), *not* projected on the tangent
    plane: one step is projected Euler with the per-token step :math:`h/(1 + h\langle x, Ax\rangle)`,
    consistent with the same ODE.  Geshkovski, Letrouit, Polyanskiy & Rigollet, *A mathematical
    perspective on Transformers* (phase-diagram code).  Fused for many tiny SA systems
    (:class:`~wflow.solvers.fused.FusedEuler` with ``projected=False``).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem
    >>> class Pull(Problem):  # a toy attention average: every point pulled towards e_2
    ...     def average(self, t, y):
    ...         return np.array([0.0, 1.0])
    >>> step, _ = EulerAverage().step(Pull(), 0.0, np.array([1.0, 0.0]), 0.1, None)
    >>> np.allclose(step.y, np.array([1.0, 0.1]) / np.hypot(1.0, 0.1)), round(float(np.linalg.norm(step.y)), 12)
    (True, 1.0)
    """

    name = "euler-average"
    order = 1

    def step(self, problem, t, y, dt, state, **_):
        average = getattr(problem, "average", None)
        if average is None:
            raise TypeError(
                f"method 'euler-average' needs a problem with an attention average "
                f"(particles of SA/USA on the sphere), got {type(problem).__name__}"
            )
        return StepResult(project_to_sphere(y + dt * average(t, y))), state


@register_solver
class RK4(Solver):
    """Classical fourth-order Runge--Kutta with retraction (order 4).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem
    >>> class Decay(Problem):  # y' = -y
    ...     def rhs(self, t, y):
    ...         return -y
    >>> step, _ = RK4().step(Decay(), 0.0, np.array([1.0]), 0.1, None)
    >>> round(float(step.y[0]), 6), round(float(np.exp(-0.1)), 6)
    (0.904837, 0.904837)
    """

    name = "rk4"
    order = 4

    def step(self, problem, t, y, dt, state, **_):
        f = problem.rhs
        k1 = f(t, y)
        k2 = f(t + dt / 2, y + (dt / 2) * k1)
        k3 = f(t + dt / 2, y + (dt / 2) * k2)
        k4 = f(t + dt, y + dt * k3)
        return StepResult(problem.retract(y + (dt / 6) * (k1 + 2 * k2 + 2 * k3 + k4))), state


@register_solver
class DormandPrince(Solver):
    """Dormand--Prince 5(4) embedded pair with retraction (order 5, error estimate of order 4).

    The error estimate is the difference of the two solutions before retraction, measured by
    ``problem.error_norm`` (for points: :math:`\\|e_i / (atol + rtol\\max(|x_i|, |\\tilde x_i|))\\|_{\\mathrm{RMS}}`,
    as :func:`scipy.integrate.solve_ivp`).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem
    >>> class Decay(Problem):  # y' = -y
    ...     def rhs(self, t, y):
    ...         return -y
    >>> step, _ = DormandPrince().step(Decay(), 0.0, np.array([1.0]), 0.1, None)
    >>> round(float(step.y[0]), 8), round(float(np.exp(-0.1)), 8), step.evaluations
    (0.90483742, 0.90483742, 7)
    """

    name = "dopri5"
    order = 5
    error_order = 4

    C = np.array([0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1, 1])
    A = [
        [],
        [1 / 5],
        [3 / 40, 9 / 40],
        [44 / 45, -56 / 15, 32 / 9],
        [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729],
        [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656],
        [35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84],
    ]
    B5 = np.array([35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0])
    B4 = np.array([5179 / 57600, 0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40])

    def step(self, problem, t, y, dt, state, *, rtol=0.0, atol=0.0, **_):
        ks: list[np.ndarray] = []
        for i in range(7):
            yi = y
            for a, k in zip(self.A[i], ks):
                if a != 0:
                    yi = yi + (dt * a) * k
            ks.append(problem.rhs(t + self.C[i] * dt, yi))
        y5 = y + dt * sum(b * k for b, k in zip(self.B5, ks) if b != 0)
        err = dt * sum((b5 - b4) * k for b5, b4, k in zip(self.B5, self.B4, ks) if b5 != b4)
        enorm = (
            problem.error_norm(err, y, y5, rtol, atol) if rtol or atol else None
        )  # fixed steps: no control
        return StepResult(problem.retract(y5), error=enorm, evaluations=7), state


@register_solver
class EulerMaruyama(Solver):
    r"""Euler--Maruyama, :math:`y \mapsto R(y + h f(t, y) + \xi_h)` with the problem's noise increment :math:`\xi_h`.

    For particles on the sphere :math:`\xi_h = \sqrt{2h/\kappa}\,P_x\xi`, :math:`\xi \sim N(0, I_d)`,
    and the projection supplies the Itô drift :math:`-(d-1)\kappa^{-1}x` of Brownian motion on
    :math:`S^{d-1}` (generator :math:`\kappa^{-1}\Delta_S`): weak order 1, strong order 1/2.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem
    >>> class Decay(Problem):  # y' = -y
    ...     def rhs(self, t, y):
    ...         return -y
    ...     def noise(self, t, y, dt, rng):  # additive noise sqrt(h) xi
    ...         return np.sqrt(dt) * rng.standard_normal(y.shape)
    >>> step, _ = EulerMaruyama().step(Decay(), 0.0, np.array([1.0]), 0.1, None, rng=np.random.default_rng(0))
    >>> xi = np.random.default_rng(0).standard_normal(1)
    >>> np.allclose(step.y, 0.9 + np.sqrt(0.1) * xi)
    True
    """

    name = "euler-maruyama"
    order = 0.5
    stochastic = True

    def step(self, problem, t, y, dt, state, *, rng=None, **_):
        return StepResult(
            problem.retract(y + dt * problem.rhs(t, y) + problem.noise(t, y, dt, rng))
        ), state


@register_solver
class SSPRK3(Solver):
    r"""Shu--Osher SSP-RK3 with an embedded second-order (Heun) error estimate and stage stability checks.

    .. math::

        y^{(1)} = y + h f(y),\quad y^{(2)} = \tfrac34 y + \tfrac14\big(y^{(1)} + h f(y^{(1)})\big),\quad
        y^{+} = \tfrac13 y + \tfrac23\big(y^{(2)} + h f(y^{(2)})\big).

    Each stage is a forward-Euler step, so when every stage is below the problem's forward-Euler limit
    (``problem.rhs_with_limit`` times ``problem.limit_slack``) the step preserves whatever forward Euler
    preserves (Gottlieb, Shu & Tadmor 2001); a stage above it makes the step ``ok=False``.  Heun's method
    uses the same two first stages: the error estimate :math:`y^+ - y_{\mathrm{Heun}}` is free.  The
    right-hand side at the new state is the next step's first stage (first same as last).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem
    >>> class Decay(Problem):  # y' = -y
    ...     def rhs(self, t, y):
    ...         return -y
    >>> ssp = SSPRK3()
    >>> y0 = np.array([1.0])
    >>> step, _ = ssp.step(Decay(), 0.0, y0, 0.1, ssp.init(Decay(), 0.0, y0))
    >>> step.ok, round(float(step.y[0]), 6), round(float(np.exp(-0.1)), 6)
    (True, 0.904833, 0.904837)
    """

    name = "ssprk3"
    order = 3
    error_order = 2

    def init(self, problem: Problem, t0: float, y0: np.ndarray) -> Any:
        return problem.rhs_with_limit(t0, y0)

    def limit(self, problem, t, y, state) -> float:
        return state[1]

    def step(self, problem, t, y, dt, state, *, rtol=0.0, atol=0.0, **_):
        f0, lim0 = state
        # each stage against its own true limit (the proposed step keeps the problem's CFL margin)
        slack = problem.limit_slack
        if dt > lim0 * slack:
            return StepResult(y, ok=False, limit=lim0), state
        y1 = y + dt * f0
        f1, lim1 = problem.rhs_with_limit(t + dt, y1)
        if dt > lim1 * slack:
            return StepResult(y, ok=False, limit=lim1), state
        e1 = y1 + dt * f1
        y2 = 0.75 * y + 0.25 * e1
        f2, lim2 = problem.rhs_with_limit(t + dt / 2, y2)
        if dt > lim2 * slack:
            return StepResult(y, ok=False, limit=min(lim1, lim2)), state
        # (y + 2 x) / 3, not y/3 + 2x/3: fl(1/3) + fl(2/3) != 1 would drift a conserved sum by ~2e-17 a step
        y3 = problem.retract((y + 2.0 * (y2 + dt * f2)) / 3.0)
        heun = 0.5 * (y + e1)
        err = problem.error_norm(y3 - heun, y, y3, rtol, atol) if rtol or atol else None
        with problem.stepping(None):  # the next step's first stage: the piece that starts at t + dt
            new_state = problem.rhs_with_limit(t + dt, y3)
        return StepResult(y3, error=err, evaluations=3, limit=new_state[1]), new_state


@register_solver
class ROS2(Solver):
    r"""Two-stage L-stable Rosenbrock method (Verwer, Spee, Blom & Hundsdorfer 1999), order 2, for stiff flows.

    .. math::

        (I - \gamma hJ)k_1 = f(y),\quad (I - \gamma hJ)k_2 = f(y + hk_1) - 2k_1,\quad
        y^+ = R\big(y + \tfrac32 hk_1 + \tfrac12 hk_2\big),\qquad \gamma = 1 + 1/\sqrt2,

    with the embedded first-order solution :math:`y + hk_1` for error control and :math:`J` the
    problem's exact Jacobian (``problem.jacobian(t, y)``) or forward differences (``m`` right-hand sides
    for ``m`` unknowns: small systems).  For metastable staircases, where explicit methods are held to
    steps :math:`\sim 1/\beta`.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem
    >>> class Decay(Problem):  # y' = -y
    ...     def rhs(self, t, y):
    ...         return -y
    >>> step, _ = ROS2().step(Decay(), 0.0, np.array([1.0]), 0.1, None)  # Jacobian by differences
    >>> round(float(step.y[0]), 4), round(float(np.exp(-0.1)), 4)
    (0.9058, 0.9048)
    """

    name = "ros2"
    order = 2
    error_order = 1
    GAMMA = 1.0 + 1.0 / np.sqrt(2.0)

    def jacobian(self, problem: Problem, t: float, y: np.ndarray, f0: np.ndarray) -> np.ndarray:
        flat = y.reshape(-1)
        m = flat.size
        J = np.empty((m, m))
        scale = np.sqrt(np.finfo(np.float64).eps)
        for j in range(m):
            e = scale * max(1.0, abs(flat[j]))
            yj = flat.copy()
            yj[j] += e
            J[:, j] = (problem.rhs(t, yj.reshape(y.shape)).reshape(-1) - f0.reshape(-1)) / e
        return J

    def step(self, problem, t, y, dt, state, *, rtol=0.0, atol=0.0, **_):
        import scipy.linalg as sla

        f0 = problem.rhs(t, y)
        exact = getattr(problem, "jacobian", None)
        J = exact(t, y) if exact is not None else None
        differenced = J is None
        if differenced:
            J = self.jacobian(problem, t, y, f0)
        # one BLAS thread for small factorizations (faster than several)
        with (
            warnings.catch_warnings(),
            blas_threads(1) if J.shape[0] <= 2048 else contextlib.nullcontext(),
        ):
            warnings.simplefilter("ignore", sla.LinAlgWarning)
            lu = sla.lu_factor(np.eye(J.shape[0]) - self.GAMMA * dt * J)
            k1 = sla.lu_solve(lu, f0.reshape(-1)).reshape(y.shape)
            if not np.all(np.isfinite(k1)):  # I - gamma h J singular at this h: a smaller step
                return StepResult(y, error=np.inf), state
            f1 = problem.rhs(t + dt, y + dt * k1)
            k2 = sla.lu_solve(lu, (f1 - 2 * k1).reshape(-1)).reshape(y.shape)
        y2 = y + 1.5 * dt * k1 + 0.5 * dt * k2
        err = problem.error_norm(0.5 * dt * (k1 + k2), y, y2, rtol, atol) if rtol or atol else None
        return StepResult(
            problem.retract(y2), error=err, evaluations=2 + differenced * y.size
        ), state


@register_solver
class Remap(Solver):
    r"""Characteristics and conservative remap for one-dimensional conservation laws (order 3 in time, error order 2).

    The problem takes the step itself: ``problem.remap_step(t, y, dt)`` returns the new state and a
    lower-order one (the error estimate), or ``None`` when characteristics would cross (the driver then
    halves the step).  Positive and conservative, with no CFL limit
    (:class:`wflow.solvers.zonal.ZonalProblem`).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem
    >>> class Still(Problem):  # nothing moves: the step returns the state
    ...     def remap_step(self, t, y, dt):
    ...         return y.copy(), y.copy()
    >>> step, _ = Remap().step(Still(), 0.0, np.array([0.25, 0.75]), 10.0, None, rtol=1e-3, atol=1e-12)
    >>> step.ok, step.y.tolist(), step.error
    (True, [0.25, 0.75], 0.0)
    """

    name = "remap"
    order = 3
    error_order = 2

    def step(self, problem, t, y, dt, state, *, rtol=0.0, atol=0.0, **_):
        remap_step = getattr(problem, "remap_step", None)
        if remap_step is None:
            raise TypeError(
                f"method 'remap' needs a problem with a remap step (a 1-D conservation law such as the "
                f"zonal solver's), got {type(problem).__name__}"
            )
        out = remap_step(t, y, dt)
        if out is None:
            return StepResult(y, ok=False, limit=0.5 * dt), state
        y_new, y_low = out
        err = problem.error_norm(y_new - y_low, y, y_new, rtol, atol) if rtol or atol else None
        return StepResult(y_new, error=err, evaluations=3), state
