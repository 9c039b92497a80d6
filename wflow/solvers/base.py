r"""The solver contract: problems say *what* moves, solvers *how* one step is taken, one driver *when*.

Every time-dependent computation in wflow -- particles, Lagrangian nodes, finite volumes,
JKO steps -- is a :class:`Problem` (the state space and its right-hand side), a
:class:`Solver` (one step: ``init`` / ``step``, a declared ``order``, an error estimate
where it has one, a stability limit) and one call of :func:`integrate`, the only time
loop of the package.  The driver owns save times, step-size control, ``max_steps``,
detection of non-finite states, trackers (progress bar, callbacks, recorders) and
resume; the result is a :class:`Result` that turns into an :class:`xarray.Dataset`.

Step-size control
-----------------
*Fixed steps* (``dt`` given and the solver has no error estimate, or ``adaptive=False``):
steps of exactly ``dt`` on the grid :math:`t_k = t_0 + k\,dt`; the last step ends at
``t_end`` (it is stretched by at most :math:`10^{-6}dt` rather than followed by a
round-off step).  A save time is *snapped* to the nearest grid time and the result
records the grid time: ``dt`` is never changed to land on a save time.

*Adaptive steps* (a solver with an error estimate): the step is accepted when the
solver's scaled error norm is :math:`\le 1`, and the next step is
:math:`h\min(5, \max(0.2, 0.9\,\mathrm{err}^{-1/(q+1)}))` with :math:`q` the order of the
error estimate (Hairer, Nørsett & Wanner, *Solving ODEs I*, II.4).  The step is capped by
the solver's stability limit (e.g. the positivity CFL limit of a finite-volume scheme)
and lands exactly on each save time; a remainder below :math:`10^{-3}` of a step is
absorbed by stretching that step, so no step is shorter than the problem warrants.

Randomness
----------
The noise of step ``k`` is drawn from ``default_rng(SeedSequence(seed, spawn_key=(k,)))``,
so a run resumed after any saved snapshot repeats the uninterrupted run bit for bit.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .._version import __version__
from ..errors import SolverError, check_int, check_positive, short_repr

__all__ = [
    "Problem",
    "Solver",
    "StepResult",
    "Snapshot",
    "Tracker",
    "Result",
    "SOLVERS",
    "register_solver",
    "get_solver",
    "integrate",
    "ResumeState",
    "check_save_at",
    "seed_entropy",
]

log = logging.getLogger(__name__)

#: a variable of a snapshot: ``(dimension names, array)``; the leading ``time`` dimension is implied
Variable = tuple[tuple[str, ...], np.ndarray]


# ------------------------------------------------------------------------------ the *what*
class Problem:
    r"""A state space and its right-hand side :math:`\dot y = f(t, y)` (the *what*).

    Subclasses give :meth:`rhs`; the other methods have defaults for a plain ODE in
    :math:`\mathbb{R}^m`.  A problem counts its right-hand-side ``evaluations``.

    Attributes
    ----------
    kind : str
        The result kind (``"particles"``, ``"lagrangian"``, ``"density"``, ``"jko"``, ...):
        how snapshots are stored and which result class is returned.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem, integrate
    >>> class Decay(Problem):  # y' = -y, a plain ODE in R^1
    ...     def rhs(self, t, y):
    ...         return -y
    >>> res = integrate(Decay(), "rk4", np.array([1.0]), 0.0, 1.0, dt=0.01)
    >>> res.kind, round(float(res["state"][-1, 0]), 6), round(float(np.exp(-1.0)), 6)
    ('ode', 0.367879, 0.367879)
    """

    kind: ClassVar[str] = "ode"

    def __init__(self) -> None:
        self.evaluations = 0

    def rhs(self, t: float, y: np.ndarray) -> np.ndarray:
        """The time derivative of the state."""
        raise TypeError(
            f"{type(self).__name__} has no explicit right-hand side; use a solver made for it"
        )

    def rhs_with_limit(self, t: float, y: np.ndarray) -> tuple[np.ndarray, float]:
        """``(rhs, limit)``: the derivative and the largest stable forward-Euler step at ``y`` (``inf`` if none)."""
        return self.rhs(t, y), math.inf

    def retract(self, y: np.ndarray) -> np.ndarray:
        """Map a stepped state back onto the state manifold (identity in flat space)."""
        return y

    def known_finite(self, y: np.ndarray) -> bool:
        """Whether the problem already knows the state ``y`` it returned from a step is finite (e.g. a fused
        step that saw every row's norm); the driver then skips its own scan of the state.  ``False``: scan."""
        return False

    def noise(self, t: float, y: np.ndarray, dt: float, rng: np.random.Generator) -> np.ndarray:
        """The noise increment of one step (stochastic problems only)."""
        raise TypeError(f"{type(self).__name__} has no noise; use a deterministic solver")

    @property
    def stochastic(self) -> bool:
        return False

    def error_norm(
        self, err: np.ndarray, y0: np.ndarray, y1: np.ndarray, rtol: float, atol: float
    ) -> float:
        r"""Scaled RMS norm :math:`\|e_i/(atol + rtol\max(|y_{0,i}|, |y_{1,i}|))\|_{\mathrm{RMS}}` (as in scipy)."""
        scale = atol + rtol * np.maximum(np.abs(y0), np.abs(y1))
        return float(np.sqrt(np.mean(np.square(err / scale))))

    def snapshot(self, t: float, y: np.ndarray) -> dict[str, Variable]:
        """The variables saved at a save time (state and diagnostics), without the time axis."""
        return {"state": (tuple(f"dim_{i}" for i in range(np.ndim(y))), np.array(y, copy=True))}

    def static(self) -> dict[str, Variable]:
        """Variables written once (weights, mesh arrays, ...)."""
        return {}

    def config(self) -> dict[str, Any]:
        """Everything besides the solver and the step control that is needed to repeat the run."""
        return {"kind": self.kind}

    def default_tolerances(self) -> tuple[float, float]:
        """``(rtol, atol)`` used by adaptive solvers when none are given."""
        return 1e-6, 1e-9

    def breakpoints(self, t0: float, t_end: float) -> np.ndarray:
        """Times in ``(t0, t_end)`` where the right-hand side jumps (layer boundaries): adaptive steps land on them."""
        return np.empty(0)

    @property
    def autonomous(self) -> bool:
        """True when the right-hand side does not depend on t.  Adaptive steps of such a problem may be far
        below the rounding of t (the time is compensated): a merge lasting O(1) at t ~ 1e30 is resolved, and a
        stall is detected by consecutive rejections instead of the floor ``1e-30 |t|``."""
        return False


# ------------------------------------------------------------------------------ the *how*
@dataclass
class StepResult:
    """What one attempted step gives back to the driver.

    Attributes
    ----------
    y : ndarray
        The new state (ignored when ``ok`` is False).
    error : float or None
        Scaled error norm (accept when ``<= 1``); None for solvers without an estimate.
    evaluations : int
        Informational; the driver counts work by ``problem.evaluations``.
    ok : bool
        False when a stage violated the stability limit: the driver retries with ``limit``.
    limit : float
        The largest stable step at the new state (or, when ``ok`` is False, the violated one).
    failure : str or None
        Set when the step was taken but missed its own target (e.g. a JKO step whose
        optimality residual stayed above tolerance): the driver stops with a failure status.
    info : dict
        Per-step statistics the solver wants recorded (e.g. a JKO step's residual).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem, get_solver
    >>> class Decay(Problem):
    ...     def rhs(self, t, y):
    ...         return -y
    >>> rk4 = get_solver("rk4")
    >>> step, _ = rk4.step(Decay(), 0.0, np.array([1.0]), 0.1, rk4.init(Decay(), 0.0, np.array([1.0])))
    >>> step.ok, step.error, round(float(step.y[0]), 6)  # exp(-0.1) = 0.904837
    (True, None, 0.904837)
    """

    y: np.ndarray
    error: float | None = None
    evaluations: int = 0
    ok: bool = True
    limit: float = math.inf
    failure: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Solver(ABC):
    """One step of a time discretization (the *how*); stateless apart from its options.

    Subclasses set ``name``, ``order`` (and ``error_order`` when they estimate their
    error) and implement :meth:`step`.  Per-run state (cached derivatives, transport
    potentials) lives in the object returned by :meth:`init` and passed back to :meth:`step`.

    Examples
    --------
    >>> from wflow.solvers.base import Solver, get_solver
    >>> rk4, dopri5 = get_solver("rk4"), get_solver("dopri5")
    >>> isinstance(rk4, Solver), rk4.order, rk4.adaptive, dopri5.adaptive
    (True, 4, False, True)
    """

    name: ClassVar[str] = ""
    order: ClassVar[float] = 0
    #: order of the embedded error estimate; None when the solver has none (fixed steps only)
    error_order: ClassVar[float | None] = None
    stochastic: ClassVar[bool] = False

    @property
    def adaptive(self) -> bool:
        return self.error_order is not None

    def init(self, problem: Problem, t0: float, y0: np.ndarray) -> Any:
        """Per-run state; ``None`` by default."""
        return None

    @abstractmethod
    def step(
        self,
        problem: Problem,
        t: float,
        y: np.ndarray,
        dt: float,
        state: Any,
        *,
        rtol: float = 0.0,
        atol: float = 0.0,
        rng: np.random.Generator | None = None,
    ) -> tuple[StepResult, Any]:
        """One step of size ``dt`` from ``(t, y)``: ``(StepResult, new state)``."""

    def limit(self, problem: Problem, t: float, y: np.ndarray, state: Any) -> float:
        """The largest stable step at ``(t, y)``; ``inf`` when the solver has no stability limit."""
        return math.inf

    def checkpoint(self, state: Any) -> dict[str, Variable]:
        """Variables that let :meth:`restore` rebuild ``state`` after a resume (none by default)."""
        return {}

    def restore(
        self, problem: Problem, t: float, y: np.ndarray, saved: dict[str, np.ndarray]
    ) -> Any:
        """The state after a resume from a snapshot whose :meth:`checkpoint` variables are ``saved``."""
        return self.init(problem, t, y)

    def options(self) -> dict[str, Any]:
        """The solver's options, for the run configuration."""
        return {}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts})"


