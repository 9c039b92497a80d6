"""Trackers of the driver (:func:`wflow.solvers.base.integrate`): what they are shown, progress bars, callbacks.

A tracker watches a run and never changes it; recorders that write to disk live in :mod:`wflow.io`
(:class:`~wflow.io.ZarrRecorder`).  Import :class:`Tracker`, :class:`RunInfo` and :class:`Snapshot`
from :mod:`wflow.solvers.base`.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from ..errors import short_repr
from .contract import Problem, Solver, StepResult, Variable

if TYPE_CHECKING:
    from .result import Result

__all__ = ["Snapshot", "RunInfo", "Tracker", "ProgressBar", "Callback", "Record", "StepLog"]


@dataclass
class Snapshot:
    """One saved state, as trackers receive it: the problem's variables ``data``, the cumulative ``stats``,
    the controller's ``dt_next`` in ``control``, the solver's resume variables ``checkpoint`` and ``state``,
    a read-only view of the state the run continues from.

    Examples
    --------
    >>> import wflow
    >>> from wflow.solvers.base import Tracker
    >>> class Last(Tracker):  # keeps the last snapshot it was shown
    ...     def save(self, snap):
    ...         self.snap = snap
    >>> last = Last()
    >>> _ = wflow.simulate(wflow.SA(1.0), wflow.sphere.uniform(8, 3, seed=0), 1.0, dt=0.1, trackers=[last])
    >>> last.snap.index, last.snap.t, last.snap.stats["steps"], last.snap.data["points"][1].shape
    (10, 1.0, 10, (8, 3))
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

    ``save`` and ``step`` may return True to stop the run (status 1); ``close`` is called last whatever
    ended the run.

    Examples
    --------
    >>> import wflow
    >>> from wflow.solvers.base import Tracker
    >>> class StopAtHalf(Tracker):
    ...     name = "stop-at-half"
    ...     def save(self, snap):
    ...         return snap.t >= 0.5  # True stops the run
    >>> x0 = wflow.sphere.uniform(8, 3, seed=0)
    >>> res = wflow.simulate(wflow.SA(1.0), x0, 1.0, dt=0.1, trackers=[StopAtHalf()], backend="numpy")
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


class ProgressBar(Tracker):
    """A tqdm bar over the time interval, labelled with the solver (and with the function numba compiles,
    while it does: :func:`wflow.kernels.jit.compile_notices`).

    Examples
    --------
    >>> import wflow
    >>> from wflow.solvers.trackers import ProgressBar
    >>> bar = ProgressBar("SA")  # (simulate(..., progress=True) adds one)
    >>> _ = wflow.simulate(wflow.SA(1.0), wflow.sphere.uniform(8, 3, seed=0), 1.0, dt=0.1, trackers=[bar])
    >>> bar.label, round(bar.bar.n, 6)  # the bar, drawn on stderr, ends at t_end
    ('SA', 1.0)
    """

    name = "progress bar"

    def __init__(self, label: str | None = None):
        self.label = label
        self.bar: Any = None  # a tqdm bar while the run lasts
        self._notices: contextlib.ExitStack | None = None

    def start(self, run: RunInfo) -> None:
        from tqdm.auto import tqdm

        from ..kernels.jit import compile_notices

        self.t0, self.total = run.t0, run.t_end - run.t0
        start = float(run.save_times[run.resumed_at] - run.t0)
        self.desc = self.label or run.solver.name
        self.bar = tqdm(
            total=self.total,
            initial=start,
            unit="t",
            desc=self.desc,
            dynamic_ncols=True,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| t={n:.4g}/{total:.4g} "
            "[{elapsed}<{remaining}{postfix}]",
        )
        self._notices = contextlib.ExitStack()
        self._notices.enter_context(compile_notices(self._compiling))

    def _compiling(self, name: str, cached: bool, seconds: float | None) -> None:
        if self.bar is None:
            return
        if seconds is None:
            once = ", first run only" if cached else ""
            self.bar.set_description_str(f"{self.desc} [compiling {name}{once}]")
        else:
            self.bar.set_description_str(self.desc)

    def step(self, t: float, dt: float, step: StepResult) -> None:
        new = min(max(t - self.t0, 0.0), self.total)
        if new > self.bar.n:
            self.bar.update(new - self.bar.n)

    def finish(self, result) -> None:
        self.close()

    def close(self) -> None:
        if self._notices is not None:
            self._notices.close()
            self._notices = None
        if self.bar is not None:
            self.bar.close()


