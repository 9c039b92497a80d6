r"""The solver contract: a :class:`Problem` says *what* moves, a :class:`Solver` *how* one step is taken.

A :class:`Solver` has ``init`` / ``step``, a declared ``order``, an error estimate where it has one, a
stability limit and ``checkpoint`` / ``restore`` for a bit-exact resume; solvers are looked up by name
in :data:`SOLVERS`.  Import these names from :mod:`wflow.solvers.base`.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np

from ..errors import did_you_mean, short_repr

__all__ = [
    "Problem",
    "StepResult",
    "Solver",
    "SOLVERS",
    "Registry",
    "register_solver",
    "get_solver",
]

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
    limit_slack : float
        A Runge--Kutta *stage* is rejected only beyond ``limit_slack`` times the limit of
        :meth:`rhs_with_limit` (``1 / cfl`` when that limit is a CFL fraction of the true one; default 1).

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
    limit_slack: float = 1.0

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

    #: the names of the snapshot variables that hold the state (kept for the last save only when a
    #: :class:`~wflow.solvers.saveat.SaveAt` asks ``points=False``)
    state_variables: ClassVar[frozenset[str]] = frozenset({"state"})

    def points_shape(self, y: np.ndarray) -> tuple[int, ...] | None:
        """The shape of the points a snapshot of state ``y`` holds (:meth:`saved_points`); None when it holds none."""
        return None

    def saved_points(self, data: dict[str, Variable]) -> Variable:
        """The points of a snapshot's variables ``data``, as ``(dims, array)`` (problems with points only)."""
        raise TypeError(f"{type(self).__name__} saves no points")

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

    #: the step being taken, ``(t, t + dt)``, while a solver evaluates its stages (set by :meth:`stepping`;
    #: None between steps)
    step_span: tuple[float, float] | None = None

    @contextlib.contextmanager
    def stepping(self, t: float | None, dt: float = 0.0) -> Iterator[None]:
        r"""Within: every stage of the step from ``t`` to ``t + dt`` sees the piece of a piecewise-in-time model
        (a :class:`~wflow.schemes.Layered` model's layer) that the step lies in.

        The last stage of a step that ends on a layer boundary (RK4's :math:`k_4`) must see the layer the
        step belongs to, not the next one.  The driver takes every step inside ``stepping(t, dt)``; problems
        choose the piece by :meth:`piece_time`.  ``stepping(None)`` leaves the step (a first-same-as-last
        evaluation at ``t + dt`` is the *next* step's first stage).

        Examples
        --------
        >>> from wflow.solvers.base import Problem
        >>> p = Problem()
        >>> with p.stepping(0.5, 0.5):  # a step that ends on a layer boundary at t = 1
        ...     p.piece_time(1.0)
        0.75
        >>> p.piece_time(1.0)  # between steps: the time itself (the next layer acts at t = 1)
        1.0
        """
        prev = self.step_span
        self.step_span = None if t is None else (float(t), float(t) + float(dt))
        try:
            yield
        finally:
            self.step_span = prev

    def piece_time(self, t: float) -> float:
        """The time that decides which piece of a piecewise-in-time model acts at stage time ``t``: inside a step
        (:meth:`stepping`) the step's midpoint, so that all its stages see one layer; else ``t`` itself."""
        span = self.step_span
        return t if span is None else 0.5 * (span[0] + span[1])

    @property
    def autonomous(self) -> bool:
        """True when the right-hand side does not depend on t: adaptive steps may then be far below the
        rounding of t (the time is compensated), and a stall is detected by consecutive rejections."""
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
    finite : bool or None
        Whether every number of ``y`` is finite, when the solver knows; None: the driver scans ``y``.
    diagnostics : dict or None
        Save-time diagnostics of ``y`` the step formed on its way (:attr:`Solver.forms_diagnostics`,
        asked with ``save=True``), which the save then does not form again.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import StepResult
    >>> step = StepResult(np.array([0.9]), error=0.5)  # an accepted step (error <= 1)
    >>> step.ok, step.error, step.limit, step.finite
    (True, 0.5, inf, None)
    """

    y: np.ndarray
    error: float | None = None
    evaluations: int = 0
    ok: bool = True
    limit: float = math.inf
    failure: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    finite: bool | None = None
    diagnostics: dict[str, np.ndarray] | None = None


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
    #: whether :meth:`step` takes the keyword ``save`` (the step ends on a save time) and may then return
    #: the saved state's diagnostics in :attr:`StepResult.diagnostics`
    forms_diagnostics: ClassVar[bool] = False

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


_Entry = TypeVar("_Entry")


class Registry(MutableMapping[str, _Entry]):
    """A dict by name whose entries are loaded on first use.

    ``modules`` names, for each entry wflow defines, the module that registers it when imported:
    listing, counting and testing names imports nothing; reading an entry imports its module
    once.  Entries registered elsewhere (a user's solver) are plain entries.

    Examples
    --------
    >>> from wflow.solvers.base import SOLVERS
    >>> "jko" in SOLVERS, SOLVERS.modules["jko"]  # known before wflow.solvers.jko is imported
    (True, 'wflow.solvers.jko.step')
    >>> SOLVERS["jko"].order  # imports it
    1
    """

    def __init__(self, modules: dict[str, str]) -> None:
        #: entry name -> the module that registers it
        self.modules = dict(modules)
        self._entries: dict[str, _Entry] = {}

    def __getitem__(self, name: str) -> _Entry:
        if name not in self._entries and name in self.modules:
            importlib.import_module(self.modules[name])
            if name not in self._entries:
                raise KeyError(f"{self.modules[name]} does not register {name!r}")
        return self._entries[name]

    def __setitem__(self, name: str, value: _Entry) -> None:
        self._entries[name] = value

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self.modules.pop(name, None)
        self._entries.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self.modules

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self.modules, *self._entries]))

    def __len__(self) -> int:
        return len(self.modules.keys() | self._entries.keys())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({sorted(self)})"


#: every solver of wflow, by name (``get_solver(name, **options)`` builds one); each is loaded
#: with the module that defines it, on first use
SOLVERS: Registry[type[Solver]] = Registry(
    {
        **dict.fromkeys(
            "euler euler-average rk4 dopri5 euler-maruyama ssprk3 ros2 remap".split(),
            "wflow.solvers.steppers",
        ),
        "fused-euler": "wflow.solvers.fused",
        "jko": "wflow.solvers.jko.step",
    }
)


def register_solver(cls: type[Solver]) -> type[Solver]:
    """Class decorator: list a solver in :data:`SOLVERS` under its ``name``.

    Examples
    --------
    >>> from wflow.solvers.base import SOLVERS, Solver, StepResult, get_solver, register_solver
    >>> @register_solver
    ... class Heun(Solver):  # explicit trapezoid rule, order 2 (docs/solvers.md: a worked example)
    ...     name, order = "toy-heun", 2
    ...     def step(self, problem, t, y, dt, state, *, rtol=0.0, atol=0.0, rng=None):
    ...         k1 = problem.rhs(t, y)
    ...         k2 = problem.rhs(t + dt, y + dt * k1)
    ...         return StepResult(y + dt / 2 * (k1 + k2), evaluations=2), state
    >>> "toy-heun" in SOLVERS, get_solver("toy-heun").order
    (True, 2)
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
        raise ValueError(
            f"solver/method must be one of {sorted(SOLVERS)}, got {short_repr(name)}"
            + did_you_mean(name, SOLVERS)
        )
    return SOLVERS[name](**options)