#: every solver of wflow, by name (``get_solver(name, **options)`` builds one)
SOLVERS: dict[str, type[Solver]] = {}


def register_solver(cls: type[Solver]) -> type[Solver]:
    """Class decorator: list a solver in :data:`SOLVERS` under its ``name``.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import SOLVERS, Problem, Solver, StepResult, integrate, register_solver
    >>> @register_solver
    ... class Heun(Solver):  # explicit trapezoid rule, order 2
    ...     name, order = "toy-heun", 2
    ...     def step(self, problem, t, y, dt, state, *, rtol=0.0, atol=0.0, rng=None):
    ...         k1 = problem.rhs(t, y)
    ...         k2 = problem.rhs(t + dt, y + dt * k1)
    ...         return StepResult(y + dt / 2 * (k1 + k2), evaluations=2), state
    >>> class Decay(Problem):
    ...     def rhs(self, t, y):
    ...         return -y
    >>> res = integrate(Decay(), "toy-heun", np.array([1.0]), 0.0, 1.0, dt=0.01)
    >>> res.solver, bool(abs(res["state"][-1, 0] - np.exp(-1.0)) < 1e-5)
    ('toy-heun', True)
    >>> del SOLVERS["toy-heun"]
    """
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a name to be registered")
    SOLVERS[cls.name] = cls
    return cls


