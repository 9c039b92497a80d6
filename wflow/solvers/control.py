r"""Step-size control: the size of the next trial step, whether a step is kept, where time lands.

The driver (:func:`wflow.solvers.driver.integrate`) asks one :class:`StepSizeController` (as diffrax's
``AbstractStepSizeController``): :meth:`~StepSizeController.init` once, then per attempted step
:meth:`~StepSizeController.propose`, :meth:`~StepSizeController.accept`,
:meth:`~StepSizeController.unstable` and :meth:`~StepSizeController.advance`.  :class:`ConstantSteps`
takes steps of exactly ``dt`` on a grid, split to land on save times; :class:`AdaptiveSteps` controls
the error (Hairer, Nørsett & Wanner, *Solving ODEs I*, II.4) and lands on save times and breakpoints
(``docs/solvers.md``, step control).  :func:`make_controller` checks the arguments and builds one.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import SolverError, check_int, check_positive
from .contract import Problem, Solver
from .saveat import SaveTimes, StepGrid

__all__ = [
    "StepControl",
    "MAX_REJECTIONS",
    "StepSizeController",
    "ConstantSteps",
    "AdaptiveSteps",
    "make_controller",
    "initial_step",
    "check_tolerance",
]

_EPS = float(np.finfo(np.float64).eps)
#: consecutive rejected steps after which an autonomous problem's run stops with "step size underflow"
MAX_REJECTIONS = 60


@dataclass(frozen=True)
class StepControl:
    """How adaptive steps are controlled and how many a run may take (the step itself is ``dt``).

    Parameters
    ----------
    rtol, atol : float, optional
        Tolerances of an error-controlled method (``"dopri5"``; default 1e-6 and 1e-9 for particles).
    max_steps : int
        Attempted steps (accepted + rejected) before the run fails.

    Examples
    --------
    >>> import wflow
    >>> traj = wflow.simulate(wflow.SA(4.0), wflow.sphere.uniform(32, 3, seed=0), 1.0,
    ...                       control=wflow.StepControl(rtol=1e-8, atol=1e-10))
    >>> traj.config["rtol"], traj.config["atol"], traj.status
    (1e-08, 1e-10, 0)
    """

    rtol: float | None = None
    atol: float | None = None
    max_steps: int = 10**7

    def __post_init__(self) -> None:
        if self.rtol is not None:
            object.__setattr__(self, "rtol", check_tolerance(self.rtol, "StepControl: rtol"))
        if self.atol is not None:
            object.__setattr__(self, "atol", check_tolerance(self.atol, "StepControl: atol"))
        object.__setattr__(self, "max_steps", check_int(self.max_steps, "StepControl: max_steps"))


class StepSizeController(ABC):
    """Chooses the steps of one run; holds the controller's state between steps.

    Attributes
    ----------
    adaptive : bool
        Error-controlled steps (True) or a fixed grid.
    dt : float or None
        The step the run was given (fixed step, or first trial step), as recorded.
    rtol, atol : float or None
        The tolerances of adaptive steps (None with fixed steps).
    grid : StepGrid or None
        The fixed-step grid (None with adaptive steps).
    """

    adaptive: ClassVar[bool] = False
    dt: float | None = None
    rtol: float | None = None
    atol: float | None = None
    grid: StepGrid | None = None

    def init(
        self, problem: Problem, solver: Solver, saves: SaveTimes, t: float, y: np.ndarray, h: Any
    ) -> None:
        """Before the first step of this call (a fresh run or a resume at ``t``); ``h``: the first trial step or None."""
        self.saves = saves

    @abstractmethod
    def propose(
        self,
        problem: Problem,
        solver: Solver,
        t: float,
        y: np.ndarray,
        state: Any,
        step_no: int,
        k_save: int,
    ) -> tuple[float | None, bool, float]:
        """``(h, lands, stop)``: the trial step from ``t``, whether it ends on ``stop`` (the next save time or
        breakpoint before save ``k_save``).  ``h`` is None when ``t`` is already within rounding of ``stop``: the
        run is at the stop.  Raises :class:`~wflow.errors.SolverError` when the step underflows."""

    def unstable(self, t: float, h: float, limit: float) -> None:
        """The step ``h`` broke the solver's stability limit ``limit``: shrink the next trial, or raise."""
        raise SolverError(
            f"the fixed step dt={h:.6g} exceeds the solver's stability limit "
            f"{limit:.6g} at t={t:.6g}; use a smaller dt or adaptive steps"
        )

    def accept(self, h: float, error: float | None) -> bool:
        """Whether the step ``h`` with scaled error norm ``error`` is kept; sets the next trial step."""
        return True

    @abstractmethod
    def advance(self, t: float, h: float, land: bool, stop: float, step_no: int) -> float:
        """The time after the kept step ``h`` from ``t`` (``step_no`` steps taken since ``t0``)."""

    @property
    def dt_next(self) -> float:
        """The next trial step, saved with each snapshot for a resume (``nan`` with fixed steps)."""
        return math.nan


