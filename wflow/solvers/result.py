"""What a run gives back: its status codes (:class:`Status`), the :class:`Result` and the kinds of results.

The status codes live here only (as diffrax's ``RESULTS``); stores record them as plain integers.
:data:`KINDS` lists every kind of result with what a resume needs to rebuild its run.  Import these
names from :mod:`wflow.solvers.base`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import short_repr
from .contract import Problem, Registry, Solver, Variable

__all__ = ["Status", "Result", "Kind", "KINDS", "register_kind"]


class Status(enum.IntEnum):
    """The status of a run, :attr:`Result.status` (stored as the plain integer).

    Examples
    --------
    >>> from wflow.solvers.base import Status
    >>> int(Status.SUCCESS), int(Status.STOPPED), int(Status.FAILED), Status.SUCCESS.message
    (0, 1, -1, 'reached t_end')
    """

    #: reached ``t_end``
    SUCCESS = 0
    #: stopped by a tracker or a callback before ``t_end`` (``message``: by whom and when)
    STOPPED = 1
    #: failed (``message``: what happened and what to change)
    FAILED = -1

    @property
    def message(self) -> str:
        """The message of a run that ended with this status, without its details."""
        return _MESSAGES[self]

    @staticmethod
    def stopped(by: str, t: float) -> str:
        """The message of a run stopped by ``by`` at time ``t``."""
        return f"stopped by {by} at t={t:.6g}"


_MESSAGES = {
    Status.SUCCESS: "reached t_end",
    Status.STOPPED: "stopped by a tracker",
    Status.FAILED: "failed",
}


@dataclass
class Result:
    """The outcome of a run, for every kind of problem.

    Attributes
    ----------
    kind : str
        ``"particles"``, ``"lagrangian"``, ``"density"``, ``"jko"``, ...
    times : ndarray, shape (k,)
        Saved times.
    data, static : dict
        ``name -> (dims, array)``: the saved variables (shape ``(k, ...)``), and those that do not change.
    stats : dict of ndarray, each shape (k,)
        Cumulative ``steps``, ``rejected`` and ``evaluations`` at each save, and ``dt_next``.
    status : int
        A :class:`Status`: 0 reached ``t_end``; 1 stopped by a tracker or callback; -1 failed.
    message : str
    config : dict
        Everything needed to repeat the run.
    solver : str
    order : float
    checkpoint : dict
        The solver's resume variables at the last save.
    last_state : dict
        ``name -> (dims, array)``: the state variables of the last save with ``SaveAt(points=False)``.

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
    status: int = int(Status.SUCCESS)
    message: str = Status.SUCCESS.message
    config: dict[str, Any] = field(default_factory=dict)
    solver: str = ""
    order: float = 0
    checkpoint: dict[str, Variable] = field(default_factory=dict)
    step_info: list[dict[str, Any]] = field(default_factory=list)
    last_state: dict[str, Variable] = field(default_factory=dict)

    @property
    def success(self) -> bool:
        """True unless the run failed (status -1)."""
        return self.status >= Status.SUCCESS

    def __len__(self) -> int:
        return int(len(self.times))

    def save_index(self, t: float) -> int:
        """The index of the save at time ``t`` (to ``1e-9`` of the interval), or a ``ValueError`` naming the
        nearest saved times.

        Examples
        --------
        >>> import wflow
        >>> x0 = wflow.sphere.uniform(4, 3, seed=0)
        >>> traj = wflow.simulate(wflow.SA(1.0), x0, 1.0, dt=0.1, save_at=[0.5, 1.0], backend="numpy")
        >>> traj.save_index(0.5), traj.save_index(1.0)
        (1, 2)
        """
        if isinstance(t, (bool, np.bool_)) or not isinstance(
            t, (int, float, np.integer, np.floating)
        ):
            raise TypeError(f"t must be a real number (a saved time), got {short_repr(t)}")
        times = np.asarray(self.times, dtype=np.float64)
        if not len(times):
            raise ValueError("this result holds no saves")
        span = float(times[-1] - times[0]) if len(times) > 1 else 0.0
        tol = 1e-9 * max(span, abs(float(times[-1])), 1e-300)
        i = int(np.argmin(np.abs(times - float(t))))
        if abs(times[i] - float(t)) > tol:
            j = int(np.searchsorted(times, float(t)))
            near = [f"{times[k]:.6g}" for k in (j - 1, j) if 0 <= k < len(times)]
            raise ValueError(
                f"t={float(t)!r} is not a saved time of this result; the nearest are {' and '.join(near)} "
                f"(saves at {short_repr(times)})"
            )
        return i

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


@dataclass(frozen=True)
class Kind:
    """How one kind of result is rebuilt: its result class and ``rebuild(config, stored) -> (problem,
    solver, y_last)``, which continues a store's run (:func:`wflow.io.read_store`) from its last snapshot.
    """

    name: str
    result_class: type[Result]
    rebuild: Callable[[dict[str, Any], dict[str, Any]], tuple[Problem, Solver, np.ndarray]]


#: every kind of result, by name; each is loaded with the solver module that registers it, on first use
KINDS: Registry[Kind] = Registry(
    {
        "particles": "wflow.solvers.particles",
        "density": "wflow.solvers.eulerian",
        "lagrangian": "wflow.solvers.lagrangian",
        "jko": "wflow.solvers.jko.step",
        "zonal": "wflow.solvers.zonal",
    }
)


def register_kind(name: str, result_class: type[Result], rebuild) -> None:
    KINDS[name] = Kind(name, result_class, rebuild)