def get_solver(name: Any, **options: Any) -> Solver:
    """The solver registered as ``name``, built with ``options``.

    Examples
    --------
    >>> from wflow.solvers.base import SOLVERS, get_solver
    >>> get_solver("rk4").order, "dopri5" in SOLVERS
    (4, True)
    """
    if isinstance(name, Solver):
        return name
    if not isinstance(name, str) or name not in SOLVERS:
        raise ValueError(f"solver/method must be one of {sorted(SOLVERS)}, got {short_repr(name)}")
    return SOLVERS[name](**options)


# ------------------------------------------------------------------------------ the *record*
@dataclass
class Snapshot:
    """One saved state, as trackers receive it.

    ``data`` holds the problem's variables (state and diagnostics), ``stats`` the
    cumulative solver statistics, ``control`` the step-size controller's state
    (``dt_next``), ``checkpoint`` the solver's resume variables and ``state`` the raw
    state array (not a copy: a read-only view of the state the run continues from, so a tracker
    or callback that tries to change it gets an error instead of silently changing the run).

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem, Tracker, integrate
    >>> class Decay(Problem):
    ...     def rhs(self, t, y):
    ...         return -y
    >>> class Last(Tracker):  # keeps the last snapshot it was shown
    ...     def save(self, snap):
    ...         self.snap = snap
    >>> last = Last()
    >>> _ = integrate(Decay(), "rk4", np.array([1.0]), 0.0, 1.0, dt=0.1, trackers=[last])
    >>> last.snap.index, last.snap.t, last.snap.stats["steps"], sorted(last.snap.data)
    (10, 1.0, 10, ['state'])
    """

    index: int
    t: float
    data: dict[str, Variable]
    stats: dict[str, int]
    control: dict[str, float]
    checkpoint: dict[str, Variable]
    state: np.ndarray | None = None


@dataclass
class RunInfo:
    """What trackers learn when a run starts."""

    problem: Problem
    solver: Solver
    config: dict[str, Any]
    static: dict[str, Variable]
    save_times: np.ndarray
    t0: float
    t_end: float
    resumed_at: int  # index of the first snapshot this call will save (0 unless resuming)