class ConstantSteps(StepSizeController):
    """Steps of exactly ``dt`` on a :class:`~wflow.solvers.saveat.StepGrid`, the one crossing a save time split
    in two to land on it; every step is kept.

    Examples
    --------
    >>> import wflow
    >>> x0 = wflow.sphere.uniform(8, 3, seed=0)
    >>> res = wflow.simulate(wflow.SA(1.0), x0, 0.9, method="rk4", dt=0.3, save_at=[0.5, 0.9], backend="numpy")
    >>> [round(float(t), 12) for t in res.times], res.stats["steps"].tolist()  # 0.3 -> 0.5 -> 0.6 -> 0.9
    ([0.0, 0.5, 0.9], [0, 2, 4])
    """

    def __init__(self, grid: StepGrid) -> None:
        self.grid = grid
        self.dt = grid.dt

    def init(self, problem, solver, saves, t, y, h):
        self.saves = saves
        g = self.grid
        breaks = np.asarray(problem.breakpoints(g.t0, g.t_end), dtype=np.float64).reshape(-1)
        off = [float(b) for b in breaks if abs(g.time(g.index(b)) - b) > 1e-9 * g.dt]
        if off:
            # a step across a layer boundary has one layer for all its stages (Problem.stepping)
            warnings.warn(
                f"fixed steps of dt={g.dt:g} straddle the model's breakpoints (layer boundaries) at "
                f"t = {', '.join(f'{b:g}' for b in off[:3])}{', ...' if len(off) > 3 else ''}: the step "
                f"across each uses one layer, which makes the run first order there; choose a dt that "
                f"divides the layer length, or adaptive steps (they land on the boundaries)",
                stacklevel=2,
            )

    def propose(self, problem, solver, t, y, state, step_no, k_save):
        g, stop = self.grid, float(self.saves.times[k_save])
        k = g.interval(t)
        end = g.time(k + 1)
        h = g.step(k) if t == g.time(k) else end - t  # exactly dt from a grid time
        if stop < end:
            return stop - t, True, stop
        return h, stop == end, stop

    def advance(self, t, h, land, stop, step_no):
        return stop if land else self.grid.time(self.grid.interval(t) + 1)