class Callback(Tracker):
    """``f(t, state)`` at every save time (``state`` read-only); a true return value stops the run.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem, integrate
    >>> from wflow.solvers.trackers import Callback
    >>> class Decay(Problem):
    ...     def rhs(self, t, y):
    ...         return -y
    >>> stop = Callback(lambda t, y: y[0] < 0.5)  # stop once y has halved (at a save time)
    >>> res = integrate(Decay(), "rk4", np.array([1.0]), 0.0, 2.0, dt=0.1, trackers=[stop])
    >>> res.status, round(float(res.times[-1]), 6)  # exp(-0.8) < 0.5 < exp(-0.6)
    (1, 0.8)
    """

    name = "callback"

    def __init__(self, f: Callable[..., Any], *, every_step: bool = False):
        if not callable(f):
            raise TypeError(f"callback must be callable, got {short_repr(f)}")
        self.f = f
        self.every_step = every_step

    def save(self, snap: Snapshot) -> bool:
        return bool(self.f(snap.t, snap.state)) if not self.every_step else False

    def step(self, t: float, dt: float, step: StepResult) -> bool:
        return bool(self.f(t, step.y)) if self.every_step else False


class Record(Tracker):
    """Keeps the named variables of every snapshot (``times``, ``values[name]``), for runs with ``keep=False``.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.solvers.base import Problem, integrate
    >>> from wflow.solvers.trackers import Record
    >>> class Decay(Problem):
    ...     def rhs(self, t, y):
    ...         return -y
    >>> rec = Record("state")
    >>> res = integrate(Decay(), "rk4", np.array([1.0]), 0.0, 1.0, dt=0.1, save_at=[0.0, 0.5, 1.0],
    ...                 keep=False, trackers=[rec])
    >>> len(res.times), rec.times, np.round(np.ravel(rec.values["state"]), 5).tolist()  # e^-t
    (1, [0.0, 0.5, 1.0], [1.0, 0.60653, 0.36788])
    """

    name = "record"

    def __init__(self, *names: str):
        if not names or not all(isinstance(n, str) for n in names):
            raise TypeError(f"Record needs the names of snapshot variables, got {names!r}")
        self.times: list[float] = []
        self.values: dict[str, list[np.ndarray]] = {n: [] for n in names}

    def save(self, snap: Snapshot) -> None:
        self.times.append(float(snap.t))
        for n, v in self.values.items():
            v.append(np.array(snap.data[n][1], copy=True))


class StepLog(Tracker):
    """One CSV row per accepted step: ``step, t, dt, error`` and the solver's per-step ``info``.

    On resume the rows after the resumed snapshot's step are dropped: the log equals the uninterrupted run's.

    Examples
    --------
    >>> import csv, tempfile, pathlib, wflow
    >>> from wflow.solvers.trackers import StepLog
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "steps.csv"
    >>> x0 = wflow.sphere.uniform(8, 3, seed=0)
    >>> _ = wflow.simulate(wflow.SA(1.0), x0, 1.0, dt=0.25, trackers=[StepLog(path)], backend="numpy")
    >>> rows = list(csv.DictReader(open(path)))
    >>> len(rows), rows[-1]["step"], float(rows[-1]["t"]), float(rows[-1]["dt"])
    (4, '4', 1.0, 0.25)
    """

    name = "step log"

    def __init__(self, path: str | os.PathLike, *, append: bool = False):
        self.path = Path(path)
        self.append = append
        self.fh: IO[str] | None = None
        self.writer: csv.DictWriter[str] | None = None
        self.fields: list[str] = []
        self.step_no = 0

    def start(self, run: RunInfo) -> None:
        kept: list[dict] = []
        self.step_no = 0
        from ..io.paths import read_regular

        old = read_regular(self.path) if self.append and run.resumed_at > 0 else None
        if old is not None:  # (a FIFO in its place is refused, never waited on)
            rows = list(csv.DictReader(io.StringIO(old.decode("utf-8"), newline="")))
            # complete rows of the steps up to the resumed snapshot are kept; the rest are redone
            limit = float(run.save_times[run.resumed_at])
            kept = [
                r
                for r in rows
                if None not in r.values()
                and None not in r
                and (t := _float(r["t"])) is not None
                and t <= limit * (1 + 1e-12) + 1e-300
            ]
            self.step_no = int(kept[-1]["step"]) if kept else 0
            self.fields = list(rows[0].keys()) if rows else []
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        # a killed run's leftover (a link there is removed, not followed)
        tmp.unlink(missing_ok=True)
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644
        )
        self.fh = fh = os.fdopen(fd, "w", newline="")
        if kept:
            self.writer = csv.DictWriter(fh, fieldnames=self.fields)
            self.writer.writeheader()
            self.writer.writerows(kept)
        fh.flush()
        os.replace(tmp, self.path)

    def step(self, t: float, dt: float, step: StepResult) -> None:
        self.step_no += 1
        row = {
            "step": self.step_no,
            "t": repr(float(t)),
            "dt": repr(float(dt)),
            "error": "" if step.error is None else repr(float(step.error)),
        }
        row.update(
            {k: (repr(float(v)) if isinstance(v, float) else v) for k, v in step.info.items()}
        )
        assert self.fh is not None, "StepLog.step before start"
        if self.writer is None:
            self.fields = list(row)
            self.writer = csv.DictWriter(self.fh, fieldnames=self.fields, extrasaction="ignore")
            self.writer.writeheader()
        self.writer.writerow(row)
        self.fh.flush()

    def finish(self, result) -> None:
        if self.fh is not None:
            self.fh.close()


def _float(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None