class Tracker:
    """Watches a run: ``start`` once, ``save`` at each save time, ``step`` after each accepted step, ``finish``.

    ``save`` and ``step`` may return True to stop the run (status 1, "stopped by ...").
    ``close`` is called last whatever ended the run (an exception or an interrupt included).
    A tracker never changes the state.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem, Tracker, integrate
    >>> class Decay(Problem):
    ...     def rhs(self, t, y):
    ...         return -y
    >>> class StopAtHalf(Tracker):
    ...     name = "stop-at-half"
    ...     def save(self, snap):
    ...         return snap.t >= 0.5  # True stops the run
    >>> res = integrate(Decay(), "rk4", np.array([1.0]), 0.0, 1.0, dt=0.1, trackers=[StopAtHalf()])
    >>> res.status, float(res.times[-1]), len(res)
    (1, 0.5, 6)
    """

    name = "tracker"

    def start(self, run: RunInfo) -> None:
        pass

    def save(self, snap: Snapshot) -> bool | None:
        return None

    def step(self, t: float, dt: float, step: StepResult) -> bool | None:
        return None

    def finish(self, result: Result) -> None:
        pass

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------ results
@dataclass
class Result:
    """The outcome of a run, for every kind of problem.

    Attributes
    ----------
    kind : str
        ``"particles"``, ``"lagrangian"``, ``"density"``, ``"jko"``, ...
    times : ndarray, shape (k,)
        Saved times.
    data : dict
        ``name -> (dims, array of shape (k, ...))``: the saved variables.
    static : dict
        ``name -> (dims, array)``: variables that do not change (weights, mesh).
    stats : dict of ndarray, each shape (k,)
        Cumulative ``steps``, ``rejected`` and ``evaluations`` at each save, and ``dt_next``.
    status : int
        0: reached ``t_end``; 1: stopped by a tracker or callback; -1: failed (see ``message``).
    message : str
    config : dict
        Everything needed to repeat the run (problem, solver and its options, step control,
        seed, save times, wflow version).
    solver : str
    order : float
    checkpoint : dict
        The solver's resume variables at the last save.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem, integrate
    >>> class Decay(Problem):
    ...     def rhs(self, t, y):
    ...         return -y
    >>> res = integrate(Decay(), "rk4", np.array([1.0]), 0.0, 1.0, dt=0.1, save_at=[0.5, 1.0])
    >>> res.times.tolist(), res["state"].shape, res.success, res.stats["steps"].tolist()
    ([0.0, 0.5, 1.0], (3, 1), True, [0, 5, 10])
    >>> res
    Result(ode, 3 snapshots, t=0..1, solver=rk4, steps=10, status=0: reached t_end)
    """

    kind: str
    times: np.ndarray
    data: dict[str, Variable]
    static: dict[str, Variable]
    stats: dict[str, np.ndarray]
    status: int = 0
    message: str = "reached t_end"
    config: dict[str, Any] = field(default_factory=dict)
    solver: str = ""
    order: float = 0
    checkpoint: dict[str, Variable] = field(default_factory=dict)
    step_info: list[dict[str, Any]] = field(default_factory=list)

    @property
    def success(self) -> bool:
        """True unless the run failed (status -1)."""
        return self.status >= 0

    def __len__(self) -> int:
        return int(len(self.times))

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.data:
            return self.data[name][1]
        if name in self.static:
            return self.static[name][1]
        raise KeyError(
            f"{name!r}: this {self.kind} result holds {sorted(self.data) + sorted(self.static)}"
        )

    def to_dataset(self):
        """This result as an :class:`xarray.Dataset` (the layout of its Zarr store)."""
        from ..io import result_dataset

        return result_dataset(self)

    def __repr__(self) -> str:
        t = f"t={self.times[0]:g}..{self.times[-1]:g}" if len(self.times) else "no snapshots"
        steps = int(self.stats["steps"][-1]) if len(self.stats.get("steps", ())) else 0
        return (
            f"{type(self).__name__}({self.kind}, {len(self)} snapshots, {t}, solver={self.solver}, "
            f"steps={steps}, status={self.status}: {self.message})"
        )


# ------------------------------------------------------------------------------ checks
def check_save_at(save_at: Any, t0: float, t_end: float, default: int = 11) -> np.ndarray:
    """Validated save times in ``[t0, t_end]``, strictly increasing, always starting at ``t0``.

    Examples
    --------
    >>> from wflow.solvers.base import check_save_at
    >>> check_save_at([0.5, 1.0], 0.0, 1.0).tolist()  # t0 is always saved
    [0.0, 0.5, 1.0]
    >>> check_save_at(None, 0.0, 1.0, default=3).tolist()
    [0.0, 0.5, 1.0]
    """
    if save_at is None:
        return np.linspace(t0, t_end, default) if t_end > t0 else np.array([t0])
    try:
        s = np.atleast_1d(np.asarray(save_at, dtype=np.float64))
    except (TypeError, ValueError):
        raise TypeError(
            f"save_at must be a 1-d sequence of times, got {short_repr(save_at)}"
        ) from None
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"save_at must be a 1-d sequence of times, got {short_repr(save_at)}")
    if not np.all(np.isfinite(s)):
        raise ValueError(f"save_at contains non-finite times: {short_repr(s)}")
    if np.any(np.diff(s) <= 0):
        raise ValueError(f"save_at must be strictly increasing, got {short_repr(s)}")
    tol = 1e-12 * max(1.0, abs(t0), abs(t_end))
    if s[0] < t0 - tol or s[-1] > t_end + tol:
        raise ValueError(
            f"save_at must lie in [t0, t_end] = [{t0:g}, {t_end:g}], got {s[0]:g}..{s[-1]:g}"
        )
    s = np.clip(s, t0, t_end)
    if s[0] > t0:
        s = np.concatenate([[t0], s])
    return s