class AdaptiveSteps(StepSizeController):
    r"""Error-controlled steps (Hairer, Nørsett & Wanner, II.4) that land on save times and breakpoints.

    Parameters
    ----------
    rtol, atol : float
        Tolerances of the solver's scaled error norm.
    error_order : float
        Order :math:`q` of the solver's error estimate: the step changes by
        :math:`\min(5, \max(0.2, 0.9\,\mathrm{err}^{-1/(q+1)}))`.
    t0, t_end : float
        The interval of the run (its breakpoints are landed on).
    dt : float or None
        The first trial step (None: :func:`initial_step`).

    Examples
    --------
    >>> import wflow
    >>> x0 = wflow.sphere.uniform(8, 3, seed=0)
    >>> res = wflow.simulate(wflow.SA(1.0), x0, 1.0, save_at=[0.5, 1.0], backend="numpy")  # dopri5
    >>> res.times.tolist(), res.config["save_mode"], bool(res.stats["dt_next"][-1] > 0)  # lands on each save
    ([0.0, 0.5, 1.0], 'land', True)
    """

    adaptive = True

    def __init__(
        self,
        rtol: float,
        atol: float,
        error_order: float,
        t0: float,
        t_end: float,
        dt: float | None = None,
    ) -> None:
        self.rtol, self.atol, self.dt = rtol, atol, dt
        self.t0, self.t_end = t0, t_end
        self.expo = -1.0 / (error_order + 1)
        self.h: float = math.nan
        self.tc = 0.0  # the low part of the time: the run is at t + tc
        self.rejected_in_row = 0

    def init(self, problem, solver, saves, t, y, h):
        self.saves = saves
        self.autonomous = bool(problem.autonomous)
        self.breaks = np.sort(
            np.asarray(problem.breakpoints(self.t0, self.t_end), dtype=np.float64).reshape(-1)
        )
        self.h = initial_step(problem, solver, t, y, self.rtol, self.atol) if h is None else h

    def propose(self, problem, solver, t, y, state, step_no, k_save):
        target = float(self.saves.times[k_save])
        breaks = self.breaks
        # the next stop: the save time, or a breakpoint of the problem (a layer boundary) before it
        j = int(np.searchsorted(breaks, t, side="right"))
        stop = float(breaks[j]) if j < breaks.size and breaks[j] < target else target
        rest = (stop - t) - self.tc
        if rest <= 4 * _EPS * max(abs(stop), 1e-300):
            # the previous step ended within rounding of the stop: it is the stop
            self.tc = 0.0
            return None, True, stop
        lim = solver.limit(problem, t, y, state)
        h_try = min(self.h, lim)
        land = h_try >= rest
        if not land and rest - h_try < 1e-3 * h_try:
            # no sliver of a step before the save time: stretch this step, or split the rest in two
            if rest <= lim:
                land = True
            else:
                h_try = rest / 2
        if land:
            h_try = rest
        if (
            not h_try > (0.0 if self.autonomous else 1e-30 * abs(t))
            or self.rejected_in_row >= MAX_REJECTIONS
        ):
            scale = (
                f"{MAX_REJECTIONS} steps rejected in a row"
                if self.autonomous
                else "the solution changes on a time scale 1e-30 of the time itself"
            )
            raise SolverError(
                f"step size underflow at t={t:.6g} (dt={h_try:.3g}): {scale}; the problem "
                f"may be stiff, the tolerances too tight (rtol={self.rtol:g}, atol={self.atol:g}), "
                f"or the kernel overflowing"
            )
        return h_try, land, stop

    def unstable(self, t, h, limit):
        self.h = min(h, 0.9 * limit)

    def accept(self, h, error):
        err = error if error is not None and math.isfinite(error) else math.inf
        if err > 1.0:
            self.rejected_in_row += 1
            self.h = h * (max(0.2, 0.9 * err**self.expo) if math.isfinite(err) else 0.2)
            return False
        self.h = h * (5.0 if err == 0 else min(5.0, 0.9 * err**self.expo))
        self.rejected_in_row = 0
        return True

    def advance(self, t, h, land, stop, step_no):
        if land:
            self.tc = 0.0
            return stop
        # compensated time (t + tc): steps below the rounding of t still advance it
        tc = self.tc
        s_ = t + h
        b_ = s_ - t
        tc += (t - (s_ - b_)) + (h - b_)
        t = s_ + tc
        tc -= t - s_
        self.tc = tc
        return t

    @property
    def dt_next(self) -> float:
        return float(self.h)


