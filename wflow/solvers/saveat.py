"""When a run saves: the save times (:class:`SaveAt`, as diffrax's) and the fixed-step grid they snap to.

*Adaptive steps* land exactly on each save time (``mode="land"``).  *Fixed steps* of size
``dt`` run on the grid :math:`t_k = t_0 + k\\,dt` (:class:`StepGrid`), whose last step ends
at ``t_end``; a save time is *snapped* to the nearest grid time and the run records the grid
time (``mode="snap"``): ``dt`` is never changed to land on a save time.  Import
:func:`check_save_at` from :mod:`wflow.solvers.base`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import short_repr

__all__ = ["check_save_at", "StepGrid", "SaveAt"]

#: with fixed steps and no ``save_at``: at most this many step times spread over the interval
DEFAULT_SAVES = 11


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
    """The fixed-step grid: step k goes from t0 + k dt to t0 + (k+1) dt, the last one ends at t_end.

    The last step is stretched by at most :math:`10^{-6} dt` rather than followed by a
    round-off step.

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


@dataclass(frozen=True)
class SaveAt:
    """The save times of one run: ``times[0] = t0``; with fixed steps also the grid step of each.

    Attributes
    ----------
    times : ndarray, shape (k,)
        The times saved (with fixed steps: grid times).
    steps : ndarray of int, shape (k,), or None
        Fixed steps: the number of steps taken at each save time; None with adaptive steps.
    mode : str
        ``"land"`` (adaptive steps land on each time) or ``"snap"`` (fixed steps, times
        snapped to the grid), recorded in the run's configuration as ``save_mode``.

    Examples
    --------
    >>> from wflow.solvers.saveat import SaveAt, StepGrid
    >>> s = SaveAt.make([0.26, 1.0], 0.0, 1.0, StepGrid.make(0.0, 1.0, 0.1))
    >>> [round(float(t), 12) for t in s.times], s.steps.tolist(), s.mode
    ([0.0, 0.3, 1.0], [0, 3, 10], 'snap')
    >>> SaveAt.make(None, 0.0, 1.0).times.size, SaveAt.make(None, 0.0, 1.0).mode  # adaptive: land
    (11, 'land')
    """

    times: np.ndarray
    steps: np.ndarray | None
    mode: str

    @classmethod
    def make(cls, save_at: Any, t0: float, t_end: float, grid: StepGrid | None = None) -> SaveAt:
        """Check ``save_at`` (:func:`check_save_at`) and, on a fixed-step ``grid``, snap it.

        Raises ``ValueError`` when two save times fall within one fixed step.
        """
        saves = check_save_at(save_at, t0, t_end)
        if grid is None:
            return cls(saves, None, "land")
        if save_at is None:  # the default: (at most) 11 step times spread over the interval
            steps = np.unique(np.round(np.linspace(0, grid.n, DEFAULT_SAVES)).astype(int))
        else:
            steps = np.array([grid.index(s) for s in saves])
        if np.any(np.diff(steps) <= 0):
            i = int(np.flatnonzero(np.diff(steps) <= 0)[0])
            raise ValueError(
                f"save_at has two times ({saves[i]:g}, {saves[i + 1]:g}) within one step dt={grid.dt:g}; "
                f"use a smaller dt or fewer save times"
            )
        return cls(np.array([grid.time(int(k)) for k in steps]), steps, "snap")