def seed_entropy(seed: Any) -> int:
    """A non-negative integer seed from ``None`` (fresh entropy), an int or a Generator.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import seed_entropy
    >>> seed_entropy(7), isinstance(seed_entropy(np.random.default_rng(0)), int)
    (7, True)
    """
    if seed is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(2**63))
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0:
        return int(seed)
    raise TypeError(
        f"seed must be None, a non-negative int or a numpy Generator, got {short_repr(seed)}"
    )


def _check_tolerance(value: Any, name: str) -> float:
    v = check_positive(value, name)
    if v < 1e-15:
        raise ValueError(
            f"{name} must be >= 1e-15 (below double-precision rounding nothing can be resolved), "
            f"got {value!r}"
        )
    return v


_EPS = float(np.finfo(np.float64).eps)
#: consecutive rejected steps after which an autonomous problem's run stops with "step size underflow"
MAX_REJECTIONS = 60


def read_only(y: Any) -> Any:
    """A read-only view of an array state (what trackers are shown), other states as they are."""
    if isinstance(y, np.ndarray):
        y = y.view()
        y.flags.writeable = False
    return y


def _finite(y: np.ndarray) -> bool:
    with np.errstate(invalid="ignore", over="ignore"):
        return math.isfinite(float(np.sum(y)))


# ------------------------------------------------------------------------------ the *when*
@dataclass
class ResumeState:
    """Where a resumed run starts: the index of the last saved snapshot, its state and the counters.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem, ResumeState, integrate
    >>> class Decay(Problem):
    ...     def rhs(self, t, y):
    ...         return -y
    >>> full = integrate(Decay(), "rk4", np.array([1.0]), 0.0, 1.0, dt=0.1)
    >>> state = ResumeState(index=5, t=0.5, y=full["state"][5], dt_next=0.1,
    ...                     stats={"steps": 5, "rejected": 0, "evaluations": 0})
    >>> rest = integrate(Decay(), "rk4", np.array([1.0]), 0.0, 1.0, dt=0.1, resume=state)
    >>> round(float(rest.times[0]), 12), bool((rest["state"][-1] == full["state"][-1]).all())  # bit for bit
    (0.6, True)
    """

    index: int
    t: float
    y: np.ndarray
    stats: dict[str, int]
    dt_next: float
    checkpoint: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class _Grid:
    """The fixed-step grid: step k goes from t0 + k dt to t0 + (k+1) dt, the last one ends at t_end."""

    t0: float
    t_end: float
    dt: float
    n: int

    @classmethod
    def make(cls, t0: float, t_end: float, dt: float) -> _Grid:
        q = (t_end - t0) / dt
        return cls(t0, t_end, dt, max(1, math.ceil(q - 1e-6)))

    def time(self, k: int) -> float:
        return self.t_end if k >= self.n else self.t0 + k * self.dt

    def step(self, k: int) -> float:
        """The size of step k: exactly dt, except a last step that differs from dt by more than rounding."""
        if k + 1 < self.n:
            return self.dt
        last = self.t_end - self.time(k)
        return self.dt if abs(last - self.dt) <= 1e-6 * self.dt else last

    def index(self, s: float) -> int:
        return min(self.n, max(0, int(round((s - self.t0) / self.dt))))