def check_tolerance(value: Any, name: str) -> float:
    """A tolerance ``rtol`` or ``atol``: positive and at least ``1e-15``."""
    v = check_positive(value, name)
    if v < 1e-15:
        raise ValueError(
            f"{name} must be >= 1e-15 (below double-precision rounding nothing can be resolved), "
            f"got {value!r}"
        )
    return v


def make_controller(
    problem: Problem,
    solver: Solver,
    t0: float,
    t_end: float,
    dt: Any = None,
    rtol: Any = None,
    atol: Any = None,
    adaptive: bool | None = None,
) -> StepSizeController:
    """The controller :func:`~wflow.solvers.driver.integrate` uses, its arguments checked: adaptive steps
    whenever the solver has an error estimate, unless ``adaptive=False`` (then ``dt`` is required).

    Examples
    --------
    >>> from wflow.solvers.base import Problem, get_solver
    >>> from wflow.solvers.control import make_controller
    >>> type(make_controller(Problem(), get_solver("rk4"), 0.0, 1.0, dt=0.1)).__name__
    'ConstantSteps'
    >>> c = make_controller(Problem(), get_solver("dopri5"), 0.0, 1.0)
    >>> type(c).__name__, c.rtol, c.atol
    ('AdaptiveSteps', 1e-06, 1e-09)
    """
    if dt is not None:
        dt = check_positive(dt, "dt")
        if dt <= 4 * np.finfo(float).eps * max(abs(t0), abs(t_end)):
            raise ValueError(f"dt={dt!r} is below the rounding of the times in [{t0:g}, {t_end:g}]")
    if adaptive is None:
        adaptive = solver.adaptive
    if adaptive and not solver.adaptive:
        raise ValueError(
            f"solver {solver.name!r} has no error estimate: give a fixed dt (adaptive=False)"
        )
    if not adaptive:
        if rtol is not None or atol is not None:
            raise ValueError(
                f"rtol/atol control adaptive steps; solver {solver.name!r} with a fixed dt "
                f"does not use them"
            )
        if dt is None:
            raise ValueError(f"solver {solver.name!r} takes fixed steps: give dt")
        return ConstantSteps(StepGrid.make(t0, t_end, dt))
    r0, a0 = problem.default_tolerances()
    rtol = r0 if rtol is None else check_tolerance(rtol, "rtol")
    atol = a0 if atol is None else check_tolerance(atol, "atol")
    error_order = solver.error_order
    assert error_order is not None  # solver.adaptive, checked above
    return AdaptiveSteps(rtol, atol, error_order, t0, t_end, dt)


def initial_step(
    problem: Problem, solver: Solver, t0: float, y0: np.ndarray, rtol: float, atol: float
) -> float:
    """Hairer, Nørsett & Wanner (1993), II.4: a first step for an adaptive method, capped by the stability limit."""
    f0, lim = problem.rhs_with_limit(t0, y0)
    scale = atol + rtol * np.abs(y0)
    d0 = float(np.sqrt(np.mean(np.square(y0 / scale))))
    d1 = float(np.sqrt(np.mean(np.square(f0 / scale))))
    h0 = 1e-6 if d0 < 1e-5 or d1 < 1e-5 else 0.01 * d0 / d1
    h0 = min(h0, lim)
    y1 = problem.retract(y0 + h0 * f0)
    f1 = problem.rhs(t0 + h0, y1)
    d2 = float(np.sqrt(np.mean(np.square((f1 - f0) / scale)))) / h0
    order = solver.error_order or 1
    h1 = (
        max(1e-6, h0 * 1e-3)
        if max(d1, d2) <= 1e-15
        else (0.01 / max(d1, d2)) ** (1.0 / (order + 1))
    )
    return float(min(100 * h0, h1, lim))
