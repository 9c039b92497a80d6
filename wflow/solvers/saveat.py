"""What a run saves and when: the user's specification (:class:`SaveAt`, as diffrax's), the save times
of one run (:class:`SaveTimes`) and the fixed-step grid they snap to (:class:`StepGrid`).

Every run saves at the times asked for: adaptive steps land on each, fixed steps on the grid
:math:`t_k = t_0 + k\\,dt` split the step that crosses one in two (``docs/solvers.md``).  Import
:func:`check_save_at` from :mod:`wflow.solvers.base`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import real_float_dtype as real_float_dtype
from ..errors import short_repr

__all__ = ["SaveAt", "check_save_at", "StepGrid", "SaveTimes"]

#: with fixed steps and no ``save_at``: at most this many step times spread over the interval
DEFAULT_SAVES = 11
#: a time within this many steps of a grid time is that grid time
GRID_SNAP = 1e-9


@dataclass(frozen=True, eq=False)
class SaveAt:
    r"""What a run saves and when (diffrax's ``SaveAt``, NumPy's ``out=``): ``save_at`` of
    :func:`wflow.simulate` (a plain sequence of times means ``SaveAt(ts=times)``).

    Parameters
    ----------
    ts : array_like, optional
        Save times in ``[t0, t_end]``, increasing (``t0`` is always saved); default 11 equally spaced.
    points : bool
        Keep the points of every save in the result (default); ``False``: of the last one only
        (:attr:`Trajectory.final <wflow.solvers.particles.Trajectory.final>`), while a recorder still
        writes every save.
    diagnostics : sequence of str, optional
        Built-in diagnostics saved at each time (default: ``energy``, ``log_energy``,
        ``order_parameter``, ``n_eff``, ``n_clusters``; also ``pair_fraction``); ``()`` for none.
    fn : dict, optional
        ``name -> f(mu)``: functions of the measure saved at each time, one value (or array) per system.
    dtype : dtype, optional
        The floating type of the kept points (not of the run's); default the run's own (or ``out``'s).
    out : ndarray, optional
        A writeable floating array of shape ``(k, ..., n, d)``, ``k`` the number of saves (with ``t0``),
        into which the points of every save are written: the result's ``points`` is this array.
    cluster_threshold : float
        Geodesic linkage distance of the ``n_clusters`` diagnostic.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> x0 = wflow.sphere.uniform(16, 3, seed=0)
    >>> spec = wflow.SaveAt(ts=[0.0, 0.5, 1.0], points=False, diagnostics=("pair_fraction",))
    >>> traj = wflow.simulate(wflow.SA(4.0), x0, 1.0, dt=0.1, save_at=spec)
    >>> sorted(traj.diagnostics), traj.diagnostics["pair_fraction"].shape, traj.final.points.shape
    (['pair_fraction'], (3,), (16, 3))
    >>> out = np.empty((3, 16, 3), dtype=np.float32)
    >>> traj = wflow.simulate(wflow.SA(4.0), x0, 1.0, dt=0.1, save_at=wflow.SaveAt([0.5, 1.0], out=out))
    >>> traj.points is out, bool(np.allclose(out[0], x0))
    (True, True)
    """

    ts: Any = None
    points: bool = True
    diagnostics: Sequence[str] | None = None
    fn: Mapping[str, Callable[..., Any]] | None = None
    dtype: Any = None
    out: np.ndarray | None = None
    cluster_threshold: float = 0.1

    def __post_init__(self) -> None:
        if not isinstance(self.points, (bool, np.bool_)):
            raise TypeError(f"SaveAt: points must be True or False, got {short_repr(self.points)}")
        if self.diagnostics is not None and (
            isinstance(self.diagnostics, str)
            or not all(isinstance(k, str) for k in self.diagnostics)
        ):
            raise TypeError(
                f"SaveAt: diagnostics must be a sequence of names, got {short_repr(self.diagnostics)}"
            )
        if self.fn is not None:
            if not isinstance(self.fn, Mapping):
                raise TypeError(
                    f"SaveAt: fn must be a dict name -> f(mu), got {short_repr(self.fn)}"
                )
            for name, f in self.fn.items():
                if not isinstance(name, str) or not name.isidentifier():
                    raise ValueError(f"SaveAt: fn names must be identifiers, got {name!r}")
                if not callable(f):
                    raise TypeError(
                        f"SaveAt: fn[{name!r}] must be callable f(mu), got {short_repr(f)}"
                    )
        if self.dtype is not None:
            object.__setattr__(self, "dtype", real_float_dtype(self.dtype, "SaveAt: dtype"))
        if self.out is not None:
            out = self.out
            if not isinstance(out, np.ndarray):
                raise TypeError(f"SaveAt: out must be a numpy array, got {short_repr(out)}")
            real_float_dtype(out.dtype, "SaveAt: out's dtype")
            if self.dtype is not None and out.dtype != self.dtype:
                raise TypeError(
                    f"SaveAt: out has dtype {out.dtype}, but dtype={self.dtype} was asked"
                )
            if not out.flags.writeable:
                raise ValueError("SaveAt: out is read-only; pass a writeable array")
            if not self.points:
                raise ValueError(
                    "SaveAt: out= holds the points of every save; it needs points=True"
                )

    @classmethod
    def of(cls, save_at: Any) -> SaveAt:
        """``save_at`` itself when it is a :class:`SaveAt`, else ``SaveAt(ts=save_at)``."""
        return save_at if isinstance(save_at, SaveAt) else cls(ts=save_at)

    def check_out(self, n_saves: int, shape: tuple[int, ...]) -> None:
        """Raise unless :attr:`out` (when given) holds ``n_saves`` saves of points of ``shape``."""
        out = self.out
        if out is not None and out.shape != (n_saves, *shape):
            raise ValueError(
                f"SaveAt: out must have shape {(n_saves, *shape)} ({n_saves} saves of points {shape}), "
                f"got {out.shape}"
            )


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


@dataclass
class StepGrid:
    """The fixed-step grid: step k goes from t0 + k dt to t0 + (k+1) dt, the last one ends at t_end (stretched
    by at most :math:`10^{-6} dt` rather than followed by a round-off step).

    Examples
    --------
    >>> from wflow.solvers.saveat import StepGrid
    >>> g = StepGrid.make(0.0, 1.0, 0.3)  # 0, 0.3, 0.6, 0.9, then a last step of 0.1 to 1.0
    >>> g.n, round(g.time(2), 12), round(g.step(3), 12), g.index(0.5)
    (4, 0.6, 0.1, 2)
    """

    t0: float
    t_end: float
    dt: float
    n: int

    @classmethod
    def make(cls, t0: float, t_end: float, dt: float) -> StepGrid:
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

    def interval(self, t: float) -> int:
        """The step ``k`` whose interval :math:`[t_k, t_{k+1})` holds ``t``."""
        return min(self.n - 1, max(0, math.floor((t - self.t0) / self.dt + GRID_SNAP)))

    def snap(self, s: float) -> float:
        """The grid time within :data:`GRID_SNAP` steps of ``s``, or ``s`` itself."""
        k = self.index(s)
        return self.time(k) if abs(self.time(k) - s) <= GRID_SNAP * self.dt else s


@dataclass(frozen=True)
class SaveTimes:
    """The save times of one run: ``times[0] = t0``.

    Attributes
    ----------
    times : ndarray, shape (k,)
        The times asked for (with fixed steps, snapped to a grid time within :data:`GRID_SNAP` steps).
    mode : str
        ``"land"``: the run lands on each time (``config["save_mode"]``).

    Examples
    --------
    >>> from wflow.solvers.saveat import SaveTimes, StepGrid
    >>> s = SaveTimes.make([0.26, 1.0], 0.0, 1.0, StepGrid.make(0.0, 1.0, 0.1))
    >>> [round(float(t), 12) for t in s.times], s.mode
    ([0.0, 0.26, 1.0], 'land')
    >>> SaveTimes.make(None, 0.0, 1.0).times.size  # adaptive steps: 11 equally spaced by default
    11
    """

    times: np.ndarray
    mode: str = "land"

    @classmethod
    def make(cls, save_at: Any, t0: float, t_end: float, grid: StepGrid | None = None) -> SaveTimes:
        """Check ``save_at`` (:func:`check_save_at`); on a fixed-step ``grid`` the default is (at most) 11
        grid times spread over the interval."""
        saves = check_save_at(save_at, t0, t_end)
        if grid is None:
            return cls(saves)
        if save_at is None:
            steps = np.unique(np.round(np.linspace(0, grid.n, DEFAULT_SAVES)).astype(int))
            return cls(np.array([grid.time(int(k)) for k in steps]))
        return cls(np.array([grid.snap(float(s)) for s in saves]))