def integrate(
    problem: Problem,
    solver: Solver | str,
    y0: np.ndarray,
    t0: float,
    t_end: float,
    *,
    save_at: Any = None,
    dt: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    adaptive: bool | None = None,
    max_steps: int = 10**7,
    seed: Any = None,
    trackers: Sequence[Tracker] = (),
    keep: bool = True,
    throw: bool = True,
    resume: ResumeState | None = None,
    config: dict[str, Any] | None = None,
    result_class: type[Result] = Result,
) -> Result:
    r"""Integrate ``problem`` from ``(t0, y0)`` to ``t_end`` with ``solver``: the one time loop of wflow.

    Parameters
    ----------
    problem : Problem
        The state space and its right-hand side.
    solver : Solver or str
        A :class:`Solver` or a name in :data:`SOLVERS`.
    y0 : ndarray
        Initial state.
    t0, t_end : float
        The interval, ``t_end > t0``.
    save_at : array_like, optional
        Save times in ``[t0, t_end]`` (``t0`` is always saved); default 11 equally spaced
        (with fixed steps: at most 11 step times spread over the interval).  With fixed steps
        each is snapped to the nearest step time (module docstring).
    dt : float, optional
        Fixed step, or the first trial step of an adaptive solver (default: Hairer's estimate).
    rtol, atol : float, optional
        Tolerances of adaptive solvers (default ``problem.default_tolerances()``).
    adaptive : bool, optional
        Error-controlled steps (default: whenever the solver has an error estimate);
        ``False`` with ``dt`` takes fixed steps with an adaptive solver.
    max_steps : int
        Attempted steps (accepted + rejected) before the run fails.
    seed : int or Generator, optional
        Seed of the noise of stochastic solvers (recorded in the configuration).
    trackers : sequence of Tracker
        Progress bars, callbacks, recorders (e.g. :class:`wflow.io.ZarrRecorder`).
    keep : bool
        Keep every snapshot in memory (default); ``False`` keeps only the last one (a
        recorder then holds the rest).
    throw : bool
        Raise :class:`~wflow.errors.SolverError` on failure (default); otherwise return a
        result with ``status = -1`` and the failure in ``message``.
    resume : ResumeState, optional
        Continue a stored run from its last snapshot (see :func:`wflow.resume`).
    config : dict, optional
        Extra configuration recorded with the result (a front door's arguments).

    Returns
    -------
    Result
        ``result_class`` (a subclass of :class:`Result` for the problem's kind).

    Raises
    ------
    ValueError
        Bad arguments (named in the message), before anything is written.
    SolverError
        With ``throw=True``: non-finite state, step size underflow, ``max_steps`` exceeded or
        a step that missed its own tolerance.  Snapshots already given to trackers are kept.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem, integrate
    >>> class Decay(Problem):  # y' = -y
    ...     def rhs(self, t, y):
    ...         return -y
    >>> res = integrate(Decay(), "dopri5", np.array([1.0]), 0.0, 1.0, rtol=1e-10, atol=1e-12)
    >>> res.status, len(res), bool(abs(res["state"][-1, 0] - np.exp(-1.0)) < 1e-9)
    (0, 11, True)
    """
    if not isinstance(problem, Problem):
        raise TypeError(f"problem must be a wflow Problem, got {short_repr(problem)}")
    solver = get_solver(solver)
    t0 = float(t0)
    if isinstance(t_end, bool) or not isinstance(t_end, (int, float, np.integer, np.floating)):
        raise TypeError(f"t_end must be a number, got {short_repr(t_end)}")
    t_end = float(t_end)
    if not math.isfinite(t0):
        raise ValueError(f"t0 must be finite, got {t0!r}")
    if not math.isfinite(t_end) or t_end <= t0:
        raise ValueError(f"t_end must be a finite time > t0 = {t0:g}, got {t_end!r}")
    max_steps = check_int(max_steps, "max_steps")
    if solver.stochastic != problem.stochastic:
        if solver.stochastic:
            raise ValueError(
                f"solver {solver.name!r} is for noisy problems; this {problem.kind} problem has no "
                f"noise (give kappa, or choose a deterministic solver)"
            )
        raise ValueError(
            f"this {problem.kind} problem has noise; solver {solver.name!r} is deterministic "
            f"(use 'euler-maruyama')"
        )
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
    else:
        r0, a0 = problem.default_tolerances()
        rtol = r0 if rtol is None else _check_tolerance(rtol, "rtol")
        atol = a0 if atol is None else _check_tolerance(atol, "atol")
    saves = check_save_at(save_at, t0, t_end)
    grid = None
    save_steps = None
    if not adaptive:
        grid = _Grid.make(t0, t_end, dt)
        if save_at is None:  # the default: (at most) 11 step times spread over the interval
            save_steps = np.unique(np.round(np.linspace(0, grid.n, 11)).astype(int))
        else:
            save_steps = np.array([grid.index(s) for s in saves])
        if np.any(np.diff(save_steps) <= 0):
            i = int(np.flatnonzero(np.diff(save_steps) <= 0)[0])
            raise ValueError(
                f"save_at has two times ({saves[i]:g}, {saves[i + 1]:g}) within one step dt={dt:g}; "
                f"use a smaller dt or fewer save times"
            )
        saves = np.array([grid.time(int(k)) for k in save_steps])
    entropy = seed_entropy(seed) if solver.stochastic else None

    cfg = dict(problem.config())
    cfg.update(config or {})
    cfg.update(
        {
            "solver": solver.name,
            "solver_options": solver.options(),
            "order": solver.order,
            "adaptive": bool(adaptive),
            "dt": dt,
            "rtol": rtol,
            "atol": atol,
            "seed": entropy,
            "t0": t0,
            "t_end": t_end,
            "save_at": [float(s) for s in saves],
            "save_mode": "land" if adaptive else "snap",
            "max_steps": max_steps,
            "wflow_version": __version__,
        }
    )

    # ---- state at the first saved time of this call
    if resume is None:
        first = 0
        t, y = t0, np.array(y0, copy=True)
        stats = {"steps": 0, "rejected": 0, "evaluations": 0}
        state = solver.init(problem, t, y)
        h = dt
    else:
        first = int(resume.index)
        t, y = float(resume.t), np.array(resume.y, copy=True)
        stats = dict(resume.stats)
        state = solver.restore(problem, t, y, resume.checkpoint)
        h = resume.dt_next if adaptive and resume.dt_next > 0 else dt
    ev0 = problem.evaluations
    breaks = np.sort(np.asarray(problem.breakpoints(t0, t_end), dtype=np.float64).reshape(-1))
    if adaptive and h is None:
        h = _initial_step(problem, solver, t, y, rtol, atol)

    static = problem.static()
    started: list = []
    try:
        run = RunInfo(problem, solver, cfg, static, saves, t0, t_end, first)
        for tr in trackers:
            tr.start(run)
            started.append(tr)

        times: list[float] = []
        kept: list[dict[str, Variable]] = []
        kept_stats: dict[str, list] = {
            "steps": [],
            "rejected": [],
            "evaluations": [],
            "dt_next": [],
        }
        step_info: list[dict[str, Any]] = []
        last_snap: list[Snapshot] = []

        def do_save(index: int, t: float, y: np.ndarray) -> bool:
            stats["evaluations"] = stats_base_ev + problem.evaluations - ev0
            snap = Snapshot(
                index,
                t,
                problem.snapshot(t, y),
                dict(stats),
                {"dt_next": float(h) if (adaptive and h is not None) else math.nan},
                solver.checkpoint(state),
                read_only(y),
            )
            if keep or not kept:
                times.append(t)
                kept.append(snap.data)
                for k in ("steps", "rejected", "evaluations"):
                    kept_stats[k].append(stats[k])
                kept_stats["dt_next"].append(snap.control["dt_next"])
            else:
                times[-1] = t
                kept[-1] = snap.data
                for k in ("steps", "rejected", "evaluations"):
                    kept_stats[k][-1] = stats[k]
                kept_stats["dt_next"][-1] = snap.control["dt_next"]
            last_snap[:] = [snap]
            stop = False
            for tr in trackers:
                stop = bool(tr.save(snap)) or stop
            return stop

        stats_base_ev = stats["evaluations"]
        tc = 0.0  # the low part of the time: the run is at t + tc
        autonomous = bool(problem.autonomous)
        rejected_in_row = 0
        status, message = 0, "reached t_end"
        stopped_by = None
        try:
            if resume is None:
                if do_save(0, t, y):
                    stopped_by = "a tracker"
            k_save = first + 1
            step_no = stats["steps"]
            while stopped_by is None and k_save < len(saves):
                target = float(saves[k_save])
                # ---- one attempted step
                if stats["steps"] + stats["rejected"] >= max_steps:
                    raise SolverError(
                        f"max_steps={max_steps} exceeded at t={t:.6g}; raise max_steps or the step size"
                    )
                if adaptive:
                    # the next stop: the save time, or a breakpoint of the problem (a layer boundary) before it
                    j = int(np.searchsorted(breaks, t, side="right"))
                    stop = float(breaks[j]) if j < breaks.size and breaks[j] < target else target
                    rest = (stop - t) - tc
                    if rest <= 4 * _EPS * max(abs(stop), 1e-300):
                        # the previous step ended within rounding of the stop: it is the stop
                        t, tc = stop, 0.0
                        if stop == target:
                            if do_save(k_save, t, y):
                                stopped_by = "a tracker"
                            k_save += 1
                        continue
                    lim = solver.limit(problem, t, y, state)
                    h_try = min(h, lim)
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
                        not h_try > (0.0 if autonomous else 1e-30 * abs(t))
                        or rejected_in_row >= MAX_REJECTIONS
                    ):
                        scale = (
                            f"{MAX_REJECTIONS} steps rejected in a row"
                            if autonomous
                            else "the solution changes on a time scale 1e-30 of the time itself"
                        )
                        raise SolverError(
                            f"step size underflow at t={t:.6g} (dt={h_try:.3g}): {scale}; the problem "
                            f"may be stiff, the tolerances too tight (rtol={rtol:g}, atol={atol:g}), "
                            f"or the kernel overflowing"
                        )
                else:
                    land = step_no + 1 >= save_steps[k_save]
                    h_try = grid.step(step_no)
                rng = None
                if solver.stochastic:
                    rng = np.random.default_rng(
                        np.random.SeedSequence(entropy, spawn_key=(step_no,))
                    )
                res, new_state = solver.step(
                    problem, t, y, h_try, state, rtol=rtol or 0.0, atol=atol or 0.0, rng=rng
                )
                stats["evaluations"] = stats_base_ev + problem.evaluations - ev0
                if not res.ok:
                    stats["rejected"] += 1
                    if not adaptive:
                        raise SolverError(
                            f"the fixed step dt={h_try:.6g} exceeds the solver's stability limit "
                            f"{res.limit:.6g} at t={t:.6g}; use a smaller dt or adaptive steps"
                        )
                    h = min(h_try, 0.9 * res.limit)
                    continue
                if adaptive:
                    err = (
                        res.error
                        if res.error is not None and math.isfinite(res.error)
                        else math.inf
                    )
                    expo = -1.0 / (solver.error_order + 1)
                    if err > 1.0:
                        stats["rejected"] += 1
                        rejected_in_row += 1
                        h = h_try * (max(0.2, 0.9 * err**expo) if math.isfinite(err) else 0.2)
                        continue
                    h = h_try * (5.0 if err == 0 else min(5.0, 0.9 * err**expo))
                    rejected_in_row = 0
                if not (problem.known_finite(res.y) or _finite(res.y)):
                    raise SolverError(
                        f"the state became non-finite in the step from t={t:.6g} with dt={h_try:.3g} "
                        f"({solver.name}); snapshots written so far are kept. Reduce dt (or rtol), or "
                        f"check the model's parameters (e.g. USA at large beta overflows: use the "
                        f"rescaled kernel or SA)"
                    )
                y = res.y
                state = new_state
                stats["steps"] += 1
                step_no += 1
                at_save = land and (not adaptive or stop == target)
                if land:
                    t, tc = (stop if adaptive else target), 0.0
                elif adaptive:
                    # compensated time (t + tc): a fast event late in a long run (a merge at t ~ 1e17 lasting
                    # O(1)) advances time by steps below the rounding of t
                    s_ = t + h_try
                    b_ = s_ - t
                    tc += (t - (s_ - b_)) + (h_try - b_)
                    t = s_ + tc
                    tc -= t - s_
                else:
                    t = grid.time(step_no)
                land = at_save
                if res.info:
                    step_info.append({"step": step_no, "t": t, "dt": h_try, **res.info})
                for tr in trackers:
                    if tr.step(t, h_try, res):
                        stopped_by = stopped_by or getattr(tr, "name", "a tracker")
                if res.failure is not None:
                    if land:
                        do_save(k_save, t, y)
                    raise SolverError(f"{res.failure} (step {step_no}, t={t:.6g})")
                if land:
                    if do_save(k_save, t, y):
                        stopped_by = stopped_by or "a tracker"
                    k_save += 1
                elif stopped_by is not None:
                    do_save(k_save, t, y)
            if stopped_by is not None and k_save < len(saves):
                status, message = 1, f"stopped by {stopped_by} at t={t:.6g}"
        except SolverError as exc:
            if throw:
                raise
            status, message = -1, str(exc)
        result = _make_result(
            result_class,
            problem,
            solver,
            cfg,
            static,
            times,
            kept,
            kept_stats,
            status,
            message,
            last_snap,
            step_info,
        )
        for tr in trackers:
            tr.finish(result)
        log.debug("integrate: %s", result)
        return result
    finally:
        # trackers release what they hold (a recorder's lock) whatever ended the run, an interrupt included
        for tr in started:
            close = getattr(tr, "close", None)
            if close is not None:
                close()


def _make_result(
    cls,
    problem,
    solver,
    cfg,
    static,
    times,
    kept,
    kept_stats,
    status,
    message,
    last_snap,
    step_info,
):
    data: dict[str, Variable] = {}
    if kept:
        for name, (dims, _) in kept[0].items():
            data[name] = (dims, np.stack([np.asarray(s[name][1]) for s in kept]))
    stats = {
        k: np.asarray(v, dtype=np.float64 if k == "dt_next" else np.int64)
        for k, v in kept_stats.items()
    }
    return cls(
        kind=problem.kind,
        times=np.asarray(times, dtype=np.float64),
        data=data,
        static=static,
        stats=stats,
        status=status,
        message=message,
        config=cfg,
        solver=solver.name,
        order=solver.order,
        checkpoint=last_snap[0].checkpoint if last_snap else {},
        step_info=step_info,
    )


def _initial_step(
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


# ------------------------------------------------------------------------------ kinds of results
@dataclass(frozen=True)
class Kind:
    """How one kind of result is rebuilt: its result class and, for resume, its problem and state.

    ``rebuild(config, stored) -> (problem, solver, y_last)`` gets a store's configuration and
    its contents (:func:`wflow.io.read_store`) and returns what :func:`integrate` needs to
    continue the run from the last committed snapshot.
    """

    name: str
    result_class: type[Result]
    rebuild: Callable[[dict[str, Any], dict[str, Any]], tuple[Problem, Solver, np.ndarray]]


#: every kind of result, by name (filled by the solver modules)
KINDS: dict[str, Kind] = {}


def register_kind(name: str, result_class: type[Result], rebuild) -> None:
    KINDS[name] = Kind(name, result_class, rebuild)
